"""EaDRA's tiled regularizer pass (`hf_headattn.methods.eadra.tiled`, `implementation="triton"`) on the CPU, under
Triton's interpreter (`TRITON_INTERPRET=1`, set for the whole test run by the Makefile): R_peak, R_sent, R_dist
(Eq. 4, 6, 8) and the gradients of the queries and keys against the eager pass (float32) and against float64 (the
eager pass on float64 heads, itself checked against the definitions in test_eadra_math.py).

Tiles of 16 queries x 16 keys (the smallest `tl.dot` takes) and lengths that are not multiples of them, so that the
cases cross query tiles (the pair of rows at a tile boundary) and key blocks (the carried softmax statistics and
cumulative sums): layers of different lengths stacked (encoder self-, causal decoder self- and cross-attention),
chosen heads (2 of 3), cross-attention with T != S and an additive bias, half-precision heads, and each of g_peak,
g_sent, g_dist present or None. Small shapes: the interpreter runs each tile in NumPy.
"""

import importlib.util
import os
import sys

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the tiled kernels run on CPU tensors only under Triton's interpreter: TRITON_INTERPRET=1 (make test "
                "sets it)", allow_module_level=True)

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, triton_support
from hf_headattn.methods.eadra import equations, passes, tiled, tiled_kernels

BLOCKS = dict(block_m=16, block_n=16)
SCALING = 0.5
OBJECTIVES = [(0.7, -1.3, 0.9), (1.0, None, None), (None, -0.6, 0.4)]
"""Weights of (R_peak, R_sent, R_dist) in the objective; None: the term is left out (its gradient is None)."""


def layer(kind, B, H, T, S, D, generator, dtype=torch.float32):
    """Queries (B, H, T, D), keys (B, H, S, D), support (B, 1, T, S) and real queries (B, 1, T) of one layer with
    padding in the second sentence: "encoder" (T = S), "decoder" (causal), "cross"."""
    q = torch.randn(B, H, T, D, generator=generator) * 1.5
    k = torch.randn(B, H, S, D, generator=generator) * 1.5
    keys = torch.arange(S)[None] < torch.tensor([S, S - 6])[:, None]  # (B, S)
    if kind == "encoder":
        support, real = keys[:, None, :].expand(B, T, S), keys
    elif kind == "decoder":
        real = torch.arange(T)[None] < torch.tensor([T, T - 4])[:, None]
        support = real[:, None, :] & torch.ones(T, S, dtype=torch.bool).tril()
        real = real & support.any(-1)
    else:
        real = torch.arange(T)[None] < torch.tensor([T, 5])[:, None]
        support = keys[:, None, :].expand(B, T, S)
    return q.to(dtype), k.to(dtype), support[:, None], real[:, None]


def stacked_layers():
    """An encoder (T = S = 19), a causal decoder (17) and a cross-attention layer (17 x 19), padded together to
    T = S = 19 as the model stacks them (the padding in no support and no query)."""
    g = torch.Generator().manual_seed(0)
    specs = [("encoder", 19, 19), ("decoder", 17, 17), ("cross", 17, 19)]
    parts = [layer(kind, 2, 3, t, s, 6, g) for kind, t, s in specs]
    T, S = 19, 19
    pad = torch.nn.functional.pad
    support = torch.stack([pad(p[2], (0, S - p[2].shape[-1], 0, T - p[2].shape[-2])) for p in parts])
    queries = torch.stack([pad(p[3], (0, T - p[3].shape[-1])) for p in parts])
    return [p[0] for p in parts], [p[1] for p in parts], support, queries


def run_passes(queries, keys, support, query_mask, bias=None, num_heads=2, float64=True):
    """The terms, with their graphs, of the tiled pass, the eager pass (and the eager pass in float64), and each
    one's inputs."""
    out = {}
    for name, dtype in (("triton", None), ("eager", None), ("float64", torch.float64))[:3 if float64 else 2]:
        inputs = [(x if dtype is None else x.to(dtype)).detach().requires_grad_() for x in (*queries, *keys)]
        qs, ks = inputs[:len(queries)], inputs[len(queries):]
        b = None if bias is None else bias.to(dtype or bias.dtype)
        if name == "triton":
            terms = tiled.layer_regularizers(qs, ks, num_heads, SCALING, support, query_mask, b, **BLOCKS)
        else:
            terms = equations.layer_regularizers(qs, ks, num_heads, SCALING, support, query_mask, b)
        out[name] = (terms, inputs)
    return out


