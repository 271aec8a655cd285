"""EaDRA's regularizers as pure functions of attention probabilities (Araabi, Niculae & Monz, §3, Eq. 1-8).

Shapes: `a` (..., T, S) holds attention distributions, row i that of query i over S keys (leading dims are usually
(B, H)), zero outside `support`; `support` (bool, broadcastable to `a`) marks the keys that count for each
query: the real (non-padding) keys, and for causal self-attention only the query's prefix; `query_mask` (bool,
broadcastable to `a.shape[:-1]`) marks the queries that count (real tokens whose support is not empty). `None`
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

`layer_regularizers` gives all three from the queries and keys of several layers at once (the model's path: one
pass, few operations), with a hand-written backward that keeps only the probabilities and skips the terms outside the
objective; `normalized_entropy` is Eq. 1-2 (the analysis reads attention maps with it). The definitions of the
three terms, differentiable by autograd, are the tests' references (`tests/methods/eadra/test_eadra_math.py`).

Its map-sized work (scores, probabilities, terms; in the backward the probabilities again and the scores' gradient)
is two functions, `_forward_maps` and `_backward_maps`, run under `torch.compile` (CUDA's default;
`hf_headattn.methods.eadra.compiled`, chosen by `hf_headattn.methods.eadra.passes`), where Inductor fuses
their some twenty passes over float32 maps of (layers x batch x heads x T x S) into a few kernels, or one operation at
a time as `mode="reference"`; the eager pass ("eager", the CPU's) runs the same math reorganised by `lean`,
whose operations write fewer maps (`_lean_forward_maps`, `_lean_backward_maps`). On CUDA the products of
half-precision heads run in TF32 (`_matmul_precision`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils.checkpoint
from torch.autograd.function import once_differentiable

from ...hf_compat import softmax_backward
from .compiled import check_mode, run
from .lean import forward_terms, scores_gradient

TERMS = ("peak", "sent", "dist")


def _safe_log(a: torch.Tensor) -> torch.Tensor:
    """log max(a, tiny): finite, so 0 * log 0 = 0 and gradients stay finite."""
    return a.clamp_min(torch.finfo(a.dtype).tiny).log()


def _inverse_log_count(n: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """1 / log n, and 0 where n <= 1 (the normaliser of Eq. 2)."""
    return torch.where(n > 1, 1.0 / n.clamp(min=2).to(dtype).log(), 0.0)


def normalized_entropy(a: torch.Tensor, support: torch.Tensor | None = None) -> torch.Tensor:
    """Length-normalised Shannon entropy of each distribution (Eq. 1-2), in [0, 1].

    Parameters
    ----------
    a
        (..., S) probabilities, zero outside `support`.
    support
        (..., S) bool, broadcastable to `a`; the positions that count (`None`: all S).

    Returns
    -------
    :
        (...) H(a) / log n with n = `support.sum(-1)`; 0 where n <= 1.
    """
    count = torch.tensor(a.shape[-1]) if support is None else support.sum(-1)
    entropy = -torch.linalg.vecdot(a, _safe_log(a))
    return entropy * _inverse_log_count(count, a.dtype)


def _inverse_log(n: torch.Tensor) -> torch.Tensor:
    """1 / log n for float counts n >= 0, and 0 where n <= 1 (log 0 = -inf gives -0, log 1 = 0 gives inf -> 0)."""
    return n.log().reciprocal_().nan_to_num_(posinf=0.0)


def _as_uint8(mask: torch.Tensor) -> torch.Tensor:
    """A bool tensor as uint8: a free view in eager, a conversion under torch.compile (see `_coefficients`)."""
    return mask.to(torch.uint8) if torch.compiler.is_compiling() else mask.view(torch.uint8)


def _coefficients(support, query_mask, dtype) -> tuple[torch.Tensor, ...]:
    """What the masks contribute, computed once per call: `-w_i / log n_i` (..., T) for R_peak, the query weights
    w (..., T) of the mean over real queries, the pairs of consecutive real queries (..., T-1) (bool) and
    1 / log n_bar for the query-averaged attention. (Counted on uint8 views, as bool reductions are slow on the
    CPU; a conversion under torch.compile, whose CUDA lowering refuses a bool-to-uint8 view, and which fuses it.)"""
    real = query_mask.to(dtype)
    weights = real / real.sum(-1, keepdim=True).clamp_(min=1)
    pairs = query_mask[..., :-1] & query_mask[..., 1:]
    keys, queries = _as_uint8(support), _as_uint8(query_mask)
    peak_coef = (_inverse_log(keys.sum(-1).to(dtype)) * weights).neg_()
    union = (keys * queries.unsqueeze(-1)).sum(-2) > 0  # keys some real query sees
    bar_norm = _inverse_log(union.sum(-1).to(dtype))
    return peak_coef, weights, pairs, bar_norm


def _forward(a, a_log_a, peak_coef, weights, pairs, bar_norm) -> tuple[torch.Tensor, ...]:
    """R_peak, R_sent, R_dist as chosen above, from a and sum_j a_j log a_j (..., T), sharing the mask
    coefficients; and log a_bar (which R_sent's gradient needs)."""
    peak = torch.linalg.vecdot(a_log_a, peak_coef)  # Eq. 4
    a_bar = (a * weights.unsqueeze(-1)).sum(-2)  # (..., S): Eq. 5
    log_a_bar = _safe_log(a_bar)
    sent = torch.linalg.vecdot(a_bar, log_a_bar) * bar_norm  # Eq. 6: 0 log 0 = 0 outside the union
    cdf = a.cumsum(-1)  # (..., T, S)
    one_minus_2cdf = torch.rsub(cdf, 1, alpha=2)
    pair_distance = torch.addcmul(cdf[..., :-1, :], cdf[..., 1:, :], one_minus_2cdf[..., :-1, :])  # F_i+F_i+1(1-2F_i)
    return peak, sent, (pair_distance.sum(-1) * pairs).sum(-1), log_a_bar  # Eq. 8


def _gradient_wrt_probs(a, peak_coef, weights, pairs, bar_norm, log_a_bar, g_peak, g_sent, g_dist):
    """d(g_peak R_peak + g_sent R_sent + g_dist R_dist) / d a up to a constant per row (which the softmax Jacobian
    removes); each g is a.shape[:-2], or `None` for a term outside the objective (skipped)."""
    grad = None
    if g_dist is not None:
        # d R_dist / d F_i(k) = pair_i (1 - 2 F_{i+1}(k)) + pair_{i-1} (1 - 2 F_{i-1}(k)), and
        # d / d a_i(t) = sum_{k >= t} d / d F_i(k) = (row constant) - sum_{k < t} d / d F_i(k)
        one_minus_2cdf = torch.rsub(a.cumsum(-1), 1, alpha=2)  # (..., T, S)
        pairs = (g_dist.unsqueeze(-1) * pairs).unsqueeze(-1)  # (..., T-1, 1)
        grad_cdf = torch.zeros_like(one_minus_2cdf)
        grad_cdf[..., :-1, :].addcmul_(pairs, one_minus_2cdf[..., 1:, :])
        grad_cdf[..., 1:, :].addcmul_(pairs, one_minus_2cdf[..., :-1, :])
        grad = grad_cdf.sub_(grad_cdf.cumsum(-1))
    if g_peak is not None:  # d R_peak / d a_ij = -w_i (log a_ij + 1) / log n_i
        coef = (g_peak.unsqueeze(-1) * peak_coef).unsqueeze(-1)  # (..., T, 1)
        grad = coef * _safe_log(a) if grad is None else grad.addcmul_(coef, _safe_log(a))
    if g_sent is not None:  # d R_sent / d a_ij = w_i (log abar_j + 1) / log n_bar
        coef = ((g_sent * bar_norm).unsqueeze(-1) * weights).unsqueeze(-1)  # (..., T, 1)
        log_a_bar = log_a_bar.unsqueeze(-2)  # (..., 1, S)
        grad = coef * log_a_bar if grad is None else grad.addcmul_(coef, log_a_bar)
    return grad


OUTSIDE_SUPPORT = -1e9
"""Added to the scores outside the support in the fused pass (`layer_regularizers`): exp underflows to exactly 0
for any score far below 1e9 in size, and a row without support stays finite. One addition costs a fraction of a
`masked_fill` (about 0.1 vs 0.35 ms for the tiny benchmark's 9 x 16 x 3 x 32 x 32 scores on 2 CPU cores)."""


def _terms(scores, support, query_mask) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, tuple[torch.Tensor, ...]]:
    """The forward of the terms, from scores already masked outside the support (so that a is exactly 0 there and
    log a finite): the three terms, the probabilities a, and what the backward needs besides a (the coefficients
    and log a_bar)."""
    a = torch.softmax(scores, dim=-1)  # (..., T, S) (log a from log_softmax, not a.log(): slow on CPU)
    a_log_a = torch.linalg.vecdot(a, torch.log_softmax(scores, dim=-1))  # (..., T), no log a kept
    del scores  # the callers keep no reference: freed before the next maps are made
    coefficients = _coefficients(support, query_mask, a.dtype)
    peak, sent, dist, log_a_bar = _forward(a, a_log_a, *coefficients)
    return (peak, sent, dist), a, (*coefficients, log_a_bar)


