"""EaDRA's math (Eq. 1-8) against hand-written loops, gradchecks, bounds and numerically hard rows.

The references live here: ``loop_reference`` (Python loops), the definitions of the three terms, differentiable by
autograd (``peak_regularizer``, ``sentence_regularizer``, ``distance_regularizer``), and ``eadra_regularizers``, the
model's fused pass (:func:`hf_headattn.methods.eadra.equations.layer_regularizers`) on one layer's scores, unfused.
"""

import math

import numpy as np
import pytest
import torch
from torch.autograd.function import once_differentiable

from hf_headattn.methods.eadra.equations import _scores_gradient, _terms, layer_regularizers, normalized_entropy

# ---------------------------------------------------------------- the definitions (autograd)


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


# ---------------------------------------------------------------- one layer's scores, hand-written backward


class _Regularizers(torch.autograd.Function):
    """R_peak, R_sent, R_dist of softmax(scores); saves only the probabilities (and small mask coefficients) for a
    hand-written backward, which skips the terms outside the objective (autograd passes ``None`` for them)."""

    @staticmethod
    def forward(ctx, scores, support, query_mask):
        ctx.set_materialize_grads(False)
        with torch.autocast(scores.device.type, enabled=False):  # in the scores' dtype, also under autocast
            terms, a, saved = _terms(scores.masked_fill(~support, torch.finfo(scores.dtype).min), support, query_mask)
        ctx.save_for_backward(a, *saved)
        return terms

    @staticmethod
    @once_differentiable
    def backward(ctx, g_peak, g_sent, g_dist):
        a, *coefficients = ctx.saved_tensors
        with torch.autocast(a.device.type, enabled=False):
            return _scores_gradient(a, coefficients, g_peak, g_sent, g_dist), None, None


