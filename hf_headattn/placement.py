"""The placement vocabulary every method's settings share: where a method goes (layers of each attention kind) and
on which heads, read by one resolver (errors name the field, the bad value and what was expected). The fields and
their values are tabled in `hf_headattn.plugin`'s docstring, the page plug-in authors read.

A method has the fields of the attention kinds and head choices it supports, each default its paper's layout. A
method may name a layout of its own ([`layers_of`][hf_headattn.placement.layers_of]'s `layouts`: Localness's
`"lower_half"`, DHICM's `cross_layers="decoder_layers"`). The spellings these replace (`layers`, `decoder`/`cross`
switches, a head mode or a count in `heads`, None for every layer) load with a deprecation warning
(`MethodSpec.older_spellings`, [`renamed`][hf_headattn.placement.renamed], translated by `hf_headattn.legacy`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .settings_checks import resolve_layers

LAYER_FIELDS = {"encoder_layers": ("encoder", "self"), "decoder_layers": ("decoder", "self"),
                "cross_layers": ("decoder", "cross")}
"""The layer fields: field -> (side, kind) of the attention modules it places on."""
HEAD_SELECTIONS = ("all", "redundant")
"""`head_selection`'s values: every head of `heads`, or those RHE (Zhang et al. 2021, Eq. 10) finds redundant."""


def layers_of(value, count: int, name: str,
              layouts: Mapping[str, Callable[[int], Iterable[int]]] | None = None) -> list[int]:
    """The layer numbers a layer field's `value` names in a stack of `count` layers, sorted and distinct:
    `"all"` every layer, a list its numbers (negative ones count from the end), None none (not placed), a name of
    `layouts` (`{name: layers(count)}`, the method's own layouts) what it gives. `ValueError` naming `name`
    and the bad value otherwise."""
    if value is None:
        return []
    if isinstance(value, str):
        if value == "all":
            return list(range(count))
        if layouts and value in layouts:
            return resolve_layers(layouts[value](count), count, name)
    elif isinstance(value, (list, tuple)):
        return resolve_layers(value, count, name)
    named = "".join(f", {key!r}" for key in layouts or ())
    raise ValueError(f"{name} must be 'all'{named}, a list of layer numbers in [{-count}, {count - 1}] or None (not "
                     f"placed), got {value!r}")


def heads_of(value, count: int, name: str) -> list[int]:
    """The head numbers `heads`'s `value` names in a module of `count` heads, sorted and distinct: `"all"`
    every head, a non-empty list its numbers (negative ones count from the end). `ValueError` otherwise."""
    if value == "all":
        return list(range(count))
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(head, int) and not isinstance(head, bool) and -count <= head < count for head in value):
        return sorted({head % count for head in value})
    raise ValueError(f"{name} must be 'all' or a non-empty list of head numbers in [{-count}, {count - 1}], got "
                     f"{value!r}")


def check_head_selection(value, name: str) -> None:
    """`ValueError` unless `value` is one of [`HEAD_SELECTIONS`][hf_headattn.placement.HEAD_SELECTIONS]."""
    if value not in HEAD_SELECTIONS:
        raise ValueError(f"{name} must be one of {HEAD_SELECTIONS} (every head of heads, or those RHE finds "
                         f"redundant), got {value!r}")


def layer_placements(settings, config, name: str,
                     layouts: Mapping[str, Callable[[int], Iterable[int]]] | None = None) -> list[tuple[str, int, str]]:
    """The attention modules a method's settings place it on, from its layer fields (the default of
    `MethodSpec.placements`): those of `LAYER_FIELDS` the settings have, each read by
    [`layers_of`][hf_headattn.placement.layers_of] (`layouts` as there). Returns `[(side, layer, kind), ...]`, encoder
    first, then each decoder layer's self-attention before its cross-attention; a bad value is a `ValueError` naming
    `<name>.<field>`."""
    sites = []
    for field, (side, kind) in LAYER_FIELDS.items():
        if hasattr(settings, field):
            layers = layers_of(getattr(settings, field), getattr(config, f"{side}_layers"), f"{name}.{field}", layouts)
            sites += [(side, layer, kind) for layer in layers]
    return sorted(sites, key=lambda site: (site[0] != "encoder", site[1], site[2] == "cross"))


def renamed(values: Mapping, old: str, new: str, convert: Callable = lambda value: value,
            notes: list | None = None) -> dict:
    """`values` (a settings dict) with the older spelling `old` given as `new` (its value through `convert`,
    which may return a dict of several new fields), and `(old, new)` added to `notes`: the pieces of a
    `MethodSpec.older_spellings`. Both spellings given: a `ValueError` naming them."""
    values = dict(values)
    if old not in values:
        return values
    converted = convert(values.pop(old))
    converted = converted if isinstance(converted, dict) else {new: converted}
    both = sorted(key for key in converted if key in values)
    if both:
        raise ValueError(f"the settings give {old!r} (an older spelling) and {both}; expected {new!r} alone")
    if notes is not None:
        notes.append((old, new))
    return {**values, **converted}
