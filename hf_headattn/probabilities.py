"""Attention probabilities computed outside the backend: the one scores -> mask -> softmax sequence for every method
that needs them ([`attention_probabilities`][hf_headattn.probabilities.attention_probabilities]), and the path an
attention call takes once a method mixes heads (`mixed_attention`,
[`mix_scores`][hf_headattn.attention_call.AttentionCall.mix_scores] / `mix_weights`).

The softmax runs as transformers' eager attention runs it: in at least float32, the result in the query's dtype; a
bool mask sets `finfo.min` where False, an additive float mask is added.

Shapes: B batch, H heads, T queries, S keys, D head dim.
"""

from __future__ import annotations

import torch
from torch import nn


def mix_heads(values: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Head `i` of the result is `sum_j matrix[i, j] * values[:, j]`: `values` (B, H, T, S), `matrix` (H, H)."""
    return torch.einsum("ij,bjts->bits", matrix.to(values.dtype), values)


def attention_probabilities(query: torch.Tensor, key: torch.Tensor, scaling: float,
                            attention_mask: torch.Tensor | None = None,
                            score_mix: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """softmax(mix(q k^T * scaling) + mask) over the keys.

    Parameters
    ----------
    query : (B, H, T, D)
    key : (B, H, S, D)
    scaling
        the scores' factor (1 / sqrt(D) in mBART/Marian)
    attention_mask : None, bool (True = attend) or additive float (`finfo.min` where masked), broadcastable to
        (B, H, T, S) (the call's mask with the score biases in it: `AttentionCall.mask_tensor` or what `attend`
        gets)
    score_mix
        None, or (H, H): the scores mixed over heads before the mask
        ([`mix_heads`][hf_headattn.probabilities.mix_heads])
    dtype : None (the query's), or the dtype the scores are cast to after the product, and of the result (e.g.
        `torch.float32` for probabilities read by a statistic, as RHE's Eq. 2)

    Returns
    -------
    :
        (B, H, T, S) in `dtype` (None: the query's)
    """
    scores = torch.matmul(query, key.transpose(-1, -2))  # (B, H, T, S)
    scores = (scores if dtype is None else scores.to(dtype)) * scaling
    if score_mix is not None:
        scores = mix_heads(scores, score_mix)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    return scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(dtype or query.dtype)


def mixed_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float, dropout: float,
                    score_mix: torch.Tensor | None, weight_mix: torch.Tensor | None) -> tuple:
    """Attention with its heads mixed (talking-heads attention, Shazeer et al. 2020): the probabilities of the
    mixed scores ([`attention_probabilities`][hf_headattn.probabilities.attention_probabilities]), mixed again over
    heads by `weight_mix` (None: not), dropout on them (as eager), times V.

    Returns `(output (B, T, H, D), weights (B, H, T, S))`, as transformers' attention functions return them.
    """
    weights = attention_probabilities(query, key, scaling, attention_mask, score_mix)
    if weight_mix is not None:
        weights = mix_heads(weights, weight_mix)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights
