"""A method's kit: what the recipes, studies and analyses know of a method beyond the model.

The model needs a method's core spec (:class:`hf_headattn.registry.MethodSpec`: settings, placements, hooks,
inputs, outputs). Everything else about it (its recipe names, the papers' presets, the model card's line, its
head-importance criterion, whether the recipes must parse syntax for it) is its kit: ``KIT = MethodKit(...)`` in the
module that ``MethodSpec.kit`` names, next to the method's study rows and analyses (the built-in ones:
``hf_headattn/experiment/methods/<name>/``). The core names its kit by import path only, so the model (and the
code ``save_pretrained`` ships to the Hub) never loads it; :func:`kit_of` does, when a recipe asks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..registry import MethodSpec, registered_methods


def merge_settings(base: dict, update: dict) -> dict:
    """``base`` updated with ``update``; nested dicts (``eadra``'s components) are merged, not replaced."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            value = merge_settings(dict(merged[key]), dict(value))
        merged[key] = value
    return merged


@dataclass(frozen=True)
class Preset:
    """A paper's setting (``--preset NAME``). ``doc`` names its source table; ``flags``: values of recipe flags and
    of ``Seq2SeqTrainingArguments``; ``config``: config fields without a flag; ``method_overrides``: {method name:
    settings} merged into a method's settings only when the chosen methods switch it on (e.g. DHICM Table 2's DHICM
    dropout, which means nothing for the T-base/T-optimal baselines). (:mod:`~hf_headattn.experiment.presets`.)"""

    doc: str
    flags: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    method_overrides: dict[str, dict] = field(default_factory=dict)

    def apply(self, settings: dict) -> dict:
        """``settings`` (config fields) with this preset's ``config`` and ``method_overrides`` merged in."""
        merged = merge_settings(settings, self.config)
        for method, overrides in self.method_overrides.items():
            if merged.get(method) is not None:
                merged[method] = merge_settings(merged[method], overrides)
        return merged


@dataclass(frozen=True)
class MethodKit:
    """What the recipes know of one method.

    name: the method's name (its ``MethodSpec.name``).
    paper: one line for the model card (default: the name).
    method_names: recipe method names (``--method NAME``) -> this method's settings dict.
    presets: the papers' presets (``--preset NAME``) -> :class:`Preset`.
    uses_syntax: whether the method reads the syntax inputs (the recipes then parse and collate them).
    importance: ``(criterion name, function)``: the method's head-importance criterion for
        :func:`hf_headattn.analysis.head_ranking.score_heads`; the function maps one batch's read-out (the value of
        its read-out field, :func:`hf_headattn.registry.readout`) to ``{module name: (per-head sums (heads,), number
        of items)}``, higher = more important.
    """

    name: str
    paper: str = ""
    method_names: Mapping[str, dict] = field(default_factory=dict)
    presets: Mapping[str, Preset] = field(default_factory=dict)
    uses_syntax: bool = False
    importance: tuple[str, Callable] | None = None


def kit_of(spec: MethodSpec) -> MethodKit:
    """The kit ``spec.kit`` names (``KIT`` of that module), or an empty one (``MethodKit(spec.name)``)."""
    if spec.kit is None:
        return MethodKit(spec.name, paper=spec.name)
    kit = getattr(importlib.import_module(spec.kit), "KIT", None)
    if not isinstance(kit, MethodKit) or kit.name != spec.name:
        raise ValueError(f"method {spec.name!r}: its kit module {spec.kit!r} must define KIT = MethodKit("
                         f"{spec.name!r}, ...), got {kit!r}")
    return kit


def kits() -> list[MethodKit]:
    """The kits of the registered methods, in their order; two kits that claim one recipe method or preset name are
    refused."""
    found = [kit_of(spec) for spec in registered_methods()]
    owners: dict[str, str] = {}
    for kit in found:
        for name in [*kit.method_names, *kit.presets]:
            if owners.setdefault(name, kit.name) != kit.name:
                raise ValueError(f"the methods {owners[name]!r} and {kit.name!r} both define the recipe name "
                                 f"{name!r}; expected names unique over all methods")
    return found


def uses_syntax(settings: Mapping[str, Any]) -> bool:
    """Whether config settings (a dict of config fields, e.g. a recipe's) switch on a method that needs syntax."""
    return any(kit.uses_syntax and settings.get(kit.name) is not None for kit in kits())
