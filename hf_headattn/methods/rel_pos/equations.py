"""Relative position representations (Shaw, Uszkoreit & Vaswani 2018), the pure math: Eq. 3-5 without a (T, S, d)
tensor.

§3.2: a^K_ij = w^K_{clip(j - i, k)}, a^V_ij = w^V_{clip(j - i, k)}, clip(x, k) = max(-k, min(k, x)), the tables
w^K, w^V of shape (2k+1, d_head), or (H, 2k+1, d_head) with a table per head (row `clip(j - i) + k`, the
*label*). Eq. 4: e_ij = q_i (k_j + a^K_ij)^T / sqrt(d), split as Eq. 5 does
= q_i k_j^T / sqrt(d) + q_i . w^K_{label_ij} / sqrt(d): the second term is q @ W^K^T (B, H, T, 2k+1), gathered by the
labels (`key_term`). Eq. 3: z_i = sum_j alpha_ij (v_j + a^V_ij) = (alpha @ V)_i + sum_l (sum_{j: label_ij = l}
alpha_ij) w^V_l: the per-label sums of alpha (a scatter-add into (B, H, T, 2k+1)) times W^V (`value_term`).

Shapes: B batch, H heads, T queries, S keys, D head dim, L = 2k+1 labels.
"""

from __future__ import annotations

import torch

from ...hf_compat import softmax_backward


def relative_labels(query_length: int, key_length: int, k: int, device=None) -> torch.Tensor:
    """The label clip(j - i, k) + k of each (query, key) pair: LongTensor (T, S) in [0, 2k].

    The queries are the *last* T of the S positions (query i sits at position i + S - T): in self-attention without a
    cache T = S; with a key-value cache during generation the one new query is position S - 1."""
    offset = key_length - query_length
    positions = torch.arange(offset - k, key_length - k, device=device)  # i + offset - k: the label's shift folded in
    return (torch.arange(key_length, device=device)[None, :] - positions[:, None]).clamp(0, 2 * k)


def labels_at(positions: torch.Tensor, key_length: int, k: int) -> torch.Tensor:
    """clip(j - i, k) + k for queries at `positions` (B, 1, T): LongTensor (B, 1, T, S)."""
    keys = torch.arange(key_length, device=positions.device)
    return (keys - positions[..., None]).clamp(-k, k) + k


def key_term(query: torch.Tensor, table: torch.Tensor, labels: torch.Tensor, scaling: float = 1.0) -> torch.Tensor:
    """q_i . w^K_{label_ij} for every (query, key) pair (Eq. 4's second term), times `scaling` (1 / sqrt(d)),
    applied to the (B, H, T, L) table before the gather: no (B, H, T, S) operator besides the gather itself.

    Parameters
    ----------
    query : (B, H, T, D)
    table
        (L, D), w^K (rows w_-k .. w_k), or (H, L, D): one table per head
    labels
        LongTensor (T, S) (`relative_labels`) or (B, 1, T, S) (`labels_at`)

    Returns
    -------
    :
        (B, H, T, S): q @ W^K^T (B, H, T, L) gathered along its last dimension by the labels.
    """
    per_label = torch.matmul(query, table.transpose(-1, -2))  # (B, H, T, L)
    if scaling != 1.0:
        per_label = per_label * scaling
    batch, heads, length, _ = per_label.shape
    return per_label.gather(-1, labels.expand(batch, heads, length, labels.shape[-1]))


def label_sums(probs: torch.Tensor, labels: torch.Tensor, num_labels: int) -> torch.Tensor:
    """sum_{j: label_ij = l} alpha_ij: (B, H, T, S) -> (B, H, T, L), a scatter-add along the keys."""
    batch, heads, length, key_length = probs.shape
    sums = probs.new_zeros(batch, heads, length, num_labels)
    return sums.scatter_add(-1, labels.expand(batch, heads, length, key_length), probs)


def value_term(probs: torch.Tensor, table: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """sum_j alpha_ij w^V_{label_ij} (Eq. 3's second term).

    Parameters
    ----------
    probs
        (B, H, T, S), the attention weights alpha
    table
        (L, D), w^V, or (H, L, D): one table per head
    labels : LongTensor (T, S) or (B, 1, T, S)

    Returns
    -------
    (B, H, T, D)
    """
    return torch.matmul(label_sums(probs, labels, table.shape[-2]), table)


def relative_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_table: torch.Tensor,
                       value_table: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None,
                       scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 3-4 in one autograd Function (`RelativeAttention`): alpha = softmax((q k^T + key term) * scaling +
    mask), z = alpha @ V + the value term, the key term gathered from q @ W^K^T (B, H, T, L) in the same write as the
    mask, and no other (B, H, T, S) tensor than the scores and alpha forward, dP and dS backward (alpha saved).

    Parameters
    ----------
    query
        (B, H, T, D); key, value : (B, H, S, D)
    key_table, value_table : (L, D) or (H, L, D), w^K and w^V
    labels : LongTensor (T, S) or (B, 1, T, S)
    mask : None, bool (True = attend) or additive float (`finfo.min` where masked; with a gradient where another
        method's bias is in it), broadcastable to (B, H, T, S)

    Returns
    -------
    :
        output (B, H, T, D), alpha (B, H, T, S) (the weights; differentiable too)
    """
    return RelativeAttention.apply(query, key, value, key_table, value_table, labels, mask, scaling)


class RelativeAttention(torch.autograd.Function):
    """`relative_attention`. Forward: q @ W^K^T * scaling per label, gathered with the mask in one write (a bool
    mask as an extra label of `finfo.min`), the scores by one `baddbmm`, alpha, the per-label sums of alpha (a
    scatter-add) and the output. Backward: dP = dO V^T + (dO W^V^T) gathered by the labels (one gather, one
    `baddbmm`), dS = softmax's backward; the key term's gradient the per-label sums of dS (none on a row that allows
    no key, as where the mask is applied after the bias), then dq, dk, dv, dW^K and dW^V as products."""

    @staticmethod
    def forward(ctx, query, key, value, key_table, value_table, labels, mask, scaling):
        ctx.set_materialize_grads(False)
        batch, heads, length, dim = query.shape
        key_length, num_labels = key.shape[2], key_table.shape[-2]
        shape = (batch, heads, length, key_length)
        index = labels.expand(shape)
        query3, key3, value3 = (t.reshape(-1, t.shape[2], dim) for t in (query, key, value))  # (copied once)
        per_label = torch.matmul(query3.view(query.shape), (key_table * scaling).mT)  # (B, H, T, L), Eq. 4's term
        if mask is not None and mask.dtype == torch.bool:  # masked keys read an extra label of finfo.min
            low = per_label.new_full((*per_label.shape[:-1], 1), torch.finfo(per_label.dtype).min)
            biased = torch.cat([per_label, low], -1).gather(-1, torch.where(mask, labels, num_labels).expand(shape))
        else:
            biased = per_label.gather(-1, index)
            if mask is not None:
                biased = biased + mask
        scores = torch.baddbmm(biased.reshape(-1, length, key_length), query3, key3.mT, alpha=scaling)
        dtype = torch.promote_types(query.dtype, torch.float32)
        probs = scores.softmax(-1, dtype=dtype).view(shape)  # (B, H, T, S)
        weights = probs.to(query.dtype)
        sums = weights.new_zeros(*shape[:-1], num_labels).scatter_add_(-1, index, weights)  # (B, H, T, L)
        output = torch.baddbmm(torch.matmul(sums, value_table).view(-1, length, dim),  # the value term, + alpha V
                               weights.view(-1, length, key_length), value3).view(batch, heads, length, dim)
        ctx.save_for_backward(query3, key3, value3, probs, sums, key_table, value_table, labels, mask)
        ctx.scaling, ctx.shapes = scaling, (query.shape, key.shape, value.shape)
        return output, weights

    @staticmethod
    def backward(ctx, grad_output, grad_weights):
        query3, key3, value3, probs, sums, key_table, value_table, labels, mask = ctx.saved_tensors
        query_shape, key_shape, value_shape = ctx.shapes
        batch, heads, length, dim = query_shape
        key_length, scaling = key_shape[2], ctx.scaling
        shape = (batch, heads, length, key_length)
        index = labels.expand(shape)
        grads = [None] * 8
        if grad_output is None:
            grad_output = query3.new_zeros(query_shape)
        grad_output3 = grad_output.reshape(-1, length, dim)  # (copied once)
        grad_output = grad_output3.view(query_shape)
        by_label = torch.matmul(grad_output, value_table.mT)  # dO . w^V_l, (B, H, T, L)
        grad_probs = torch.baddbmm(by_label.gather(-1, index).view(-1, length, key_length), grad_output3,
                                   value3.mT).view(shape)
        if grad_weights is not None:
            grad_probs = grad_probs + grad_weights
        grad_scores = softmax_backward(grad_probs.to(probs.dtype), probs)
        grad_scores = grad_scores.to(query3.dtype)  # dS (B, H, T, S)
        scores3 = grad_scores.view(-1, length, key_length)
        # the key term's gradient per label: the sums of dS (none on a row that allows no key)
        grad_label = grad_scores.new_zeros(sums.shape).scatter_add_(-1, index, grad_scores)
        keeps = None if mask is None else _allows_a_key(mask).to(grad_scores.dtype)
        grad_label = grad_label * (scaling if keeps is None else keeps * scaling)
        grads[0] = torch.baddbmm(torch.matmul(grad_label, key_table).view(-1, length, dim), scores3, key3,
                                 alpha=scaling).view(query_shape)
        grads[1] = torch.baddbmm(key3.new_empty(()), scores3.mT, query3, beta=0, alpha=scaling).view(key_shape)
        weights = probs.to(query3.dtype).view(-1, length, key_length)
        grads[2] = torch.bmm(weights.mT, grad_output3).view(value_shape)
        if ctx.needs_input_grad[3]:
            grads[3] = _table_gradient(grad_label, query3, key_table)
        if ctx.needs_input_grad[4]:
            grads[4] = _table_gradient(sums, grad_output3, value_table)
        if ctx.needs_input_grad[6]:
            grads[6] = _reduced(grad_scores * keeps, mask.shape)
        return tuple(grads)


def _table_gradient(per_label: torch.Tensor, rows: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """sum over sentences and queries (and heads, for a table shared by them) of per_label^T @ rows: (B, H, T, L) and
    (B H, T, D) -> the table's shape, (H, L, D) or (L, D), by one batched product of (L, D) blocks."""
    batch, heads, length, num_labels = per_label.shape
    blocks = torch.bmm(per_label.reshape(-1, length, num_labels).mT, rows).view(batch, heads, num_labels, -1)
    return blocks.sum(0) if table.dim() == 3 else blocks.sum((0, 1))


def _allows_a_key(mask: torch.Tensor) -> torch.Tensor:
    """(B, 1 or H, T, 1) bool: whether each query row allows a key by `mask` (bool, or additive float)."""
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return allowed.any(-1, keepdim=True)


def _reduced(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """`grad` summed over the dimensions `shape` broadcasts."""
    dims = tuple(i for i, (size, full) in enumerate(zip(shape, grad.shape)) if size == 1 and full != 1)
    return (grad.sum(dims, keepdim=True) if dims else grad).reshape(shape)
