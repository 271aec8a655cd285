"""EaDRA's eager pass with few maps written (:mod:`hf_headattn.methods.eadra.lean`, issue #63) against the reference
operations (``mode="reference"``: those the compiled pass fuses, run eagerly): terms and gradients in float64 and
float32, every subset of terms in the objective, kept or recomputed probabilities, layers of different lengths with an
additive bias, chosen heads and the reductions in a model; and the bytes its operators write."""

import pytest
import torch
from test_eadra_compiled import padded_layers
from test_eadra_math import layer_case

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.methods.eadra import equations, lean
from hf_headattn.methods.eadra import passes as eadra_passes

#: Which terms are in the objective, with their weights (a term left out gets no gradient: its g is None).
OBJECTIVES = {"all": (0.7, -1.3, 0.05), "dist": (None, None, 0.3), "sent": (None, 1.1, None), "peak": (0.9, None, None),
              "sent+dist": (None, 0.8, -2.0)}


def terms_and_grads(inputs, bias, mode, weights, recompute=True, num_heads=3):
    (qs, ks, support, queries), tensors = inputs, [*inputs[0], *inputs[1], *([] if bias is None else [bias])]
    for x in tensors:
        x.grad = None
    terms = equations.layer_regularizers(qs, ks, num_heads, 0.4, support, queries, bias, recompute, mode)
    sum(w * t.sum() for w, t in zip(weights, terms) if w is not None).backward()
    return [t.detach() for t in terms], [x.grad for x in tensors]


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("with_bias", [True, False])
def test_the_eager_pass_equals_the_reference(with_bias, dtype, objective, recompute):
    """Encoder-, decoder- and cross-like layers padded to one pass (queries without support among them), token-major
    heads, with an LPEA-like bias or without: terms and the gradients of queries, keys and bias; the heads left out
    get zero."""
    inputs, bias = padded_layers(dtype)
    bias = bias if with_bias else None
    got = terms_and_grads(inputs, bias, "eager", OBJECTIVES[objective], recompute)
    expected = terms_and_grads(inputs, bias, "reference", OBJECTIVES[objective], recompute)
    tolerance = {} if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    for value, reference in zip([*got[0], *got[1]], [*expected[0], *expected[1]]):
        torch.testing.assert_close(value, reference, **tolerance)
    assert all(grad[:, 3:].eq(0).all() for grad in got[1][:6])
    assert all(grad.abs().sum() > 0 for grad in got[1])  # (every input gets a gradient: the comparison can fail)


def test_gradcheck_float64_with_a_bias():
    qs, ks, support, queries = layer_case("causal", layers=2, heads=3, D=2)
    qs, ks = ([q[:1, :, :4].detach().requires_grad_() for q in qs],
              [k[:1, :, :4].detach().requires_grad_() for k in ks])
    support, queries = support[:1, :, :4, :4], queries[:1, :, :4]
    bias = torch.randn(1, 1, 4, 4, dtype=torch.float64, requires_grad=True)
    for recompute in (True, False):
        def f(*x):
            return equations.layer_regularizers(x[:2], x[2:4], 2, 0.7, support, queries, x[4], recompute, "eager")

        assert torch.autograd.gradcheck(f, (*qs, *ks, bias))


def test_the_eager_pass_leaves_the_probabilities_as_they_were():
    a = torch.softmax(torch.randn(2, 5, 6, dtype=torch.float64), -1)
    before = a.clone()
    centred = lean._centred_cdf(a)
    assert torch.equal(a, before)
    torch.testing.assert_close(centred, a.cumsum(-1) - 0.5)
    x = torch.randn(2, 5, 6)
    torch.testing.assert_close(lean._neighbour_dots(x), (x[:, :-1] * x[:, 1:]).sum(-1))
    torch.testing.assert_close(lean.rowdot(x, x.flip(-1)), (x * x.flip(-1)).sum(-1))


def model_terms_and_grads(monkeypatch, settings, mode):
    monkeypatch.setattr(eadra_passes, "choose_pass", lambda implementation, device: mode)
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(
        **TINY, dropout=0.0, attention_dropout=0.0, eadra=settings)).train()
    out = model(**batch())
    out.loss.backward()
    return out, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("settings", [
    {"encoder": {"heads": [1, 3], "alpha_peak": 0.2}, "decoder": {"num_heads": 2}, "cross": {"heads": [0, 2]}},
    {"encoder": {"layers": [1], "num_heads": 4, "alpha_peak": 1.0}, "decoder": {}, "dist_reduction": "sum",
     "peak_reduction": "sum"},
    {"decoder": {"alpha_sent": 0.0}, "cross": {"alpha_dist": 0.0}, "dist_reduction": "normalized_positions"},
])
def test_a_model_trains_alike_with_the_eager_and_the_reference_pass(monkeypatch, settings):
    """Heads (first ones, chosen ones, all), layers, terms outside the objective and the reductions: loss, terms and
    every parameter's gradient."""
    lean_out, lean_grads = model_terms_and_grads(monkeypatch, settings, "eager")
    out, grads = model_terms_and_grads(monkeypatch, settings, "reference")
    torch.testing.assert_close(lean_out.loss, out.loss, rtol=1e-6, atol=1e-7)
    for name, value in out.eadra_terms.items():
        torch.testing.assert_close(lean_out.eadra_terms[name], value, rtol=1e-5, atol=1e-6)
    assert grads.keys() == lean_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(lean_grads[name], grad, rtol=1e-5, atol=1e-6)


def written_maps(mode):
    """Bytes the operators of the pass write (forward and backward, the distance and sentence terms in the objective,
    as the defaults have them), in maps of (L, B, h, T, S) float32."""
    from counting import WrittenCounter

    L, B, H, h, T, D = 3, 2, 4, 3, 64, 16  # D / T and h / H as at transformer-base
    with torch._subclasses.fake_tensor.FakeTensorMode():
        qs = [torch.randn(B, T, H, D).transpose(1, 2).requires_grad_() for _ in range(L)]
        ks = [torch.randn(B, T, H, D).transpose(1, 2).requires_grad_() for _ in range(L)]
        support = (torch.arange(T) < torch.randint(T // 2, T + 1, (B,))[:, None])[None, :, None, None, :]
        support = support.expand(L, B, 1, T, T)
        queries = support[..., 0]
        with WrittenCounter() as written:
            _, sent, dist = equations.layer_regularizers(qs, ks, h, 0.125, support, queries, mode=mode)
            (sent.sum() + dist.sum()).backward()
    return written.bytes / (L * B * h * T * T * 4)


def test_the_eager_pass_writes_fewer_maps():
    """Forward: the scores (and their mask), a and its centred cumulative sums; backward: the same, the second
    cumulative sums, the shifted neighbours, the rank-one part and the product with a, plus the stacked heads and
    their gradients (about 2.5 maps here, as at transformer-base). 24 maps before #63."""
    assert written_maps("reference") > 23
    assert written_maps("eager") < 17


def test_products_are_full_float32_on_cuda_within_the_pass():
    """Half-precision heads run the pass's q k^T in TF32 on CUDA; the row dot products of the terms must not (a
    distance is S / 2 minus such a sum): "highest" inside, the user's setting restored after, untouched off CUDA."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with lean._float32_products(torch.device("cuda")):
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "high"
        with lean._float32_products(torch.device("cpu")):
            assert torch.get_float32_matmul_precision() == "high"
        seen = []
        wrapped = lean._exact(lambda a: seen.append(torch.get_float32_matmul_precision()))
        wrapped(torch.empty(0, device="meta"))
        assert seen == ["high"]
    finally:
        torch.set_float32_matmul_precision(previous)
