"""A griffe extension for the API reference (mkdocs.yml): reads the package's docstring conventions, changing no file.

The docstrings are prose written for Sphinx-style readers; griffe reads the source statically and mkdocstrings renders
docstrings as Markdown. Before they are rendered this extension, for every object of a loaded package:

- takes the ``#:`` comment lines right above an attribute as its docstring (Sphinx's convention, used for the
  constants, e.g. a kit's tables);
- turns roles (``:class:`~a.b.C```, ``:func:`name```, ``:mod:`.kit```, ``:meth:`title <a.B.c>```) into links to the
  objects the reference shows (resolved as Sphinx does: the class, the module, then its parent packages), or into
  code where the target is not rendered or not ours;
- shows ``<name>`` outside code as text (Markdown would take it for an HTML tag and hide it);
- turns a line ``name: text`` (or ``a / b: text``) that starts with a field or parameter name of the object into a
  list item, so that a settings class's field list keeps one line per field;
- describes a dataclass field by its ``metadata={"help": ...}`` (the recipes' flags: what ``--help`` prints);
- describes ``METHOD = MethodSpec(...)`` by its output fields, read-out flags, forward inputs and logged fields;
- in the numpy sections some docstrings have (``Parameters``, ``Returns``), where the project writes
  ``name : description``, shows the text as the description (not as a type) and a ``Returns`` section as one text.
"""

from __future__ import annotations

import ast
import re
from functools import cached_property
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?P<role>[a-z]+):`(?P<body>[^`]+)`")
#: A role, or a code span (RST's ``x`` or Markdown's `x`): the parts of a docstring whose text stays as written.
TOKENS = re.compile(ROLE.pattern + r"|(?P<code>``.+?``|`[^`\n]+`)", re.S)
TAG = re.compile(r"<(?=[A-Za-z/!])")
FIELD = re.compile(r"(?P<names>[A-Za-z_]\w*(?:\s*/\s*[A-Za-z_]\w*)*)(?P<note>\s*\([^)\n]*\))?:\s")
SPEC_CALL = "MethodSpec"


class HeadAttnDocstrings(griffe.Extension):
    """The conventions above, applied when a package is loaded (before any docstring is parsed)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        objects = list(_walk(pkg))
        for obj in objects:
            if obj.is_attribute:
                _comment_docstring(obj, loader)
                _help_docstring(obj, loader)
                _spec_docstring(obj, loader)
        for obj in objects:
            if obj.docstring is not None:
                obj.docstring.value = _markdown(obj.docstring.value, obj, loader.modules_collection)
                obj.docstring.__class__ = _Docstring  # parsed when rendered, as before: unrendered ones are not


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias and member.parent is obj:
            yield from _walk(member)


def _set_docstring(obj: griffe.Object, text: str, loader: griffe.GriffeLoader) -> None:
    obj.docstring = griffe.Docstring(text, lineno=obj.lineno, endlineno=obj.lineno, parent=obj,
                                     parser=loader.docstring_parser, parser_options=loader.docstring_options)


def _source_lines(obj: griffe.Object) -> list[str]:
    try:
        return obj.lines_collection[obj.filepath]
    except (KeyError, TypeError):
        return []


def _comment_docstring(attr: griffe.Attribute, loader: griffe.GriffeLoader) -> None:
    """``#:`` lines right above the attribute (each attribute's first assignment)."""
    if attr.docstring is not None or not attr.lineno:
        return
    lines, comment = _source_lines(attr), []
    index = attr.lineno - 2
    while index >= 0 and lines[index].lstrip().startswith("#:"):
        comment.insert(0, lines[index].lstrip()[2:].strip())
        index -= 1
    if comment:
        _set_docstring(attr, "\n".join(comment), loader)


def _value_call(attr: griffe.Attribute) -> ast.Call | None:
    if attr.value is None:
        return None
    try:
        node = ast.parse(str(attr.value), mode="eval").body
    except SyntaxError:
        return None
    return node if isinstance(node, ast.Call) else None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((keyword.value for keyword in call.keywords if keyword.arg == name), None)


def _help_docstring(attr: griffe.Attribute, loader: griffe.GriffeLoader) -> None:
    """A dataclass field's ``field(..., metadata={"help": "..."})``."""
    call = _value_call(attr)
    if attr.docstring is not None or call is None or getattr(call.func, "id", None) != "field":
        return
    metadata = _keyword(call, "metadata")
    if isinstance(metadata, ast.Dict):
        for key, value in zip(metadata.keys, metadata.values):
            if isinstance(key, ast.Constant) and key.value == "help" and isinstance(value, ast.Constant):
                _set_docstring(attr, str(value.value), loader)


