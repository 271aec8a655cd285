"""Finds uses of transformers', torch's and datasets' internals outside ``hf_headattn/hf_compat.py``, the one module
allowed them (each of its names has a contract test in ``tests/test_hf_compat.py``).

A use is (a) an import from transformers' model, ``modeling_utils``, ``initialization`` or ``trainer_pt_utils``
modules, from ``datasets.fingerprint``, or of any private name (``torch._dynamo``); (b) a read or write of an
underscore attribute, ``x._name`` (or ``getattr(x, "_name")``), that no class of ours defines outside the door (its
methods, class attributes, dataclass fields, ``self._name = ...``), or of a private dunder (``__dataclass_fields__``);
(c) a read of ``torch._*`` (``torch.compiler.*`` is public and fine).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The module allowed the libraries' internals, relative to the repository root.
DOORS = ("hf_headattn/hf_compat.py",)
#: The folders whose modules may use them only through the door. (``benchmarks/`` is left out: it counts operators
#: and compiled graphs with torch's dispatch modes and dynamo's counters, and ships in no wheel.)
SCANNED = ("hf_headattn", "recipes", "research")
FORBIDDEN_MODULES = ("transformers.models", "transformers.modeling_utils", "transformers.initialization",
                     "transformers.trainer_pt_utils", "transformers.dynamic_module_utils", "datasets.fingerprint")
LIBRARIES = ("transformers", "torch", "datasets")
#: Dunders that are no public API of the objects they are read from.
PRIVATE_DUNDERS = {"__dataclass_fields__"}
ATTRIBUTE_FUNCTIONS = {"getattr", "hasattr", "setattr", "delattr"}


def scanned_sources(root: Path = ROOT) -> dict[str, str]:
    """``{path relative to root: source}`` of every module of :data:`SCANNED`."""
    return {path.relative_to(root).as_posix(): path.read_text(encoding="utf-8")
            for folder in SCANNED for path in sorted((root / folder).rglob("*.py"))}


def _is_private(name: str) -> bool:
    """``_name``, but no dunder, nor ``_`` alone (spaCy's public extension namespace, ``doc._.name``)."""
    return name.startswith("_") and name != "_" and not (name.startswith("__") and name.endswith("__"))


def _class_body_names(statement: ast.stmt) -> list[str]:
    """The attribute names a statement of a class body defines (a method, a nested class, an assignment)."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [statement.name]
    targets = statement.targets if isinstance(statement, ast.Assign) else \
        [statement.target] if isinstance(statement, ast.AnnAssign) else []
    return [name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)]


def _attribute_name_argument(node: ast.Call) -> str | None:
    """The constant name of ``getattr(x, "name", ...)`` and its kin, else None."""
    if (isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_FUNCTIONS and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[1].value
    return None


def library_private_names() -> set[str]:
    """The private attribute names of the library objects our code meets most (transformers' models, configs,
    attention modules and Trainer, torch's modules and tensors, datasets' ``Dataset``): a class of ours that defines
    one overrides an internal, and reading one is no read of ours."""
    import datasets
    import torch
    import transformers
    from transformers.models.mbart.modeling_mbart import MBartAttention

    objects = [transformers.PreTrainedModel, transformers.MBartForConditionalGeneration, transformers.MarianMTModel,
               transformers.MBartConfig(), transformers.MarianConfig(), MBartAttention, transformers.Seq2SeqTrainer,
               transformers.Seq2SeqTrainingArguments, transformers.TrainerCallback, torch.nn.Module, torch.Tensor,
               torch.nn.Parameter, torch.autograd.Function, datasets.Dataset.from_dict({"text": ["a"]})]
    return {name for obj in objects for name in dir(obj) if _is_private(name)}


def own_attributes(trees: Iterable[ast.AST]) -> set[str]:
    """The attribute names our code defines: what a class body defines or assigns (methods, class attributes,
    dataclass fields), attributes assigned to ``self`` or ``cls`` (``self._x = ...``), ``setattr(x, "name", ...)`` and
    ``x.__dict__["name"] = ...``. (A module-level ``_name`` of ours makes no ``x._name`` ours: ``readers._fingerprint``
    is no ``Dataset._fingerprint``.)"""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names.update(name for statement in node.body for name in _class_body_names(statement))
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
            elif isinstance(node, ast.Call) and _attribute_name_argument(node) and node.func.id == "setattr":
                names.add(_attribute_name_argument(node))
            elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__"
                  and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
                names.add(node.slice.value)
    return names


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an absolute import reads: ``from a.b import c`` reads ``a.b.c`` (a module or a name)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level or node.module is None:
        return []  # ours
    return [f"{node.module}.{alias.name}" for alias in node.names]


def _import_use(imported: str) -> str | None:
    library = imported.split(".")[0]
    if library not in LIBRARIES:
        return None
    if any(imported == module or imported.startswith(module + ".") for module in FORBIDDEN_MODULES):
        return f"imports {imported}"
    parts = imported.split(".")
    if any(_is_private(part) for part in parts[1:]):
        return f"imports the private {imported}"
    return None


def internal_uses(sources: Mapping[str, str], doors: Iterable[str] = DOORS,
                  library_names: set[str] = frozenset()) -> list[str]:
    """``"path:line: what"`` for each use of the libraries' internals in ``sources`` (``{path: source}``) outside
    ``doors``, counting a class of ours that defines one of ``library_names`` (:func:`library_private_names`) as an
    override; empty when there is none."""
    trees = {path: ast.parse(source, filename=path) for path, source in sources.items()}
    ours = own_attributes(tree for path, tree in trees.items() if path not in doors) - set(library_names)
    found = []
    for path, tree in trees.items():
        if path in doors:
            continue
        for node in ast.walk(tree):
            uses = []
            if isinstance(node, ast.ClassDef):
                found += [f"{path}:{statement.lineno}: defines the libraries' private {name} (class {node.name})"
                          for statement in node.body for name in _class_body_names(statement)
                          if name in library_names]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                uses = [_import_use(imported) for imported in _imported(node)]
            elif isinstance(node, ast.Attribute):
                verb = "writes" if isinstance(node.ctx, ast.Store) else "reads"
                if isinstance(node.value, ast.Name) and node.value.id == "torch" and _is_private(node.attr):
                    uses = [f"{verb} torch.{node.attr}"]
                elif _is_private(node.attr) and node.attr not in ours or node.attr in PRIVATE_DUNDERS:
                    uses = [f"{verb} the private attribute .{node.attr}"]
            elif isinstance(node, ast.Call):
                name = _attribute_name_argument(node)
                if name is not None and (_is_private(name) and name not in ours or name in PRIVATE_DUNDERS):
                    uses = [f"reads the private attribute {name!r} ({node.func.id})"]
            found += [f"{path}:{node.lineno}: {use}" for use in uses if use]
    return sorted(found, key=lambda entry: (entry.split(":")[0], int(entry.split(":")[1])))
