"""What a study reads from a run's training log (``results.json``'s ``log_history``): its validation curve (one point
per evaluation), its training curve (per-epoch means of the training logs), the evaluation whose checkpoint the
Trainer keeps, and why the run stopped.
"""

from __future__ import annotations

import math

#: Training-log values that describe the schedule, not the model: left out of :func:`training_curve`.
SCHEDULE_LOG_KEYS = frozenset({"epoch", "step", "learning_rate", "grad_norm"})


def validation_curve(log_history: list[dict]) -> list[dict]:
    """One entry per evaluation: epoch, step, greedy validation BLEU and chrF (against the decoded references, as
    early stopping reads them), validation loss."""
    return [{"epoch": entry.get("epoch"), "step": entry.get("step"), "bleu": entry["eval_bleu"],
             "chrf": entry.get("eval_chrf"), "loss": entry.get("eval_loss")}
            for entry in log_history if "eval_bleu" in entry]


def training_curve(log_history: list[dict]) -> list[dict]:
    """Per epoch k (the training logs with epoch in (k-1, k]), the mean of each logged training value: the loss, the
    NLL and the methods' terms and statistics (e.g. ``dhicm_kl``, ``dhicm_stats/top_head_share``), as the Trainer
    logged them every ``logging_steps`` (numbers only); ``logs`` says how many logs each mean joins."""
    epochs: dict[int, list[dict]] = {}
    for entry in log_history:
        if "loss" in entry:  # a training log (evaluations log eval_loss, the run's summary train_loss)
            epochs.setdefault(max(math.ceil(entry["epoch"] - 1e-9), 1), []).append(entry)
    curve = []
    for epoch, entries in sorted(epochs.items()):
        values: dict[str, list[float]] = {}
        for entry in entries:
            for key, value in entry.items():
                if key not in SCHEDULE_LOG_KEYS and isinstance(value, (int, float)):
                    values.setdefault(key, []).append(value)
        means = {key: sum(numbers) / len(numbers) for key, numbers in sorted(values.items())}
        curve.append({"epoch": epoch, "logs": len(entries), **means})
    return curve


def best_index(curve: list[dict]) -> int | None:
    """The evaluation the Trainer keeps: the first with the highest BLEU (a later one must be strictly higher)."""
    return max(range(len(curve)), key=lambda i: (curve[i]["bleu"], -i)) if curve else None


def stop_reason(results: dict, curve: list[dict], patience: int, max_epochs: int, finish_only: str | None) -> str:
    """Why a run stopped: ``time_cap`` (its training time ran out), ``early_stopping`` (``patience`` evaluations
    after the best), ``max_epochs``; else the stop condition its last session found met before it only scored
    (``finish_only``), or ``unknown``."""
    if results.get("stopped_at_time_limit") or finish_only == "time_cap":
        return "time_cap"
    best = best_index(curve)
    if best is not None and len(curve) - 1 - best >= patience:
        return "early_stopping"
    if (results.get("epochs") or 0) >= max_epochs - 1e-6:
        return "max_epochs"
    return finish_only or "unknown"