def _spec_docstring(attr: griffe.Attribute, loader: griffe.GriffeLoader) -> None:
    """``METHOD = MethodSpec(...)``: its output fields, flags, inputs and logged fields, from the call's literals."""
    call = _value_call(attr)
    if call is None or getattr(call.func, "id", None) != SPEC_CALL:
        return
    parts = ["The method's registration (:class:`hf_headattn.registry.MethodSpec`)."]
    outputs = _keyword(call, "outputs")
    if isinstance(outputs, ast.Dict):
        parts.append("Output fields (``outputs``; ``None`` when the method is off or a read-out was not asked for):")
        parts.append("\n".join(f"- ``{ast.literal_eval(key)}``: {ast.literal_eval(value)}"
                               for key, value in zip(outputs.keys, outputs.values)))
    for name, text in (("flags", "Read-out flags (forward arguments, default False)"),
                       ("inputs", "Forward inputs"), ("logged", "Logged as loss components")):
        value = _keyword(call, name)
        if isinstance(value, (ast.Tuple, ast.List)) and value.elts:
            parts.append(f"{text} (``{name}``): " + ", ".join(f"``{ast.literal_eval(item)}``" for item in value.elts)
                         + ".")
    text = "\n\n".join(parts)
    _set_docstring(attr, text if attr.docstring is None else f"{attr.docstring.value}\n\n{text}", loader)


def _lookup(collection, path: str) -> griffe.Object | None:
    """The object at ``path``, through re-exports, or None (not loaded, or not ours)."""
    for _ in range(10):
        try:
            found = collection[path]
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
        if not found.is_alias:
            return found
        path = found.target_path
    return None


def _resolve(target: str, obj: griffe.Object, collection) -> str | None:
    """The canonical path of a role's target, as Sphinx looks it up from ``obj``, or None."""
    module = obj if obj.is_module else obj.module
    scopes = [obj.path] if obj.is_class else []
    if obj.parent is not None and obj.parent.is_class:
        scopes.append(obj.parent.path)
    parts = module.path.split(".")
    scopes += [".".join(parts[:end]) for end in range(len(parts), 0, -1)]
    if target.startswith("."):
        candidates = [f"{scope}{target}" for scope in scopes]
    else:
        candidates = [f"{scope}.{target}" for scope in scopes] + [target]
    for candidate in candidates:
        found = _lookup(collection, candidate)
        if found is not None:
            return found.path
    return None


def _role(match: re.Match, obj: griffe.Object, collection) -> str:
    body = match["body"].strip()
    titled = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^<>]+)>", body)
    if titled:
        title, target = titled["title"], titled["target"]
    else:
        target = body.lstrip("!")
        title = target.lstrip("~").split(".")[-1] if target.startswith("~") else target.lstrip(".")
    target = target.lstrip("~!").removesuffix("()")
    path = _resolve(target, obj, collection)
    code = f"<code>{_escape(title)}</code>"
    return f'<autoref identifier="{path}" optional>{code}</autoref>' if path else code


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _field_names(obj: griffe.Object) -> set[str]:
    if obj.is_function:
        return {parameter.name for parameter in obj.parameters}
    if obj.is_class:
        names = set(obj.members)
        init = obj.members.get("__init__")
        if init is not None and not init.is_alias:
            names |= {parameter.name for parameter in init.parameters}
        return names
    return set()


def _field_lists(text: str, obj: griffe.Object) -> str:
    """Lines that start with ``name:`` (names of the object's fields or parameters) as list items."""
    names = _field_names(obj)
    if not names:
        return text
    lines, out, in_list = text.split("\n"), [], False
    for line in lines:
        match = FIELD.match(line)
        if match and all(name.strip() in names for name in match["names"].split("/")):
            if out and out[-1].strip() and not in_list:
                out.append("")
            shown = " / ".join(f"``{name.strip()}``" for name in match["names"].split("/"))
            out.append(f"- {shown}{match['note'] or ''}: {line[match.end():]}")
            in_list = True
            continue
        if not line.strip() or not line.startswith(" "):
            in_list = in_list and bool(line.strip())
        out.append(line)
    return "\n".join(out)


def _markdown(text: str, obj: griffe.Object, collection) -> str:
    text = _field_lists(text, obj)
    out, last = [], 0
    for match in TOKENS.finditer(text):
        out.append(TAG.sub("&lt;", text[last:match.start()]))
        out.append(match[0] if match["code"] else _role(match, obj, collection))
        last = match.end()
    out.append(TAG.sub("&lt;", text[last:]))
    return "".join(out)


class _Docstring(griffe.Docstring):
    """A docstring whose numpy ``name : description`` items show the text as the description (not as a type), and
    whose Returns section's lines are one text."""

    @cached_property
    def parsed(self) -> list[griffe.DocstringSection]:
        sections = self.parse()
        if self.parser is not None and self.parent is not None:
            _numpy_descriptions(self.parent, sections)
        return sections


def _numpy_descriptions(obj: griffe.Object, sections: list[griffe.DocstringSection]) -> None:
    for section in sections:
        if section.kind in (griffe.DocstringSectionKind.parameters, griffe.DocstringSectionKind.other_parameters):
            for item in section.value:
                if not item.description and isinstance(item.annotation, str):  # text, not a type expression
                    item.description, item.annotation = str(item.annotation), None
                    if obj.is_function and item.name in obj.parameters:
                        item.annotation = obj.parameters[item.name].annotation
        elif section.kind is griffe.DocstringSectionKind.returns and section.value:
            lines = [" ".join(str(part) for part in (item.name, item.annotation, item.description) if part)
                     for item in section.value]
            section.value = [griffe.DocstringReturn(name="", annotation=None, description="\n".join(lines))]
