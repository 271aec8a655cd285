"""The API reference's configuration (mkdocs.yml): a page per registered method with its guide (the folder's README),
and every page and documented module there. The build itself is ``make docs`` (mkdocs --strict); this only reads
files."""

import ast
import io
import re
import tokenize
from pathlib import Path

import yaml

from hf_headattn.registry import registered_methods

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
DOCS = ROOT / CONFIG["docs_dir"]
#: The Python handler's configuration (its search paths).
HANDLER = next(plugin["mkdocstrings"] for plugin in CONFIG["plugins"]
               if isinstance(plugin, dict) and "mkdocstrings" in plugin)["handlers"]["python"]
#: ``::: dotted.path`` lines: the objects mkdocstrings renders.
DIRECTIVE = re.compile(r"^::: (\S+)", re.M)
#: ``--8<-- "path"`` lines: the files pymdownx.snippets includes (paths from the repository root).
INCLUDE = re.compile(r'^--8<-- "([^"]+)"', re.M)
#: A Sphinx role (``:func:`name```), which mkdocstrings would show as written.
SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`")


def nav_pages(entries) -> list[str]:
    """The page files the nav names, in order (entries are ``{title: page}`` or ``{title: [entries]}``)."""
    pages = []
    for entry in entries:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def module_file(dotted: str) -> Path | None:
    """The source file of the module ``dotted`` names or of the module that holds the object it names, among the
    handler's search paths, else None."""
    parts = dotted.split(".")
    for folder in HANDLER["paths"]:
        for end in range(len(parts), 0, -1):
            base = (ROOT / folder).joinpath(*parts[:end])
            for candidate in (base / "__init__.py", base.with_suffix(".py")):
                if candidate.is_file():
                    return candidate
    return None


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    pages = nav_pages(CONFIG["nav"])
    assert len(pages) == len(set(pages)), pages
    assert [page for page in pages if not (DOCS / page).is_file()] == []
    assert sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")) == sorted(pages)


def test_every_documented_object_is_in_a_module_there():
    for page in nav_pages(CONFIG["nav"]):
        for dotted in DIRECTIVE.findall((DOCS / page).read_text()):
            assert module_file(dotted) is not None, f"{page}: ::: {dotted} names no module of the search paths"


def test_each_built_in_method_has_its_page_with_settings_spec_and_kit():
    pages = nav_pages(CONFIG["nav"])
    built_in = [spec for spec in registered_methods() if spec.settings.__module__.startswith("hf_headattn.")]
    assert {spec.name for spec in built_in} >= {"dhicm", "eadra", "sea"}
    for spec in built_in:
        page = f"methods/{spec.name}.md"
        assert page in pages, f"mkdocs.yml's nav has no page for the method {spec.name!r} ({page})"
        text = (DOCS / page).read_text()
        documented = DIRECTIVE.findall(text)
        assert spec.settings.__module__ in documented and spec.kit in documented, (page, documented)
        assert spec.settings.__name__ in text and "METHOD" in text, page  # the settings class and the spec


def test_every_guide_beside_the_code_is_included_in_a_page_and_links_nothing_relative():
    """Each README of the package (a method's guide, the syntax inputs') is a page of the site, included whole; a
    relative link in it resolves from the page, not from the README, so there is none (paths are written as code)."""
    included = {include: page for page in nav_pages(CONFIG["nav"])
                for include in INCLUDE.findall((DOCS / page).read_text())}
    guides = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "hf_headattn").rglob("README.md"))
    assert guides and sorted(included) == guides
    for spec in registered_methods():
        if spec.settings.__module__.startswith("hf_headattn."):
            assert included[f"hf_headattn/methods/{spec.name}/README.md"] == f"methods/{spec.name}.md"
    for guide in guides:
        text = re.sub(r"```.*?```", "", (ROOT / guide).read_text(), flags=re.S)
        assert re.findall(r"\]\((?!https?://)[^)]*\)", text) == [], guide
def test_the_package_docstrings_are_markdown_that_mkdocstrings_renders_as_they_are():
    """No custom docstring parser: a cross-reference is an autorefs link (``[`title`][dotted.path]``), not a Sphinx
    role, and an attribute's docstring is the string right after it (griffe's), not ``#:`` comments above it."""
    found = []
    for path in sorted((ROOT / "hf_headattn").rglob("*.py")):
        source, name = path.read_text(), path.relative_to(ROOT)
        found += [f"{name}:{node.lineno}: a Sphinx role" for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                  and isinstance(node.value.value, str) and SPHINX_ROLE.search(node.value.value)]
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        found += [f"{name}:{token.start[0]}: a #: comment" for token in tokens
                  if token.type == tokenize.COMMENT and token.string.startswith("#:")]
    assert found == [], found
