"""The README's runnable blocks run as written: each Python block marked ``<!-- runnable ... -->`` runs in a fresh
process, in an empty folder, offline (no Hub, no Multi30k at hand), and prints what the README says it prints."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
#: A marked block, and the ``It prints `...` `` sentence that may follow it.
BLOCK = re.compile(r"<!-- runnable[^>]*-->\n```python\n(.*?)```\n(?:It prints `([^`]*)`)?", re.S)
BLOCKS = BLOCK.findall(README.read_text(encoding="utf-8"))


def test_the_readme_marks_its_quickstart_runnable_and_short():
    assert BLOCKS, "README.md marks no block runnable"
    quickstart, printed = BLOCKS[0]
    assert len(quickstart.splitlines()) <= 20 and printed  # the Quickstart: at most 20 lines, its output stated


@pytest.mark.slow
@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_a_runnable_block_runs_offline_and_prints_what_the_readme_says(number, tmp_path):
    code, printed = BLOCKS[number]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "HF_HEADATTN_MULTI30K_URL": "http://127.0.0.1:9/"}  # nothing to download from
    env.pop("HF_HEADATTN_DATA", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    if printed:
        assert done.stdout.strip().splitlines()[-1] == printed
