"""Deprecated spellings, each warned through one function that names its replacement and the release that removes
it (as transformers' `deprecate_kwarg(..., version=...)` does): `warn_deprecated` for a name, a keyword or a
config field, `MOVED_MODULES` for a module path that moved.

What is deprecated, and when it goes: CHANGELOG.md ("Deprecated"). `tests/test_deprecation.py` fails once the
running release reaches a removal release still named here, so a spelling cannot outlive its date unnoticed. (A
checkpoint's remote code ships this module: standard library only.)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

NEXT_RELEASE = "0.4"
"""The release that removes what the running release deprecates (every `removed_in` of the package names it)."""

MOVED_MODULES = {
    "hf_headattn.dhicm": "hf_headattn.methods.dhicm.core",
    "hf_headattn.eadra": "hf_headattn.methods.eadra.core",
    "hf_headattn.eadra_math": "hf_headattn.methods.eadra.equations",
    "hf_headattn.fused_passes": "hf_headattn.methods.eadra.compiled",
    "hf_headattn.sea": "hf_headattn.methods.sea.core",
    "hf_headattn.sea_math": "hf_headattn.methods.sea.equations",
    "hf_headattn.syntax": "hf_headattn.syntax_inputs",
    "hf_headattn.methods.sea.syntax": "hf_headattn.syntax_inputs",
    "hf_headattn.methods.sea.inputs": "hf_headattn.syntax_inputs.provider",
    "hf_headattn.analysis": "hf_headattn.experiment.analysis",
    "hf_headattn.experiment.recipe": "hf_headattn.commands.train",  # release 0.2's name
    "hf_headattn.experiment.training": "hf_headattn.experiment.recipe_parts",  # release 0.2's name
    "hf_headattn.experiment.translation_recipe": "hf_headattn.commands.train",
    "hf_headattn.experiment.finetune_mbart": "hf_headattn.commands.finetune",
    "hf_headattn.experiment.translate_lines": "hf_headattn.commands.translate",
    "hf_headattn.experiment.prune_heads": "hf_headattn.commands.prune",
    "hf_headattn.experiment.average_checkpoints": "hf_headattn.commands.average",
    "hf_headattn.experiment.parse_sources": "hf_headattn.commands.parse",
    "hf_headattn.experiment.demo": "hf_headattn.commands.demo",
}
"""Modules that moved, old dotted name -> new (their submodules follow): importing the old name warns and gives the
new module itself (`install_moved_modules`). Release 0.2's flat method modules moved into one folder per
method (`hf_headattn/methods/<name>/`) in 0.3.0, as did SEA's syntax pipeline (`hf_headattn.syntax`), which
then left SEA's folder for the shared input provider (`hf_headattn.syntax_inputs`: SEA, Rel_Pos+RHE and
Localness+RHE read its inputs alike); the commands left the experiment kit for one folder,
`hf_headattn/commands/` (one module per `hf-headattn` command), and the analyses joined the kit they import
(`hf_headattn.experiment.analysis`)."""


class HeadAttnDeprecationWarning(FutureWarning):
    """What hf-headattn says of its own deprecated spellings (shown by default, as every `FutureWarning`)."""


def deprecation_message(old: str, new: str, removed_in: str, *, plural: bool = False) -> str:
    """`"<old> is deprecated and will be removed in hf-headattn <removed_in>; use <new>"`."""
    return f"{old} {'are' if plural else 'is'} deprecated and will be removed in hf-headattn {removed_in}; use {new}"


def warn_deprecated(old: str, new: str, removed_in: str, *, plural: bool = False, stacklevel: int = 2) -> None:
    """Warn (`HeadAttnDeprecationWarning`) that `old` is deprecated for `new` and goes in hf-headattn
    `removed_in` (e.g. `"0.5"`). `stacklevel` counts as `warnings.warn`'s does, from the caller of this
    function: 2 names the line that called the caller."""
    warnings.warn(deprecation_message(old, new, removed_in, plural=plural), HeadAttnDeprecationWarning,
                  stacklevel=stacklevel + 1)


def moved_module(name: str) -> str | None:
    """The new name of module `name` if it (or a package above it) is in `MOVED_MODULES`, else None."""
    for old, new in MOVED_MODULES.items():
        if name == old or name.startswith(f"{old}."):
            return new + name[len(old):]
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names of `MOVED_MODULES` and their submodules, before the path finders (which would load a
    submodule a second time, from the new package's folder under the old name); loading one returns the new module
    (one module, not a copy: `import hf_headattn.sea` then gives `hf_headattn.methods.sea.core` itself). A moved
    module warns; its submodules do not (their package did)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if moved_module(name) else None

    def create_module(self, spec):
        new = moved_module(spec.name)
        if spec.name in MOVED_MODULES:
            warn_deprecated(f"the module {spec.name}", new, NEXT_RELEASE, stacklevel=2)  # (importlib's frames skipped)
        return importlib.import_module(new)

    def exec_module(self, module):
        """Nothing to run: the new module was imported by `create_module`."""


def install_moved_modules() -> None:
    """Let the old names of `MOVED_MODULES` import (the package's `__init__` calls it; idempotent)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
