"""DHICM head importance over a dataset, and the token-by-head heatmap of the paper's Figure 3."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from hf_headattn.methods.dhicm.core import METHOD
from hf_headattn.plugin import pyplot, readout, save_figure

from .kit import importance_sums

FLAG, FIELD = readout(METHOD)
"""DHICM's read-out: the forward flag that asks for the importances, and the output field that holds them."""


@torch.no_grad()
def mean_head_importance(model, batches: Iterable[dict]) -> dict[str, list[float]]:
    """Mean importance G of each head, over the real tokens of all batches, per DHICM module.

    Parameters
    ----------
    model
        a HeadAttn model with DHICM on.
    batches : dicts of model inputs (`input_ids`, `attention_mask`, `labels` or `decoder_input_ids`), e.g. a
        `DataLoader` with a `DataCollatorForSeq2Seq`.

    Returns
    -------
    :
        `{module name: [mean G of head 0, head 1, ...]}`; each list sums to 1.
    """
    was_training = model.training
    model.eval()
    sums, counts = {}, {}
    for batch in batches:
        batch = {k: v.to(model.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        importances = getattr(model(**batch, **{FLAG: True}), FIELD)
        if not importances:
            raise ValueError(f"the model returned no head importances: switch DHICM on (config.{METHOD.name})")
        for name, (total, count) in importance_sums(importances).items():
            sums[name] = sums.get(name, 0) + total.double()
            counts[name] = counts.get(name, 0) + int(count)
    model.train(was_training)
    return {name: (sums[name] / max(counts[name], 1)).tolist() for name in sums}


@torch.no_grad()
def sentence_head_importance(model, tokenizer, source: str | None, target: str | None, module: str,
                             inputs: dict | None = None) -> tuple[list[str], torch.Tensor]:
    """The (tokens, heads) importance of one module for one sentence pair, and the tokens its rows belong to.

    Encoder modules give source tokens, decoder modules target tokens (teacher-forced on `target`). Instead of
    the two texts, `inputs` may be a model batch (its first sentence is used), e.g. from the syntax collator for a
    model with SEA on.
    """
    model.eval()
    if inputs is None:
        inputs = tokenizer(source, text_target=target, return_tensors="pt")
    inputs = {k: v[:1].to(model.device) for k, v in inputs.items()}
    importances = getattr(model(**inputs, **{FLAG: True}), FIELD) or {}
    if module not in importances:
        raise ValueError(f"no DHICM module named {module!r}; the model has {sorted(importances)}")
    ids = inputs["input_ids"] if module.startswith("encoder") else inputs["labels"]
    real = ids[0].ne(-100) & ids[0].ne(tokenizer.pad_token_id)
    return tokenizer.convert_ids_to_tokens(ids[0][real]), importances[module][0][real.to(model.device)].cpu()


def plot_head_importance(importance: torch.Tensor, tokens: list[str], path: str | Path, title: str = "") -> Path:
    """A token-by-head heatmap (rows: tokens, columns: heads; brighter = more important), as in Figure 3.

    The colour scale is the whole range of G, 0 to 1 (each row sums to 1), so pictures of different models and
    modules compare; values above 1 (not importances) widen it."""
    plt = pyplot()

    importance = torch.as_tensor(importance).float()
    if importance.dim() != 2 or importance.shape[0] != len(tokens):
        raise ValueError(f"importance must be (tokens, heads) with {len(tokens)} tokens, got {tuple(importance.shape)}")
    fig, ax = plt.subplots(figsize=(max(4.0, 1.5 + 0.6 * importance.shape[1]), 1.0 + 0.35 * len(tokens)))
    image = ax.imshow(importance.numpy(), cmap="viridis", aspect="auto", vmin=0,
                      vmax=max(1.0, float(importance.max())))
    ax.set_xticks(range(importance.shape[1]), [str(h) for h in range(importance.shape[1])])
    ax.set_xlabel("head")
    ax.set_yticks(range(len(tokens)), tokens)
    ax.set_title(title or "DHICM head importance", fontsize=8)
    fig.colorbar(image, ax=ax, label="head importance G (rows sum to 1)")
    return save_figure(fig, path)
