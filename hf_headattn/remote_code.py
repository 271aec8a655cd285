"""What a checkpoint's remote code carries: the model core written flat, and the `auto_map` that names it.

A user without the package loads a saved folder with `trust_remote_code=True`: transformers' loader fetches the
module `auto_map` names (`modeling.py`) and, recursively, the modules it imports relatively, as flat sibling
files (`from .x import` means `x.py` beside it: its dynamic modules know no subpackages). The package keeps each
method in its own folder (`methods/<name>/`), so the copy cannot be HF's (`custom_object_save` copies files as
they are). Instead a config's `save_pretrained` writes the core itself (`ship`): every module that
`configuration.py` and `modeling.py` import relatively, each under a flat name (`flat_name`:
`methods/dhicm/core.py` becomes `dhicm_core.py`) with its relative imports rewritten to those names. The
experiment kit is never reached (the core names kits by strings), so a checkpoint carries the model's code only.
The rewriting is line-based, as HF's own reading of imports is (`from .x import` at a line's start).

Why not keep the core flat beside `modeling.py` as before: a method's code then lived in three trees. Why not
vendor a flat copy in the package: two copies drift. Written at save time from the one copy, the folder holds what
ran (tested: every method, and two together, loaded in a process that cannot import `hf_headattn`).

The same code runs when the model was itself loaded as remote code (its modules are then flat already, and
`flat_name` maps each to itself), so a remote-code model saved again carries the same files.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent
"""The folder of the package (or of a flat remote copy of it)."""
ENTRY_MODULES = ("configuration", "modeling")
"""The modules `auto_map` names: the configs and the models."""
RELATIVE_IMPORT = re.compile(r"^(\s*from\s+)(\.+)([\w.]*)(\s+import\b)", re.MULTILINE)
"""A relative import at a line's start (inside a function too), as transformers' loader reads them."""


def auto_map(config) -> dict[str, str]:
    """The `auto_map` of a saved config: the Auto classes -> `"<flat module>.<class>"` of its config class and its
    models (`config.headattn_model_classes`: the Auto class -> the model class's name)."""
    return {"AutoConfig": f"configuration.{type(config).__name__}",
            **{auto_class: f"modeling.{name}" for auto_class, name in config.headattn_model_classes.items()}}


def flat_name(path: Path, root: Path = ROOT) -> str:
    """The flat module name of a core module file: its path under `root` joined by `_`, without the `methods`
    folder and `__init__` (`methods/dhicm/core.py` -> `dhicm_core`, `methods/__init__.py` -> `methods`,
    `attention.py` -> `attention`)."""
    parts = list(path.resolve().relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if len(parts) > 1 and parts[0] == "methods":
        parts.pop(0)
    return "_".join(parts)


def _imported_file(path: Path, dots: str, module: str, root: Path) -> Path:
    """The file a relative import in `path` names (a module file, or a package's `__init__.py`)."""
    base = path.parent
    for _ in range(len(dots) - 1):
        base = base.parent
    target = base.joinpath(*module.split(".")) if module else base
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file() and candidate.resolve().is_relative_to(root):
            return candidate.resolve()
    raise FileNotFoundError(f"{path}: 'from {dots}{module} import' names no module file under {root}; expected the "
                            "model core's relative imports to name modules of the package")


def core_files(root: Path = ROOT) -> dict[str, Path]:
    """`{flat name: file}` of the entry modules and every module they import relatively, recursively; two files
    with one flat name are refused. (In a remote copy, transformers' loader puts the config's modules and the
    model's in folders of their own: the entry module missing there is left to its own class's save, HF's.)"""
    found: dict[str, Path] = {}
    pending = [(root / f"{name}.py").resolve() for name in ENTRY_MODULES if (root / f"{name}.py").is_file()]
    while pending:
        path = pending.pop()
        name = flat_name(path, root)
        if name in found:
            if found[name] != path:
                raise ValueError(f"{found[name]} and {path} both have the flat name {name!r} in a checkpoint's remote "
                                 "code; expected distinct names (rename one)")
            continue
        found[name] = path
        for match in RELATIVE_IMPORT.finditer(path.read_text(encoding="utf-8")):
            if not match.group(3):
                raise ValueError(f"{path}: 'from {match.group(2)} import ...' imports from a package, which the flat "
                                 "remote code cannot; expected 'from .module import name'")
            pending.append(_imported_file(path, match.group(2), match.group(3), root))
    return found


def flattened(path: Path, root: Path = ROOT) -> str:
    """The text of `path` with each relative import naming the flat module (`from ...attention import` ->
    `from .attention import`)."""

    def flat(match: re.Match) -> str:
        target = _imported_file(path, match.group(2), match.group(3), root)
        return f"{match.group(1)}.{flat_name(target, root)}{match.group(4)}"

    return RELATIVE_IMPORT.sub(flat, path.read_text(encoding="utf-8"))


FORMER_FLAT_NAMES = ("dhicm", "eadra", "eadra_math", "eadra_triton", "fused_passes", "modeling_eadra_triton", "sea",
                     "sea_math")
"""The flat modules that releases up to 0.3 shipped (HF's copy of the package's then flat modules) and the core no
longer has: a folder saved again must not keep them, which a push to the Hub would upload."""
OURS = re.compile(r"^\s*from\s+\.|hf_headattn|hf-headattn|HeadAttn", re.MULTILINE)
"""What marks a file as this package's code (each former flat module has one of these)."""


def remove_former(folder, shipped=()) -> list[Path]:
    """Remove from `folder` the flat modules an earlier release shipped (`FORMER_FLAT_NAMES`) that the core
    `shipped` now does not, and only where the file is this package's code (`OURS`): a user's own file of
    that name stays. The removed files."""
    removed = []
    for name in FORMER_FLAT_NAMES:
        path = Path(folder) / f"{name}.py"
        if name in shipped or not path.is_file() or path.is_symlink():
            continue
        if OURS.search(path.read_text(encoding="utf-8", errors="replace")):
            path.unlink()
            removed.append(path)
    return removed


def ship(folder) -> list[Path]:
    """Write the model core into `folder`, flat (`core_files`, `flattened`); the written files. The flat
    modules an earlier release shipped there and the core no longer has are removed (`remove_former`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    files = core_files()
    for name, path in sorted(files.items()):
        target = folder / f"{name}.py"
        if target.resolve() != path:  # (a remote copy saved into its own folder)
            target.write_text(flattened(path), encoding="utf-8")
        written.append(target)
    remove_former(folder, files)
    return written
