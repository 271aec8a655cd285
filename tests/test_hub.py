"""Sharing: saved folders carry the model core, written flat (:mod:`hf_headattn.remote_code`), and its auto_map, and
load without hf_headattn installed."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, remote_code
from hf_headattn.hf_compat import get_relative_import_files

SETTINGS = dict(dhicm={"encoder_layers": [-1], "decoder_layers": [-1]}, eadra={"encoder": {"num_heads": 2}},
                sea={"type": "lpea", "head_selection": "all"})
#: each method alone, two together, and all three (SETTINGS)
REMOTE_CASES = {
    "dhicm": dict(dhicm={"encoder_layers": [-1], "decoder_layers": [-1]}),
    "eadra": dict(eadra={"encoder": {"num_heads": 2}, "cross": {}}),
    "sea": dict(sea={"type": "dea", "head_selection": "redundant"}),
    "dhicm+sea": dict(dhicm={"encoder_layers": [0]}, sea={"type": "lpea", "head_selection": "all"}),
    "localness+sea": dict(localness={"head_selection": "redundant"}, sea={"type": "lpea"}),
    "rel_pos": dict(rel_pos={"decoder_layers": [-1], "max_relative_position": 2}),
    "fixed_attention": dict(fixed_attention={"patterns": ["previous", "left", "start"], "decoder_layers": "all"}),
    "all": SETTINGS,
}

LOAD_WITHOUT_PACKAGE = """
import sys, torch
sys.modules["hf_headattn"] = None  # as if it were not installed
from transformers import AutoModelForSeq2SeqLM
inputs, results = torch.load(sys.argv[1]), {}
for folder in sys.argv[3:]:
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        out = model(**inputs)
    results[folder] = {"logits": out.logits, "loss": out.loss, "module": type(model).__module__}
    if folder == sys.argv[3]:  # a remote-code model saved again carries the same code
        model.save_pretrained(folder + "-again")
torch.save(results, sys.argv[2])
"""


def saved(tmp_path, settings=SETTINGS, name="model"):
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **settings, dropout=0.0)).eval()
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


def syntax_inputs():
    torch.manual_seed(1)  # (the same inputs at every call)
    inputs = batch()
    n = inputs["input_ids"].shape[1]
    inputs["phrase_positions"] = torch.randint(-2, 3, (2, n, n))
    inputs["dependency_mask"] = (torch.rand(2, n, n) < 0.5) | torch.eye(n, dtype=torch.bool)
    return inputs


def load_in_subprocess(tmp_path, *folders):
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}  # a fresh copy of the remote code
    torch.save(syntax_inputs(), tmp_path / "inputs.pt")
    return subprocess.run([sys.executable, "-c", LOAD_WITHOUT_PACKAGE, str(tmp_path / "inputs.pt"),
                           str(tmp_path / "out.pt"), *map(str, folders)], capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_saved_folder_holds_the_model_core_flat_and_auto_map_names_it(tmp_path):
    """The folder holds the core, flat (each method's modules as ``<method>_<module>.py``), no kit and no folder;
    every relative import names a flat sibling, so transformers' loader (which reads ``from .x import`` as ``x.py``
    beside it) fetches from ``modeling.py`` exactly the files written; ``auto_map`` names the config and both models."""
    _, folder = saved(tmp_path)
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map == {"AutoConfig": "configuration.HeadAttnMBartConfig", "AutoModel": "modeling.HeadAttnMBartModel",
                        "AutoModelForSeq2SeqLM": "modeling.HeadAttnMBartForConditionalGeneration"}
    code = {path.name for path in folder.glob("*.py")}
    assert {"modeling.py", "configuration.py", "attention.py", "methods.py", "dhicm_core.py", "eadra_core.py",
            "eadra_equations.py", "eadra_passes.py", "eadra_compiled.py", "sea_core.py", "sea_equations.py"} <= code
    assert not any("kit" in name or "syntax" in name or "analysis" in name for name in code), code
    assert not [path for path in folder.iterdir() if path.is_dir()]
    fetched = {Path(file).name for file in get_relative_import_files(str(folder / "modeling.py"))} | {"modeling.py"}
    assert fetched == code
    for path in folder.glob("*.py"):
        for dots in re.findall(r"^\s*from\s+(\.+)\w", path.read_text(), flags=re.MULTILINE):
            assert dots == ".", path.name


def test_a_folder_saved_again_drops_an_earlier_releases_flat_files_but_no_file_of_its_owner(tmp_path):
    """Release 0.3 shipped e.g. ``dhicm.py`` and ``sea_math.py`` flat; a save into that folder removes them (a push
    would upload code no ``auto_map`` names), and only files that are this package's code (#64)."""
    (tmp_path / "dhicm.py").write_text('"""DHICM."""\nfrom .registry import MethodSpec\n')
    (tmp_path / "eadra_triton.py").write_text("import triton\n# hf_headattn's EaDRA kernels\n")
    (tmp_path / "sea.py").write_text("print('the owner\\'s own sea.py')\n")
    (tmp_path / "notes.py").write_text("from .dhicm import x\n")
    HeadAttnMBartConfig(**TINY, **SETTINGS).save_pretrained(tmp_path)
    names = {path.name for path in tmp_path.glob("*.py")}
    assert not {"dhicm.py", "eadra_triton.py"} & names and {"sea.py", "notes.py", "dhicm_core.py"} <= names


