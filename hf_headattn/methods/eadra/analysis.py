"""Encoder self-attention entropy per layer and head over a dataset: EaDRA's Table 2 and Figure 1.

Araabi, Niculae & Monz (§5.1) compare the normalised entropy (Eq. 2) of every encoder self-attention head of models
trained on more or less data, and after EaDRA: per head its mean over the dataset, and over all heads the min, average
and max. Here a head's mean is over all real (non-padding) query tokens of the dataset, each query's distribution
normalised by the log of its number of real keys (`hf_headattn.methods.eadra.equations.normalized_entropy`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

from hf_headattn.methods.eadra.equations import normalized_entropy
from hf_headattn.plugin import attention_backend, method_inputs, pyplot, save_figure


@torch.no_grad()
def encoder_attention_entropy(model, batches: Iterable[dict]) -> dict:
    """Mean normalised entropy of each encoder self-attention head over `batches`, and its min/avg/max.

    Parameters
    ----------
    model
        an mBART/Marian model (ours or stock); it runs its encoder with eager attention (restored afterwards).
    batches : dicts with `input_ids` and optionally `attention_mask` (and the methods' forward inputs,
        `registry.method_inputs()`, e.g. SEA's, for a model with them on; other keys are ignored), e.g. a
        `DataLoader` with a `DataCollatorForSeq2Seq`.

    Returns
    -------
    :
        dict with `entropy` (per layer, a list of per-head means in [0, 1]; a layer whose heads were pruned lists the
        heads it kept), `min`, `avg`, `max` (over all heads; `avg` is the mean of the head means),
        `num_sentences` and `num_tokens` (real source tokens).
    """
    was_training = model.training
    model.eval()
    sums, tokens, sentences = None, 0, 0
    try:
        with attention_backend(model, "eager"):  # SDPA returns no attention maps
            for batch in batches:
                input_ids = batch["input_ids"].to(model.device)
                mask = batch.get("attention_mask")
                real = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.to(model.device).bool()
                extra = {k: batch[k].to(model.device) for k in method_inputs() if batch.get(k) is not None}
                out = model.get_encoder()(input_ids=input_ids, attention_mask=real.long(), output_attentions=True,
                                          **extra)
                # per layer: a model with pruned heads has layers of different head counts
                batch_sums = [(normalized_entropy(maps.float(), real[:, None, None, :]) * real[:, None, :]).sum((0, 2))
                              .double() for maps in out.attentions]  # (B, H, S, S) -> (H,) each
                sums = batch_sums if sums is None else [total + add for total, add in zip(sums, batch_sums)]
                tokens += int(real.sum())
                sentences += input_ids.shape[0]
    finally:
        model.train(was_training)
    if not tokens:
        raise ValueError("no real source token in the batches: expected at least one non-empty input")
    means = [layer / tokens for layer in sums]  # (H_l,) per layer
    every = torch.cat(means)
    return {
        "entropy": [layer.tolist() for layer in means], "min": every.min().item(), "avg": every.mean().item(),
        "max": every.max().item(),
        "num_sentences": sentences, "num_tokens": tokens,
    }


def plot_encoder_entropy(result: dict, path: str | Path, title: str = "") -> Path:
    """Layers x heads heatmap of the mean entropies, heads sorted within each layer (as in Figure 1), as a PNG."""
    plt = pyplot()

    rows = [sorted(layer, reverse=True) for layer in result["entropy"]]  # sorted per layer
    layers, heads = len(rows), max(map(len, rows))
    values = torch.tensor([row + [float("nan")] * (heads - len(row)) for row in rows])  # (L, H); pruned heads: NaN
    fig, ax = plt.subplots(figsize=(1 + 0.6 * heads, 1 + 0.5 * layers))
    image = ax.imshow(values, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    for layer, row in enumerate(rows):
        for rank, value in enumerate(row):
            ax.text(rank, layer, f"{value:.2f}", ha="center", va="center", fontsize=7,
                    color="w" if value < 0.5 else "k")
    ax.set_xlabel("head (sorted by entropy within the layer)")
    ax.set_ylabel("encoder layer")
    ax.set_yticks(range(layers))
    ax.set_xticks(range(heads))
    summary = f"min {result['min']:.2f}  avg {result['avg']:.2f}  max {result['max']:.2f}"
    ax.set_title(f"{title}\n{summary}" if title else summary, fontsize=9)
    fig.colorbar(image, ax=ax, label="normalised entropy")
    return save_figure(fig, path)


def write_entropy_report(result: dict, output_dir: str | Path, name: str = "encoder_entropy",
                         title: str = "") -> tuple[Path, Path]:
    """Write `<name>.json` and `<name>.png` into `output_dir`; returns both paths."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path = output_dir / f"{name}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return json_path, plot_encoder_entropy(result, output_dir / f"{name}.png", title)
