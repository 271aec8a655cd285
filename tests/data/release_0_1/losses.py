"""The translation loss: label-smoothed cross-entropy, and how the methods' terms join it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def label_smoothed_nll_loss(
    logits: torch.Tensor, labels: torch.Tensor, epsilon: float = 0.0, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy, summed over the target tokens that are not ``ignore_index``.

    loss_t = (1 - epsilon) * (-log p(y_t)) + epsilon * mean_v(-log p(v)), the form of Szegedy et al. (2016) that
    fairseq, ``torch.nn.CrossEntropyLoss(label_smoothing=...)`` and HF's ``LabelSmoother`` use.

    Parameters
    ----------
    logits : (B, T, V) tensor; half precision is computed in float32.
    labels : (B, T) long tensor; ``ignore_index`` marks positions that do not count.
    epsilon : smoothing in [0, 1).

    Returns
    -------
    loss_sum : scalar, sum over counted tokens of the smoothed loss.
    nll_sum : scalar, sum over counted tokens of -log p(y_t) (equals ``loss_sum`` when ``epsilon == 0``).
    num_tokens : scalar long tensor, the number of counted tokens.
    """
    logits = logits.reshape(-1, logits.shape[-1])  # (B*T, V)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    labels = labels.reshape(-1)
    num_tokens = labels.ne(ignore_index).sum()
    if epsilon == 0.0:
        nll_sum = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
        return nll_sum, nll_sum, num_tokens
    keep = labels.ne(ignore_index)
    lprobs = F.log_softmax(logits, dim=-1)
    nll = -lprobs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    nll_sum = (nll * keep).sum()
    loss_sum = ((1.0 - epsilon) * nll + epsilon * smooth).mul(keep).sum()
    return loss_sum, nll_sum, num_tokens


def total_objective(
    loss_sum: torch.Tensor,
    num_tokens: torch.Tensor,
    method_term: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """The objective the optimizer sees: the token loss plus the methods' (already weighted) terms.

    Without ``num_items_in_batch`` this is ``loss_sum / num_tokens + method_term``. When the Trainer passes
    ``num_items_in_batch`` (the label tokens of the whole accumulated, all-process batch), the token loss is divided by
    it, so gradient accumulation and DDP give exactly the gradient of one big batch; each method term, a mean over its
    micro-batch, is weighted by the micro-batch's share of tokens, ``num_tokens / num_items_in_batch``, so the
    accumulated objective holds the token-weighted mean of the terms (equal to the full-batch term when the micro-
    batches carry equal token counts).
    """
    denominator = num_tokens.clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    loss = loss_sum / denominator
    if method_term is not None:
        loss = loss + method_term * (num_tokens / denominator)
    return loss
