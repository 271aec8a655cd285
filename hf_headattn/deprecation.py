"""Deprecated spellings, each warned through one function that names its replacement and the release that removes
it (as transformers' ``deprecate_kwarg(..., version=...)`` does): :func:`warn_deprecated` for a name, a keyword or a
config field, :func:`alias_module` for a module path that moved.

What is deprecated, and when it goes: CHANGELOG.md ("Deprecated"). ``tests/test_deprecation.py`` fails once the
running release reaches a removal release still named here, so a spelling cannot outlive its date unnoticed. (A
checkpoint's remote code ships this module: standard library only.)
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Iterable
from types import ModuleType


class HeadAttnDeprecationWarning(FutureWarning):
    """What hf-headattn says of its own deprecated spellings (shown by default, as every ``FutureWarning``)."""


def deprecation_message(old: str, new: str, removed_in: str, *, plural: bool = False) -> str:
    """``"<old> is deprecated and will be removed in hf-headattn <removed_in>; use <new>"``."""
    return f"{old} {'are' if plural else 'is'} deprecated and will be removed in hf-headattn {removed_in}; use {new}"


def warn_deprecated(old: str, new: str, removed_in: str, *, plural: bool = False, stacklevel: int = 2) -> None:
    """Warn (:class:`HeadAttnDeprecationWarning`) that ``old`` is deprecated for ``new`` and goes in hf-headattn
    ``removed_in`` (e.g. ``"0.5"``). ``stacklevel`` counts as ``warnings.warn``'s does, from the caller of this
    function: 2 names the line that called the caller."""
    warnings.warn(deprecation_message(old, new, removed_in, plural=plural), HeadAttnDeprecationWarning,
                  stacklevel=stacklevel + 1)


def alias_module(old: str, new: str, removed_in: str, submodules: Iterable[str] = ()) -> ModuleType:
    """Make the module being imported as ``old`` (call this from its body, with its ``__name__``) the module ``new``,
    and ``old.<name>`` the module ``new.<name>`` for each of ``submodules``, after a warning naming the line that
    imported it: ``import old`` then gives ``new`` itself (one module, not a copy). Returns ``new``."""
    warn_deprecated(f"the module {old}", new, removed_in, stacklevel=3)  # (importlib's frames are skipped)
    module = importlib.import_module(new)
    for name in submodules:
        sys.modules[f"{old}.{name}"] = importlib.import_module(f"{new}.{name}")
    sys.modules[old] = module
    return module
