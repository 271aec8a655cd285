"""Translation metrics: sacreBLEU BLEU and chrF with signatures, and paired bootstrap significance.

Scores are detokenised sacreBLEU (Post 2018, "A Call for Clarity in Reporting BLEU Scores"); report them
with their signatures. Significance is sacreBLEU's own paired bootstrap resampling (Koehn 2004,
"Statistical Significance Tests for Machine Translation Evaluation"), `sacrebleu.significance.PairedTest`.
The study recipes' tables of runs over seeds: `per_seed_p_values`, `mean_sd`, `per_seed` and
`markdown_table`.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from ..losses import IGNORE_INDEX

_METRICS = {"bleu": BLEU, "chrf": CHRF}


def _check_pair(predictions, references, what: str = "predictions") -> None:
    for name, seq in ((what, predictions), ("references", references)):
        if isinstance(seq, str) or not all(isinstance(s, str) for s in seq):
            raise TypeError(f"{name} must be a sequence of str (one reference per sentence), got {type(seq).__name__}")
    if len(predictions) != len(references):
        raise ValueError(f"{what} and references differ in length: {len(predictions)} vs {len(references)}")
    if not references:
        raise ValueError("references is empty; expected at least one sentence")


def compute_translation_metrics(predictions: Sequence[str], references: Sequence[str]) -> dict:
    """Corpus BLEU and chrF of detokenised predictions against one reference each.

    Parameters
    ----------
    predictions, references : sequence of str
        Aligned sentences.

    Returns
    -------
    dict
        `bleu`, `chrf` (floats, 0-100), `bleu_signature`, `chrf_signature` (str), and the BLEU
        details `bleu_precisions`, `bleu_bp`, `sys_len`, `ref_len`.
    """
    _check_pair(predictions, references)
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(list(predictions), [list(references)])
    c = chrf.corpus_score(list(predictions), [list(references)])
    return {
        "bleu": b.score,
        "chrf": c.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_precisions": list(b.precisions),
        "bleu_bp": b.bp,
        "sys_len": b.sys_len,
        "ref_len": b.ref_len,
    }


@contextmanager
def _sacrebleu_seed(seed: int | None):
    """sacrebleu reads its resampling seed from `SACREBLEU_SEED`; set it for the duration of a test."""
    old = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = "none" if seed is None else str(seed)
    try:
        yield
    finally:
        if old is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = old


def _as_floats(result, fields) -> dict:
    """Plain floats (JSON-serialisable) from a `sacrebleu.significance.Result`."""
    return {f: None if getattr(result, f) is None else float(getattr(result, f)) for f in fields}


def paired_bootstrap(
    baseline_predictions: Sequence[str],
    system_predictions: Mapping[str, Sequence[str]],
    references: Sequence[str],
    *,
    n_samples: int = 1000,
    seed: int | None = 12345,
    metrics: Sequence[str] = ("bleu", "chrf"),
    baseline_name: str = "baseline",
) -> dict:
    """Paired bootstrap resampling of each system against a baseline (sacreBLEU's implementation).

    Parameters
    ----------
    baseline_predictions
        sequence of str
    system_predictions : mapping of str to sequence of str
        System name -> predictions, each aligned with `references`.
    references
        sequence of str
    n_samples : int
        Bootstrap resamples (sacreBLEU's default is 1000).
    seed : int or None
        Resampling seed (sacreBLEU's default 12345); None draws from the OS. 0 is refused because
        sacreBLEU 2.6 treats a zero seed as "unseeded" for the system resamples.
    metrics
        sequence of {"bleu", "chrf"}
    baseline_name : str

    Returns
    -------
    dict
        `{"signatures": {metric: str}, "baseline": {metric: {"score", "mean", "ci"}},
        "systems": {name: {metric: {"score", "p_value", "mean", "ci"}}}}`; `mean` and `ci` are the
        bootstrap mean and the half-width of its 95% interval, `p_value` tests "no difference to the baseline".
        A system scoring exactly the baseline's score gets `p_value` 1.0: sacreBLEU 2.6 counts resampled
        differences strictly above the observed one, which gives the smallest p-value, 1/(n_samples+1), to a
        system identical to the baseline.
    """
    if not system_predictions:
        raise ValueError("system_predictions is empty; expected at least one {name: predictions}")
    if baseline_name in system_predictions:
        raise ValueError(f"system name {baseline_name!r} clashes with baseline_name; rename one of them")
    bad = [m for m in metrics if m not in _METRICS]
    if bad or not metrics:
        raise ValueError(f"metrics must be a non-empty subset of {list(_METRICS)}, got {list(metrics)}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive int, got {n_samples!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed <= 0):
        raise ValueError(f"seed must be a positive int or None, got {seed!r}")
    _check_pair(baseline_predictions, references, "baseline_predictions")
    for name, preds in system_predictions.items():
        _check_pair(preds, references, f"predictions of system {name!r}")

    named = [(baseline_name, list(baseline_predictions))] + [(n, list(p)) for n, p in system_predictions.items()]
    with _sacrebleu_seed(seed):
        test = PairedTest(
            named, {m: _METRICS[m]() for m in metrics}, references=[list(references)], test_type="bs",
            n_samples=n_samples, n_jobs=1,
        )  # fmt: skip
        signatures, scores = test()
    # PairedTest keys its results by score name ("BLEU", "chrF2"), in the order of `metrics`.
    score_names = [k for k in scores if k != "System"]
    out = {"signatures": {}, "baseline": {}, "systems": {name: {} for name in system_predictions}}
    for metric, score_name in zip(metrics, score_names, strict=True):
        out["signatures"][metric] = str(signatures[score_name])
        base, *systems = scores[score_name]
        out["baseline"][metric] = _as_floats(base, ("score", "mean", "ci"))
        for name, res in zip(system_predictions, systems, strict=True):
            out["systems"][name][metric] = _as_floats(res, ("score", "p_value", "mean", "ci"))
            if res.score == base.score:
                out["systems"][name][metric]["p_value"] = 1.0
    return out


def per_seed_p_values(baseline: Mapping[int, Sequence[str]], system: Mapping[int, Sequence[str]],
                      references: Sequence[str], metric: str = "bleu") -> list[float]:
    """For each seed of `system` that `baseline` also has, in ascending order, the p-value of the system's
    predictions against the baseline's of the same seed (`paired_bootstrap` with its defaults: 1000 resamples,
    seed 12345). `baseline` and `system` map seeds to predictions aligned with `references`."""
    return [paired_bootstrap(baseline[seed], {"system": system[seed]}, references,
                             metrics=(metric,))["systems"]["system"][metric]["p_value"]
            for seed in sorted(system) if seed in baseline]


def mean_sd(values: Iterable[float]) -> str:
    """`"mean ± sd"` to two decimals, sd the sample standard deviation (0.00 for one value); nan values (runs
    without the value) are left out, and "n/a" stands for none."""
    values = [value for value in values if not math.isnan(value)]
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {sd:.2f}"


def per_seed(values: Iterable[float], spec: str = ".2f") -> str:
    """The values one per seed, formatted with `spec` and joined by " / " ("-" for none)."""
    return " / ".join(format(value, spec) for value in values) or "-"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table: the `header` cells, then a line per row of cells (each written with `str`)."""
    head, *body = ["| " + " | ".join(map(str, cells)) + " |" for cells in [header, *rows]]
    return "\n".join([head, "|---" * len(header) + "|", *body])


def make_compute_metrics(tokenizer):
    """Build `compute_metrics` for `Seq2SeqTrainer(..., predict_with_generate=True)`.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        Decodes generated ids and labels; its `pad_token_id` replaces the `IGNORE_INDEX` padding.

    Returns
    -------
    callable
        `compute_metrics(eval_preds) -> {"bleu", "chrf", "gen_len"}` where `eval_preds` is an
        `EvalPrediction` or a `(predictions, label_ids)` pair; `gen_len` is the mean number of
        non-pad generated tokens.
    """
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no pad_token_id; set tokenizer.pad_token first")

    def compute_metrics(eval_preds) -> dict:
        preds, labels = eval_preds[0], eval_preds[1]
        if isinstance(preds, tuple):
            preds = preds[0]
        preds, labels = np.asarray(preds), np.asarray(labels)
        if preds.ndim != 2:
            raise ValueError(
                f"expected generated token ids of shape (batch, length), got shape {preds.shape}; "
                "set predict_with_generate=True in Seq2SeqTrainingArguments"
            )
        preds = np.where(preds == IGNORE_INDEX, pad_id, preds)
        labels = np.where(labels == IGNORE_INDEX, pad_id, labels)
        hyps = [s.strip() for s in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        refs = [s.strip() for s in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        scores = compute_translation_metrics(hyps, refs)
        return {
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "gen_len": float(np.mean(np.count_nonzero(preds != pad_id, axis=1))),
        }

    return compute_metrics
