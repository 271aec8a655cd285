"""research/fidelity_study.py: the choice is made on the screen's validation BLEU only (never on test, never a
diagnostic row), the confirmation reads test, and the tables hold what the runs logged. Fabricated runs, no training."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

import fidelity_study  # noqa: E402
from workshop.runs import load_results, run_dir  # noqa: E402


def fake_run(root: Path, stage: str, row: str, seed: int, scores: dict, predictions: dict, log: list) -> None:
    folder = run_dir(root / stage, row, seed)
    folder.mkdir(parents=True)
    results = {"scores": {split: {"bleu": bleu, "chrf": 2 * bleu} for split, bleu in scores.items()},
               "log_history": log, "train_time_s": 100.0, "global_step": 500, "device": "cpu"}
    (folder / "results.json").write_text(json.dumps(results))
    for split, lines in predictions.items():
        (folder / f"predictions_{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.slow  # (make test-fast: within 3 CPU-minutes)
def test_choice_on_validation_then_confirmation_tables(tmp_path, multi30k, multi30k_lines):
    valid, test = multi30k_lines("val", "de"), multi30k_lines("test_2016_flickr", "de")
    worse = {"validation": [" ".join(line.split()[:-3]) for line in valid]}
    same = {"validation": valid}
    log = [{"loss": 3.0, "nll_loss": 3.1, "dhicm_kl": 0.2, "dhicm_stats/top_head_share": 0.1}]
    # the best validation BLEU is "baseline" (not a candidate) and dhicm_per_token_l1e-3; the others are lower
    for row, bleu in (("baseline", 40.0), ("dhicm_per_token_l0.1", 10.0), ("dhicm_per_token_l1e-3", 30.0),
                      ("dhicm_per_batch_l0.1", 29.0), ("eadra_sum", 1.0), ("eadra_pair_mean", 20.0)):
        fake_run(tmp_path, "screen", row, 1, {"validation": bleu}, same if bleu > 25 else worse, log)
    chosen = fidelity_study.choose(load_results(tmp_path / "screen"))
    assert chosen == {"dhicm": ["dhicm_per_token_l1e-3"], "eadra": ["eadra_pair_mean"]}
    top = fidelity_study.choose(load_results(tmp_path / "screen"), top=2)
    assert top["dhicm"] == ["dhicm_per_token_l1e-3", "dhicm_per_batch_l0.1"]
    summary, markdown = fidelity_study.screen_table(load_results(tmp_path / "screen"))
    assert [entry["row"] for entry in summary][0] == "baseline" and len(summary) == 6
    assert summary[1]["dhicm_stats/top_head_share"] == 0.1 and "| dhicm_per_token_l0.1 | 10.00 |" in markdown
    for seed in fidelity_study.CONFIRM_SEEDS:  # test: the chosen row is better there; validation: identical
        both = {"validation": valid, "test_2016_flickr": test}
        fake_run(tmp_path, "confirm", "baseline", seed, {"validation": 40.0, "test_2016_flickr": 30.0},
                 {"validation": valid, "test_2016_flickr": [" ".join(t.split()[:-3]) for t in test]}, log)
        fake_run(tmp_path, "confirm", "dhicm_per_token_l1e-3", seed, {"validation": 40.0, "test_2016_flickr": 35.0},
                 both, log)
        fake_run(tmp_path, "confirm", "dhicm_per_batch_l0.1", seed,
                 {"validation": 38.0 + seed, "test_2016_flickr": 20.0}, both, log)
    confirm = load_results(tmp_path / "confirm")
    assert fidelity_study.confirmed_choice(confirm) == {"dhicm": "dhicm_per_batch_l0.1"}  # validation, not test
    summary, markdown = fidelity_study.confirm_table(confirm, multi30k)
    rows = {entry["row"]: entry for entry in summary}
    seeds = len(fidelity_study.CONFIRM_SEEDS)
    assert rows["dhicm_per_token_l1e-3"]["validation_p_values"] == [1.0] * seeds  # identical predictions
    assert all(p < 0.05 for p in rows["dhicm_per_token_l1e-3"]["test_2016_flickr_p_values"])
    assert rows["baseline"]["validation_p_values"] == [] and "| baseline |" in markdown
