"""The README and the guides it links to (each method's folder README, the syntax inputs' README, docs/usage.md).

The runnable blocks run as written: each Python block marked ``<!-- runnable ... -->`` runs in a fresh process, in an
empty folder, offline (no Hub, no Multi30k at hand), and prints what the guide says it prints. The README stays a
guide of at most 400 lines; the names the guides give ``--method`` and ``--preset`` exist, each method's guide names
every recipe name of its kit, and every relative link among these files reaches a file and a heading."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_headattn.deprecation import MOVED_MODULES
from hf_headattn.experiment import kit, presets

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The guides: the README, the details it links to, and the READMEs beside the code (the methods', the syntax inputs').
GUIDES = [README, ROOT / "docs" / "usage.md", *sorted((ROOT / "hf_headattn").rglob("README.md"))]
#: A marked block, and the ``It prints `...` `` sentence that may follow it.
BLOCK = re.compile(r"<!-- runnable[^>]*-->\n```python\n(.*?)```\n(?:It prints `([^`]*)`)?", re.S)
BLOCKS = [(path.relative_to(ROOT).as_posix(), *block) for path in GUIDES
          for block in BLOCK.findall(path.read_text(encoding="utf-8"))]
#: ``--method a+b`` / ``--preset name`` as the guides write them in code (a placeholder such as ``...`` is no name).
FLAG_NAME = re.compile(r"--(method|preset) ([a-z][a-z0-9_+]*)")
#: Fenced blocks, and of them those of Python and shell (not the help's prose in ``text`` blocks).
FENCED, COMMANDS = re.compile(r"```.*?```", re.S), re.compile(r"```(?:python|bash)\n(.*?)```", re.S)
#: A relative Markdown link: its file (empty: this file) and its anchor.
LINK = re.compile(r"\]\((?!https?://|mailto:)([^)#\s]*)(?:#([^)\s]*))?\)")


def code(text: str) -> list[str]:
    """The Python and shell blocks and the inline code spans of a Markdown text (a span may wrap: one space then)."""
    spans = re.findall(r"`([^`]+)`", FENCED.sub("", text))
    return COMMANDS.findall(text) + [" ".join(span.split()) for span in spans]


def test_the_readme_is_a_guide_of_at_most_400_lines_with_its_quickstart_runnable_and_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 400
    readme_blocks = [block for block in BLOCKS if block[0] == "README.md"]
    assert readme_blocks, "README.md marks no block runnable"
    _, quickstart, printed = readme_blocks[0]
    assert len(quickstart.splitlines()) <= 20 and printed  # the Quickstart: at most 20 lines, its output stated


@pytest.mark.slow
@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_a_runnable_block_runs_offline_and_prints_what_the_guide_says(number, tmp_path):
    _, code, printed = BLOCKS[number]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "HF_HEADATTN_MULTI30K_URL": "http://127.0.0.1:9/"}  # nothing to download from
    env.pop("HF_HEADATTN_DATA", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    if printed:
        assert done.stdout.strip().splitlines()[-1] == printed


def test_the_method_and_preset_names_in_the_guides_exist_and_each_method_guide_names_its_recipe_names():
    known = {"method": set(presets.method_names()), "preset": set(presets.paper_presets())}
    unknown = [(path.relative_to(ROOT).as_posix(), flag, name) for path in GUIDES
               for snippet in code(path.read_text(encoding="utf-8"))
               for flag, names in FLAG_NAME.findall(snippet)
               for name in names.split("+") if name not in known[flag]]
    assert unknown == []
    kits = {method_kit.name: method_kit for method_kit in kit.kits()}
    assert len(kits) >= 6
    for name, method_kit in kits.items():
        guide = ROOT / "hf_headattn" / "methods" / name / "README.md"
        if guide.is_file():  # a built-in method (a test's toy method has no folder)
            text = guide.read_text(encoding="utf-8")
            named = {word for snippet in code(text) for word in re.findall(r"^(?:--method )?(\w+)$", snippet)}
            assert set(method_kit.method_names) - named == set(), name
            assert f"(hf_headattn/methods/{name}/README.md)" in README.read_text(encoding="utf-8"), name


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file: lower case, punctuation dropped, spaces as hyphens."""
    text = FENCED.sub("", path.read_text(encoding="utf-8"))
    headings = re.findall(r"^#+ (.+?)\s*$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_of_the_guides_and_docs_reaches_a_file_and_its_heading():
    broken = []
    for path in [*GUIDES, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")),
                 *sorted((ROOT / "docs" / "results").glob("*.md"))]:
        text = FENCED.sub("", path.read_text(encoding="utf-8"))
        for target, anchor in LINK.findall(text):
            file = (path.parent / target).resolve() if target else path
            if not file.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{path.relative_to(ROOT)}: {target}#{anchor}")
    assert broken == []


def test_the_changelog_names_every_moved_module_path():
    """Each old module path that still imports, with a warning, is named in CHANGELOG.md (with its removal release):
    ``hf_headattn.experiment.prune_heads`` as written, or as ``.prune_heads`` after its package's first name."""
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    unreleased = changelog.split("## Unreleased", 1)[1].split("\n## ", 1)[0]
    missing = [old for old in MOVED_MODULES
               if f"`{old}`" not in unreleased and f"`.{old.rsplit('.', 1)[1]}`" not in unreleased]
    assert missing == []
