"""Checks of the config's settings, shared by the methods' settings and `config.pruned_heads`
(`check_pruned_heads`, which the config runs when the field is set and [`hf_headattn.pruning`][hf_headattn.pruning] when
it prunes): each error names the field, the bad value and what was expected."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Iterable, Mapping
from numbers import Integral

from .sites import AttentionSite, component_shape


def resolve_layers(indices: Iterable[int] | None, num_layers: int, name: str) -> list[int]:
    """Layer indices (negative ones count from the end, as in Python) as a sorted list of distinct non-negative ones.

    Raises `ValueError` for an index outside `[-num_layers, num_layers)`; `None` gives `[]`.
    """
    if indices is None:
        return []
    resolved = set()
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, int) or not -num_layers <= index < num_layers:
            raise ValueError(
                f"{name} contains {index!r}, but the model has {num_layers} layers: expected integers in "
                f"[{-num_layers}, {num_layers - 1}]"
            )
        resolved.add(index % num_layers)
    return sorted(resolved)


def check_range(value, name: str, low: float, high: float | None = None, *, high_open: bool = False) -> None:
    """Raise `ValueError` unless `low <= value` (and `value <= high`, or `< high` when `high_open`)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        upper = "" if high is None else f", {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a number in [{low}{upper or ', inf)'}, got {value!r}")


def check_choice(value, name: str, choices: Iterable) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@functools.cache
def allowed_values(settings_class: type, field: str) -> tuple:
    """The values a settings field's `Literal` annotation allows (`None` too where the field is optional): the
    one place they are listed."""
    hint = typing.get_type_hints(settings_class)[field]
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return tuple(value for option in options for value in (
        typing.get_args(option) if typing.get_origin(option) is typing.Literal
        else (None,) if option is type(None) else ()))


def describe_type(annotation) -> str:
    """A settings annotation in words, for error messages: `list[int] | None` -> "a list of integers or None"."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(arg) for arg in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(arg) for arg in args)
    if origin is list:
        return f"a list of ({describe_type(args[0])})"
    if dataclasses.is_dataclass(annotation):
        return "a dict of settings"
    names = {bool: "True or False", int: "an integer", float: "a finite number", str: "a string", dict: "a dict"}
    return names.get(annotation, names.get(origin, str(annotation)))


def check_pruned_heads(value, config, where: str = "pruned_heads") -> dict[str, list[int]]:
    """`value` as `{module name: sorted original head numbers}` if valid, else a `ValueError` naming the bad
    entry and what was expected (`None` or `{}`: nothing pruned)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a dict {{module name: [head numbers]}} (or None), got {value!r}")
    checked = {}
    for name, heads in value.items():
        site = AttentionSite.parse(name)
        if site is None or site.name != name:
            raise ValueError(f"{where} has the key {name!r}; expected an attention module's name in the base model, "
                             "e.g. 'encoder.layers.0.self_attn' or 'decoder.layers.1.encoder_attn'")
        layers, total = component_shape(config, site.component)
        if site.layer >= layers:
            raise ValueError(f"{where}[{name!r}]: the {site.side} has {layers} layers, expected a layer index below it")
        checked[name] = check_head_numbers(heads, total, f"{where}[{name!r}]")
    return checked


def check_head_numbers(heads, total: int, where: str) -> list[int]:
    """`heads` (a list, tuple or set, or a 1-d integer array or tensor, of head numbers: ints, numpy integers or
    0-d integer arrays/tensors) as sorted distinct ints, else a `ValueError` naming what was given."""
    expected = f"a list of head numbers in [0, {total - 1}] (the original numbering)"
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable) or getattr(heads, "ndim", 1) != 1:
        raise ValueError(f"{where} must be {expected}, got {heads!r}")
    numbers = [_head_number(h) for h in heads]
    if any(h is None or not 0 <= h < total for h in numbers):
        raise ValueError(f"{where} must be {expected}, got {_listed(heads)!r}")
    if len(set(numbers)) == total:
        raise ValueError(f"{where} would remove all {total} heads of the module; keep at least one (pruning a whole "
                         "attention module is refused)")
    return sorted(set(numbers))


def _head_number(value) -> int | None:
    """`value` as an int if it is an integer (a Python or numpy integer, a 0-d integer array or tensor; no bool,
    no float), else None."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # numpy scalars and 0-d arrays/tensors: a Python int, float or bool
    return int(value) if isinstance(value, Integral) and not isinstance(value, bool) else None


def _listed(heads) -> list:
    """`heads` as a list of Python scalars, for messages."""
    return [h.item() if getattr(h, "ndim", None) == 0 and hasattr(h, "item") else h for h in heads]
