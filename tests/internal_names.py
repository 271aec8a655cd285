"""Finds uses of transformers', torch's and datasets' internals outside ``hf_headattn/hf_compat.py``, the one module
allowed them (each of its names has a contract test in ``tests/test_hf_compat.py``).

The rest of the code (:data:`SCANNED`) may use the libraries' public modules, :data:`PUBLIC_MODULES`, an allow-list:
a module is on it when the library documents it. A use is, with file and line:

(a) an import of a module of theirs not on the list, or of a private name (``torch._dynamo``); an import by name,
    ``importlib.import_module("transformers...")``, ``__import__("torch...")``, ``sys.modules["datasets..."]``, of
    any module of theirs (an import statement is what the list checks);
(b) an attribute chain from an imported module of theirs into a module not on the list
    (``transformers.models.mbart.modeling_mbart.eager_attention_forward``) or to a private name (``torch._dynamo``);
(c) a private attribute, read or written as ``x._name``, ``getattr(x, "_name")`` (``hasattr``, ``setattr``,
    ``delattr``), ``vars(x)["_name"]`` or ``x.__dict__["_name"]``, unless ``x`` is ours as far as the AST can tell:
    ``self``/``cls`` inside a class of ours, a class of ours by its name, or a name its function (or module) binds to
    one, ``x = Ours(...)`` or ``x: Ours``; and that class, or a base class of ours, defines the name (in its body,
    or as ``self._name = ...``, ``setattr(self, "_name", ...)``, ``self.__dict__["_name"] = ...``); a private dunder
    (``__dataclass_fields__``) on anything;
(d) a class of ours that defines a private name of the libraries' objects (an override of theirs).

What it cannot see: a module reached through a value (``m = transformers; m.models``) or a name built at run time
(``import_module(name)``, ``getattr(x, name)``); import bindings are per file, not per function. What it cannot tell
it flags: an object whose class the AST does not show (``self.helper._x``, a call's result, a loop variable) is not
ours, even if it is; classes are matched by name (in the same file first), so two classes of ours with one name
count as one.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The module allowed the libraries' internals, relative to the repository root.
DOORS = ("hf_headattn/hf_compat.py",)
#: The folders whose modules may use them only through the door. (``benchmarks/`` is left out: it counts operators
#: and compiled graphs with torch's dispatch modes and dynamo's counters, and ships in no wheel.)
SCANNED = ("hf_headattn", "research")
LIBRARIES = ("transformers", "torch", "datasets")
#: The libraries' modules our code may import or reach (exactly these: a submodule is on the list or not), each one the
#: library documents. To add one: check that its library's API reference documents it, then add it here.
PUBLIC_MODULES = frozenset({
    # transformers: the top-level API; model outputs (main_classes/output), logging (main_classes/logging), the general
    # utilities (internal/file_utils: PaddingStrategy) and the Trainer's (internal/trainer_utils)
    "transformers", "transformers.modeling_outputs", "transformers.utils.logging", "transformers.utils",
    "transformers.trainer_utils",
    # torch: the modules of its Python API reference
    "torch", "torch.nn", "torch.nn.functional", "torch.nn.attention.flex_attention", "torch.autograd",
    "torch.autograd.function", "torch.utils.checkpoint", "torch.utils.data", "torch.linalg", "torch.optim",
    "torch.library", "torch.compiler", "torch.cuda", "torch.accelerator", "torch.distributed",
    # datasets: the top-level API
    "datasets",
})
#: Dunders that are no public API of the objects they are read from.
PRIVATE_DUNDERS = {"__dataclass_fields__"}
ATTRIBUTE_FUNCTIONS = {"getattr", "hasattr", "setattr", "delattr"}
IMPORT_FUNCTIONS = {"import_module", "__import__"}


def scanned_sources(root: Path = ROOT) -> dict[str, str]:
    """``{path relative to root: source}`` of every module of :data:`SCANNED`."""
    return {path.relative_to(root).as_posix(): path.read_text(encoding="utf-8")
            for folder in SCANNED for path in sorted((root / folder).rglob("*.py"))}


def _is_private(name: str) -> bool:
    """``_name``, but no dunder, nor ``_`` alone (spaCy's public extension namespace, ``doc._.name``)."""
    return name.startswith("_") and name != "_" and not (name.startswith("__") and name.endswith("__"))


@cache
def _is_module(name: str) -> bool:
    """Whether the dotted ``name`` is a module (finding out imports its parent package)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):  # a parent that is no package, or no module at all
        return False


def _library_use(dotted: str, verb: str) -> str | None:
    """What is wrong with reaching the library name ``dotted`` (``verb``: "imports", "reads", ...), or None: the
    deepest module it goes through must be public, and no part of it private."""
    parts = dotted.split(".")
    if parts[0] not in LIBRARIES:
        return None
    module = parts[0]
    for part in parts[1:]:
        if _is_private(part) or not _is_module(f"{module}.{part}"):
            break
        module = f"{module}.{part}"
    if module not in PUBLIC_MODULES:
        return f"{verb} {module}, no public module on the allow-list (PUBLIC_MODULES)"
    private = next((i for i, part in enumerate(parts) if _is_private(part)), None)
    return None if private is None else f"{verb} the private {'.'.join(parts[:private + 1])}"


def _string_prefix(node: ast.AST) -> str | None:
    """The constant start of a string expression: ``"a"``, ``f"a{x}"``, ``"a" + x``; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return _string_prefix(node.values[0])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _string_prefix(node.left)
    return None


def _import_by_name(node: ast.AST) -> str | None:
    """What an import by name of a library module does, or None: ``import_module("m")``, ``__import__("m")``,
    ``sys.modules["m"]``."""
    name = how = None
    if isinstance(node, ast.Call) and node.args:
        how = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        name = _string_prefix(node.args[0]) if how in IMPORT_FUNCTIONS else None
    elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "modules"
          and isinstance(node.value.value, ast.Name) and node.value.value.id == "sys"):
        name, how = _string_prefix(node.slice), "sys.modules"
    if name is None or name.split(".")[0] not in LIBRARIES:
        return None
    return f"imports {name!r} by name ({how}); expected an import statement of a public module (PUBLIC_MODULES)"


