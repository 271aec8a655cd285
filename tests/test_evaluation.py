"""Tests for hf_headattn.experiment.evaluation against sacrebleu itself, on real Multi30k lines."""

import os
import unicodedata

import numpy as np
import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest
from transformers import EvalPrediction

from hf_headattn.experiment.evaluation import (
    compute_translation_metrics,
    make_compute_metrics,
    markdown_table,
    mean_sd,
    paired_bootstrap,
    per_seed,
    per_seed_p_values,
)
from hf_headattn.experiment.tokenization import train_joint_sentencepiece


@pytest.fixture(scope="module")
def refs(multi30k_lines):
    return multi30k_lines("val", "de", 300)


def _perturb(sentences, every):
    """Drop the last word of every `every`-th sentence and swap the first two words of the others."""
    out = []
    for i, s in enumerate(sentences):
        w = s.split()
        w = w[:-1] if i % every == 0 else [w[1], w[0], *w[2:]]
        out.append(" ".join(w))
    return out


def _edit_few(sentences, n):
    """Drop the last word of the first n sentences only."""
    return [" ".join(s.split()[:-1]) if i < n else s for i, s in enumerate(sentences)]


# ---------------------------------------------------------------- compute_translation_metrics


def test_metrics_match_sacrebleu(refs):
    hyps = _perturb(refs, 3)
    got = compute_translation_metrics(hyps, refs)
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    assert got["bleu"] == pytest.approx(bleu.score, abs=1e-12)
    assert got["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-12)
    assert got["bleu_precisions"] == pytest.approx(bleu.precisions)
    assert (got["bleu_bp"], got["sys_len"], got["ref_len"]) == (bleu.bp, bleu.sys_len, bleu.ref_len)
    for key, metric in (("bleu_signature", BLEU()), ("chrf_signature", CHRF())):
        metric.corpus_score(hyps, [refs])
        assert got[key] == str(metric.get_signature())
    assert got["bleu_signature"].startswith("nrefs:1|") and "tok:13a" in got["bleu_signature"]
    assert 20 < got["bleu"] < 90  # the perturbation costs BLEU but keeps most n-grams


def test_identical_and_worse_hypotheses(refs):
    perfect = compute_translation_metrics(refs, refs)
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)
    mild = compute_translation_metrics(_perturb(refs, 5), refs)
    heavy = compute_translation_metrics(_perturb(refs, 1), refs)
    assert perfect["bleu"] > mild["bleu"] > heavy["bleu"]
    assert perfect["chrf"] > heavy["chrf"]


def test_metric_input_errors(refs):
    with pytest.raises(ValueError, match="predictions and references differ in length: 299 vs 300"):
        compute_translation_metrics(refs[:-1], refs)
    with pytest.raises(TypeError, match="references must be a sequence of str"):
        compute_translation_metrics(refs[:2], [[r] for r in refs[:2]])
    with pytest.raises(ValueError, match="references is empty"):
        compute_translation_metrics([], [])


# ---------------------------------------------------------------- paired_bootstrap


def test_paired_bootstrap_is_sacrebleus_test(refs, monkeypatch):
    base, systems = _perturb(refs, 2), {"a": _perturb(refs, 4), "b": refs}
    got = paired_bootstrap(base, systems, refs, n_samples=200, seed=7)
    monkeypatch.setenv("SACREBLEU_SEED", "7")
    named = [("baseline", base), ("a", systems["a"]), ("b", systems["b"])]
    sigs, scores = PairedTest(named, {"BLEU": BLEU(), "chrF": CHRF()}, [refs], test_type="bs", n_samples=200)()
    for metric, name in (("bleu", "BLEU"), ("chrf", "chrF2")):
        assert got["signatures"][metric] == str(sigs[name])
        assert got["baseline"][metric]["score"] == pytest.approx(scores[name][0].score)
        assert got["baseline"][metric]["ci"] == pytest.approx(scores[name][0].ci)
        for i, system in enumerate(("a", "b"), start=1):
            expected = scores[name][i]
            assert got["systems"][system][metric] == pytest.approx(
                {"score": expected.score, "p_value": expected.p_value, "mean": expected.mean, "ci": expected.ci}
            )
    assert "bs:200" in got["signatures"]["bleu"] and "seed:7" in got["signatures"]["bleu"]


