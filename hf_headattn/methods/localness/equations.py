"""Localness's math (Yang, Tu, Wong, Meng, Chao & Zhang 2018, "Modeling Localness for Self-Attention Networks",
EMNLP 2018), pure functions of tensors. The paper's full text was not reachable here (`shared/papers/
localness-yang.md`), so no equation number is cited; the forms below are the authors' public code's
(`baosongyang/Context-Aware-SAN`, `layers/attention_dyn.py` and `attention_local.py`).

* the Gaussian bias G_ij = -(j - P_i)^2 / (2 sigma_i^2) = -2 (j - P_i)^2 / D_i^2, sigma_i = D_i / 2, added to the
  scaled scores before the softmax (`gaussian_bias`);
* the authors' predictor (`query_centre_and_window`): from the whole query q_i (d_model wide, every head's
  query before the split), one hidden layer h_i = tanh(W_p q_i + b_p) shared by the centre, the window and the heads,
  then per-head output weights with biases: P_i^h = (I - 1) sigmoid(u_h^T h_i + c_h) and
  D_i^h = I sigmoid(v_h^T h_i + e_h) + 0.1 (or a fixed D, the code's `local_size` 10);
* the per-head reading (`centre_and_window`): each head predicts from its own query Q_i^h (d_h wide), with
  W_p, v_p, v_d shared by the heads and no biases, P_i = I sigmoid(v_p^T tanh(W_p Q_i)) and
  D_i = I sigmoid(v_d^T tanh(W_p Q_i)).

Shapes: B batch, H heads, T queries, S keys (T = S: encoder self-attention), d_h the head dimension. Positions j and
the length I count the sentence's real tokens only (padding is neither a position nor part of I).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BIAS_FLOOR = -1.0e4
"""The bias's floor where it is cast to float16: exp(-1e4) is 0 in every float dtype, and the bias stays finite there
(a window collapsing to 0 would otherwise give -inf). Never reached in ordinary use."""
MIN_WINDOW = 1.0e-3
"""The smallest window D (in tokens) the bias uses, so that sigma never underflows to 0 (0/0 = NaN at j = P_i) and
the float32 bias stays finite (at most 2 I^2 / MIN_WINDOW^2)."""


def sentence_positions(real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions j of the real tokens in their sentence and the sentence lengths I.

    Parameters
    ----------
    real : BoolTensor, shape (B, S)
        True at real (non-padding) tokens; padding on either side.

    Returns
    -------
    positions : FloatTensor, shape (B, S): 0, 1, ..., I - 1 over the real tokens (a padding token gets the position
        of the real token before it, or -1 before the first: finite, and masked by the padding mask anyway)
    lengths :
        FloatTensor, shape (B,): I, the number of real tokens (at least 1)
    """
    counts = real.long().cumsum(-1)  # (B, S)
    return (counts - 1).float(), counts[:, -1].clamp(min=1).float()


