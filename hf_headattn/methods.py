"""The built-in methods: one registration line each.

Adding a method: write ``hf_headattn/<name>.py`` with its settings (a :class:`~.registry.MethodSettings` dataclass),
its :class:`~.attention.AttentionMethod` and ``METHOD = MethodSpec(...)`` (see :mod:`hf_headattn.dhicm` for a short
one), and add its line here. Everything else (config field, validation, placement, forward, outputs, logging, model
card, recipe names) reads the registry.
"""

# (``from .module import ...``, not ``from . import module``: save_pretrained finds the files to ship by that form)
from .dhicm import METHOD as DHICM
from .eadra import METHOD as EADRA
from .registry import register_method
from .sea import METHOD as SEA

register_method(SEA)
register_method(EADRA)
register_method(DHICM)
