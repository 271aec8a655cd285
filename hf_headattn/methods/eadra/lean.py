"""EaDRA's terms and their scores' gradient writing few maps of (queries x keys): the eager pass (issue #63).

The same values as `equations._forward` and `equations._gradient_wrt_probs` (the reference, which the
compiled pass fuses), reorganised for a pass run one operation at a time, where each operation writes its whole
(..., T, S) output to memory (at transformer-base a float32 map of the 18 layers' 6 regularized heads is 0.84 GiB):

* entropy (Eq. 1): sum_j a_j log a_j = E_a[s] - LSE with s the masked scores; E_a[s] is a row's dot product, a batched
  (1 x S) @ (S x 1) product that writes one number per row, and LSE = s_j - log a_j at the largest a_j (whose log is
  precise), a reduction: no `log_softmax` map, no product map;
* the query-averaged attention (Eq. 5): w^T a, a product writing (..., S);
* the distance of consecutive rows (Eq. 8), with F the cumulative sums and G = F - 1/2 (one `cumsum` of a with
  a_0 - 1/2 in its first column): F_a + F_b - 2 F_a F_b = 1/2 - 2 G_a G_b, so a^T D b = S / 2 - 2 G_a . G_b, a dot
  product of two consecutive rows of the flattened (rows, S) matrix, again one number per pair;
* the gradient of a weighted sum of the terms with respect to the probabilities, up to a constant per row (which the
  softmax's Jacobian removes): g_dist c_i (1 - 2 F_{i+1}(k)) summed over k >= t is, up to such a constant,
  2 g_dist c_i C_{i+1}(t - 1), C = cumsum(G) (the same for the pair's other row), so the distance term's part is two
  neighbour rows of one map shifted by a column, and R_peak's part is the scores themselves (log a = s - LSE);
  R_sent's part and the row constants are of rank one (a coefficient per row times a vector per head), added by one
  `baddbmm_`, and the product with a (the softmax's Jacobian) is one `mul_`.

Forward: the scores, a and G (3 maps). Backward: the scores and a again, G, C, the shifted neighbours (2 writes), the
rank-one part and the product with a (7 maps; against 3 + 13 for the reference's eager operations).
"""

from __future__ import annotations

import contextlib
import functools

import torch


@contextlib.contextmanager
def _float32_products(device: torch.device):
    """Full float32 matrix products on CUDA while the terms are formed from products (the pass runs half-precision
    heads' q k^T in TF32, `equations._matmul_precision`: exact there, not for the row dot products here, whose
    differences of sums of S terms would lose the distances)."""
    previous = torch.get_float32_matmul_precision()
    if device.type != "cuda" or previous == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _exact(function):
    """`function(a, ...)` under `_float32_products` for a's device."""

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        with _float32_products(args[0].device):
            return function(*args, **kwargs)

    return wrapped


def _safe_log(a: torch.Tensor) -> torch.Tensor:
    return a.clamp_min(torch.finfo(a.dtype).tiny).log()


def rowdot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """sum_j x[..., j] y[..., j] for two contiguous tensors of one shape (..., S), as a batched (1 x S) @ (S x 1)
    product: it writes the (...) result only, never the (..., S) elementwise product."""
    return (x.reshape(-1, 1, x.shape[-1]) @ y.reshape(-1, y.shape[-1], 1)).view(x.shape[:-1])


def _centred_cdf(a: torch.Tensor) -> torch.Tensor:
    """F - 1/2 with F = cumsum(a) along the keys, written once: the cumulative sums of a with 1/2 taken from its first
    column (which is restored: a is left as it was)."""
    first = a[..., 0].clone()
    a[..., 0] -= 0.5
    centred = a.cumsum(-1)
    a[..., 0] = first
    return centred


def _neighbour_dots(x: torch.Tensor) -> torch.Tensor:
    """(..., T-1): x_i . x_{i+1} for the consecutive rows of a contiguous (..., T, S) tensor, from the (rows, S) matrix
    of all its rows (views of it shifted by one row; the products across two heads' last and first rows are dropped)."""
    flat = x.view(-1, x.shape[-1])
    dots = rowdot(flat[:-1], flat[1:])
    return torch.nn.functional.pad(dots, (0, 1)).view(x.shape[:-1])[..., :-1]


