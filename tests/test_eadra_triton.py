"""EaDRA's Triton regularizer pass (:mod:`hf_headattn.eadra_triton`) on the CPU, under Triton's interpreter
(``TRITON_INTERPRET=1``): R_peak, R_sent, R_dist (Eq. 4, 6, 8) and the gradients of the queries and keys against the
eager pass (:func:`hf_headattn.eadra_math.layer_regularizers`, float32) and against float64 (the eager pass on
float64 heads, itself checked against the definitions in ``test_eadra_math``).

Tiles of 16 queries x 16 keys (the smallest ``tl.dot`` takes) and lengths that are not multiples of them, so that
the cases cross query tiles (the pair of rows at a tile boundary) and key blocks (the carried softmax statistics and
cumulative sums): layers of different lengths stacked (padding of keys and queries, encoder self-, causal decoder
self- and cross-attention), chosen heads (2 of 3), cross-attention with T != S and an additive bias, half-precision
heads, and each of g_peak, g_sent, g_dist present or ``None``. Small shapes: the interpreter runs each tile in NumPy.

The interpreter must be chosen before Triton is imported (Triton's own library functions are built then), and the
test session has usually imported it already (PyTorch does): unless this process runs under TRITON_INTERPRET=1 from
its start, one test runs this module again in a subprocess with TRITON_INTERPRET=1 set before anything is imported,
and the others are skipped here.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
import triton.language as tl
from triton.runtime.jit import JITFunction

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, eadra_math, eadra_triton

#: Whether Triton runs under its interpreter in this process: TRITON_INTERPRET=1 when Triton was imported (its library
#: functions are then interpreted, not JIT-compiled).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and not isinstance(tl.zeros, JITFunction)
_in_subprocess = pytest.mark.skipif(not INTERPRETED, reason="run by test_under_the_interpreter_in_a_subprocess")


def interpreted(test):
    """A test run under the interpreter only (by :func:`test_under_the_interpreter_in_a_subprocess` here): slow."""
    return pytest.mark.slow(_in_subprocess(test))

BLOCKS = dict(block_m=16, block_n=16)
SCALING = 0.5
#: Weights of (R_peak, R_sent, R_dist) in the objective; None: the term is left out (its gradient is None).
OBJECTIVES = [(0.7, -1.3, 0.9), (1.0, None, None), (None, 1.0, None), (None, None, 1.0), (None, -0.6, 0.4)]


@pytest.mark.skipif(INTERPRETED, reason="this process runs the tests itself")
@pytest.mark.slow
def test_under_the_interpreter_in_a_subprocess():
    """This module's tests in a fresh process whose TRITON_INTERPRET=1 is set before Triton is imported."""
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(root), __file__],
        cwd=root, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(r"\d+ passed, 1 skipped in", result.stdout), result.stdout[-3000:]  # skipped: this test


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


def passes(queries, keys, support, query_mask, bias=None, num_heads=2):
    """The terms, with their graphs, of the Triton pass, the eager pass and the eager pass in float64, and each
    one's inputs."""
    out = {}
    for name, dtype in (("triton", None), ("eager", None), ("float64", torch.float64)):
        inputs = [(x if dtype is None else x.to(dtype)).detach().requires_grad_() for x in (*queries, *keys)]
        qs, ks = inputs[:len(queries)], inputs[len(queries):]
        b = None if bias is None else bias.to(dtype or bias.dtype)
        if name == "triton":
            terms = eadra_triton.layer_regularizers(qs, ks, num_heads, SCALING, support, query_mask, b, **BLOCKS)
        else:
            terms = eadra_math.layer_regularizers(qs, ks, num_heads, SCALING, support, query_mask, b, mode="eager")
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


def check(out, objectives=OBJECTIVES, num_heads=2, rel=1e-5):
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


@pytest.fixture(scope="module")
def stacked():
    queries, keys, support, query_mask = stacked_layers()
    return passes(queries, keys, support, query_mask)