def _imported(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str, str]]:
    """``(bound name, the dotted name bound to it, the dotted name read)`` of an absolute import: ``from a.b import c``
    binds ``c`` to ``a.b.c`` (a module or a name); ``import a.b`` binds ``a`` to ``a`` and reads ``a.b``."""
    if isinstance(node, ast.Import):
        return [(alias.asname, alias.name, alias.name) if alias.asname else
                (alias.name.split(".")[0], alias.name.split(".")[0], alias.name) for alias in node.names]
    if node.level or node.module is None:
        return []  # ours
    return [(alias.asname or alias.name, f"{node.module}.{alias.name}", f"{node.module}.{alias.name}")
            for alias in node.names]


def _chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """``(root name, [attributes])`` of ``a.b.c``, or None where the root is no name (a call, a subscript)."""
    attributes = []
    while isinstance(node, ast.Attribute):
        attributes.insert(0, node.attr)
        node = node.value
    return (node.id, attributes) if isinstance(node, ast.Name) else None


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


def _attribute_dict(node: ast.Subscript) -> ast.AST | None:
    """``x`` of ``vars(x)[...]`` or ``x.__dict__[...]``, else None."""
    value = node.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "vars" and value.args:
        return value.args[0]
    return value.value if isinstance(value, ast.Attribute) and value.attr == "__dict__" else None


def _private_access(node: ast.AST) -> tuple[ast.AST, str, str] | None:
    """``(object, name, how)`` of a private attribute's read or write: ``x._name``, ``getattr(x, "_name")``,
    ``vars(x)["_name"]``, ``x.__dict__["_name"]``; ``how`` is the phrase for the message."""
    if isinstance(node, ast.Attribute) and (_is_private(node.attr) or node.attr in PRIVATE_DUNDERS):
        verb = "writes" if isinstance(node.ctx, ast.Store) else "reads"
        return node.value, node.attr, f"{verb} the private attribute .{node.attr}"
    if isinstance(node, ast.Call):
        name = _attribute_name_argument(node)
        if name is not None and (_is_private(name) or name in PRIVATE_DUNDERS):
            verb = "reads" if node.func.id in ("getattr", "hasattr") else "writes"
            return node.args[0], name, f"{verb} the private attribute {name!r} ({node.func.id})"
    if isinstance(node, ast.Subscript) and _attribute_dict(node) is not None:
        name = node.slice.value if isinstance(node.slice, ast.Constant) else None
        if isinstance(name, str) and _is_private(name):
            verb = "writes" if isinstance(node.ctx, ast.Store) else "reads"
            return _attribute_dict(node), name, f"{verb} the private attribute [{name!r}] (vars/__dict__)"
    return None


@dataclass
class _Class:
    """A class of ours: where, its bases' names, and the attribute names it defines itself."""

    path: str
    node: ast.ClassDef
    bases: list[str]
    defined: dict[str, int] = field(default_factory=dict)  # name: line


def _annotated_classes(annotation: ast.AST | None) -> set[str]:
    """The class names an annotation mentions (``Ours``, ``"Ours"``, ``Ours | None``, ``module.Ours``)."""
    names = set()
    for node in ast.walk(annotation) if annotation is not None else ():
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                names |= _annotated_classes(ast.parse(node.value, mode="eval"))
            except SyntaxError:
                pass
    return names


