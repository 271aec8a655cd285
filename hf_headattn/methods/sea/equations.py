"""Pure math of SEA + RHE (Zhang et al. 2021, "Enlivening Redundant Heads in Multi-head Self-attention for MT").

Functions of tensors only (never of a config), each naming its equation:

* RHE (Eq. 3, 9, 10) and Eq. 5's related pairs are shared by every bias method (`head_selection="redundant"`):
  `hf_headattn.redundancy`;
* `lpea_label_bias` (Eq. 8 for the 2k+1 labels) and
  `lpea_bias` (Eq. 6-8 gathered by the relative phrasal positions; its gradient by `sum_per_label`): LPEA.

Masking (Eq. 4 / Eq. 6 on the selected heads): SEA adds the allowed pairs and P to the scores through the shared
layer (`AttentionCall.add_score_bias`, `hf_headattn.scores`), which makes the paper's -inf (Eq. 5, Figure 3's
infinity) the most negative finite value of the dtype in an additive mask (`torch.finfo(dtype).min`, as HF's own
masks, set with `torch.where`, never by addition, which could overflow to -inf and give NaN), a bool mask's False,
or -inf in flex's `score_mod`. The diagonal is always allowed, and a query row left with no allowed key (a padding
row) falls back to the padding mask alone, so no attention row is ever all-masked.

Shapes: B batch, H heads, T = S source length (encoder self-attention), k = `config.sea["max_relative_position"]`.
"""

from __future__ import annotations

import torch

from ...phrase_values import NOT_IN_PHRASE  # noqa: F401  (its home until #65; release 0.2's sea_math.NOT_IN_PHRASE)
from ...redundancy import dependency_allowed


def lpea_label_bias(embeddings: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    projection: torch.Tensor) -> torch.Tensor:
    """Eq. 8 for each of the 2k+1 labels: P_l = -|tanh(W_P w_l + b_P) U_P|, l = -k..k.

    P depends on a position pair only through its label, so the n x n x d_h tensor M of Eq. 7 is never built:
    these 2k+1 scalars are gathered by `lpea_bias`.

    Parameters
    ----------
    embeddings
        (2k+1, d_h), row l + k is w_l; weight : W_P, (d_h, d_h); bias : b_P, (d_h,); projection : U_P, (d_h,)

    Returns
    -------
    :
        Tensor, shape (2k+1,), every value <= 0
    """
    hidden = torch.tanh(torch.addmm(bias, embeddings, weight.T))  # (2k+1, d_h): W_P w_l + b_P in one product
    return -(hidden @ projection).abs()


def lpea_bias(phrase_positions: torch.Tensor, label_bias: torch.Tensor,
              not_in_phrase: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6-8: P_ij = label_bias[clip(RP_ij, k)], and masking outside the local phrase.

    Follows the text of §4.1.2: M_ij embeds the relative *phrasal* position RP_ij (Figure 3), clipped to [-k, k];
    Eq. 7 as printed writes clip(j - i, k), the linear distance, which would ignore the constituency tree.

    Parameters
    ----------
    phrase_positions : LongTensor, shape (B, T, S)
        RP; `not_in_phrase` where x_j is outside local_phrase(x_i) (Figure 3's infinity).
    label_bias : Tensor, shape (2k+1,)
        From `lpea_label_bias`.
    not_in_phrase : int
        The sentinel value.

    Returns
    -------
    bias :
        Tensor, shape (B, T, S), the gathered P (arbitrary where not allowed)
    allowed :
        BoolTensor, shape (B, T, S), inside the local phrase or i = j
    """
    k = (label_bias.shape[0] - 1) // 2
    allowed = dependency_allowed(phrase_positions != not_in_phrase)
    labels = phrase_positions.clamp(-k, k) + k  # (B, T, S) in [0, 2k]
    return _GatherLabels.apply(label_bias, labels), allowed


def sum_per_label(values: torch.Tensor, labels: torch.Tensor, num_labels: int,
                  one_hot: bool | None = None) -> torch.Tensor:
    """out[l] = sum of `values` where `labels == l` (a weighted bincount without a host sync), shape (num_labels,).

    `one_hot` (default: everywhere but on the CPU): one matrix product over the one-hot labels, deterministic and
    spread over the whole device; autograd's own backward of indexing, `index_put_` with accumulation, reduces each
    label's duplicates in a single warp on CUDA (pytorch/pytorch#41162), which LPEA's 2k+1 labels over all B x T x S
    pairs turn into the slowest part of a step. On the CPU `index_add_` (sequential, 15x faster than the product).
    """
    if one_hot is None:
        one_hot = values.device.type != "cpu"
    if not one_hot:
        return values.new_zeros(num_labels).index_add_(0, labels.flatten(), values.flatten())
    matches = labels.reshape(-1, 1) == torch.arange(num_labels, device=labels.device)  # (N, num_labels)
    return (values.reshape(1, -1) @ matches.to(values.dtype)).reshape(-1)


class _GatherLabels(torch.autograd.Function):
    """`table[labels]`, whose backward sums the gradient per label with `sum_per_label`."""

    @staticmethod
    def forward(ctx, table: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(labels)
        ctx.num_labels = table.shape[0]
        return table[labels]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (labels,) = ctx.saved_tensors
        return sum_per_label(grad, labels, ctx.num_labels), None