@interpreted
@pytest.mark.parametrize("weights", OBJECTIVES, ids=str)
def test_stacked_layers_of_different_lengths(stacked, weights):
    """Encoder, causal decoder and cross-attention padded to one pass, 2 of 3 heads, two query tiles and two key
    blocks: terms and query/key gradients as the eager pass's and float64's, whichever terms are in the
    objective."""
    check(stacked, [weights])


@interpreted
def test_cross_attention_with_an_additive_bias():
    """T = 9 queries over S = 35 keys (three key blocks, the last of 3), a support broadcast over queries and
    heads (stride 0, never expanded), an additive bias without gradient broadcast over heads."""
    g = torch.Generator().manual_seed(1)
    q, k, support, query_mask = layer("cross", 2, 3, 9, 35, 5, g)
    key_padding = support[:, :, :1, :]  # (B, 1, 1, S)
    bias = torch.randn(2, 1, 9, 35, generator=g)
    out = passes([q], [k], key_padding, query_mask, bias)
    check(out, [(0.7, -1.3, 0.9), (None, None, 1.0)])


@interpreted
def test_half_precision_heads():
    """bfloat16 heads are read as they are (converted per tile): terms and gradients as the eager pass's on the
    same heads (which computes in float32); the gradients in bfloat16."""
    g = torch.Generator().manual_seed(2)
    q, k, support, query_mask = layer("decoder", 2, 2, 20, 20, 8, g, dtype=torch.bfloat16)
    out = passes([q], [k], support, query_mask, num_heads=2)
    del out["float64"]
    for got, expected in zip(out["triton"][0], out["eager"][0]):
        assert_near(got, expected, 1e-5)
    for got, expected in zip(gradients(*out["triton"], (0.7, -1.3, 0.9)), gradients(*out["eager"], (0.7, -1.3, 0.9))):
        assert got.dtype == torch.bfloat16
        assert_near(got.float(), expected.float(), 1e-2)  # one bfloat16 rounding


@interpreted
def test_what_is_saved_and_what_is_refused():
    """The forward saves two statistics per query (the log-sum-exp as max and log-sum) and log abar per key (no
    map); no term in the objective gives no gradient; a bias with a gradient (LPEA) and float64 heads are
    refused."""
    g = torch.Generator().manual_seed(3)
    q, k, support, query_mask = layer("encoder", 2, 2, 7, 7, 4, g)
    query, key, shape = eadra_triton._stacked_heads([q], [k], 2)
    coefficients = eadra_math._coefficients(support, query_mask, torch.float32)
    terms, saved = eadra_triton.forward(query, key, SCALING, shape, support, None, coefficients, **BLOCKS)
    assert [x.shape for x in saved] == [(1, 2, 2, 7)] * 3 and all(t.shape == (1, 2, 2) for t in terms)
    scores = eadra_math._masked_scores(query, key, SCALING, shape, support, None)
    torch.testing.assert_close(saved[0] + saved[1], scores.logsumexp(-1))
    assert eadra_triton.backward(query, key, SCALING, shape, support, None, coefficients, saved,
                                 (None, None, None)) is None
    bias = torch.zeros(2, 1, 7, 7, requires_grad=True)
    assert not eadra_triton.supports(query, bias) and eadra_triton.supports(query, bias.detach())
    with pytest.raises(ValueError, match="gives no bias gradient"):
        eadra_triton.layer_regularizers([q], [k], 2, SCALING, support, query_mask, bias)
    assert not eadra_triton.supports(query.double())
    with pytest.raises(ValueError, match="float64"):
        eadra_triton.forward(query.double(), key.double(), SCALING, shape, support, None, coefficients)


def test_the_module_imports_without_triton(monkeypatch):
    """Without Triton the module imports, says it is not available and its entry points raise a clear error."""
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton -> ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.spec_from_file_location("hf_headattn._eadra_triton_without", eadra_triton.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.triton is None and not module.available() and not module.supports(torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="needs Triton"):
        module.forward(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), 1.0, (1, 1, 1, 2, 2), None, None, None)


@interpreted
def test_a_model_trains_alike_with_the_triton_pass():
    """``eadra={"implementation": "triton"}``: chosen heads on all three components, padding, LPEA off: the loss,
    the terms and every parameter's gradient as with the eager pass."""
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
