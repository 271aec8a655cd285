"""Iterative head pruning as Michel et al. (2019, §6.1) do it, with any importance criterion.

Each step removes a share of the remaining heads, the least important by the criterion
([`heads_to_prune`][hf_headattn.experiment.analysis.head_ranking.heads_to_prune]), optionally fine-tunes, optionally
recomputes the importance on the pruned model, and evaluates: BLEU and chrF on the evaluation sentences, the parameters,
and `generate`'s sentences per second. `hf-headattn prune` runs it per criterion and writes the JSON, the plot
and the pruned model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from ...sites import COMPONENTS, component_shape
from ..evaluation import compute_translation_metrics
from ..translate import translate
from .head_ranking import heads_to_prune, score_heads

BLEU_TOLERANCE = 0.5
"""A pruned model is judged "as good" as the unpruned one within this many BLEU points (Michel et al.)."""


def total_heads(config) -> int:
    """All attention heads of the unpruned model (encoder self, decoder self and cross)."""
    return sum(math.prod(component_shape(config, component)) for component in COMPONENTS)


def pruned_count(config) -> int:
    return sum(len(heads) for heads in (config.pruned_heads or {}).values())


def evaluate(model, tokenizer, sources: Sequence[str], references: Sequence[str], **generate_kwargs) -> dict:
    """BLEU/chrF of `translate` (beam search as `generate_kwargs` say), the parameters and sentences/s."""
    start = time.perf_counter()
    hypotheses = translate(model, tokenizer, list(sources), **generate_kwargs)
    seconds = time.perf_counter() - start
    metrics = compute_translation_metrics(hypotheses, references)
    return {"bleu": metrics["bleu"], "chrf": metrics["chrf"], "bleu_signature": metrics["bleu_signature"],
            "parameters": sum(p.numel() for p in model.parameters()),
            "sentences_per_second": len(sources) / seconds}


def iterative_pruning(model, criterion: str, importance_batches: Callable[[], Iterable[dict]],
                      evaluate_model: Callable[[torch.nn.Module], dict], *, step_share: float = 0.1,
                      max_share: float = 0.9, recompute: bool = True,
                      finetune: Callable[[torch.nn.Module], None] | None = None, seed: int = 0,
                      on_step: Callable[[torch.nn.Module, list[dict]], None] | None = None,
                      among: dict[str, torch.Tensor] | None = None, unpruned: dict | None = None,
                      log: Callable[[str], None] = print) -> list[dict]:
    """Prune `model` in place step by step; returns one record per step, the unpruned model first.

    Each record: `share` (of all heads pruned), `heads_pruned`, `pruned` (`config.pruned_heads`) and what
    `evaluate_model` returns. Each step prunes `max(1, round(step_share * remaining heads))` heads, never more
    than `max_share` of all heads and never a module's last head; it stops when nothing is left to prune.
    `importance_batches()` gives the batches the importance is computed on (each time it is recomputed);
    `on_step(model, records)` is called after each step is scored (e.g. to keep the fine-tuned model).
    `among` (`{component: bool (layers, heads)}`) limits the heads that can be pruned (`heads_to_prune`);
    `unpruned`, the first record of an earlier run on the same model, saves evaluating the unpruned model again.
    """
    if not 0 < step_share <= 1 or not 0 < max_share < 1:
        raise ValueError(f"step_share must be in (0, 1] and max_share in (0, 1), got {step_share!r}, {max_share!r}")
    total = total_heads(model.config)
    records = [unpruned if unpruned is not None else _record(model, total, evaluate_model)]
    log(f"{criterion}: unpruned BLEU {records[0]['bleu']:.2f}")
    importance = score_heads(model, importance_batches(), [criterion], seed=seed)[criterion]
    limit = math.floor(max_share * total)
    while pruned_count(model.config) < limit:
        remaining = total - pruned_count(model.config)
        count = min(max(1, round(step_share * remaining)), limit - pruned_count(model.config))
        chosen = heads_to_prune(model, importance, count, among)
        if not chosen:
            break
        model.prune_heads(chosen)
        if finetune is not None:
            finetune(model)
        records.append(_record(model, total, evaluate_model))
        log(f"{criterion}: {records[-1]['heads_pruned']}/{total} heads pruned, BLEU {records[-1]['bleu']:.2f}")
        if on_step is not None:
            on_step(model, records)
        if recompute and pruned_count(model.config) < limit:
            importance = score_heads(model, importance_batches(), [criterion], seed=seed)[criterion]
    return records


def _record(model, total: int, evaluate_model) -> dict:
    pruned = pruned_count(model.config)
    return {"share": pruned / total, "heads_pruned": pruned,
            "pruned": {name: list(heads) for name, heads in (model.config.pruned_heads or {}).items()},
            **evaluate_model(model)}


def largest_share_within(records: Sequence[dict], tolerance: float = BLEU_TOLERANCE) -> dict:
    """The record with the largest share pruned whose BLEU is within `tolerance` of the unpruned record's
    (`records[0]`), before the first step that falls below it (the unpruned record if none is)."""
    chosen = records[0]
    for record in records[1:]:
        if record["bleu"] < records[0]["bleu"] - tolerance:
            break
        chosen = record
    return chosen


def throughput_ratio(model, reference, tokenizer, sources: Sequence[str], repeats: int = 3,
                     **generate_kwargs) -> dict:
    """`generate` sentences/s of `model` and `reference` on `sources`, timed alternately `repeats` times,
    so that a load on the machine weighs on both alike; `ratio` is the median of the per-repeat ratios."""
    speeds = {"model": [], "reference": []}
    for _ in range(repeats):
        for name, candidate in (("reference", reference), ("model", model)):
            start = time.perf_counter()
            translate(candidate, tokenizer, list(sources), **generate_kwargs)
            speeds[name].append(len(sources) / (time.perf_counter() - start))
    ratios = sorted(m / r for m, r in zip(speeds["model"], speeds["reference"]))
    return {"ratio": ratios[len(ratios) // 2], "sentences_per_second": speeds}


def finetuning(batches: Callable[[], Iterable[dict]], steps: int, learning_rate: float) -> Callable:
    """A `finetune` for [`iterative_pruning`][hf_headattn.experiment.analysis.head_pruning.iterative_pruning]: `steps`
    AdamW steps on `batches()` (cycled), then eval mode."""
    def finetune(model) -> None:
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
        model.train()
        done = 0
        while done < steps:
            for batch in batches():
                batch = {k: v.to(model.device) if torch.is_tensor(v) else v for k, v in batch.items()}
                model(**batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                done += 1
                if done == steps:
                    break
        model.eval()
    return finetune
