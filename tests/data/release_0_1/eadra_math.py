"""EaDRA's regularizers as pure functions of attention probabilities (Araabi, Niculae & Monz, §3, Eq. 1-8).

Shapes: ``a`` (..., T, S) holds attention distributions, row i that of query i over S keys (leading dims are usually
(B, H)), zero outside ``support``; ``support`` (bool, broadcastable to ``a``) marks the keys that count for each
query: the real (non-padding) keys, and for causal self-attention only the query's prefix; ``query_mask`` (bool,
broadcastable to ``a.shape[:-1]``) marks the queries that count (real tokens whose support is not empty). ``None``
masks count everything.

Choices (the paper leaves them open):

* H_N(a_i) = H(a_i) / log n_i with n_i the size of query i's support (Eq. 2 with n = the keys it can see), and
  H_N := 0 when n_i <= 1: a distribution over one key has no spread to measure (0 / 0 otherwise). Natural logs: the
  base cancels in Eq. 2. 0 log 0 := 0, and logs are taken of max(a, tiny) so that one-hot rows have finite gradients.
* Per (sentence, head): R_peak is the *mean* over real queries of H_N (the authors' code divides by the query count),
  R_sent = -H_N(mean over real queries of a_i) over the union of their supports, R_dist the *sum* over pairs of
  consecutive real queries (Eq. 8 sums; so does the authors' code).
* a^T D b (D_st = |s - t|) is E|X - Y| for X ~ a, Y ~ b, and |x - y| counts the k with min(x, y) <= k < max(x, y),
  so a^T D b = sum_k F_a(k) (1 - F_b(k)) + F_b(k) (1 - F_a(k)) = sum_k F_a(k) + F_b(k) - 2 F_a(k) F_b(k) with F the
  cumulative sums: O(S) per pair of rows, never the S x S matrix D (Eq. 8 suggests an FFT; this is cheaper).

:func:`eadra_regularizers` gives all three from attention scores with a hand-written backward that keeps only the
probabilities and skips the terms outside the objective; the other functions are the definitions, differentiable by
autograd (the tests check one against the other).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

TERMS = ("peak", "sent", "dist")


def _safe_log(a: torch.Tensor) -> torch.Tensor:
    """log max(a, tiny): finite, so 0 * log 0 = 0 and gradients stay finite."""
    return a.clamp_min(torch.finfo(a.dtype).tiny).log()


def _inverse_log_count(n: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """1 / log n, and 0 where n <= 1 (the normaliser of Eq. 2)."""
    return torch.where(n > 1, 1.0 / n.clamp(min=2).to(dtype).log(), 0.0)


def _query_weights(query_mask: torch.Tensor | None, a: torch.Tensor) -> torch.Tensor:
    """(..., T) weights of the mean over real queries: 1 / (number of real queries) at real ones, 0 elsewhere."""
    if query_mask is None:
        return a.new_full(a.shape[-2:-1], 1.0 / a.shape[-2])
    real = query_mask.to(a.dtype)
    return real / real.sum(-1, keepdim=True).clamp(min=1)


def _pair_weights(query_mask: torch.Tensor | None, a: torch.Tensor) -> torch.Tensor:
    """(..., T-1) 1 where queries i and i+1 are both real."""
    if query_mask is None:
        return a.new_ones(a.shape[-2] - 1)
    return (query_mask[..., :-1] & query_mask[..., 1:]).to(a.dtype)


def normalized_entropy(a: torch.Tensor, support: torch.Tensor | None = None) -> torch.Tensor:
    """Length-normalised Shannon entropy of each distribution (Eq. 1-2), in [0, 1].

    Parameters
    ----------
    a : (..., S) probabilities, zero outside ``support``.
    support : (..., S) bool, broadcastable to ``a``; the positions that count (``None``: all S).

    Returns
    -------
    (...) H(a) / log n with n = ``support.sum(-1)``; 0 where n <= 1.
    """
    count = torch.tensor(a.shape[-1]) if support is None else support.sum(-1)
    entropy = -torch.linalg.vecdot(a, _safe_log(a))
    return entropy * _inverse_log_count(count, a.dtype)


def peak_regularizer(a, support=None, query_mask=None) -> torch.Tensor:
    """R_peak (Eq. 4) of one sentence and head: the mean over real queries of H_N(a_i). Returns a.shape[:-2]."""
    return (normalized_entropy(a, support) * _query_weights(query_mask, a)).sum(-1)


def sentence_regularizer(a, support=None, query_mask=None) -> torch.Tensor:
    """R_sent (Eq. 5-6): -H_N of the mean of the real queries' distributions, over the union of their supports.

    Returns a.shape[:-2], in [-1, 0].
    """
    a_bar = (_query_weights(query_mask, a).unsqueeze(-2) @ a).squeeze(-2)  # (..., 1, T) @ (..., T, S): Eq. 5
    if support is None:
        return -normalized_entropy(a_bar)
    real = torch.ones(a.shape[-2], 1, dtype=torch.bool, device=a.device) if query_mask is None else (
        query_mask.unsqueeze(-1))  # (..., T, 1)
    return -normalized_entropy(a_bar, (support & real).any(-2))


def expected_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a^T D b = E|X - Y| for independent X ~ a, Y ~ b on positions 0..S-1 (Eq. 8's summand), in O(S)."""
    cdf_a, cdf_b = a.cumsum(-1), b.cumsum(-1)
    return (cdf_a + cdf_b - 2 * cdf_a * cdf_b).sum(-1)


