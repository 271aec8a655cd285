"""Pure math of SEA + RHE (Zhang et al. 2021, "Enlivening Redundant Heads in Multi-head Self-attention for MT").

Functions of tensors only (never of a config), each naming its equation:

* :func:`head_confidence` (Eq. 3), :func:`syntactic_attention` (Eq. 9), :func:`redundant_heads` (Eq. 10): RHE;
* :func:`dependency_allowed` (Eq. 5): DEA; :func:`lpea_label_bias` (Eq. 8 for the 2k+1 labels) and
  :func:`lpea_bias` (Eq. 6-8 gathered by the relative phrasal positions; its gradient by :func:`sum_per_label`): LPEA.

Masking (Eq. 4 / Eq. 6 on the selected heads): SEA adds the allowed pairs and P to the scores through the shared
layer (``AttentionCall.add_score_bias``, :mod:`hf_headattn.scores`), which makes the paper's -inf (Eq. 5, Figure 3's
infinity) the most negative finite value of the dtype in an additive mask (``torch.finfo(dtype).min``, as HF's own
masks, set with ``torch.where``, never by addition, which could overflow to -inf and give NaN), a bool mask's False,
or -inf in flex's ``score_mod``. The diagonal is always allowed, and a query row left with no allowed key (a padding
row) falls back to the padding mask alone, so no attention row is ever all-masked.

Shapes: B batch, H heads, T = S source length (encoder self-attention), k = ``config.sea["max_relative_position"]``.
"""

from __future__ import annotations

import torch

from ...attention import key_allowed  # noqa: F401  (core.py imports it from here: part of Eq. 9's inputs)

#: ``phrase_positions`` value outside the local phrase and on padding (the syntax collator writes it).
NOT_IN_PHRASE = -10000


