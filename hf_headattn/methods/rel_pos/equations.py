"""Relative position representations (Shaw, Uszkoreit & Vaswani 2018), the pure math: Eq. 3-5 without a (T, S, d)
tensor.

§3.2: a^K_ij = w^K_{clip(j - i, k)}, a^V_ij = w^V_{clip(j - i, k)}, clip(x, k) = max(-k, min(k, x)), the tables
w^K, w^V of shape (2k+1, d_head), or (H, 2k+1, d_head) with a table per head (row ``clip(j - i) + k``, the
*label*). Eq. 4: e_ij = q_i (k_j + a^K_ij)^T / sqrt(d), split as Eq. 5 does
= q_i k_j^T / sqrt(d) + q_i . w^K_{label_ij} / sqrt(d): the second term is q @ W^K^T (B, H, T, 2k+1), gathered by the
labels (:func:`key_term`). Eq. 3: z_i = sum_j alpha_ij (v_j + a^V_ij) = (alpha @ V)_i + sum_l (sum_{j: label_ij = l}
alpha_ij) w^V_l: the per-label sums of alpha (a scatter-add into (B, H, T, 2k+1)) times W^V (:func:`value_term`).

Shapes: B batch, H heads, T queries, S keys, D head dim, L = 2k+1 labels.
"""

from __future__ import annotations

import torch


def relative_labels(query_length: int, key_length: int, k: int, device=None) -> torch.Tensor:
    """The label clip(j - i, k) + k of each (query, key) pair: LongTensor (T, S) in [0, 2k].

    The queries are the *last* T of the S positions (query i sits at position i + S - T): in self-attention without a
    cache T = S; with a key-value cache during generation the one new query is position S - 1."""
    offset = key_length - query_length
    positions = torch.arange(offset - k, key_length - k, device=device)  # i + offset - k: the label's shift folded in
    return (torch.arange(key_length, device=device)[None, :] - positions[:, None]).clamp(0, 2 * k)


def labels_at(positions: torch.Tensor, key_length: int, k: int) -> torch.Tensor:
    """clip(j - i, k) + k for queries at ``positions`` (B, 1, T): LongTensor (B, 1, T, S)."""
    keys = torch.arange(key_length, device=positions.device)
    return (keys - positions[..., None]).clamp(-k, k) + k


def key_term(query: torch.Tensor, table: torch.Tensor, labels: torch.Tensor, scaling: float = 1.0) -> torch.Tensor:
    """q_i . w^K_{label_ij} for every (query, key) pair (Eq. 4's second term), times ``scaling`` (1 / sqrt(d)),
    applied to the (B, H, T, L) table before the gather: no (B, H, T, S) operator besides the gather itself.

    Parameters
    ----------
    query : (B, H, T, D)
    table : (L, D), w^K (rows w_-k .. w_k), or (H, L, D): one table per head
    labels : LongTensor (T, S) (:func:`relative_labels`) or (B, 1, T, S) (:func:`labels_at`)

    Returns
    -------
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
    probs : (B, H, T, S), the attention weights alpha
    table : (L, D), w^V, or (H, L, D): one table per head
    labels : LongTensor (T, S) or (B, 1, T, S)

    Returns
    -------
    (B, H, T, D)
    """
    return torch.matmul(label_sums(probs, labels, table.shape[-2]), table)
