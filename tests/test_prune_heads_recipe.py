"""recipes/prune_heads.py end to end on a tiny model trained on a few real Multi30k lines (issue #25)."""

import json
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForSeq2SeqLM

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"
sys.path.insert(0, str(ROOT / "recipes"))

import prune_heads  # noqa: E402
from hf_headattn.experiment import recipe as train_translation  # noqa: E402
from hf_headattn.experiment.head_pruning import largest_share_within  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("dhicm")
    train_translation.main([
        "--multi30k_dir", str(DATA), "--model_shape", "tiny", "--method", "dhicm", "--output_dir", str(out),
        "--max_train_samples", "200", "--max_eval_samples", "8", "--max_predict_samples", "8", "--vocab_size", "300",
        "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_beams", "1", "--max_target_length", "16",
        "--report_to", "none", "--save_strategy", "no", "--use_cpu", "true", "--test_splits", "test_2016_flickr",
    ])
    return out


def test_every_criterion_prunes_scores_plots_and_saves_the_chosen_model(model_dir, tmp_path, capsys):
    argv = ["--model_dir", str(model_dir), "--multi30k_dir", str(DATA), "--output_dir", str(tmp_path),
            "--criteria", "gradient", "confidence", "entropy", "dhicm", "random", "--importance_samples", "16",
            "--eval_samples", "8", "--num_beams", "1", "--max_length", "16", "--step_share", "0.3",
            "--max_share", "0.5", "--finetune_steps", "1", "--test_split", "test_2016_flickr"]
    results = prune_heads.main(argv)
    saved = json.loads((tmp_path / "pruning.json").read_text())
    assert set(saved["criteria"]) == {"gradient", "confidence", "entropy", "dhicm", "random"}
    total = 3 * 3 * 4  # tiny: 3+3 layers of 4 heads: encoder self, decoder self, cross
    for name, records in saved["criteria"].items():
        assert records[0]["share"] == 0 and records[0]["pruned"] == {}
        shares = [r["share"] for r in records]
        assert shares == sorted(shares) and all(0 <= r["bleu"] <= 100 and r["sentences_per_second"] > 0
                                                for r in records)
        assert all(r["heads_pruned"] == sum(map(len, r["pruned"].values())) for r in records)
        assert records[-1]["heads_pruned"] <= total // 2
        assert [r["parameters"] for r in records] == sorted((r["parameters"] for r in records), reverse=True)
        if name != "dhicm":
            assert records[-1]["heads_pruned"] == 18  # 0.3 of 36, then capped at 0.5
    # dhicm scores the last encoder and decoder layers only: it prunes no other module
    for record in saved["criteria"]["dhicm"]:
        assert all(".layers.2." in name for name in record["pruned"])
    best = saved["best"]
    chosen = largest_share_within(saved["criteria"][best])
    assert saved["chosen"][best]["share"] == chosen["share"]
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model")
    assert dict(model.config.pruned_heads) == chosen["pruned"]
    card = (tmp_path / "model" / "README.md").read_text()
    assert f"`{best}` criterion" in card and "within 0.5 BLEU" in card
    assert saved["test"]["split"] == "test_2016_flickr" and saved["test"]["throughput_ratio"] > 0
    assert (tmp_path / "pruning.png").stat().st_size > 0
    capsys.readouterr()
    prune_heads.main(argv)  # a restart: every criterion done before, and the test set is not read again
    printed = capsys.readouterr().out
    assert "gradient: done before, skipped" in printed and "the test set was read before" in printed
    assert json.loads((tmp_path / "pruning.json").read_text())["test"] == saved["test"]


def test_largest_share_stops_at_the_first_step_below_the_tolerance():
    records = [{"share": 0, "bleu": 30.0}, {"share": 0.1, "bleu": 29.8}, {"share": 0.2, "bleu": 29.4},
               {"share": 0.3, "bleu": 29.9}]
    assert largest_share_within(records)["share"] == 0.1
    assert largest_share_within(records[:1])["share"] == 0


def test_bad_arguments(model_dir, tmp_path):
    with pytest.raises(SystemExit):
        prune_heads.parse_args(["--model_dir", str(model_dir), "--num_beams", "0"])
    with pytest.raises(ValueError, match=r"step_share must be in \(0, 1\] and max_share in \(0, 1\), got 0.1, 1.0"):
        prune_heads.main(["--model_dir", str(model_dir), "--multi30k_dir", str(DATA), "--output_dir", str(tmp_path),
                          "--criteria", "random", "--importance_samples", "4", "--eval_samples", "4",
                          "--num_beams", "1", "--max_share", "1.0"])