def real_tokens(allowed: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
    """(B, S) bool, True at real tokens: the keys some query may attend to (bidirectional padding masks).

    In encoder self-attention queries and keys are the same tokens, so this is also the query mask. It is read from
    the mask itself so that ``generate()``, which runs the encoder without the model's context, sees the same tokens.
    """
    if allowed is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    return allowed.any(dim=-2).all(dim=1)  # (B, 1|H, T, S) -> (B, 1|H, S) -> (B, S)


def plain_probabilities(query: torch.Tensor, key: torch.Tensor, scaling: float,
                        allowed: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T * scaling) with the padding mask (Eq. 2), in float32.

    Parameters
    ----------
    query : (B, H, T, D); key : (B, H, S, D)
    allowed : None or BoolTensor broadcastable to (B, H, T, S), True = attend.

    Returns
    -------
    FloatTensor, shape (B, H, T, S)
    """
    logits = torch.matmul(query, key.transpose(-1, -2)).float() * scaling  # (B, H, T, S)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, torch.finfo(torch.float32).min)
    return logits.softmax(dim=-1)


def _token_mean(values: torch.Tensor, query_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of (B, H, T) values over the real query tokens -> (B, H)."""
    if query_mask is None:
        return values.mean(dim=-1)
    weights = query_mask[:, None, :].to(values.dtype)  # (B, 1, T)
    return (values * weights).sum(-1) / weights.sum(-1).clamp(min=1)


def head_confidence(probs: torch.Tensor, query_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 3: h_conf = 1/n sum_i max_j Att(Q_i, K_j), per sentence and head.

    Parameters
    ----------
    probs : FloatTensor, shape (B, H, T, S)
        Attention probabilities (rows sum to 1).
    query_mask : BoolTensor, shape (B, T), optional
        True at real query tokens; n is their number (padding rows are left out).

    Returns
    -------
    FloatTensor, shape (B, H)
    """
    return _token_mean(probs.amax(dim=-1), query_mask)


def syntactic_attention(probs: torch.Tensor, dependency_mask: torch.Tensor,
                        query_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 9: Syn_attn = 1/n sum_i sum_j Dep_mask(Att(Q_i, K_j)), the mean attention mass on related tokens.

    Parameters
    ----------
    probs : FloatTensor, shape (B, H, T, S)
    dependency_mask : BoolTensor, shape (B, T, S)
        True for a head-dependent pair (either direction); the diagonal counts as related (Eq. 5: i = j).
    query_mask : BoolTensor, shape (B, T), optional

    Returns
    -------
    FloatTensor, shape (B, H)
    """
    related = dependency_allowed(dependency_mask).to(probs.dtype)  # (B, T, S)
    mass = torch.einsum("bhts,bts->bht", probs, related)  # (B, H, T)
    return _token_mean(mass, query_mask)


def redundant_heads(h_conf: torch.Tensor, syn_attn: torch.Tensor) -> torch.Tensor:
    """Eq. 10: a head is redundant (h_label = 0) when Syn_attn <= Syn_gate = sigmoid(h_conf).

    A hard, non-differentiable decision: the result is a bool tensor with no gradient.

    Parameters
    ----------
    h_conf, syn_attn : FloatTensor, shape (B, H)

    Returns
    -------
    BoolTensor, shape (B, H), True = redundant
    """
    return syn_attn <= torch.sigmoid(h_conf)


def dependency_allowed(dependency_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 5 as a bool mask: D_ij = 0 (allowed) for a dependency pair or i = j, -inf (not allowed) elsewhere.

    Parameters
    ----------
    dependency_mask : BoolTensor, shape (B, T, S)

    Returns
    -------
    BoolTensor, shape (B, T, S): ``dependency_mask`` with the diagonal set.
    """
    eye = torch.eye(*dependency_mask.shape[-2:], dtype=torch.bool, device=dependency_mask.device)
    return dependency_mask | eye


def lpea_label_bias(embeddings: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    projection: torch.Tensor) -> torch.Tensor:
    """Eq. 8 for each of the 2k+1 labels: P_l = -|tanh(W_P w_l + b_P) U_P|, l = -k..k.

    P depends on a position pair only through its label, so the n x n x d_h tensor M of Eq. 7 is never built:
    these 2k+1 scalars are gathered by :func:`lpea_bias`.

    Parameters
    ----------
    embeddings : (2k+1, d_h), row l + k is w_l; weight : W_P, (d_h, d_h); bias : b_P, (d_h,); projection : U_P, (d_h,)

    Returns
    -------
    Tensor, shape (2k+1,), every value <= 0
    """
    hidden = torch.tanh(embeddings @ weight.T + bias)  # (2k+1, d_h)
    return -(hidden @ projection).abs()


def lpea_bias(phrase_positions: torch.Tensor, label_bias: torch.Tensor,
              not_in_phrase: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6-8: P_ij = label_bias[clip(RP_ij, k)], and masking outside the local phrase.

    Follows the text of §4.1.2: M_ij embeds the relative *phrasal* position RP_ij (Figure 3), clipped to [-k, k];
    Eq. 7 as printed writes clip(j - i, k), the linear distance, which would ignore the constituency tree.

    Parameters
    ----------
    phrase_positions : LongTensor, shape (B, T, S)
        RP; ``not_in_phrase`` where x_j is outside local_phrase(x_i) (Figure 3's infinity).
    label_bias : Tensor, shape (2k+1,)
        From :func:`lpea_label_bias`.
    not_in_phrase : int
        The sentinel value.

    Returns
    -------
    bias : Tensor, shape (B, T, S), the gathered P (arbitrary where not allowed)
    allowed : BoolTensor, shape (B, T, S), inside the local phrase or i = j
    """
    k = (label_bias.shape[0] - 1) // 2
    allowed = dependency_allowed(phrase_positions != not_in_phrase)
    labels = phrase_positions.clamp(-k, k) + k  # (B, T, S) in [0, 2k]
    return _GatherLabels.apply(label_bias, labels), allowed


def sum_per_label(values: torch.Tensor, labels: torch.Tensor, num_labels: int,
                  one_hot: bool | None = None) -> torch.Tensor:
    """out[l] = sum of ``values`` where ``labels == l`` (a weighted bincount without a host sync), shape (num_labels,).

    ``one_hot`` (default: everywhere but on the CPU): one matrix product over the one-hot labels, deterministic and
    spread over the whole device; autograd's own backward of indexing, ``index_put_`` with accumulation, reduces each
    label's duplicates in a single warp on CUDA (pytorch/pytorch#41162), which LPEA's 2k+1 labels over all B x T x S
    pairs turn into the slowest part of a step. On the CPU ``index_add_`` (sequential, 15x faster than the product).
    """
    if one_hot is None:
        one_hot = values.device.type != "cpu"
    if not one_hot:
        return values.new_zeros(num_labels).index_add_(0, labels.flatten(), values.flatten())
    matches = labels.reshape(-1, 1) == torch.arange(num_labels, device=labels.device)  # (N, num_labels)
    return (values.reshape(1, -1) @ matches.to(values.dtype)).reshape(-1)


class _GatherLabels(torch.autograd.Function):
    """``table[labels]``, whose backward sums the gradient per label with :func:`sum_per_label`."""

    @staticmethod
    def forward(ctx, table: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(labels)
        ctx.num_labels = table.shape[0]
        return table[labels]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (labels,) = ctx.saved_tensors
        return sum_per_label(grad, labels, ctx.num_labels), None