def gradients(terms, inputs, weights):
    objective = sum(w * t.sum() for w, t in zip(weights, terms) if w is not None)
    return torch.autograd.grad(objective, inputs, retain_graph=True)


def assert_near(got, expected, rel):
    """max |got - expected| <= rel * max |expected| (a norm-wise relative error; the entries near 0 of a gradient
    have no relative precision of their own)."""
    got, expected = got.double(), expected.double()
    error, scale = (got - expected).abs().max().item(), expected.abs().max().item()
    assert error <= rel * scale + 1e-12, f"max abs error {error:.3g}, max abs value {scale:.3g}"


def check(out, objectives, num_heads=2, rel=1e-5):
    for name in ("eager", "float64"):  # the terms
        for got, expected in zip(out["triton"][0], out[name][0]):
            assert got.shape == expected.shape and got.dtype == torch.float32
            assert_near(got, expected, rel)
    for weights in objectives:
        got = gradients(*out["triton"], weights)
        assert all(g[:, num_heads:].eq(0).all() for g in got)  # the heads left out get nothing
        for name in ("eager", "float64"):
            for g, expected in zip(got, gradients(*out[name], weights)):
                assert g.shape == expected.shape and g.dtype == out["triton"][1][0].dtype
                assert_near(g, expected, rel)


@pytest.mark.slow  # (5 s: every objective interpreted over stacked layers; make test runs it)
def test_stacked_layers_of_different_lengths_and_each_objective():
    """Encoder, causal decoder and cross-attention padded to one pass, 2 of 3 heads, two query tiles and two key
    blocks: terms and query/key gradients as the eager pass's and float64's, whichever terms are in the
    objective."""
    check(run_passes(*stacked_layers()), OBJECTIVES)


def test_cross_attention_with_an_additive_bias():
    """T = 9 queries over S = 35 keys (three key blocks, the last of 3), a support broadcast over queries and
    heads (stride 0, never expanded), an additive bias without gradient broadcast over heads."""
    g = torch.Generator().manual_seed(1)
    q, k, support, query_mask = layer("cross", 2, 3, 9, 35, 5, g)
    key_padding = support[:, :, :1, :]  # (B, 1, 1, S)
    bias = torch.randn(2, 1, 9, 35, generator=g)
    check(run_passes([q], [k], key_padding, query_mask, bias), [(0.7, -1.3, 0.9), (None, None, 1.0)])


def test_half_precision_heads():
    """bfloat16 heads are read as they are (converted per tile): terms and gradients as the eager pass's on the
    same heads (which computes in float32); the gradients in bfloat16."""
    g = torch.Generator().manual_seed(2)
    q, k, support, query_mask = layer("decoder", 2, 2, 20, 20, 8, g, dtype=torch.bfloat16)
    out = run_passes([q], [k], support, query_mask, num_heads=2, float64=False)
    for got, expected in zip(out["triton"][0], out["eager"][0]):
        assert_near(got, expected, 1e-5)
    for got, expected in zip(gradients(*out["triton"], (0.7, -1.3, 0.9)), gradients(*out["eager"], (0.7, -1.3, 0.9))):
        assert got.dtype == torch.bfloat16
        assert_near(got.float(), expected.float(), 1e-2)  # one bfloat16 rounding


