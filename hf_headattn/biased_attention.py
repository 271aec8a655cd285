"""SDPA with a trainable additive score bias on the CPU, at the cost of one (B, H, T, S) write forward
(`biased_sdpa`, `BiasedAttention`).

A float `attn_mask` that requires a gradient sends torch's SDPA to its math path on the CPU (scores, softmax,
their backward: about a dozen (B, H, T, S) tensors a call; CUDA's memory-efficient kernel gives the mask's gradient
itself). `BiasedAttention` instead runs SDPA's CPU kernel on the mask (the bias with the call's bool mask in
it, `finfo.min` where masked: what `biased_mask` makes, or the bias itself where it holds the mask
already) forward, and its backward for q, k and v; the bias's gradient dS comes from recomputed probabilities:
scores (the mask added by the same product), softmax, dP = dO V^T and softmax's backward, four (B, H, T, S) writes.
The attention function takes it on SDPA without dropout for one trainable bias on every head (Localness, Rel_Pos's
key term), or for the call's whole mask where that needs a gradient (biases with hard masks or on some heads: LPEA
or Localness on RHE's redundant heads), which holds the mask already (`_trainable_bias`).

Values and gradients are the math path's; a query row that allows no key (its output the mean of the values, the
bias masked out) gets SDPA's kernel's gradients to q, k and v, and none to its bias.

Shapes: B batch, H heads, T queries, S keys, D head dim.
"""

from __future__ import annotations

import torch

from .hf_compat import cpu_flash_attention, cpu_flash_attention_backward, softmax_backward


def biased_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor,
                allowed: torch.Tensor | None, scaling: float, masked: bool = False) -> torch.Tensor:
    """softmax(q k^T * scaling + bias, masked where not `allowed`) @ v, through `BiasedAttention`.

    Parameters
    ----------
    query
        (B, H, T, D); key, value : (B, H, S, D)
    bias
        float, broadcastable to (B, H, T, S), in the query's dtype (trainable)
    allowed
        None (every key) or bool broadcastable to (B, H, T, S), True = attend
    masked
        whether `bias` holds `finfo.min` (or less) where not `allowed` already: it is then the mask

    Returns
    -------
    (B, H, T, D)
    """
    return BiasedAttention.apply(query, key, value, bias, allowed, scaling, masked)


class BiasedAttention(torch.autograd.Function):
    """SDPA's CPU kernel forward on the mask where(allowed, bias, finfo.min), and its backward for q, k and v; the
    bias's gradient dS from recomputed probabilities (module docstring). Saves q, k, v, the output, its log-sum-exp
    and the mask (no probabilities)."""

    @staticmethod
    def forward(ctx, query, key, value, bias, allowed, scaling, masked):
        mask = bias if allowed is None or masked else torch.where(allowed, bias, torch.finfo(bias.dtype).min)
        # (detached: a mask that requires a gradient sends SDPA to its math path, even here where grad mode is off)
        output, log_sum_exp = cpu_flash_attention(query, key, value, mask.detach(), scaling)
        ctx.save_for_backward(query, key, value, output, log_sum_exp, mask, allowed)
        ctx.scaling, ctx.bias_shape = scaling, bias.shape
        return output

    @staticmethod
    def backward(ctx, grad_output):
        query, key, value, output, log_sum_exp, mask, allowed = ctx.saved_tensors
        scaling, mask = ctx.scaling, mask.detach()
        grad_query, grad_key, grad_value = cpu_flash_attention_backward(grad_output, query, key, value, output,
                                                                        log_sum_exp, mask, scaling)
        grad_bias = None
        if ctx.needs_input_grad[3]:
            grad_bias = _score_gradient(grad_output, query, key, value, mask, allowed, scaling).sum_to_size(
                ctx.bias_shape)  # summed over the dimensions the bias broadcasts
        return grad_query, grad_key, grad_value, grad_bias, None, None, None


def _score_gradient(grad_output, query, key, value, mask, allowed, scaling) -> torch.Tensor:
    """dL/dscores (B, H, T, S): scores (the mask added by the product), softmax, dP = dO V^T and softmax's backward,
    four (B, H, T, S) writes; 0 on a row that allows no key."""
    batch, heads, length, dim = query.shape
    key_length = key.shape[2]
    rows = (batch * heads, length, key_length)
    # (B H, ., D) each, copied once where the heads are a transposed view
    query3, key3, value3 = (t.reshape(-1, t.shape[2], dim) for t in (query, key, value))
    full = mask.expand(batch, heads, length, key_length)
    if full.is_contiguous():  # the mask added by the product: one write
        scores = torch.baddbmm(full.reshape(rows), query3, key3.mT, alpha=scaling)
    else:
        scores = torch.add(full.reshape(rows), torch.bmm(query3, key3.mT), alpha=scaling)
    dtype = torch.promote_types(query.dtype, torch.float32)
    probs = scores.softmax(-1, dtype=dtype)  # (B H, T, S)
    grad_output = grad_output.reshape(-1, length, dim)
    if allowed is not None:  # a row that allows no key: no gradient to its scores
        keeps = allowed.any(-1, keepdim=True).expand(batch, heads, length, 1)
        grad_output = grad_output * keeps.reshape(-1, length, 1)
    grad_probs = torch.bmm(grad_output, value3.mT)
    grad_scores = softmax_backward(grad_probs.to(dtype), probs).to(query.dtype)
    return grad_scores.view(batch, heads, length, key_length)

