"""The training recipe end to end on a few real Multi30k lines: one step per method, results JSON, bad input."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"
sys.path.insert(0, str(ROOT / "recipes"))

import train_translation  # noqa: E402


def run(tmp_path, *extra, method="baseline"):
    argv = [
        "--multi30k_dir", str(DATA), "--model_shape", "tiny", "--method", method, "--output_dir", str(tmp_path),
        "--max_train_samples", "200", "--max_eval_samples", "8", "--max_predict_samples", "8", "--vocab_size", "300",
        "--max_steps", "1", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
        "--num_beams", "2", "--max_target_length", "16", "--report_to", "none", "--save_strategy", "no",
        "--use_cpu", "true", "--logging_steps", "1", *extra,
    ]
    return train_translation.main(argv)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """One sentencepiece tokenizer for the recipe tests (training it is the slow part)."""
    out = tmp_path_factory.mktemp("baseline")
    run(out)
    return out / "tokenizer"


@pytest.mark.parametrize("method", ["baseline", "dhicm"])
def test_one_step_per_method_writes_scores(tmp_path, tokenizer_dir, method):
    results = run(tmp_path, "--tokenizer_name", str(tokenizer_dir), method=method)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["method"] == method and set(saved["scores"]) == {"validation", "test_2016_flickr"}
    for split, scores in saved["scores"].items():
        assert 0 <= scores["bleu"] <= 100 and scores["bleu_signature"].startswith("nrefs:1")
        assert len((tmp_path / f"predictions_{split}.txt").read_text().splitlines()) == 8
    logged = [entry for entry in saved["log_history"] if "loss" in entry]
    assert "nll_loss" in logged[0]
    assert ("dhicm_kl" in logged[0]) == (method == "dhicm")
    assert results["settings"]["label_smoothing"] == 0.1


def test_saved_model_reloads_with_auto_classes(tmp_path, tokenizer_dir):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    run(tmp_path, "--tokenizer_name", str(tokenizer_dir), "--test_splits", "test_2016_flickr", method="dhicm")
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert type(model).__name__ == "HeadAttnMarianMTModel" and model.config.dhicm_encoder_layers == [-1]
    out = model.generate(**tokenizer(["A dog runs."], return_tensors="pt"), max_new_tokens=5)
    assert out.shape[0] == 1


@pytest.mark.parametrize("extra,message", [
    (["--method", "dhicm+magic"], r"unknown method 'magic' in 'dhicm\+magic'"),
    (["--model_shape", "huge"], r"unknown model shape 'huge'"),
    (["--target_lang", "xx"], r"language 'xx' not found"),
    (["--test_splits", "test_2017"], r"test_splits \['test_2017'\] are not in the data"),
])
def test_bad_input_is_refused_before_training(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        run(tmp_path, *extra)


def test_missing_data_and_unequal_line_counts(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        run(tmp_path, "--train_file", str(tmp_path / "nowhere.tsv"), "--multi30k_dir", "")
    (tmp_path / "corpus.en").write_text("a\nb\nc\n")
    (tmp_path / "corpus.de").write_text("x\ny\n")
    with pytest.raises(ValueError, match=r"3 .* 2|2 .* 3"):
        run(tmp_path, "--train_file", str(tmp_path / "corpus"), "--multi30k_dir", "")
