"""EaDRA's regularizer pass as tiled Triton kernels that never write a (queries x keys) map (`eadra={"implementation":
"triton"}`; issue #63): the scores and probabilities of R_peak, R_sent and R_dist (Araabi, Niculae & Monz, Eq. 4, 6,
8) are recomputed tile by tile from the stacked heads, flash-attention style, in the forward and in the backward
(the kernels: `hf_headattn.methods.eadra.tiled_kernels`).

Same math as `hf_headattn.methods.eadra.equations` (its choices hold here: H_N with n_i the query's support, the
mean over real queries, R_dist as sum_k F_i + F_{i+1} - 2 F_i F_{i+1} over the cumulative sums F). One "row block"
n is one (layer, sentence, head) of the stacked heads (`equations._stack_heads`): query (N, T, D), key (N, S, D),
N = L * B * h; the scores are `scaling * q_i . k_j + bias_ij` on the support and `OUTSIDE_SUPPORT` (-1e9) added
elsewhere, read tile by tile from the (broadcast, never expanded) `support` and `bias`.

Two custom operators (`torch.library.custom_op`, with fake implementations giving their true output shapes, so that
`FakeTensorMode` counts exactly what the kernels write and `torch.compile` calls them as opaque operators):

* `hf_headattn::eadra_tiled_forward`: per row its max score m_i and log sum_j exp(s_ij - m_i) (the log-sum-exp in
  two parts: exp(s - LSE) would lose |LSE| 2^-24 of every probability), sum_j a_ij log a_ij (Eq. 4), sum_k F_i(k)
  and sum_k F_i(k) F_{i+1}(k) (Eq. 8), stacked as (5, N, T), and abar (N, S) (Eq. 5). The three terms are then
  O(T + S) reductions in PyTorch.
* `hf_headattn::eadra_tiled_backward`: the layers' query and key gradients, (L, B, T, heads, D) and (L, B, S, heads,
  D) in the heads' dtype (the attention modules' token-major layout, zero on the heads left out: no copy after it),
  from the heads, the saved m, log-sum and log abar, and the per-row coefficients of the terms in the objective.

Saved for the backward: the two row statistics and log abar, the small mask coefficients and the layers' heads
(which the attention keeps anyway). Nothing of size T x S, in the forward or the backward.

Refused with a `ValueError` naming what is missing (no silent fallback: choose "auto", "eager" or "compiled" there):
no Triton installed, a `bias` that requires a gradient (SEA's LPEA bias), float64 heads, CPU tensors outside
Triton's interpreter (`TRITON_INTERPRET=1` set before Triton is imported). A bias without gradient (an additive
mask) is supported.
"""

from __future__ import annotations

import torch

from ...triton_support import triton_kernel_device
from .equations import _coefficients, _safe_log, _stack_heads
from .tiled_kernels import KERNELS as kernels

BLOCK_M, BLOCK_N = 64, 64
"""Tile sizes on a GPU (queries x keys); the head dimension is one tile (padded to a power of two, at least 16)."""
STATISTICS = 5
"""The per-row statistics of the forward operator: max, log-sum, sum a log a, sum F, sum F_i F_{i+1}."""


def available() -> bool:
    """Whether Triton is importable (the kernels run on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1)."""
    return kernels.triton is not None