def _scores_gradient(a, coefficients, g_peak, g_sent, g_dist) -> torch.Tensor | None:
    """d(objective) / d scores, through the softmax (`None` when no term is in the objective)."""
    grad = _gradient_wrt_probs(a, *coefficients, g_peak, g_sent, g_dist)
    return None if grad is None else softmax_backward(grad, a)


def _forward_maps(query, key, scaling, shape, support, bias, query_mask, keep_probs: bool):
    """The forward's map-sized work, from the stacked heads (`_stacked`): the terms, the probabilities with
    `keep_probs` (else None), and what the backward needs besides them."""
    terms, a, saved = _terms(_masked_scores(query, key, scaling, shape, support, bias), support, query_mask)
    return terms, (a if keep_probs else None), saved


def _backward_maps(query, key, scaling, shape, support, bias, coefficients, grads):
    """The backward's map-sized work when it recomputes: the probabilities again, and d(objective) / d scores
    (`grads`: g_peak, g_sent, g_dist, each None for a term outside the objective)."""
    a = torch.softmax(_masked_scores(query, key, scaling, shape, support, bias), dim=-1)
    return _scores_gradient(a, coefficients, *grads)


def _lean_probabilities(query, key, scaling, shape, support, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked scores, a = their softmax). (`torch._masked_softmax` would write the masked scores' map once less,
    but took 6 times `add_` and `softmax` on the CPU, whose pass this is.)"""
    scores = _masked_scores(query, key, scaling, shape, support, bias)
    return scores, torch.softmax(scores, dim=-1)


def _lean_forward_maps(query, key, scaling, shape, support, bias, query_mask, keep_probs: bool):
    """`_forward_maps` by `lean.forward_terms` (the eager pass: fewer maps written)."""
    scores, a = _lean_probabilities(query, key, scaling, shape, support, bias)
    coefficients = _coefficients(support, query_mask, a.dtype)
    peak, sent, dist, log_a_bar = forward_terms(scores, a, *coefficients)
    return (peak, sent, dist), (a if keep_probs else None), (*coefficients, log_a_bar)


def _lean_backward_maps(query, key, scaling, shape, support, bias, coefficients, grads):
    """`_backward_maps` by `lean.scores_gradient`."""
    scores, a = _lean_probabilities(query, key, scaling, shape, support, bias)
    return scores_gradient(a, scores, *coefficients, *grads)


def _maps(mode: str):
    """(forward, backward, mode for `compiled.run`): inside a compiled model, or compiled, the reference's."""
    if mode == "eager" and not torch.compiler.is_compiling():
        return _lean_forward_maps, _lean_backward_maps, "eager"
    return _forward_maps, _backward_maps, "eager" if mode == "reference" else mode


