"""Sharing: saved folders carry the modeling code and auto_map, and load without hf_headattn installed."""

import contextlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, eadra_passes

SETTINGS = dict(dhicm={"encoder_layers": [-1], "decoder_layers": [-1]}, eadra={"encoder": {"num_heads": 2}},
                sea={"type": "lpea", "heads": "all"}, dropout=0.0)

LOAD_WITHOUT_PACKAGE = """
import sys, json, torch
sys.modules["hf_headattn"] = None  # as if it were not installed
from transformers import AutoModelForSeq2SeqLM
folder, inputs = sys.argv[1], torch.load(sys.argv[2])
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
with torch.no_grad():
    out = model(**inputs)
torch.save({"logits": out.logits, "loss": out.loss, "module": type(model).__module__,
            "triton_pass": [name for name in sys.modules if name.endswith(".eadra_triton")]}, sys.argv[3])
"""

#: EaDRA with the Triton pass (on the CPU under Triton's interpreter; LPEA's bias gradient is refused by it)
TRITON = {"encoder": {"num_heads": 2}, "decoder": {}, "cross": {"heads": [0, 2]}, "implementation": "triton"}


def saved(tmp_path):
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **SETTINGS)).eval()
    model.save_pretrained(tmp_path / "model")
    return model, tmp_path / "model"


def syntax_inputs():
    inputs = batch()
    n = inputs["input_ids"].shape[1]
    inputs["phrase_positions"] = torch.randint(-2, 3, (2, n, n))
    return inputs


def saved_with_triton(tmp_path):
    torch.manual_seed(0)
    with triton_warning():
        model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, eadra=TRITON, dropout=0.0)).eval()
        model.save_pretrained(tmp_path / "triton")  # (saving checks the settings again)
    return model, tmp_path / "triton"


def triton_warning():
    """The warning of a config choosing the Triton pass where it cannot run (tests/test_eadra_passes.py), expected
    where it is due."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if importlib.util.find_spec("triton") is None or not (torch.cuda.is_available() or interpreted):
        return pytest.warns(UserWarning, match="eadra.implementation='triton' needs")
    return contextlib.nullcontext()


def load_in_subprocess(tmp_path, folder, **env):
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), **env}  # a fresh copy of the remote code
    return subprocess.run([sys.executable, "-c", LOAD_WITHOUT_PACKAGE, str(folder), str(tmp_path / "inputs.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300, env=env)


def test_saved_folder_has_code_and_auto_map(tmp_path):
    _, folder = saved(tmp_path)
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForSeq2SeqLM"] == "modeling.HeadAttnMBartForConditionalGeneration"
    for name in ("modeling.py", "configuration.py", "attention.py", "dhicm.py", "eadra.py", "sea.py"):
        assert (folder / name).is_file(), name


def test_remote_code_carries_the_triton_pass_only_when_the_config_chooses_it(tmp_path):
    """By default the saved code holds no Triton kernels and auto_map names modeling.py; with
    ``implementation="triton"`` auto_map names modeling_eadra_triton.py, which imports them, and both files are saved;
    the folder loads back (settings and weights), and auto_map follows the settings."""
    _, folder = saved(tmp_path)
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForSeq2SeqLM"] == "modeling.HeadAttnMBartForConditionalGeneration"
    assert (folder / "eadra.py").is_file() and (folder / "eadra_passes.py").is_file()
    assert not (folder / "eadra_triton.py").exists() and not (folder / "modeling_eadra_triton.py").exists()

    model, folder = saved_with_triton(tmp_path)
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map == {"AutoConfig": "configuration.HeadAttnMBartConfig",
                        "AutoModelForSeq2SeqLM": "modeling_eadra_triton.HeadAttnMBartForConditionalGeneration"}
    for name in ("eadra_triton.py", "modeling_eadra_triton.py", "modeling.py", "eadra_math.py"):
        assert (folder / name).is_file(), name
    eadra_passes._WARNED.clear()  # loading it in a new process: the warning is due again (once a process)
    with triton_warning():
        loaded = AutoModelForSeq2SeqLM.from_pretrained(folder)
    assert type(loaded) is HeadAttnMBartForConditionalGeneration and loaded.config.eadra == TRITON
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value)
    config = loaded.config
    config.eadra = {**TRITON, "implementation": "auto"}
    assert config.to_dict()["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling.HeadAttnMBartForConditionalGeneration"


@pytest.mark.slow
def test_remote_code_runs_the_triton_pass_without_the_package(tmp_path):
    """A checkpoint that chooses the Triton pass, loaded without hf_headattn installed: its own copy of the kernels
    runs (on the CPU under Triton's interpreter) and gives the eager pass's loss."""
    pytest.importorskip("triton")
    _, folder = saved_with_triton(tmp_path)
    inputs = batch()
    torch.save(inputs, tmp_path / "inputs.pt")
    result = load_in_subprocess(tmp_path, folder, TRITON_INTERPRET="1")
    assert result.returncode == 0, result.stderr[-3000:]
    remote = torch.load(tmp_path / "out.pt")
    assert remote["module"].startswith("transformers_modules.") and len(remote["triton_pass"]) == 1
    assert remote["triton_pass"][0].startswith("transformers_modules."), remote["triton_pass"]
    eager = HeadAttnMBartForConditionalGeneration.from_pretrained(folder,  # (warned once already, when saved)
                                                                  eadra={**TRITON, "implementation": "eager"})
    with torch.no_grad():
        expected = eager.eval()(**inputs)
    torch.testing.assert_close(remote["logits"], expected.logits)
    torch.testing.assert_close(remote["loss"], expected.loss, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_remote_code_loads_without_the_package_with_same_outputs(tmp_path):
    model, folder = saved(tmp_path)
    inputs = syntax_inputs()
    torch.save(inputs, tmp_path / "inputs.pt")
    result = load_in_subprocess(tmp_path, folder)
    assert result.returncode == 0, result.stderr[-3000:]
    remote = torch.load(tmp_path / "out.pt")
    assert remote["module"].startswith("transformers_modules.")
    with torch.no_grad():
        expected = model(**inputs)
    torch.testing.assert_close(remote["logits"], expected.logits)
    torch.testing.assert_close(remote["loss"], expected.loss)


@pytest.mark.slow
def test_missing_code_file_is_named(tmp_path):
    _, folder = saved(tmp_path)
    (folder / "dhicm.py").unlink()
    torch.save(syntax_inputs(), tmp_path / "inputs.pt")
    result = load_in_subprocess(tmp_path, folder)
    assert result.returncode != 0 and "dhicm.py" in result.stderr.splitlines()[-1]


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


def test_a_folder_saved_again_without_the_triton_pass_drops_its_kernels(tmp_path):
    """Re-saving a model that does not choose the Triton pass into a folder that held one that did removes the
    kernels and their model module (``auto_map`` no longer names them, and ``push_to_hub`` would upload them); a
    file of the user's own with a model module's name stays."""
    _, folder = saved_with_triton(tmp_path)
    (folder / "modeling_mine.py").write_text("# the user's own\n")
    torch.manual_seed(0)
    HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **SETTINGS)).save_pretrained(folder)
    assert not (folder / "eadra_triton.py").exists() and not (folder / "modeling_eadra_triton.py").exists()
    assert (folder / "modeling_mine.py").read_text() == "# the user's own\n"
    assert (folder / "eadra_passes.py").is_file() and (folder / "modeling.py").is_file()
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForSeq2SeqLM"] == "modeling.HeadAttnMBartForConditionalGeneration"
    assert type(AutoModelForSeq2SeqLM.from_pretrained(folder)) is HeadAttnMBartForConditionalGeneration