@_exact
def forward_terms(scores, a, peak_coef, weights, pairs, bar_norm) -> tuple[torch.Tensor, ...]:
    """R_peak, R_sent, R_dist and log a_bar, as `equations._forward` gives them, from a (..., T, S), the
    attention on the support (contiguous; modified in place and restored), the scores (log a up to a constant per row
    on the support, finite elsewhere) and the mask coefficients."""
    largest, where = a.max(-1, keepdim=True)  # LSE = s_j - log a_j at a's largest (scores may be unmasked)
    lse = (scores.gather(-1, where) - largest.log()).squeeze(-1)
    peak = torch.linalg.vecdot(rowdot(a, scores) - lse, peak_coef)  # Eq. 4: sum_j a_j log a_j = E_a[s] - LSE
    a_bar = (weights.unsqueeze(-2) @ a).squeeze(-2)  # (..., S): Eq. 5
    log_a_bar = _safe_log(a_bar)
    sent = torch.linalg.vecdot(a_bar, log_a_bar) * bar_norm  # Eq. 6
    pair_distance = a.shape[-1] / 2 - 2 * _neighbour_dots(_centred_cdf(a))  # a^T D b = S / 2 - 2 G_a . G_b
    return peak, sent, (pair_distance * pairs).sum(-1), log_a_bar  # Eq. 8


@_exact
def scores_gradient(a, log_a, peak_coef, weights, pairs, bar_norm, log_a_bar, g_peak, g_sent, g_dist,
                    scale: float = 1.0) -> torch.Tensor | None:
    """`scale` times d(g_peak R_peak + g_sent R_sent + g_dist R_dist) / d scores through the softmax, as
    `equations._scores_gradient` gives it; `log_a` is log a up to a constant per row (the masked scores; only
    read for R_peak), each g of a.shape[:-2] or `None` for a term outside the objective. a (contiguous) is modified
    in place and restored."""
    grad = None
    if g_dist is not None:
        c = (2 * scale) * g_dist.unsqueeze(-1) * pairs  # (..., T-1): pair (i, i+1)'s weight, twice
        cumulative = _centred_cdf(a).cumsum_(-1)  # C = cumsum(F - 1/2)
        grad = torch.empty_like(a)
        grad[..., 0].zero_()
        grad[..., -1, 1:].zero_()
        c = c.unsqueeze(-1)
        torch.mul(cumulative[..., 1:, :-1], c, out=grad[..., :-1, 1:])  # row i: c_i C_{i+1}(t - 1)
        grad[..., 1:, 1:].addcmul_(cumulative[..., :-1, :-1], c)  # row i: + c_{i-1} C_{i-1}(t - 1)
        del cumulative
    if g_peak is not None:  # d R_peak / d a_ij = -w_i (log a_ij + 1) / log n_i
        coef = (scale * g_peak.unsqueeze(-1) * peak_coef).unsqueeze(-1)
        grad = log_a * coef if grad is None else grad.addcmul_(log_a, coef)
    # the rank-one parts: R_sent's w_i (log abar_j + 1) / log n_bar, and minus each row's <a_i, grad_i>
    batch = a.shape[:-2]
    row_constant = 0 if grad is None else rowdot(a, grad)
    rows, columns = [], []
    if g_sent is not None:
        coef = (scale * (g_sent * bar_norm)).unsqueeze(-1) * weights  # (..., T)
        row_constant = row_constant + coef * (a @ log_a_bar.unsqueeze(-1)).squeeze(-1)
        rows.append(coef.expand(*batch, a.shape[-2]))
        columns.append(log_a_bar.expand(*batch, a.shape[-1]))
    if grad is None and not rows:
        return None
    rows.append(-torch.as_tensor(row_constant).expand(*batch, a.shape[-2]))
    columns.append(a.new_ones(()).expand(*batch, a.shape[-1]))
    rows = torch.stack(rows, -1).reshape(-1, a.shape[-2], len(columns))  # (N, T, r)
    columns = torch.stack(columns, -2).reshape(-1, len(columns), a.shape[-1])  # (N, r, S)
    if grad is None:
        grad = torch.bmm(rows, columns).view(a.shape)
    else:
        grad.view(-1, *a.shape[-2:]).baddbmm_(rows, columns)
    return grad.mul_(a)