def distance_regularizer(a, query_mask=None) -> torch.Tensor:
    """R_dist (Eq. 8): sum over consecutive real queries (i, i+1) of a_i^T D a_{i+1}. Returns a.shape[:-2]."""
    cdf = a.cumsum(-1)  # (..., T, S)
    row = cdf.sum(-1)  # (..., T)
    pair_distance = row[..., :-1] + row[..., 1:] - 2 * torch.linalg.vecdot(cdf[..., :-1, :], cdf[..., 1:, :])
    return (pair_distance * _pair_weights(query_mask, a)).sum(-1)


def _coefficients(support, query_mask, a) -> tuple[torch.Tensor, ...]:
    """What the masks contribute, computed once per call: the query weights w (..., T) of the mean over real queries,
    the pair weights (..., T-1), 1 / log n_i per query (..., T) and 1 / log n_bar for the query-averaged attention."""
    weights, pairs = _query_weights(query_mask, a), _pair_weights(query_mask, a)
    row_norm = _inverse_log_count(support.sum(-1), a.dtype)
    bar_norm = _inverse_log_count((support & query_mask.unsqueeze(-1)).any(-2).sum(-1), a.dtype)
    return weights, pairs, row_norm, bar_norm


def _forward(a, log_a, weights, pairs, row_norm, bar_norm) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R_peak, R_sent, R_dist as in the definitions above, sharing the mask coefficients."""
    peak = torch.linalg.vecdot(-torch.linalg.vecdot(a, log_a), weights * row_norm)  # Eq. 4
    a_bar = (weights.unsqueeze(-2) @ a).squeeze(-2)  # (..., 1, T) @ (..., T, S) -> (..., S): Eq. 5
    sent = torch.linalg.vecdot(a_bar, _safe_log(a_bar)) * bar_norm  # Eq. 6: 0 log 0 = 0 outside the union
    cdf = a.cumsum(-1)  # (..., T, S)
    row = cdf.sum(-1)
    pair_distance = row[..., :-1] + row[..., 1:] - 2 * torch.linalg.vecdot(cdf[..., :-1, :], cdf[..., 1:, :])
    return peak, sent, torch.linalg.vecdot(pair_distance, pairs)  # Eq. 8


def _gradient_wrt_probs(a, weights, pairs, row_norm, bar_norm, g_peak, g_sent, g_dist) -> torch.Tensor | None:
    """d(g_peak R_peak + g_sent R_sent + g_dist R_dist) / d a up to a constant per row (which the softmax Jacobian
    removes); each g is a.shape[:-2], or ``None`` for a term outside the objective (skipped)."""
    grad = None
    if g_dist is not None:
        # d R_dist / d F_i(k) = pair_i (1 - 2 F_{i+1}(k)) + pair_{i-1} (1 - 2 F_{i-1}(k)), and
        # d / d a_i(t) = sum_{k >= t} d / d F_i(k) = (row constant) - sum_{k < t} d / d F_i(k)
        one_minus_2cdf = torch.rsub(a.cumsum(-1), 1, alpha=2)  # (..., T, S)
        pairs = (g_dist[..., None] * pairs).unsqueeze(-1)  # (..., T-1, 1)
        grad_cdf = torch.zeros_like(one_minus_2cdf)
        grad_cdf[..., :-1, :].addcmul_(pairs, one_minus_2cdf[..., 1:, :])
        grad_cdf[..., 1:, :].addcmul_(pairs, one_minus_2cdf[..., :-1, :])
        grad = grad_cdf.sub_(grad_cdf.cumsum(-1))
    if g_peak is not None:  # d H_N(a_i) / d a_ij = -(log a_ij + 1) / log n_i
        coef = (-g_peak[..., None] * weights * row_norm).unsqueeze(-1)  # (..., T, 1)
        grad = coef * _safe_log(a) if grad is None else grad.addcmul_(coef, _safe_log(a))
    if g_sent is not None:  # d R_sent / d a_ij = w_i (log abar_j + 1) / log n_bar
        log_a_bar = _safe_log(weights.unsqueeze(-2) @ a)  # (..., 1, S)
        coef = ((g_sent * bar_norm)[..., None] * weights).unsqueeze(-1)  # (..., T, 1)
        grad = coef * log_a_bar if grad is None else grad.addcmul_(coef, log_a_bar)
    return grad


class _Regularizers(torch.autograd.Function):
    """R_peak, R_sent, R_dist of softmax(scores); saves only the probabilities (and small mask coefficients) for a
    hand-written backward, which skips the terms outside the objective (autograd passes ``None`` for them)."""

    @staticmethod
    def forward(ctx, scores, support, query_mask):
        ctx.set_materialize_grads(False)
        with torch.autocast(scores.device.type, enabled=False):  # in the scores' dtype, also under autocast
            scores = scores.masked_fill(~support, torch.finfo(scores.dtype).min)
            log_a, a = torch.log_softmax(scores, dim=-1), torch.softmax(scores, dim=-1)  # (not exp: slow on CPU)
            # a: (..., T, S), exactly 0 outside the support; log_a finite there
            coefficients = _coefficients(support, query_mask, a)
            ctx.save_for_backward(a, *coefficients)
            return _forward(a, log_a, *coefficients)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_peak, g_sent, g_dist):
        a, *coefficients = ctx.saved_tensors
        with torch.autocast(a.device.type, enabled=False):
            grad = _gradient_wrt_probs(a, *coefficients, g_peak, g_sent, g_dist)
            if grad is not None:
                grad = grad.sub_(torch.linalg.vecdot(a, grad).unsqueeze(-1)).mul_(a)  # softmax backward
        return grad, None, None


def eadra_regularizers(
    scores: torch.Tensor, support: torch.Tensor, query_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R_peak, R_sent and R_dist (Eq. 4, 6, 8) of the attention ``softmax(scores)`` restricted to ``support``.

    Parameters
    ----------
    scores : (..., T, S) float attention logits (q k^T * scaling + additive bias); entries outside ``support`` are
        ignored. Computed in their own dtype: pass float32 (or float64).
    support : (..., T, S) bool, broadcastable to ``scores``.
    query_mask : (..., T) bool, broadcastable to ``scores.shape[:-1]``; every counted query needs a non-empty support.

    Returns
    -------
    ``(R_peak, R_sent, R_dist)``, each of shape ``scores.shape[:-2]`` (e.g. per sentence and head), differentiable
    with respect to ``scores``; the definitions above applied to ``softmax(scores)``.
    """
    return _Regularizers.apply(scores, support, query_mask)