class _Scanner:
    """The scan of a set of sources: our classes first (:meth:`_index`), then each file's uses (:meth:`uses`)."""

    def __init__(self, trees: Mapping[str, ast.Module], library_names: set[str]):
        self.library_names = library_names
        self.classes: dict[str, list[_Class]] = {}
        for path, tree in trees.items():
            self._index(path, tree)

    def _index(self, path: str, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                         for base in node.bases]
                found = _Class(path, node, bases)
                for statement in node.body:
                    found.defined.update(dict.fromkeys(_class_body_names(statement), statement.lineno))
                for inner, owner in _with_class(node, node):
                    if owner is node:
                        name = self._self_definition(inner)
                        if name is not None:
                            found.defined.setdefault(name, inner.lineno)
                self.classes.setdefault(node.name, []).append(found)

    @staticmethod
    def _self_definition(node: ast.AST) -> str | None:
        """The name ``self._x = ...``, ``setattr(self, "_x", ...)`` or ``self.__dict__["_x"] = ...`` defines."""
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            return node.attr
        if isinstance(node, ast.Call) and _attribute_name_argument(node) and node.func.id == "setattr" \
                and _is_self(node.args[0]):
            return node.args[1].value
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and _is_self(_attribute_dict(node)) \
                and isinstance(node.slice, ast.Constant):
            return node.slice.value
        return None

    def _class(self, name: str, path: str) -> list[_Class]:
        """Our classes named ``name``: the one in ``path`` if there is one, else all of them."""
        found = self.classes.get(name, [])
        return [c for c in found if c.path == path] or found

    def defines(self, name: str, attribute: str, path: str, seen: frozenset = frozenset()) -> bool:
        """Whether our class ``name`` (as seen from ``path``) or a base class of ours defines ``attribute``."""
        return any(attribute in found.defined or any(self.defines(base, attribute, found.path, seen | {name})
                                                     for base in found.bases if base not in seen)
                   for found in self._class(name, path))

    def uses(self, path: str, tree: ast.Module) -> list[tuple[int, str]]:
        """``(line, what)`` of each use in one file."""
        bindings = {bound: dotted for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for bound, dotted, _ in _imported(node) if dotted.split(".")[0] in LIBRARIES}
        values = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        found = []
        for node, owner in _with_class(tree, None):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [(node.lineno, _library_use(read, "imports")) for _, _, read in _imported(node)]
                continue
            found.append((getattr(node, "lineno", 0), _import_by_name(node)))
            chain = _chain(node) if isinstance(node, ast.Attribute) else None
            if chain is not None and chain[0] in bindings:
                if id(node) not in values:  # the whole chain, once
                    verb = "writes" if isinstance(node.ctx, ast.Store) else "reads"
                    found.append((node.lineno, _library_use(".".join([bindings[chain[0]], *chain[1]]), verb)))
                continue
            access = _private_access(node)
            if access is not None and not self._ours(access[0], access[1], owner, path, tree, node):
                found.append((node.lineno, access[2]))
        for owner in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            found += [(line, f"defines the libraries' private {name} (class {owner.name})")
                      for c in self._class(owner.name, path) if c.node is owner
                      for name, line in c.defined.items() if name in self.library_names]
        return [(line, use) for line, use in found if use]

    def _ours(self, receiver: ast.AST, name: str, owner: ast.ClassDef | None, path: str, tree: ast.Module,
              node: ast.AST) -> bool:
        """Whether the private ``name`` used on ``receiver`` is one a class of ours defines, on an object of it."""
        if name in PRIVATE_DUNDERS or not isinstance(receiver, ast.Name):
            return False
        if _is_self(receiver):
            return owner is not None and self.defines(owner.name, name, path)
        classes = {receiver.id} if receiver.id in self.classes else _bound_classes(tree, node, receiver.id)
        return any(self.defines(c, name, path) for c in classes if c in self.classes)