def test_paired_bootstrap_gives_a_tie_no_significance(refs):
    """sacreBLEU alone gives the identical system p = 1/(n+1); a tie must not look significant."""
    hyps = _perturb(refs, 2)
    assert PairedTest([("baseline", hyps), ("same", hyps)], {"BLEU": BLEU()}, [refs], test_type="bs",
                      n_samples=100)()[1]["BLEU"][1].p_value == pytest.approx(1 / 101)
    got = paired_bootstrap(hyps, {"same": list(hyps)}, refs, n_samples=100)
    assert got["systems"]["same"]["bleu"]["p_value"] == got["systems"]["same"]["chrf"]["p_value"] == 1.0


def test_paired_bootstrap_separates_big_from_tiny_differences(refs):
    base = refs
    systems = {"heavy": _perturb(refs, 1), "tiny": _edit_few(refs, 2)}
    got = paired_bootstrap(base, systems, refs, n_samples=300)
    for metric in ("bleu", "chrf"):
        assert got["systems"]["heavy"][metric]["p_value"] < 0.01
        assert got["systems"]["tiny"][metric]["p_value"] > 0.05
    heavy_bleu = sacrebleu.corpus_bleu(systems["heavy"], [refs]).score
    assert got["systems"]["heavy"]["bleu"]["score"] == pytest.approx(heavy_bleu)
    assert got["baseline"]["chrf"]["score"] == pytest.approx(100.0)
    assert all(isinstance(v, float) for v in got["systems"]["tiny"]["chrf"].values())


def test_paired_bootstrap_seed_and_environment(refs, monkeypatch):
    base, systems = _perturb(refs, 2), {"sys": _perturb(refs, 3)}
    monkeypatch.setenv("SACREBLEU_SEED", "999")
    one = paired_bootstrap(base, systems, refs, n_samples=100, seed=1, metrics=("bleu",))
    assert os.environ["SACREBLEU_SEED"] == "999"  # restored
    assert one == paired_bootstrap(base, systems, refs, n_samples=100, seed=1, metrics=("bleu",))
    other = paired_bootstrap(base, systems, refs, n_samples=100, seed=2, metrics=("bleu",))
    assert other["systems"]["sys"]["bleu"]["mean"] != one["systems"]["sys"]["bleu"]["mean"]
    assert other["systems"]["sys"]["bleu"]["score"] == one["systems"]["sys"]["bleu"]["score"]
    assert list(one["signatures"]) == ["bleu"] and "seed:1|" in one["signatures"]["bleu"]
    monkeypatch.delenv("SACREBLEU_SEED")
    chrf_only = paired_bootstrap(base, systems, refs, n_samples=50, seed=None, metrics=("chrf",))
    assert "SACREBLEU_SEED" not in os.environ
    assert list(chrf_only["systems"]["sys"]) == ["chrf"] and "seed:none" in chrf_only["signatures"]["chrf"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"system_predictions": {}}, "system_predictions is empty"),
        ({"system_predictions": {"baseline": None}}, "clashes with baseline_name"),
        ({"metrics": ("ter",)}, r"metrics must be a non-empty subset of \['bleu', 'chrf'\], got \['ter'\]"),
        ({"n_samples": 0}, "n_samples must be a positive int, got 0"),
        ({"seed": 0}, "seed must be a positive int or None, got 0"),
        ({"system_predictions": {"short": ["a"]}}, "system 'short' and references differ in length: 1 vs 3"),
    ],
)
def test_paired_bootstrap_errors(kwargs, match):
    args = {"baseline_predictions": ["a b", "c d", "e"], "system_predictions": {"s": ["a", "c", "e"]},
            "references": ["a b", "c d", "e f"]} | kwargs  # fmt: skip
    with pytest.raises(ValueError, match=match):
        paired_bootstrap(**args)


# ---------------------------------------------------------------- tables of runs over seeds


