"""The notebooks run top to bottom on tiny settings, so they cannot rot."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
pytestmark = pytest.mark.slow  # each notebook runs in a kernel of its own


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch, multi30k):
    monkeypatch.setenv("HF_HEADATTN_QUICK", "1")
    monkeypatch.setenv("HF_HEADATTN_DATA", str(multi30k))  # where the notebooks' find_multi30k looks first
    monkeypatch.setenv("NOTEBOOK_OUTPUT_DIR", str(tmp_path))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