@contextlib.contextmanager
def _matmul_precision(dtype: torch.dtype, device: torch.device):
    """TF32 matrix products for half-precision heads on CUDA, outside `torch.compile`: their values (8 or 11
    significant bits, unscaled) are exact in TF32's 11, so the float32 scores are the same, with tensor cores (the
    float32 products took 3.2 ms of an H100 step at transformer-base, `tb-profile.json`); the backward's products
    round the float32 score gradients to 11 bits before they are summed into gradients of the heads' own half
    precision. Float32 and float64 heads keep the user's setting."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16) or torch.compiler.is_compiling():
        yield
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


class _LayerRegularizers(torch.autograd.Function):
    """`layer_regularizers`: the scores are formed inside, and the backward returns each layer's query/key
    gradient directly (one operation for all layers). With `recompute` it keeps nothing of size T x S for the

    - `backward`: it keeps references to the layers' queries and keys (which the attention keeps anyway), and recomputes
    the scores and probabilities there (one more `q k^T` and softmax); otherwise it keeps the probabilities and
    the stacked float32 heads."""

    @staticmethod
    def forward(ctx, num_heads, scaling, recompute, mode, support, query_mask, bias, *queries_and_keys):
        ctx.set_materialize_grads(False)
        layers, first = len(queries_and_keys) // 2, queries_and_keys[0]
        queries, keys = queries_and_keys[:layers], queries_and_keys[layers:]
        ctx.num_heads, ctx.scaling, ctx.mode, ctx.layers = num_heads, scaling, mode, layers
        with torch.autocast(first.device.type, enabled=False), _matmul_precision(first.dtype, first.device):
            query, key, shape = _stacked(queries, keys, num_heads)  # float32 (float64), also under autocast
            forward_maps, _, run_mode = _maps(mode)
            terms, a, saved = run(forward_maps, run_mode, query, key, scaling, shape, support, bias, query_mask,
                                  not recompute)
        kept = () if recompute else (a, query, key)
        ctx.save_for_backward(support, bias, *saved, *queries_and_keys, *kept)
        return terms

    @staticmethod
    @once_differentiable
    def backward(ctx, g_peak, g_sent, g_dist):
        support, bias, *saved = ctx.saved_tensors
        coefficients, rest, layers = saved[:5], saved[5:], ctx.layers
        queries, keys, kept = rest[:layers], rest[layers:2 * layers], rest[2 * layers:]
        first, grads = queries[0], (g_peak, g_sent, g_dist)
        with torch.autocast(first.device.type, enabled=False), _matmul_precision(first.dtype, first.device):
            forward_maps, backward_maps, run_mode = _maps(ctx.mode)
            if kept:
                a, query, key = kept
                if forward_maps is _forward_maps:
                    grad = _scores_gradient(a, coefficients, *grads)
                else:
                    log_a = None if g_peak is None else _safe_log(a)  # (a copy: a saved tensor is not changed)
                    grad = scores_gradient(a.clone(), log_a, *coefficients, *grads)
                del a
            else:
                query, key, shape = _stacked(queries, keys, ctx.num_heads)
                grad = run(backward_maps, run_mode, query, key, ctx.scaling, shape, support, bias, coefficients,
                           grads)  # (L, B, h, T, S)
            if grad is None:
                return (None,) * (7 + 2 * layers)
            grad_bias = grad.sum_to_size(bias.shape) if ctx.needs_input_grad[6] else None  # e.g. LPEA's bias
            shape, grad = grad.shape, grad.flatten(0, 2)  # (L * B * h, T, S)
            zero = grad.new_zeros(())  # (scaled in the product: one write of each gradient)
            grad_query = _unstack_heads(torch.baddbmm(zero, grad, key, beta=0, alpha=ctx.scaling), shape, queries)
            grad_key = _unstack_heads(torch.baddbmm(zero, grad.transpose(1, 2), query, beta=0, alpha=ctx.scaling),
                                      shape, keys)
        return None, None, None, None, None, None, grad_bias, *grad_query, *grad_key


def _stacked(queries, keys, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """The first `num_heads` heads of all layers stacked in float32 (float64 for float64 heads): (L * B * h, T, D)
    and (L * B * h, S, D), T and S the longest lengths, and the scores' shape (L, B, h, T, S)."""
    dtype = torch.float64 if queries[0].dtype == torch.float64 else torch.float32
    length, key_length = max(q.shape[2] for q in queries), max(k.shape[2] for k in keys)
    query = _stack_heads(queries, num_heads, dtype, length)
    key = _stack_heads(keys, num_heads, dtype, key_length)
    return query, key, (len(queries), queries[0].shape[0], num_heads, length, key_length)


