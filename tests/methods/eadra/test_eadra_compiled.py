"""EaDRA's compiled regularizer pass (:mod:`hf_headattn.methods.eadra.compiled`): ``implementation="compiled"`` runs
the map-sized work of :func:`~.equations.layer_regularizers` under ``torch.compile``; "auto" does so on
CUDA only (:mod:`~.passes` chooses: test_eadra_passes.py). Its terms and gradients equal the
eager pass's (Inductor on the CPU here; on CUDA ``benchmarks/gpu.sh`` times both), with padding, layers of different
lengths, chosen heads and bf16 autocast; a compile that fails falls back to the eager pass under "auto" and raises
under "compiled"."""


import pytest
import torch
import torch._dynamo
from test_eadra_math import layer_case

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.methods.eadra import compiled as fused_passes
from hf_headattn.methods.eadra import equations as eadra_math
from hf_headattn.methods.eadra import passes as eadra_passes

pytestmark = pytest.mark.usefixtures("scalar_inductor")  # Inductor without SIMD (conftest): a third less compiling

WEIGHTS = (0.7, -1.3, 0.05)


def terms_and_grads(inputs, bias, implementation, recompute=True, num_heads=3):
    """Terms of the encoder-, decoder- and cross-like layers of ``inputs`` (padded together) and their gradients."""
    (qs, ks, support, queries), tensors = inputs, [*inputs[0], *inputs[1], bias]
    for x in tensors:
        x.grad = None
    terms = eadra_passes.layer_regularizers(qs, ks, num_heads, 0.4, support, queries, bias, recompute, implementation)
    sum(w * t.sum() for w, t in zip(WEIGHTS, terms)).backward()
    return [t.detach() for t in terms], [x.grad for x in tensors]


def padded_layers(dtype=torch.float32):
    """Encoder-, decoder- and cross-like layers of different lengths, padded to one pass as the model does, with
    token-major queries and keys and an additive (LPEA-like) bias."""
    groups = [layer_case(kind, layers=1, heads=4, seed=seed, dtype=dtype)
              for kind, seed in (("encoder", 1), ("causal", 2), ("cross", 3))]
    length = max(qs[0].shape[2] for qs, *_ in groups)
    key_length = max(ks[0].shape[2] for _, ks, *_ in groups)
    pad = torch.nn.functional.pad
    batch_size = groups[0][2].shape[0]
    support = torch.cat([pad(s.expand(batch_size, 1, *s.shape[2:]),
                             (0, key_length - s.shape[3], 0, length - s.shape[2]))[None] for _, _, s, _ in groups])
    queries = torch.cat([pad(q.expand(batch_size, 1, q.shape[2]), (0, length - q.shape[2]))[None]
                         for _, _, _, q in groups])
    token_major = [x.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
                   for group in groups for x in (*group[0], *group[1])]
    qs, ks = token_major[0::2], token_major[1::2]
    bias = torch.randn(3, batch_size, 1, length, key_length, dtype=dtype, requires_grad=True)
    return (qs, ks, support, queries), bias


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.slow
def test_the_compiled_pass_equals_the_eager_pass(recompute):
    """Inductor (CPU) against the eager pass: terms and the gradients of queries, keys and bias; the heads left
    out get zero."""
    inputs, bias = padded_layers()
    eager = terms_and_grads(inputs, bias, "eager", recompute)
    compiled = terms_and_grads(inputs, bias, "compiled", recompute)
    for got, expected in zip([*compiled[0], *compiled[1]], [*eager[0], *eager[1]]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert all(grad[:, 3:].eq(0).all() for grad in compiled[1][:-1])


def model_step(implementation, autocast):
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, dropout=0.0, attention_dropout=0.0, eadra={
        "encoder": {"heads": [1, 3], "alpha_peak": 0.2}, "decoder": {"num_heads": 2}, "cross": {"heads": [0, 2]},
        "implementation": implementation})
    model = HeadAttnMBartForConditionalGeneration(config).train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(**batch())
    out.loss.backward()
    return out, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.slow
def test_a_model_trains_alike_with_either_pass(autocast):
    """Chosen heads, padding, all three components in one padded pass (two heads each: one compile, forward and
    backward), fp32 and bf16 autocast: loss, terms and gradients."""
    # a compile of its own, for the model's lengths: not the earlier tests' pass compiled again with dynamic lengths
    # (three times the CPU time)
    torch._dynamo.reset()
    fused_passes._compiled.clear()
    eager, eager_grads = model_step("eager", autocast)
    compiled, compiled_grads = model_step("compiled", autocast)
    torch.testing.assert_close(compiled.eadra_loss, eager.eadra_loss, rtol=1e-5, atol=1e-7)
    for name, value in eager.eadra_terms.items():
        torch.testing.assert_close(compiled.eadra_terms[name], value, rtol=1e-5, atol=1e-7)
    tolerance = dict(rtol=2e-2, atol=2e-3) if autocast else dict(rtol=1e-5, atol=1e-6)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, **tolerance)


def broken_backend(graph_module, example_inputs):
    raise RuntimeError("no compiler here")


@pytest.mark.slow
def test_auto_falls_back_to_the_eager_pass_when_the_compile_fails(monkeypatch):
    """"auto" compiles on CUDA with Triton; made to compile on the CPU here with a backend that fails, it warns once,
    gives the eager pass's values and does not try again in this process; "compiled" raises the error."""
    monkeypatch.setattr(fused_passes, "COMPILE_BACKEND", broken_backend)
    monkeypatch.setattr(eadra_passes, "AUTO_COMPILED_DEVICES", ("cpu",))
    monkeypatch.setattr(eadra_passes, "triton_installed", lambda: True)
    monkeypatch.setattr(fused_passes, "_auto_failed", [])
    inputs, bias = padded_layers()
    expected = terms_and_grads(inputs, bias, "eager")
    with pytest.warns(RuntimeWarning, match="(?s)no compiler here.*runs eagerly"):
        got = terms_and_grads(inputs, bias, "auto")
    for a, b in zip([*got[0], *got[1]], [*expected[0], *expected[1]]):
        torch.testing.assert_close(a, b)
    assert len(fused_passes._auto_failed) == 1 and fused_passes.compile_failed()
    assert eadra_passes.choose_pass("auto", torch.device("cpu")) == "eager"
    with pytest.raises(Exception, match="no compiler here"):
        terms_and_grads(inputs, bias, "compiled")


def test_bad_modes_are_refused():
    """The fused function's own ``mode`` (the dispatcher's values: tests/methods/eadra/test_eadra_passes.py)."""
    (qs, ks, support, queries), _ = padded_layers()
    with pytest.raises(ValueError, match=r"mode must be one of \('eager', 'compiled', 'compiled_or_eager'\), "
                                         r"got 'auto'"):
        eadra_math.layer_regularizers(qs, ks, 3, 0.4, support, queries, mode="auto")