def supports(query: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether these stacked heads (and bias) can run here: Triton present, CUDA tensors (any device under the
    interpreter), float32/float16/bfloat16 heads, and no bias gradient."""
    if not available() or query.dtype not in (torch.float32, *kernels.HALF) or not triton_kernel_device(query.device):
        return False
    return bias is None or not bias.requires_grad


def _check(query: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Raise `ValueError` naming what the tiled pass cannot run (`eadra={"implementation": "triton"}`)."""
    if not available():
        raise ValueError("eadra implementation='triton' needs Triton (pip install triton); expected 'auto', 'eager' "
                         "or 'compiled' without it")
    if bias is not None and bias.requires_grad:
        raise ValueError("eadra implementation='triton' gives no bias gradient (SEA's LPEA bias on a regularized "
                         "layer); expected 'auto', 'eager' or 'compiled' with LPEA")
    if not supports(query, bias):
        raise ValueError(f"eadra implementation='triton' runs float32/float16/bfloat16 heads on CUDA (or on the CPU "
                         f"under TRITON_INTERPRET=1), got {query.dtype} heads on {query.device}")


def _strided(x: torch.Tensor, shape) -> tuple[torch.Tensor, tuple[int, ...]]:
    """A view of `x` broadcast to `shape` (stride 0 on broadcast dimensions, nothing copied) and its strides; bool as
    uint8 (same bytes)."""
    x = torch.broadcast_to(x, shape)
    if x.dtype == torch.bool:
        x = x.view(torch.uint8)
    return x, tuple(x.stride())


def _rows(x: torch.Tensor, shape) -> torch.Tensor:
    """A small (..., n) per-row tensor broadcast to shape (L, B, h, n), as a contiguous float32 (N, n)."""
    return torch.broadcast_to(x, shape).reshape(-1, shape[-1]).to(torch.float32).contiguous()


def _launch_args(query, key, support, bias, shape):
    L, B, h, T, S = shape
    sup, sup_strides = _strided(support, shape)
    if bias is None:
        bias_t, bias_strides = sup, (0,) * 5
    else:
        bias_t, bias_strides = _strided(bias.detach(), shape)
    tensors = (query, key, sup, bias_t)
    strides = (*query.stride(), *key.stride(), *sup_strides, *bias_strides)
    return tensors, strides, (B, h, T, S, query.shape[-1])


def _forward_kernels(query: torch.Tensor, key: torch.Tensor, support: torch.Tensor, bias: torch.Tensor | None,
                     weights: torch.Tensor, scaling: float, shape: list[int], block_m: int,
                     block_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`hf_headattn::eadra_tiled_forward` (module docstring): the (5, N, T) row statistics and abar (N, S).
    `weights`: the query weights as a contiguous float32 (N, T)."""
    _check(query, bias)
    kernels.build()
    L, B, h, T, S = shape
    N, f32 = L * B * h, dict(dtype=torch.float32, device=query.device)
    tensors, strides, sizes = _launch_args(query, key, support, bias, shape)
    block_d = max(16, kernels.triton.next_power_of_2(query.shape[-1]))
    meta = dict(HAS_BIAS=bias is not None, PRECISION=kernels.precision(query.dtype), BM=block_m, BN=block_n,
                BD=block_d)
    stats = torch.empty(STATISTICS, N, T, **f32)
    kernels.forward_rows_kernel[(N, kernels.triton.cdiv(T, block_m - 2))](
        *tensors, *stats.unbind(0), *strides, *sizes, float(scaling), **meta, num_warps=8)
    a_bar = torch.empty(N, S, **f32)
    kernels.forward_abar_kernel[(N, kernels.triton.cdiv(S, block_n))](
        *tensors, stats[0], stats[1], weights, a_bar, *strides, *sizes, float(scaling), **meta, num_warps=4)
    return stats, a_bar


def _backward_kernels(query: torch.Tensor, key: torch.Tensor, support: torch.Tensor, bias: torch.Tensor | None,
                      row_max: torch.Tensor, log_sum: torch.Tensor, log_a_bar: torch.Tensor,
                      peak_c: torch.Tensor | None, sent_c: torch.Tensor | None, pair_c: torch.Tensor | None,
                      scaling: float, shape: list[int], heads: int, block_m: int,
                      block_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`hf_headattn::eadra_tiled_backward` (module docstring): the gradients of the layers' queries and keys, in
    the heads' dtype, (L, B, T, heads, D) and (L, B, S, heads, D), zero on the heads past the regularized h (the
    attention modules' token-major layout: autograd adds them to the attention's own gradients without a copy).
    `row_max`, `log_sum` (N, T) and `log_a_bar` (N, S) from the forward; `peak_c`, `sent_c`, `pair_c` (N, T)
    each, contiguous float32, the coefficients of the terms in the objective (None: left out)."""
    _check(query, bias)
    kernels.build()
    L, B, h, T, S = shape
    N, D, f32 = L * B * h, query.shape[-1], dict(dtype=torch.float32, device=query.device)
    key_blocks = kernels.triton.cdiv(S, block_n)
    carries = (torch.empty(N, key_blocks, T, **f32), torch.empty(N, key_blocks, T, **f32)) if pair_c is not None \
        else (row_max, row_max)
    tensors, strides, sizes = _launch_args(query, key, support, bias, shape)
    block_d = max(16, kernels.triton.next_power_of_2(D))
    precision = kernels.precision(query.dtype)
    meta = dict(HAS_BIAS=bias is not None, HAS_PEAK=peak_c is not None, HAS_SENT=sent_c is not None,
                HAS_DIST=pair_c is not None, PRECISION=precision, BM=block_m, BN=block_n, BD=block_d)
    coefficients = [row_max if c is None else c for c in (peak_c, sent_c, pair_c)]
    grad_query, grad_key = (query.new_empty(L, B, n, heads, D) for n in (T, S))
    if heads > h:  # (the heads left out get zeros; the kernels write the others)
        grad_query[..., h:, :].zero_()
        grad_key[..., h:, :].zero_()
    row_dot = torch.empty(N, T, **f32)
    kernels.backward_rows_kernel[(N, kernels.triton.cdiv(T, block_m - 2))](
        *tensors, row_max, log_sum, log_a_bar, *coefficients, grad_query, row_dot, *carries,
        *_output_strides(grad_query), *strides, *sizes,
        float(scaling), key_blocks, **meta, DIFFERENCE_PRECISION="ieee" if precision == "ieee" else "tf32x3",
        num_warps=8)
    kernels.backward_keys_kernel[(N, key_blocks)](
        *tensors, row_max, log_sum, log_a_bar, *coefficients, row_dot, *carries, grad_key, *_output_strides(grad_key),
        *strides, *sizes,
        float(scaling), key_blocks, **meta, num_warps=8)
    return grad_query, grad_key


def _fake_forward(query, key, support, bias, weights, scaling, shape, block_m, block_n):
    L, B, h, T, S = shape
    return query.new_empty(STATISTICS, L * B * h, T, dtype=torch.float32), \
        query.new_empty(L * B * h, S, dtype=torch.float32)


def _output_strides(grad: torch.Tensor) -> tuple[int, ...]:
    """A (L, B, n, heads, D) gradient's strides as the kernels take them: layer, sentence, head, position."""
    return grad.stride(0), grad.stride(1), grad.stride(3), grad.stride(2)


def _fake_backward(query, key, support, bias, row_max, log_sum, log_a_bar, peak_c, sent_c, pair_c, scaling, shape,
                   heads, block_m, block_n):
    L, B, h, T, S = shape
    return tuple(query.new_empty(L, B, n, heads, query.shape[-1]) for n in (T, S))


def _operator(name: str, function, fake):
    """The custom operator `hf_headattn::<name>` running `function`, with `fake` its fake implementation; the one
    already registered when another copy of this module (a checkpoint's remote code) registered it first."""
    namespace = torch.ops.hf_headattn
    if hasattr(namespace, name):
        return getattr(namespace, name)
    operator = torch.library.custom_op(f"hf_headattn::{name}", function, mutates_args=())
    operator.register_fake(fake)
    return operator


forward_operator = _operator("eadra_tiled_forward", _forward_kernels, _fake_forward)
"""`hf_headattn::eadra_tiled_forward` (module docstring)."""
backward_operator = _operator("eadra_tiled_backward", _backward_kernels, _fake_backward)
"""`hf_headattn::eadra_tiled_backward` (module docstring)."""


def forward(query, key, scaling: float, shape, support, bias, coefficients, *, block_m: int = BLOCK_M,
            block_n: int = BLOCK_N):
    """The terms R_peak, R_sent, R_dist (Eq. 4, 6, 8), each (L, B, h), and what the backward needs: `(peak, sent,
    dist), (row_max, log_sum, log_a_bar)`, each row's log-sum-exp in two parts (L, B, h, T) and log abar (L, B, h,
    S). `query`, `key`: the stacked heads (N, T, D), (N, S, D); `shape`: (L, B, h, T, S); `coefficients`:
    `equations._coefficients(support, query_mask, torch.float32)`."""
    L, B, h, T, S = shape
    peak_coef, weights, pairs, bar_norm = coefficients
    bias = None if bias is None else bias.detach()  # (refused with a gradient: `_check`)
    stats, a_bar = forward_operator(query, key, support, bias, _rows(weights, (L, B, h, T)), float(scaling),
                                    list(shape), block_m, block_n)
    row_max, log_sum, a_log_a, cdf_sum, cross = stats.view(STATISTICS, L, B, h, T).unbind(0)
    a_bar = a_bar.view(L, B, h, S)
    peak = torch.linalg.vecdot(a_log_a, peak_coef)  # Eq. 4
    log_a_bar = _safe_log(a_bar)
    sent = torch.linalg.vecdot(a_bar, log_a_bar) * bar_norm  # Eq. 6
    pair_distance = cdf_sum[..., :-1] + cdf_sum[..., 1:] - 2 * cross[..., :-1]  # sum_k F_i + F_i+1 - 2 F_i F_i+1
    dist = (pair_distance * pairs).sum(-1)  # Eq. 8
    return (peak, sent, dist), (row_max, log_sum, log_a_bar)


def backward(query, key, scaling: float, shape, support, bias, coefficients, saved, grads, heads: int, *,
             block_m: int = BLOCK_M, block_n: int = BLOCK_N):
    """`(grad_query, grad_key)` of the layers' heads, (L, B, T, heads, D) and (L, B, S, heads, D) in the stacked
    heads' dtype (zero on the heads past h), or None when no term is in the objective. `saved`: `forward`'s
    `(row_max, log_sum, log_a_bar)`; `grads`: g_peak, g_sent, g_dist, each (L, B, h) or None for a term outside the
    objective (skipped); `heads`: the layers' number of heads."""
    g_peak, g_sent, g_dist = grads
    if g_peak is None and g_sent is None and g_dist is None:
        return None
    L, B, h, T, S = shape
    peak_coef, weights, pairs, bar_norm = coefficients
    row_max, log_sum, log_a_bar = (x.reshape(L * B * h, -1).float().contiguous() for x in saved)
    rows = (L, B, h, T)
    peak_c = None if g_peak is None else _rows(g_peak.unsqueeze(-1) * peak_coef, rows)
    sent_c = None if g_sent is None else _rows((g_sent * bar_norm).unsqueeze(-1) * weights, rows)
    pair_c = None if g_dist is None else _rows(
        torch.nn.functional.pad(torch.broadcast_to(g_dist.unsqueeze(-1) * pairs, (L, B, h, T - 1)), (0, 1)), rows)
    bias = None if bias is None else bias.detach()
    return backward_operator(query, key, support, bias, row_max, log_sum, log_a_bar, peak_c, sent_c, pair_c,
                             float(scaling), list(shape), heads, block_m, block_n)


def _stacked_heads(queries, keys, num_heads: int):
    """`equations._stacked` in the heads' own dtype where it is half precision (half the bytes to copy and read;
    the kernels convert each tile to float32 on loading, and their TF32 products of such values are exact), else
    as they are (float32; float64 is refused)."""
    dtype = queries[0].dtype if queries[0].dtype in kernels.HALF else torch.float32
    length, key_length = max(q.shape[2] for q in queries), max(k.shape[2] for k in keys)
    query = _stack_heads(queries, num_heads, dtype, length)
    key = _stack_heads(keys, num_heads, dtype, key_length)
    return query, key, (len(queries), queries[0].shape[0], num_heads, length, key_length)


def _layers(grad: torch.Tensor, inputs) -> tuple[torch.Tensor, ...]:
    """Each of the L `inputs`' (B, H, n_l, D) gradient: a view of the backward's (L, B, n, H, D) gradient."""
    return tuple(layer[:, :, :x.shape[2]] for layer, x in zip(grad.transpose(2, 3).unbind(0), inputs))


class _TiledLayerRegularizers(torch.autograd.Function):
    """`layer_regularizers`: keeps the layers' queries and keys, the mask coefficients, each row's max and log-sum
    of the scores and log abar per row block; recomputes the rest in the backward."""

    @staticmethod
    def forward(ctx, num_heads, scaling, support, query_mask, bias, block_m, block_n, *queries_and_keys):
        ctx.set_materialize_grads(False)
        layers, first = len(queries_and_keys) // 2, queries_and_keys[0]
        queries, keys = queries_and_keys[:layers], queries_and_keys[layers:]
        ctx.num_heads, ctx.scaling, ctx.layers, ctx.blocks = num_heads, scaling, layers, (block_m, block_n)
        with torch.autocast(first.device.type, enabled=False):
            query, key, shape = _stacked_heads(queries, keys, num_heads)
            coefficients = _coefficients(support, query_mask, torch.float32)
            terms, saved = forward(query, key, scaling, shape, support, bias, coefficients, block_m=block_m,
                                   block_n=block_n)
        ctx.save_for_backward(support, bias, *coefficients, *saved, *queries_and_keys)
        return terms

    @staticmethod
    def backward(ctx, g_peak, g_sent, g_dist):
        support, bias, *rest = ctx.saved_tensors
        coefficients, saved, inputs = rest[:4], rest[4:7], rest[7:]
        queries, keys = inputs[:ctx.layers], inputs[ctx.layers:]
        block_m, block_n = ctx.blocks
        with torch.autocast(queries[0].device.type, enabled=False):
            query, key, shape = _stacked_heads(queries, keys, ctx.num_heads)
            grads = backward(query, key, ctx.scaling, shape, support, bias, coefficients, saved,
                             (g_peak, g_sent, g_dist), queries[0].shape[1], block_m=block_m, block_n=block_n)
            if grads is None:
                return (None,) * (7 + 2 * ctx.layers)
        return (None,) * 7 + (*_layers(grads[0], queries), *_layers(grads[1], keys))


def layer_regularizers(queries, keys, num_heads: int, scaling: float, support: torch.Tensor,
                       query_mask: torch.Tensor, bias: torch.Tensor | None = None, *, block_m: int = BLOCK_M,
                       block_n: int = BLOCK_N) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R_peak, R_sent and R_dist (Eq. 4, 6, 8) of the first `num_heads` heads of several layers, each (L, B, h), as
    `hf_headattn.methods.eadra.equations.layer_regularizers` (same arguments and results, always recomputing), by
    the tiled kernels: nothing of size (L, B, h, T, S) is written. Float32, float16 or bfloat16 heads; `bias`
    without gradient. (Inside a compiled model the heads' device is checked when the operators run.)"""
    if not torch.compiler.is_compiling():
        _check(queries[0], bias)
    return _TiledLayerRegularizers.apply(num_heads, scaling, support, query_mask, bias, block_m, block_n, *queries,
                                         *keys)