def _masked_scores(query, key, scaling, shape, support, bias) -> torch.Tensor:
    """`query @ key^T * scaling` (scaled after the product, which is then exact in TF32 for half-precision
    heads, `_matmul_precision`) viewed as `shape`, plus `bias` (or 0) on the support and
    OUTSIDE_SUPPORT elsewhere.

    Not [`hf_headattn.probabilities.attention_probabilities`][hf_headattn.probabilities.attention_probabilities] (issue
    #65's one scores -> mask -> softmax helper), although its probabilities equal this softmax bit for bit on the CPU:
    every EaDRA pass reads these masked scores themselves (`log_softmax` in `_terms`, E_a[s] - LSE in
    `lean.forward_terms` and its gradient), which the helper does not return, so it would cost a second product and
    scores map; and it writes the product and its scaling as two maps where `baddbmm`'s `alpha` writes one."""
    scores = torch.baddbmm(query.new_zeros(()), query, key.transpose(1, 2), beta=0, alpha=scaling).view(shape)
    return scores.add_(torch.where(support, 0.0 if bias is None else bias, OUTSIDE_SUPPORT))


def _runs(lengths: list[int]) -> list[tuple[int, int]]:
    """(start, end) of the runs of equal consecutive `lengths`."""
    starts = [i for i in range(len(lengths)) if i == 0 or lengths[i] != lengths[i - 1]]
    return list(zip(starts, starts[1:] + [len(lengths)]))