def _is_self(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _with_class(node: ast.AST, owner: ast.ClassDef | None):
    """Every node below ``node`` with its innermost enclosing class (None: none)."""
    for child in ast.iter_child_nodes(node):
        yield child, owner
        yield from _with_class(child, child if isinstance(child, ast.ClassDef) else owner)


def _bound_classes(tree: ast.Module, node: ast.AST, name: str) -> set[str]:
    """The classes the innermost function around ``node`` (or the module) binds ``name`` to: ``name = C(...)``,
    ``name: C`` (a parameter or an annotated assignment)."""
    scope = tree
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(n is node for n in ast.walk(function)):
            scope = function  # ast.walk goes breadth first: the last one holding node is the innermost
    classes = set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        arguments = scope.args
        for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if argument.arg == name:
                classes |= _annotated_classes(argument.annotation)
    for statement in ast.walk(scope):
        if isinstance(statement, ast.AnnAssign) and getattr(statement.target, "id", None) == name:
            classes |= _annotated_classes(statement.annotation)
        elif (isinstance(statement, ast.Assign) and any(getattr(t, "id", None) == name for t in statement.targets)
              and isinstance(statement.value, ast.Call) and isinstance(statement.value.func, ast.Name)):
            classes.add(statement.value.func.id)
    return classes


def library_private_names() -> set[str]:
    """The private attribute names of the library objects our code meets most (transformers' models, configs,
    attention modules and Trainer, torch's modules and tensors, datasets' ``Dataset``): a class of ours that defines
    one overrides an internal."""
    import datasets
    import torch
    import transformers
    from transformers.models.mbart.modeling_mbart import MBartAttention

    objects = [transformers.PreTrainedModel, transformers.MBartForConditionalGeneration, transformers.MarianMTModel,
               transformers.MBartConfig(), transformers.MarianConfig(), MBartAttention, transformers.Seq2SeqTrainer,
               transformers.Seq2SeqTrainingArguments, transformers.TrainerCallback, torch.nn.Module, torch.Tensor,
               torch.nn.Parameter, torch.autograd.Function, datasets.Dataset.from_dict({"text": ["a"]})]
    return {name for obj in objects for name in dir(obj) if _is_private(name)}


def internal_uses(sources: Mapping[str, str], doors: Iterable[str] = DOORS,
                  library_names: set[str] = frozenset()) -> list[str]:
    """``"path:line: what"`` for each use of the libraries' internals in ``sources`` (``{path: source}``) outside
    ``doors``, a class of ours that defines one of ``library_names`` (:func:`library_private_names`) counting as an
    override; empty when there is none."""
    trees = {path: ast.parse(source, filename=path) for path, source in sources.items() if path not in doors}
    scanner = _Scanner(trees, set(library_names))
    found = [f"{path}:{line}: {use}" for path, tree in trees.items() for line, use in scanner.uses(path, tree)]
    return sorted(set(found), key=lambda entry: (entry.split(":")[0], int(entry.split(":")[1]), entry))


#: HF's names of its models' parts and its Trainer's files, and DeepSpeed's of its partitioned parameters and its
#: checkpoints' script, which only ``hf_compat.py`` may spell (in code: names, attributes, strings; docstrings and
#: comments do not count), each as a pattern (``\b``: a whole name, so that our own ``out_proj_per_head`` and
#: ``"scaled_out_proj"`` are no use of ``out_proj``).
HF_NAMES = {"q_proj": r"\bq_proj\b", "out_proj": r"\bout_proj\b", "final_logits_bias": r"\bfinal_logits_bias\b",
            "trainer_state.json": r"\btrainer_state\.json", "rng_state": r"\brng_state", "ds_numel": r"\bds_numel\b",
            "zero_to_fp32": r"\bzero_to_fp32\b"}


def _docstrings(tree: ast.Module) -> set[int]:
    """The bare string statements: docstrings of modules, classes and functions, and those of attributes (the string
    right after an assignment), which are text, not code."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _spelled(node: ast.AST, docstrings: set[int]) -> str | None:
    """The name or string a node of code spells: a name, an attribute, a parameter, a keyword, an import, a
    definition, a string constant that is no docstring (its backslashes dropped: a regular expression's
    ``trainer_state\\.json`` spells ``trainer_state.json``); else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return None if id(node) in docstrings else node.value.replace("\\", "")
    for kind, attribute in ((ast.Name, "id"), (ast.Attribute, "attr"), (ast.arg, "arg"), (ast.keyword, "arg"),
                            (ast.alias, "name"), (ast.FunctionDef, "name"), (ast.AsyncFunctionDef, "name"),
                            (ast.ClassDef, "name")):
        if isinstance(node, kind):
            return getattr(node, attribute) or ""
    return None


def hf_name_uses(sources: Mapping[str, str], doors: Iterable[str] = DOORS) -> list[str]:
    """``"path:line: spells <name>"`` for each of :data:`HF_NAMES` in the code of ``sources`` outside ``doors``."""
    found = []
    for path, source in sources.items():
        if path in doors:
            continue
        tree = ast.parse(source, filename=path)
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            text = _spelled(node, docstrings)
            found += [f"{path}:{node.lineno}: spells {name}" for name, pattern in HF_NAMES.items()
                      if text and re.search(pattern, text)]
    return sorted(set(found), key=lambda entry: (entry.split(":")[0], int(entry.split(":")[1]), entry))
