"""The built-in methods: one registration line each.

Adding a method: write ``hf_headattn/<name>.py`` with its settings (a :class:`~.registry.MethodSettings` dataclass),
its :class:`~.attention.AttentionMethod` and ``METHOD = MethodSpec(..., kit="hf_headattn.experiment.methods.<name>")``
(see :mod:`hf_headattn.dhicm` for a short one), its kit folder ``hf_headattn/experiment/methods/<name>/`` (recipe
names, presets, model-card line, analyses: :mod:`hf_headattn.experiment.kit`), and add its line here. Everything else
(config field, validation, placement, forward, outputs, logging; the recipes, model card and analyses through the
kit) reads the registry (docs/design.md, "Adding a fourth method").
"""

# (``from .module import ...``, not ``from . import module``: save_pretrained finds the files to ship by that form)
from .dhicm import METHOD as DHICM
from .eadra import METHOD as EADRA
from .registry import register_method
from .sea import METHOD as SEA

register_method(SEA)
register_method(EADRA)
register_method(DHICM)
