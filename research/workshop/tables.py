"""Cells of the study scripts' tables of runs over seeds, each compared with the baseline run of the same seed (the
generic ones, :func:`~hf_headattn.experiment.evaluation.mean_sd`, :func:`~hf_headattn.experiment.evaluation.per_seed`
and :func:`~hf_headattn.experiment.evaluation.markdown_table`, are in :mod:`~hf_headattn.experiment.evaluation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from hf_headattn.experiment.evaluation import per_seed_p_values

#: How a run's stop reason marks its epochs (early stopping, the expected one, is not marked).
STOP_MARKS = {"early_stopping": "", "time_cap": " (time cap)", "max_epochs": " (max epochs)"}


def p_values_vs_baseline(row: str, baseline: Mapping[int, dict], runs: Mapping[int, dict], references: Sequence[str],
                         predictions: Callable[[dict], Sequence[str]]) -> list[float]:
    """Per seed that both have (ascending), the paired bootstrap p of ``row``'s run against the baseline's, on the
    ``predictions`` of each (``baseline`` and ``runs`` map seeds to runs); none for the baseline row itself."""
    if row == "baseline":
        return []
    return per_seed_p_values({seed: predictions(run) for seed, run in baseline.items()},
                             {seed: predictions(run) for seed, run in runs.items()}, references)


def against(scores: Mapping[int, float], baseline: Mapping[int, float], p_values: Sequence[float]) -> str:
    """Per seed that the baseline has too (ascending, as :func:`per_seed_p_values` gives ``p_values``): the signed
    difference from the baseline of the same seed and its p, e.g. ``+0.49 (p 0.109) / +1.30 (p 0.005)``."""
    seeds = [seed for seed in sorted(scores) if seed in baseline]
    return " / ".join(f"{scores[s] - baseline[s]:+.2f} (p {p:.3f})" for s, p in zip(seeds, p_values)) or "-"


def epochs_trained(record: dict) -> str:
    """A recorded run's epochs, marked with its stop reason unless it stopped early, e.g. ``40 (time cap)``."""
    reason = record["stop_reason"]
    return f"{record['epochs']:.0f}{STOP_MARKS.get(reason, ' (' + reason + ')')}"


def validation_curves(stage: str, runs: Mapping[str, Mapping[int, dict]], rows: Iterable[str]) -> str:
    """A markdown list, a line per recorded run of ``rows``: its greedy validation BLEU at each evaluation."""
    lines = []
    for row in rows:
        for seed, run in sorted(runs.get(row, {}).items()):
            values = ", ".join(f"{point['bleu']:.1f}" for point in run["validation_curve"])
            lines.append(f"- {stage} {row} seed {seed} ({run['stop_reason']}): {values}")
    return "\n".join(lines)


def protocol_note(patience: int, max_epochs: int, num_beams: int, test_split: str) -> str:
    """The tables' introduction: how a staged study's runs trained and were chosen."""
    return (f"Each run trains until its greedy validation BLEU has not improved for {patience} evaluations (one per "
            f"epoch), at most {max_epochs} epochs and the time cap; its best checkpoint (by that BLEU) is scored with "
            f"beam {num_beams}. Every choice is made on validation; {test_split} is read once, after the "
            "confirmation, for the confirmed rows only.")


def scores_note(record: dict | None, num_beams: int) -> str:
    """The tables' footnote: what their BLEU (with the signature of ``record``, a run's, where there is one), p and
    epochs are."""
    signature = f" ({record['validation']['bleu_signature']})" if record else ""
    return (f"BLEU: sacreBLEU{signature}, beam {num_beams}, best checkpoint. p: sacreBLEU's paired bootstrap (1000 "
            "resamples, seed 12345) of each seed against the baseline run of the same seed, two-sided; the sign of "
            "the difference gives the direction. Epochs to best: the evaluation whose checkpoint is scored; epochs "
            "trained: until early stopping unless marked (time cap, max epochs). The screen's seed chose the "
            "confirmed rows, so the confirmation reports fresh seeds only.")