def test_flat_names_and_a_clash_refused(tmp_path):
    root = tmp_path / "pkg"
    (root / "methods" / "a").mkdir(parents=True)
    assert remote_code.flat_name(root / "methods" / "a" / "core.py", root) == "a_core"
    assert remote_code.flat_name(root / "methods" / "__init__.py", root) == "methods"
    assert remote_code.flat_name(root / "attention.py", root) == "attention"
    (root / "configuration.py").write_text("from .methods.a.core import X\nfrom .a_core import Y\n")
    (root / "modeling.py").write_text("from .configuration import C\n")
    (root / "methods" / "__init__.py").write_text("")
    (root / "methods" / "a" / "core.py").write_text("X = 1\n")
    (root / "a_core.py").write_text("Y = 1\n")
    with pytest.raises(ValueError, match="both have the flat name 'a_core'"):
        remote_code.core_files(root)
    (root / "modeling.py").write_text("from . import configuration\n")
    with pytest.raises(ValueError, match="imports from a package"):
        remote_code.core_files(root)


@pytest.mark.slow
def test_remote_code_loads_without_the_package_with_same_outputs(tmp_path):
    """Each method, two together and all three, saved and loaded with ``trust_remote_code`` in a process that cannot
    import hf_headattn: the same logits and loss; the first, loaded so and saved again, carries the same code."""
    models = {name: saved(tmp_path, settings, name) for name, settings in REMOTE_CASES.items()}
    result = load_in_subprocess(tmp_path, *(folder for _, folder in models.values()))
    assert result.returncode == 0, result.stderr[-3000:]
    remote = torch.load(tmp_path / "out.pt")
    inputs = syntax_inputs()
    for name, (model, folder) in models.items():
        found = remote[str(folder)]
        assert found["module"].startswith("transformers_modules."), name
        with torch.no_grad():
            expected = model(**inputs)
        torch.testing.assert_close(found["logits"], expected.logits, msg=name)
        torch.testing.assert_close(found["loss"], expected.loss, msg=name)
    first = models["dhicm"][1]
    again = first.with_name(first.name + "-again")
    assert {p.name: p.read_text() for p in again.glob("*.py")} == {p.name: p.read_text() for p in first.glob("*.py")}


@pytest.mark.slow
def test_missing_code_file_is_named(tmp_path):
    _, folder = saved(tmp_path)
    (folder / "dhicm_core.py").unlink()
    result = load_in_subprocess(tmp_path, folder)
    assert result.returncode != 0 and "dhicm_core.py" in result.stderr.splitlines()[-1]


def test_model_card_records_methods_settings_and_scores(tmp_path):
    from hf_headattn.experiment.model_card import write_model_card

    model, _ = saved(tmp_path)
    scores = {"test_2016_flickr": {"bleu": 35.123, "chrf": 60.0, "bleu_signature": "nrefs:1|tok:13a"}}
    text = write_model_card(model, tmp_path, "me/dhicm-en-de", scores).read_text()
    assert "**dhicm**" in text and "**eadra**" in text and "**sea**" in text
    settings = json.loads(text.split("```json\n")[1].split("```")[0])
    assert settings["dhicm"] == {"encoder_layers": [-1], "decoder_layers": [-1]} and settings["sea"]["type"] == "lpea"
    assert "| test_2016_flickr | 35.12 | 60.00 | `nrefs:1|tok:13a` |" in text
    plain = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY))
    assert "none (the stock architecture)" in write_model_card(plain, tmp_path / "p", "x").read_text()