def _stack_heads(tensors, num_heads: int, dtype: torch.dtype, length: int) -> torch.Tensor:
    """(L * B * h, length, D) contiguous copy in `dtype` of the first h heads of L tensors (B, H, n_l, D),
    zero-padded to `length` (each run of equal lengths is cut to h heads and stacked in one copy, then padded)."""
    parts = []
    for start, end in _runs([t.shape[2] for t in tensors]):
        run = tensors[start:end]
        run = run if num_heads == run[0].shape[1] else [t[:, :num_heads] for t in run]
        stacked = torch.stack(run)  # (l, B, h, n, D)
        if stacked.shape[3] < length:
            stacked = torch.nn.functional.pad(stacked, (0, 0, 0, length - stacked.shape[3]))
        parts.append(stacked)
    stacked = parts[0] if len(parts) == 1 else torch.cat(parts)
    return stacked.to(dtype).flatten(0, 2)  # a view of the stacked copy unless the dtype changes


def _token_major(tensors) -> bool:
    """Whether every (B, H, n, D) tensor is laid out as (B, n, H, D) in memory, as the attention modules make them
    (`proj(x).view(B, n, H, D).transpose(1, 2)`)."""
    return all(t.transpose(1, 2).is_contiguous() for t in tensors)


def _unstack_heads(grad: torch.Tensor, shape, inputs) -> tuple[torch.Tensor, ...]:
    """The gradients of the L `inputs` (B, H, n_l, D) of `_stack_heads`, in their dtype, zero on the heads
    it left out.

    `grad`: (L * B * h, ., D); `shape`: (L, B, h, ...). Inputs laid out as (B, n, H, D) in memory
    (`_token_major`) get gradients laid out so too: autograd then adds them to the attention's own gradients,
    and reshapes the sum back to the projection's output, without a copy."""
    heads, dtype, lengths = inputs[0].shape[1], inputs[0].dtype, [x.shape[2] for x in inputs]
    grad = grad.view(*shape[:3], *grad.shape[1:])  # (L, B, h, n, D)
    regularized, length = grad.shape[2], grad.shape[3]
    if _token_major(inputs):  # one copy into (L, B, n, H, D), the left-out heads zero
        rows = grad.transpose(2, 3).to(dtype)  # (L, B, n, h, D)
        rows = (torch.nn.functional.pad(rows, (0, 0, 0, heads - regularized)) if regularized < heads
                else rows.contiguous())
        grad = rows.transpose(2, 3)  # (L, B, H, n, D)
    else:
        if regularized < heads:
            grad = torch.nn.functional.pad(grad, (0, 0, 0, 0, 0, heads - regularized))
        grad = grad.to(dtype)
    runs = _runs(lengths)
    if len(runs) == 1 and lengths[0] == length:
        return grad.unbind(0)
    return tuple(layer for start, end in runs for layer in grad[start:end, :, :, :lengths[start]].unbind(0))