def test_per_seed_p_values_pair_each_seed_with_the_baseline_of_that_seed(refs, monkeypatch):
    refs = refs[:40]
    baseline = {1: _perturb(refs, 2), 2: refs, 5: refs}
    system = {2: _perturb(refs, 1), 1: refs, 3: refs}  # seed 3: no baseline of its seed, left out
    got = per_seed_p_values(baseline, system, refs)
    # by hand: sacreBLEU's paired bootstrap (1000 resamples, seed 12345) of seed 1, then seed 2
    monkeypatch.setenv("SACREBLEU_SEED", "12345")
    expected = [PairedTest([("baseline", baseline[seed]), ("system", system[seed])], {"BLEU": BLEU()}, [refs],
                           test_type="bs", n_samples=1000)()[1]["BLEU"][1].p_value for seed in (1, 2)]
    assert got == pytest.approx(expected) and len(got) == 2
    assert got[0] < 0.01 and got[1] < 0.01  # seed 1 better, seed 2 much worse than its baseline
    assert per_seed_p_values({1: refs}, {1: list(refs)}, refs) == [1.0]  # identical: no difference
    assert per_seed_p_values({1: refs}, {2: refs}, refs) == []


def test_mean_sd_per_seed_and_markdown_table_by_hand():
    assert mean_sd([30.0, 34.0]) == "32.00 ± 2.83"  # sd = sqrt((2^2 + 2^2) / 1) = 2.828
    assert mean_sd([1.0, float("nan"), 2.0, 6.0]) == "3.00 ± 2.65"  # nan left out: sd = sqrt((4 + 1 + 9) / 2)
    assert mean_sd([12.3]) == "12.30 ± 0.00" and mean_sd([float("nan")]) == mean_sd([]) == "n/a"
    assert per_seed([0.0004, 1.0], ".3f") == "0.000 / 1.000" and per_seed([30, 34.5]) == "30.00 / 34.50"
    assert per_seed([]) == "-"
    assert markdown_table(["row", "BLEU"], [["a", 1], ["b+c", "2.00 ± 0.00"]]) == (
        "| row | BLEU |\n|---|---|\n| a | 1 |\n| b+c | 2.00 ± 0.00 |")


# ---------------------------------------------------------------- make_compute_metrics


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, multi30k_lines):
    texts = multi30k_lines("train", "de", 1000) + multi30k_lines("train", "en", 1000)
    return train_joint_sentencepiece(texts, 600, tmp_path_factory.mktemp("tok"))


def _matrix(rows, fill):
    width = max(map(len, rows))
    return np.array([r + [fill] * (width - len(r)) for r in rows])


def test_compute_metrics_decodes_with_minus_100(tokenizer, refs):
    refs = refs[:64]
    hyps = _perturb(refs, 2)
    pad = tokenizer.pad_token_id
    hyp_ids = tokenizer(text_target=hyps)["input_ids"]
    # generate() starts with decoder_start (= pad for Marian) and pads with pad; batches are joined with -100
    preds = _matrix([[pad] + ids for ids in hyp_ids], pad)
    preds = np.concatenate([preds, np.full((len(hyps), 3), -100)], axis=1)
    for i in range(1, len(hyps), 2):
        preds[i, 1 + len(hyp_ids[i]) :] = -100
    labels = _matrix(tokenizer(text_target=refs)["input_ids"], -100)
    compute_metrics = make_compute_metrics(tokenizer)
    got = compute_metrics(EvalPrediction(predictions=preds, label_ids=labels))

    def norm(s):
        return " ".join(unicodedata.normalize("NFKC", s).split())

    expected = compute_translation_metrics([norm(h) for h in hyps], [norm(r) for r in refs])
    assert set(got) == {"bleu", "chrf", "gen_len"}
    assert got["bleu"] == pytest.approx(expected["bleu"]) and got["chrf"] == pytest.approx(expected["chrf"])
    assert 20 < got["bleu"] < 100
    assert got["gen_len"] == pytest.approx(np.mean([len(ids) for ids in hyp_ids]))  # eos counted, pad not
    assert compute_metrics((preds, labels)) == got
    assert compute_metrics(((preds, None), labels)) == got  # generate outputs given as a tuple
    perfect = compute_metrics((_matrix(tokenizer(text_target=refs)["input_ids"], -100), labels))
    assert perfect["bleu"] == pytest.approx(100.0)


def test_compute_metrics_rejects_logits_and_missing_pad(tokenizer):
    with pytest.raises(ValueError, match=r"shape \(2, 3, 5\); set predict_with_generate=True"):
        make_compute_metrics(tokenizer)((np.zeros((2, 3, 5)), np.zeros((2, 3), dtype=int)))

    class NoPad:
        pad_token_id = None

    with pytest.raises(ValueError, match="NoPad has no pad_token_id"):
        make_compute_metrics(NoPad())