def localness_logits(query: torch.Tensor, weight: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """The per-head reading's logits before the sigmoid: v^T tanh(W_p Q_i) for each of v_p (and v_d if predicted).

    Parameters
    ----------
    query
        (B, H, T, d_h), each head's query
    weight : (d_h, d_h), W_p
    vectors
        (d_h, k), the columns v_p (and v_d)

    Returns
    -------
    (B, H, T, k)
    """
    return torch.tanh(F.linear(query, weight)) @ vectors


def centre_and_window(query: torch.Tensor, weight: torch.Tensor, centre_vector: torch.Tensor,
                      window_vector: torch.Tensor | None, lengths: torch.Tensor,
                      window: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-head reading: P_i = I sigmoid(v_p^T tanh(W_p Q_i)) and D_i = I sigmoid(v_d^T tanh(W_p Q_i)) (W_p
    shared), or the fixed window D_i = `window` (the fixed-window strategy: P_i still predicted).

    Parameters
    ----------
    query : (B, H, T, d_h)
    weight : (d_h, d_h), W_p; centre_vector, window_vector : (d_h,), v_p and v_d (`window_vector` None with a
        fixed `window`)
    lengths
        (B,), I per sentence
    window
        None (predicted) or a positive number of tokens

    Returns
    -------
    :
        centre, width : (B, H, T) each, P_i and D_i
    """
    scale = lengths[:, None, None].to(query.dtype)  # (B, 1, 1)
    if window is None:
        logits = localness_logits(query, weight, torch.stack([centre_vector, window_vector], dim=-1))
        return (scale[..., None] * torch.sigmoid(logits)).unbind(-1)  # (B, H, T) each
    centre = scale * torch.sigmoid(localness_logits(query, weight, centre_vector[:, None])[..., 0])
    return centre, torch.full_like(centre, float(window))


def gaussian_bias(centre: torch.Tensor, width: torch.Tensor, positions: torch.Tensor,
                  floor: float | None = None, base: torch.Tensor | None = None) -> torch.Tensor:
    """G_ij = -(j - P_i)^2 / (2 sigma_i^2), sigma_i = D_i / 2 (D_i at least `MIN_WINDOW`): a concave
    quadratic in j for each query i, 0 at j = P_i. Computed as -r^2 with r = (j - P_i) sqrt(2) / D_i by
    `GaussianBias` (two (B, H, T, S) operators forward, none backward; r and the result saved);
    `floor`: a lower bound (`BIAS_FLOOR` for a bias cast to float16, whose range would make a collapsed window
    -inf; float32 and bfloat16 hold it finite); `base`: an additive mask added in the same write (0 where a key
    is allowed, `finfo.min` where masked), whose masked entries must get no gradient (as a mask's consumers give
    them: the softmax's weight there is 0).

    Parameters
    ----------
    centre, width : (B, H, T), P_i and D_i
    positions
        (B, S), the keys' positions j
    base
        None, or (B or 1, 1, T or 1, S)

    Returns
    -------
    (B, H, T, S)
    """
    inverse = math.sqrt(2) / width.clamp(min=MIN_WINDOW)  # 1 / (sqrt(2) sigma_i), (B, H, T)
    # (B, H, T) laid out contiguously (the predictor's are transposed views): the bias and r follow their layout
    bias = GaussianBias.apply(centre.contiguous(), inverse.contiguous(), positions.to(centre.dtype), base)
    return bias if floor is None else bias.clamp(min=floor)


class GaussianBias(torch.autograd.Function):
    """base - r_ij^2, r_ij = (j - P_i) c_i, from P (B, H, T), c (B, H, T), the positions j (B, S) and `base` (None:
    0; an additive mask, finfo.min where masked), those two without gradient, with r and the result saved:
    dL/dP_i = 2 c_i sum_j g_ij r_ij, dL/dc_i = -(2 / c_i) sum_j g_ij r_ij^2 (g = dL/dG, 0 where `base` masks),
    the sums batched products of g's rows with r and with the result (two (B, H, T, S) writes forward, none
    backward)."""

    @staticmethod
    def forward(ctx, centre, inverse, positions, base=None):
        distance = _scaled_distance(centre, inverse, positions)
        bias = torch.addcmul(distance.new_zeros(()) if base is None else base, distance, distance, value=-1)
        ctx.save_for_backward(inverse, distance, bias)
        return bias

    @staticmethod
    def backward(ctx, grad):
        inverse, distance, bias = ctx.saved_tensors
        rows, keys = distance.shape[:-1], distance.shape[-1]
        grad = grad.reshape(-1, 1, keys)
        linear = torch.bmm(grad, distance.reshape(-1, keys, 1)).reshape(rows)  # sum_j g r
        square = torch.bmm(grad, bias.reshape(-1, keys, 1)).reshape(rows)  # sum_j g (-r^2) (g 0 where masked)
        return 2 * inverse * linear, 2 * square / inverse, None, None


def _scaled_distance(centre, inverse, positions):
    """r_ij = (j - P_i) c_i = j c_i - P_i c_i, (B, H, T, S), in one operator."""
    return torch.addcmul((-centre * inverse)[..., None], positions[:, None, None, :], inverse[..., None])


WINDOW_OFFSET = 0.1
"""What the authors' code adds to the predicted window D = I sigmoid(.) + 0.1 (`attention_dyn.py`): D >= 0.1."""


def query_centre_and_window(query: torch.Tensor, hidden_weight: torch.Tensor, hidden_bias: torch.Tensor,
                            output_weight: torch.Tensor, output_bias: torch.Tensor, lengths: torch.Tensor,
                            window: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' predictor: h_i = tanh(W_p q_i + b_p) from the whole query, then per head
    P_i^h = (I - 1) sigmoid(u_h^T h_i + c_h) and D_i^h = I sigmoid(v_h^T h_i + e_h) + 0.1, or D = `window`.

    Parameters
    ----------
    query
        (B, T, d), the whole query (every head's, before the split; not scaled)
    hidden_weight
        (m, d), W_p; hidden_bias : (m,), b_p (m = n d_h in the authors' code, n the heads with the bias)
    output_weight : (k n, m), the rows u_1 .. u_n (then v_1 .. v_n with the predicted window: k = 2, else k = 1);
        output_bias : (k n,), c (then e)
    lengths
        (B,), I per sentence
    window
        None (predicted) or a positive number of tokens

    Returns
    -------
    :
        centre, width : (B, n, T) each, P_i^h in [0, I - 1] and D_i^h in [0.1, I + 0.1] (or `window`)
    """
    hidden = torch.tanh(F.linear(query, hidden_weight, hidden_bias))  # (B, T, m)
    gates = torch.sigmoid(F.linear(hidden, output_weight, output_bias)).transpose(1, 2)  # (B, k n, T)
    scale = lengths[:, None, None].to(query.dtype)  # (B, 1, 1)
    if window is None:
        centre, width = gates.chunk(2, dim=1)  # (B, n, T) each
        return (scale - 1) * centre, torch.addcmul(gates.new_full((), WINDOW_OFFSET), scale, width)
    return (scale - 1) * gates, torch.full_like(gates, float(window))