def test_what_is_saved_written_and_refused():
    """The forward saves two statistics per query (the log-sum-exp as max and log-sum) and log abar per key (no
    map); the fake operators give the kernels' true outputs; no term in the objective gives no gradient; a bias
    with a gradient (LPEA), float64 heads and (outside the interpreter) CPU heads are refused, naming why."""
    g = torch.Generator().manual_seed(3)
    q, k, support, query_mask = layer("encoder", 2, 2, 7, 7, 4, g)
    query, key, shape = tiled._stacked_heads([q], [k], 2)
    coefficients = equations._coefficients(support, query_mask, torch.float32)
    terms, saved = tiled.forward(query, key, SCALING, shape, support, None, coefficients, **BLOCKS)
    assert [x.shape for x in saved] == [(1, 2, 2, 7)] * 3 and all(t.shape == (1, 2, 2) for t in terms)
    scores = equations._masked_scores(query, key, SCALING, shape, support, None)
    torch.testing.assert_close(saved[0] + saved[1], scores.logsumexp(-1))
    assert tiled.backward(query, key, SCALING, shape, support, None, coefficients, saved, (None, None, None),
                          2) is None
    weights = tiled._rows(coefficients[1], (1, 2, 2, 7))
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = [mode.from_tensor(x) for x in (query, key, support, weights)]
        stats, a_bar = tiled.forward_operator(*fake[:3], None, fake[3], SCALING, list(shape), 16, 16)
        grads = tiled.backward_operator(*fake[:3], None, stats[0], stats[1], a_bar, None, None, stats[2], SCALING,
                                        list(shape), 3, 16, 16)  # (of 3 heads)
    assert (stats.shape, a_bar.shape) == ((5, 4, 7), (4, 7))  # (5 statistics, N = 1 x 2 x 2 row blocks)
    assert [x.shape for x in grads] == [(1, 2, 7, 3, 4)] * 2  # (L, B, T, heads, D): the layers' layout
    bias = torch.zeros(2, 1, 7, 7, requires_grad=True)
    assert not tiled.supports(query, bias) and tiled.supports(query, bias.detach())
    with pytest.raises(ValueError, match="gives no bias gradient"):
        tiled.layer_regularizers([q], [k], 2, SCALING, support, query_mask, bias)
    assert not tiled.supports(query.double())
    with pytest.raises(ValueError, match="float32/float16/bfloat16 heads on CUDA .* got torch.float64 heads on cpu"):
        tiled.forward(query.double(), key.double(), SCALING, shape, support, None, coefficients)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_support, "INTERPRETED", False)  # the CPU outside the interpreter
        with pytest.raises(ValueError, match=r"on CUDA \(or on the CPU under TRITON_INTERPRET=1\), got "
                                             r"torch.float32 heads on cpu"):
            passes.layer_regularizers([q], [k], 2, SCALING, support, query_mask, implementation="triton")


def test_the_module_imports_without_triton(monkeypatch):
    """Without Triton the kernels' module imports, the pass says it is not available and raises a clear error."""
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton -> ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.spec_from_file_location("hf_headattn.methods.eadra._kernels_without",
                                                  tiled_kernels.__file__)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert module.triton is None and not module.interpreting()
    monkeypatch.setattr(tiled, "kernels", module)
    assert not tiled.available() and not tiled.supports(torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="needs Triton"):
        tiled.layer_regularizers([torch.zeros(1, 1, 2, 3)], [torch.zeros(1, 1, 2, 3)], 1, 1.0, None, None)


@pytest.mark.slow
def test_the_operators_compile_without_a_graph_break():
    """Inside `torch.compile(fullgraph=True)` the pass's custom operators are called as they are (opaque): the same
    terms and gradients as eagerly."""
    g = torch.Generator().manual_seed(4)
    q, k, support, query_mask = layer("encoder", 2, 2, 7, 7, 4, g)

    def objective(q, k):
        terms = passes.layer_regularizers([q], [k], 2, SCALING, support, query_mask, implementation="triton")
        return sum(w * t.sum() for w, t in zip((0.7, -1.3, 0.9), terms))

    torch._dynamo.reset()
    results = []
    for function in (objective, torch.compile(objective, backend="aot_eager", fullgraph=True)):
        inputs = [x.detach().requires_grad_() for x in (q, k)]
        value = function(*inputs)
        results.append((value, *torch.autograd.grad(value, inputs)))
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected)


def test_a_model_trains_alike_with_the_tiled_pass():
    """`eadra={"implementation": "triton"}`: chosen heads on all three components, padding: the loss, the terms and
    every parameter's gradient as with the eager pass."""
    def step(implementation):
        torch.manual_seed(0)
        config = HeadAttnMBartConfig(**TINY, dropout=0.0, attention_dropout=0.0, eadra={
            "encoder": {"heads": [1, 3], "alpha_peak": 0.2}, "decoder": {"num_heads": 2}, "cross": {"heads": [0, 2]},
            "implementation": implementation})
        model = HeadAttnMBartForConditionalGeneration(config).train()
        out = model(**batch())
        out.loss.backward()
        return out, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    (eager, eager_grads), (fast, fast_grads) = step("eager"), step("triton")
    torch.testing.assert_close(fast.eadra_loss, eager.eadra_loss, rtol=1e-5, atol=1e-7)
    for name, value in eager.eadra_terms.items():
        torch.testing.assert_close(fast.eadra_terms[name], value, rtol=1e-5, atol=1e-7)
    assert fast_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-4, atol=1e-6)
