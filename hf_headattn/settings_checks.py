"""Checks shared by the methods' settings: each error names the field, the bad value and what was expected."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Iterable


def resolve_layers(indices: Iterable[int] | None, num_layers: int, name: str) -> list[int]:
    """Layer indices (negative ones count from the end, as in Python) as a sorted list of distinct non-negative ones.

    Raises ``ValueError`` for an index outside ``[-num_layers, num_layers)``; ``None`` gives ``[]``.
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
    """Raise ``ValueError`` unless ``low <= value`` (and ``value <= high``, or ``< high`` when ``high_open``)."""
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
    """The values a settings field's ``Literal`` annotation allows (``None`` too where the field is optional): the
    one place they are listed."""
    hint = typing.get_type_hints(settings_class)[field]
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return tuple(value for option in options for value in (
        typing.get_args(option) if typing.get_origin(option) is typing.Literal else (None,) if option is type(None) else ()))


def describe_type(annotation) -> str:
    """A settings annotation in words, for error messages: ``list[int] | None`` -> "a list of integers or None"."""
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