def eadra_regularizers(
    scores: torch.Tensor, support: torch.Tensor, query_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R_peak, R_sent and R_dist (Eq. 4, 6, 8) of the attention ``softmax(scores)`` restricted to ``support``: the
    forward and backward of :func:`~.equations.layer_regularizers` on given scores, one layer unfused.

    Parameters
    ----------
    scores : (..., T, S) float attention logits (q k^T * scaling + additive bias); entries outside ``support`` are
        ignored. Computed in their own dtype: pass float32 (or float64).
    support : (..., T, S) bool, broadcastable to ``scores``.
    query_mask : (..., T) bool, broadcastable to ``scores.shape[:-1]``; every counted query needs a non-empty support.

    Returns
    -------
    ``(R_peak, R_sent, R_dist)``, each of shape ``scores.shape[:-2]`` (e.g. per sentence and head), differentiable
    with respect to ``scores``; the definitions above applied to ``softmax(scores)``, with
    ``eadra_math``'s hand-written backward.
    """
    return _Regularizers.apply(scores, support, query_mask)



def loop_reference(a, support, queries):
    """[R_peak, R_sent, R_dist] per (b, h) with Python loops over everything, straight from Eq. 1-8."""
    a, support, queries = a.numpy(), support.numpy(), queries.numpy()
    B, H, T, S = a.shape
    out = np.zeros((B, H, 3))

    def h_n(p, keys):
        n = len(keys)
        if n <= 1:
            return 0.0
        return -sum(p[j] * math.log(p[j]) for j in keys if p[j] > 0) / math.log(n)

    for b in range(B):
        for h in range(H):
            real = [i for i in range(T) if queries[b, i]]
            supports = {i: [j for j in range(S) if support[b, i, j]] for i in real}
            out[b, h, 0] = sum(h_n(a[b, h, i], supports[i]) for i in real) / max(len(real), 1)
            a_bar = sum(a[b, h, i] for i in real) / max(len(real), 1) if real else np.zeros(S)
            union = sorted({j for i in real for j in supports[i]})
            out[b, h, 1] = -h_n(a_bar, union)
            for i in range(T - 1):
                if queries[b, i] and queries[b, i + 1]:
                    out[b, h, 2] += sum(
                        abs(s - t) * a[b, h, i, s] * a[b, h, i + 1, t] for s in range(S) for t in range(S)
                    )
    return torch.from_numpy(out)


def case(kind, seed=0, dtype=torch.float64):
    """Scores, support (B, T, S), real queries (B, T) and probabilities of a small attention with padding.

    kind: "encoder" (T = S), "cross" (T != S), "causal" (decoder self-attention), "cached" (causal, 2 new queries
    after 4 cached keys, key offset S - T).
    """
    g = torch.Generator().manual_seed(seed)
    B, H = 3, 2
    T, S = {"encoder": (6, 6), "cross": (5, 7), "causal": (6, 6), "cached": (2, 6)}[kind]
    scores = torch.randn(B, H, T, S, generator=g, dtype=dtype) * 2
    source_len = torch.tensor([S, S - 2, S - 3])
    key_real = torch.arange(S)[None] < source_len[:, None]  # (B, S)
    if kind == "encoder":
        query_real = key_real
    else:
        query_real = torch.arange(T)[None] < torch.tensor([T, T - 1, 1])[:, None]
    support = key_real[:, None, :].expand(B, T, S).clone()
    if kind in ("causal", "cached"):
        key_real = torch.arange(S)[None] < torch.tensor([S, S - 1, S - 4])[:, None]
        support = key_real[:, None, :] & torch.ones(T, S, dtype=torch.bool).tril(S - T)
        query_real = support.any(-1) & (torch.arange(T)[None] < torch.tensor([T, T, 1])[:, None])
    probs = torch.softmax(scores.masked_fill(~support[:, None], float("-inf")), -1)
    return scores, support, query_real, probs


KINDS = ["encoder", "cross", "causal", "cached"]


@pytest.mark.parametrize("kind", KINDS)
def test_pure_functions_match_loops(kind):
    scores, support, queries, a = case(kind)
    expected = loop_reference(a, support, queries)
    s, q = support[:, None], queries[:, None]  # broadcast over heads: (B, 1, T, S), (B, 1, T)
    torch.testing.assert_close(peak_regularizer(a, s, q), expected[..., 0])
    torch.testing.assert_close(sentence_regularizer(a, s, q), expected[..., 1])
    torch.testing.assert_close(distance_regularizer(a, q), expected[..., 2])
    torch.testing.assert_close(torch.stack(eadra_regularizers(scores, s, q), -1), expected)


def test_causal_first_query_has_zero_normalised_entropy():
    _, support, _, a = case("causal")
    h_n = normalized_entropy(a, support[:, None])  # (B, H, T)
    assert torch.all(h_n[:, :, 0] == 0)  # it sees one key: H_N := 0
    assert torch.all(h_n[0, :, 1:] > 0)


def test_expected_distance_equals_the_quadratic_form():
    g = torch.Generator().manual_seed(1)
    a, b = torch.rand(2, 4, 9, generator=g, dtype=torch.float64).softmax(-1)
    D = (torch.arange(9)[:, None] - torch.arange(9)[None]).abs().double()
    torch.testing.assert_close(expected_distance(a, b), ((a @ D) * b).sum(-1))
    one_hot = torch.eye(9, dtype=torch.float64)
    torch.testing.assert_close(expected_distance(one_hot[2], one_hot[7]), torch.tensor(5.0, dtype=torch.float64))


@pytest.mark.parametrize("weights", [(0.7, -1.3, 0.05), (0.0, 0.8, 0.02), (1.0, 0.0, 0.0), (0.0, 0.0, 2.0)])
@pytest.mark.parametrize("kind", KINDS)
def test_hand_written_backward_equals_autograd_of_the_definitions(kind, weights):
    scores, support, queries, _ = case(kind, seed=3)
    s, q = support[:, None], queries[:, None]
    x = scores.clone().requires_grad_()
    sum(w * term.sum() for w, term in zip(weights, eadra_regularizers(x, s, q)) if w).backward()  # 0: unused
    y = scores.clone().requires_grad_()
    a = torch.softmax(y.masked_fill(~s, float("-inf")), -1)
    terms = torch.stack([peak_regularizer(a, s, q), sentence_regularizer(a, s, q), distance_regularizer(a, q)], -1)
    (terms * torch.tensor(weights, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)
    assert torch.all(x.grad.masked_select(~s.expand_as(x)) == 0)  # nothing flows to keys outside the support


@pytest.mark.parametrize("kind", ["encoder", "causal", "cached"])
def test_gradcheck_float64(kind):
    scores, support, queries, _ = case(kind, seed=4)
    scores = scores[:2, :1, :4].contiguous() if kind != "cached" else scores[:2, :1].contiguous()
    support, queries = support[:2, None, : scores.shape[2]], queries[:2, None, : scores.shape[2]]
    x = scores.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: eadra_regularizers(t, support, queries), (x,))  # all three
    p = torch.rand(2, 3, 5, dtype=torch.float64).softmax(-1).requires_grad_()
    m = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None].expand(2, 3, 5)
    assert torch.autograd.gradcheck(lambda t: normalized_entropy(t, m), (p,))
    real_queries = torch.tensor([[True, True, True], [True, True, False]])  # (B, T)
    assert torch.autograd.gradcheck(lambda t: sentence_regularizer(t, m, real_queries), (p,))
    assert torch.autograd.gradcheck(lambda t: peak_regularizer(t, m, real_queries), (p,))
    assert torch.autograd.gradcheck(lambda t: distance_regularizer(t), (p,))


def test_bounds_on_random_peaked_and_flat_rows():
    g = torch.Generator().manual_seed(5)
    for temperature in (0.01, 1.0, 100.0):
        scores, support, queries, _ = case("cross", seed=int(temperature))
        a = torch.softmax(scores.masked_fill(~support[:, None], float("-inf")) / temperature, -1)
        h_n = normalized_entropy(a, support[:, None])
        assert torch.all(h_n >= 0) and torch.all(h_n <= 1 + 1e-12)
        r_sent = sentence_regularizer(a, support[:, None], queries[:, None])
        assert torch.all(r_sent <= 0) and torch.all(r_sent >= -1 - 1e-12)
        assert torch.all(distance_regularizer(a, queries[:, None]) >= 0)
    a = torch.rand(2, 5, 8, generator=g).softmax(-1)
    assert torch.all((normalized_entropy(a) >= 0) & (normalized_entropy(a) <= 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_uniform_and_one_hot_rows(dtype):
    S = 7
    uniform = torch.full((1, 4, S), 1.0 / S, dtype=dtype)
    torch.testing.assert_close(normalized_entropy(uniform), torch.ones(1, 4, dtype=dtype))
    torch.testing.assert_close(peak_regularizer(uniform), torch.ones(1, dtype=dtype))
    torch.testing.assert_close(sentence_regularizer(uniform), -torch.ones(1, dtype=dtype))
    diagonal = torch.eye(4, S, dtype=dtype)[None]  # query i attends to key i only
    assert normalized_entropy(diagonal).eq(0).all() and peak_regularizer(diagonal).item() == 0
    assert distance_regularizer(diagonal).item() == 3  # three pairs, each one position apart
    same = torch.zeros(1, 4, S, dtype=dtype)
    same[..., 2] = 1  # every query on key 2: no distance, the sentence distribution is one-hot
    assert distance_regularizer(same).item() == 0 and sentence_regularizer(same).item() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_saturated_softmax_has_finite_values_and_gradients(dtype):
    scores = torch.zeros(2, 3, 5, 5, dtype=dtype)
    scores[0] = torch.eye(5, dtype=dtype) * 1e4  # one-hot after softmax (exact zeros elsewhere)
    scores[1, :, :, 3] = 1e4  # every query on the same key
    scores.requires_grad_()
    support = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    queries = torch.ones(1, 1, 5, dtype=torch.bool)
    out = torch.stack(eadra_regularizers(scores, support, queries), -1)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(scores.grad).all()
    torch.testing.assert_close(out[0, 0], torch.tensor([0.0, -1.0, 4.0], dtype=dtype))  # peak, sent, dist
    torch.testing.assert_close(out[1, 0], torch.tensor([0.0, 0.0, 0.0], dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_scores_under_autocast_give_no_nan(dtype):
    scores, support, queries, _ = case("causal", seed=6, dtype=torch.float32)
    q = torch.randn(3, 2, 6, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype):
        half = (q @ q.transpose(-1, -2)) * 30  # half-precision, saturating logits
        assert half.dtype == dtype
        out = torch.stack(eadra_regularizers(half.float(), support[:, None], queries[:, None]), -1)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()


def layer_case(kind, layers=3, heads=4, D=3, seed=7, dtype=torch.float64):
    """Queries and keys of several layers (B, H, T|S, D) with one support, as the model passes them."""
    _, support, queries, _ = case(kind, seed=seed, dtype=dtype)
    B, T, S = support.shape
    g = torch.Generator().manual_seed(seed)
    qs = [torch.randn(B, heads, T, D, generator=g, dtype=dtype, requires_grad=True) for _ in range(layers)]
    ks = [torch.randn(B, heads, S, D, generator=g, dtype=dtype, requires_grad=True) for _ in range(layers)]
    return qs, ks, support[:, None], queries[:, None]


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("num_heads", [2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_layer_regularizers_equal_the_definitions_layer_by_layer(kind, num_heads, recompute):
    """Terms and gradients (queries, keys, LPEA's bias), whether the backward recomputes the probabilities from the
    queries and keys or takes the forward's (``recompute``)."""
    qs, ks, support, queries = layer_case(kind)
    bias = torch.randn(support.shape[0], 1, *support.shape[2:], dtype=torch.float64, requires_grad=True)  # LPEA's
    weights = (0.7, -1.3, 0.05)
    fused = layer_regularizers(qs, ks, num_heads, 0.4, support, queries, bias, recompute)
    sum(w * t.sum() for w, t in zip(weights, fused)).backward()
    fused_grads = [x.grad.clone() for x in (*qs, *ks, bias)]
    for x in (*qs, *ks, bias):
        x.grad = None
    total = 0
    for layer, (q, k) in enumerate(zip(qs, ks)):  # the definitions, by autograd, one layer at a time
        scores = q[:, :num_heads] @ k[:, :num_heads].transpose(-1, -2) * 0.4 + bias
        a = torch.softmax(scores.masked_fill(~support, float("-inf")), -1)
        expected = loop_reference(a.detach(), support[:, 0], queries[:, 0])
        terms = [peak_regularizer(a, support, queries), sentence_regularizer(a, support, queries),
                 distance_regularizer(a, queries)]
        torch.testing.assert_close(torch.stack([t[layer] for t in fused], -1), expected)
        total = total + sum(w * t.sum() for w, t in zip(weights, terms))
    total.backward()
    for got, x in zip(fused_grads, (*qs, *ks, bias)):
        torch.testing.assert_close(got, x.grad)
    assert all(got[:, num_heads:].eq(0).all() for got in fused_grads[:-1])  # the other heads get nothing


def test_layer_regularizers_gradcheck_float64():
    qs, ks, support, queries = layer_case("causal", layers=2, heads=3, D=2)
    qs, ks = ([q[:1, :, :4, :].detach().requires_grad_() for q in qs],
              [k[:1, :, :4].detach().requires_grad_() for k in ks])
    support, queries = support[:1, :, :4, :4], queries[:1, :, :4]

    for recompute in (True, False):
        def f(*x):
            return layer_regularizers(x[:2], x[2:], 2, 0.7, support, queries, None, recompute)

        assert torch.autograd.gradcheck(f, (*qs, *ks))


def test_layer_regularizers_keep_the_inputs_dtype_and_compute_in_float32():
    qs, ks, support, queries = layer_case("cross", dtype=torch.float32)
    half = [x.detach().bfloat16().requires_grad_() for x in (*qs, *ks)]
    terms = layer_regularizers(half[:3], half[3:], 2, 0.5, support, queries)
    assert all(t.dtype == torch.float32 for t in terms)
    reference = layer_regularizers([x.detach().float() for x in half[:3]], [x.detach().float() for x in half[3:]], 2,
                                   0.5, support, queries)
    for got, expected in zip(terms, reference):
        torch.testing.assert_close(got, expected)
    sum(t.sum() for t in terms).backward()
    assert all(x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all() for x in half)


def test_layers_of_different_lengths_padded_together_equal_separate_passes():
    """Encoder-, decoder- and cross-like layers in one pass: zero-padded to the longest lengths, the padding in no
    support and no query; each layer's terms and its query/key gradients are those of its own pass."""
    groups = [layer_case(kind, layers=layers, seed=seed) for kind, layers, seed in
              (("encoder", 2, 11), ("causal", 1, 12), ("cross", 2, 13))]
    length = max(qs[0].shape[2] for qs, *_ in groups)
    key_length = max(ks[0].shape[2] for _, ks, *_ in groups)
    batch = groups[0][2].shape[0]
    weights = (0.7, -1.3, 0.05)
    separate, grads = [], []
    for qs, ks, support, queries in groups:
        terms = layer_regularizers(qs, ks, 3, 0.4, support, queries)
        sum(w * t.sum() for w, t in zip(weights, terms)).backward()
        separate.append(torch.stack(terms, -1))
        grads += [x.grad.clone() for x in (*qs, *ks)]
        for x in (*qs, *ks):
            x.grad = None
    pad = torch.nn.functional.pad
    support = torch.cat([pad(s.expand(batch, 1, *s.shape[2:]), (0, key_length - s.shape[3], 0, length - s.shape[2]))
                         .expand(len(qs), -1, -1, -1, -1) for qs, _, s, _ in groups])
    queries = torch.cat([pad(q.expand(batch, 1, q.shape[2]), (0, length - q.shape[2])).expand(len(qs), -1, -1, -1)
                         for qs, _, _, q in groups])
    qs = [q for group in groups for q in group[0]]
    ks = [k for group in groups for k in group[1]]
    fused = layer_regularizers(qs, ks, 3, 0.4, support, queries)
    sum(w * t.sum() for w, t in zip(weights, fused)).backward()
    torch.testing.assert_close(torch.stack(fused, -1), torch.cat(separate))
    fused_grads = [x.grad for group in groups for x in (*group[0], *group[1])]
    for got, expected in zip(fused_grads, grads):
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("num_heads", [3, 4])
def test_token_major_inputs_get_gradients_with_their_own_layout(num_heads):
    """Queries and keys laid out as the attention modules make them, proj(x).view(B, T, H, D).transpose(1, 2): the
    fused backward returns gradients with the inputs' strides (autograd then adds them to the attention's own and
    reshapes the sum to proj(x)'s shape without a copy), equal to those of contiguous copies; the layers have
    different lengths (padded together), and the heads left out get zero."""
    groups = [layer_case("cross", layers=2, heads=4), layer_case("causal", layers=1, heads=4, seed=3)]
    length = max(qs[0].shape[2] for qs, *_ in groups)
    key_length = max(ks[0].shape[2] for _, ks, *_ in groups)
    pad = torch.nn.functional.pad
    support = torch.cat([pad(s, (0, key_length - s.shape[3], 0, length - s.shape[2])).expand(len(qs), -1, -1, -1, -1)
                         for qs, _, s, _ in groups])
    queries = torch.cat([pad(q, (0, length - q.shape[2])).expand(len(qs), -1, -1, -1) for qs, _, _, q in groups])
    qs = [q for group in groups for q in group[0]]
    ks = [k for group in groups for k in group[1]]
    head_major = [x.detach().contiguous().requires_grad_() for x in (*qs, *ks)]
    token_major = [x.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for x in head_major]
    weights = (0.7, -1.3, 0.05)
    for inputs in (head_major, token_major):
        terms = layer_regularizers(inputs[:3], inputs[3:], num_heads, 0.4, support, queries)
        sum(w * t.sum() for w, t in zip(weights, terms)).backward()
    for contiguous, strided in zip(head_major, token_major):
        assert strided.grad.stride() == strided.stride()
        torch.testing.assert_close(strided.grad, contiguous.grad)
        assert strided.grad[:, num_heads:].eq(0).all()