def layer_regularizers(
    queries, keys, num_heads: int, scaling: float, support: torch.Tensor, query_mask: torch.Tensor,
    bias: torch.Tensor | None = None, recompute: bool = True, mode: str = "eager",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R_peak, R_sent and R_dist (Eq. 4, 6, 8) of the first `num_heads` heads of several layers, fused into one pass.

    The terms of the attention `softmax(scores)` restricted to `support`, with `scores = stack([q[:, :h] @
    k[:, :h]^T * scaling for q, k in zip(queries, keys)]) + bias`, computed in float32 (float64 for float64 inputs)
    whatever the inputs' dtype, with each operation run once for all layers and gradients returned straight to each
    layer's queries and keys. Every counted query needs a non-empty support. Layers of
    different lengths (e.g. encoder self-, decoder self- and cross-attention together) are zero-padded to the longest
    query and key lengths T and S; `support` and `query_mask` must then leave the padding out.

    Parameters
    ----------
    queries, keys
        sequences of L tensors (B, H, T_l, D) and (B, H, S_l, D), the layers' heads.
    num_heads
        h, the regularized heads (the first h).
    scaling
        the attention's scaling of q k^T.
    support
        bool, broadcastable to (L, B, h, T, S); query_mask : bool, broadcastable to (L, B, h, T).
    bias : None or float additive bias broadcastable to (L, B, h, T, S) (an additive attention mask); it gets a
        gradient when it requires one (SEA's LPEA bias).
    recompute : keep nothing of size (L, B, h, T, S) for the backward pass, and recompute the probabilities there
        from the queries and keys (the default: the attention keeps those anyway; one more `q k^T` and softmax);
        False keeps the probabilities and float32 copies of the heads instead.
    mode : "eager", "compiled" or "compiled_or_eager": how the map-sized work runs
        (`hf_headattn.methods.eadra.compiled`); the model's passes take the one
        `hf_headattn.methods.eadra.passes.layer_regularizers` chooses from the `implementation` setting.
        "eager" runs `lean`'s operations (fewer maps written), the compiled modes (and any pass inside a
        compiled model) those of `_forward_maps` and `_backward_maps`, which Inductor fuses;
        "reference" runs the latter eagerly (the tests' and benchmarks' reference for "eager": the same values).

    Returns
    -------
    :
        `(R_peak, R_sent, R_dist)`, each (L, B, h): per layer, sentence and head.
    """
    if mode != "reference":
        check_mode(mode)
    args = (num_heads, scaling, recompute, mode, support, query_mask, bias, *queries, *keys)
    if recompute and torch.compiler.is_compiling():
        # a compiled model's graph holds forward and backward at once, and its partitioner keeps the maps (it does not
        # recompute matrix products): marked as a checkpoint, the pass is recomputed in the backward there too
        return torch.utils.checkpoint.checkpoint(_LayerRegularizers.apply, *args, use_reentrant=False)
    return _LayerRegularizers.apply(*args)
