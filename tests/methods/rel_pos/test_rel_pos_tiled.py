"""Relative positions' Triton kernels (methods/rel_pos/tiled.py) under Triton's interpreter on CPU tensors: values and
every gradient against the naive Eq. 3-4 in float64 (a (T, S, D) tensor of edge vectors, autograd's gradients) and
against `relative_attention` in float32, with 16-wide tiles and lengths that cross them; which calls run them; a tiny
model with implementation "triton" equals "eager"."""

import os
from unittest import mock

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the kernels run on CPU tensors only under Triton's interpreter (TRITON_INTERPRET=1, as `make test` "
                "sets it)", allow_module_level=True)

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, triton_support
from hf_headattn.methods.rel_pos import core, tiled
from hf_headattn.methods.rel_pos.equations import relative_attention, relative_labels

B, H, D = 2, 2, 8
SCALING = 0.35


def naive(query, key, value, w_k, w_v, mask, k):
    """Eq. 3-4 as written, in float64: the edge vectors a^K_ij, a^V_ij as a (H or 1, T, S, D) tensor, the queries the
    last T of the S positions; the mask on the key term (`finfo.min` where a bool mask is False): a row that allows no
    key is uniform, its q k^T keeps its gradient and the key term gets none (the layer's reading)."""
    length, key_length = query.shape[2], key.shape[2]
    labels = (torch.arange(key_length)[None, :] - torch.arange(key_length - length, key_length)[:, None]).clamp(-k, k)
    a_k, a_v = (w[..., labels + k, :] for w in (w_k, w_v))  # (T, S, D) or (H, T, S, D)
    a_k, a_v = (a if a.dim() == 4 else a[None] for a in (a_k, a_v))
    bias = torch.einsum("bhtd,htsd->bhts", query, a_k) * SCALING
    if mask is not None and mask.dtype == torch.bool:
        bias = torch.where(mask, bias, torch.finfo(bias.dtype).min)
    elif mask is not None:
        bias = torch.where((mask > torch.finfo(mask.dtype).min / 2).any(-1, keepdim=True), bias, bias.detach()) + mask
    probs = (query @ key.mT * SCALING + bias).softmax(-1)
    return probs @ value + torch.einsum("bhts,htsd->bhtd", probs, a_v)


def inputs(length, key_length, k, tables, mask_kind, seed=0):
    """query, key, value, w^K, w^V (float64, std 1: the key term matters) and a mask: padding of sentence 1's last
    keys, a query row that allows no key, bool or additive (finfo.min where masked)."""
    g = torch.Generator().manual_seed(seed)
    table = (H, 2 * k + 1, D) if tables == "head" else (2 * k + 1, D)
    tensors = [torch.randn(shape, generator=g, dtype=torch.float64)
               for shape in ((B, H, length, D), (B, H, key_length, D), (B, H, key_length, D), table, table)]
    if mask_kind is None:
        return tensors, None
    allowed = torch.ones(B, 1, length, key_length, dtype=torch.bool)
    allowed[1, :, :, key_length - 7:] = False
    allowed[0, :, 3] = False  # a row that allows no key: uniform, and no gradient to the key term
    if mask_kind == "bool":
        return tensors, allowed
    return tensors, torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.double).min)


def grads_of(function, tensors, upstream):
    tensors = [t.detach().requires_grad_() for t in tensors]
    output = function(*tensors)
    return output, torch.autograd.grad(output, tensors, upstream.to(output.dtype))


@pytest.mark.parametrize("length, key_length, k, tables, mask_kind", [
    (37, 37, 2, "head", "bool"),  # three tiles each way, k small
    (21, 37, 20, "layer", "additive"),  # T != S (offset 16), k beyond a tile, tables shared by the heads
    (19, 19, 3, "head", None),
])
def test_the_kernels_equal_eq_3_4_and_relative_attention_with_every_gradient(length, key_length, k, tables,
                                                                             mask_kind):
    tensors, mask = inputs(length, key_length, k, tables, mask_kind)
    upstream = torch.randn(B, H, length, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    single = mask if mask is None or mask.dtype == torch.bool else mask.float().clamp_min(torch.finfo().min)
    ours, ours_grads = grads_of(
        lambda *x: tiled.tiled_relative_attention(*x, single, SCALING, key_length - length, k, blocks=(16, 16)),
        [t.float() for t in tensors], upstream)
    expected, expected_grads = grads_of(lambda *x: naive(*x, mask, k), tensors, upstream)
    labels = relative_labels(length, key_length, k)
    function, function_grads = grads_of(lambda *x: relative_attention(*x, labels, single, SCALING)[0],
                                        [t.float() for t in tensors], upstream)
    for name, a, b, c in zip(["output", "query", "key", "value", "w_k", "w_v"], [ours, *ours_grads],
                             [expected, *expected_grads], [function, *function_grads]):
        assert a.shape == b.shape and a.dtype == torch.float32, name
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=2e-5, msg=name)
        torch.testing.assert_close(a, c, atol=2e-5, rtol=2e-5, msg=name)
    if mask is not None:  # the row that allows no key is uniform over the keys (as the reference writes it)
        uniform = (tensors[2][0] + tensors[4][..., labels[3], :]).mean(-2)  # (H, D)
        torch.testing.assert_close(ours[0, :, 3].double(), uniform, atol=2e-5, rtol=2e-5)


def test_the_output_keeps_the_querys_layout_in_float16_too_and_blocks_are_checked():
    """The output in the query's memory layout (B, T, H, D as the projections make it: no copy for out_proj); float16
    blocks multiplied as float16."""
    tensors, _ = inputs(17, 17, 2, "head", None)
    query = tensors[0].float().transpose(1, 2).contiguous().transpose(1, 2)
    output = tiled.tiled_relative_attention(query, *[t.float() for t in tensors[1:]], None, SCALING, 0, 2,
                                            blocks=(16, 16))
    assert output.stride() == query.stride()
    half = tiled.tiled_relative_attention(*[t.half() for t in tensors], None, SCALING, 0, 2, blocks=(16, 16))
    expected = relative_attention(*[t.float() for t in tensors], relative_labels(17, 17, 2), None, SCALING)[0]
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), expected, atol=1e-2, rtol=1e-2)
    with pytest.raises(ValueError, match=r"blocks must be powers of two >= 16, got \(8, 16\)"):
        tiled.tiled_relative_attention(query, *[t.float() for t in tensors[1:]], None, SCALING, 0, 2, blocks=(8, 16))


def test_which_calls_run_the_kernels():
    """"auto" and "eager" never; "triton" where `kernel_refusal` gives no reason, today's path for the call's own
    reasons, an error naming the setting where the environment cannot run them."""
    query = torch.zeros(1, 1, 4, 8)
    mask = torch.zeros(1, 1, 4, 4)
    assert core.runs_kernel("triton", query, mask, 0) and core.kernel_refusal(query, None, 0) is None
    assert not core.runs_kernel("auto", query, mask, 0) and not core.runs_kernel("eager", query, mask, 0)
    for args, reason in [((query, mask.requires_grad_(), 0), "the mask requires a gradient"),
                         ((query.double(), None, 0), "torch.float64 with head dimension 8"),
                         ((query.bfloat16(), None, 0), "bfloat16 on the CPU"),
                         ((query, None, None), "the queries' positions are not offset")]:
        assert core.kernel_refusal(*args).startswith(reason)
        assert not core.runs_kernel("triton", *args)
    with mock.patch.object(triton_support, "INTERPRETED", False):
        assert core.kernel_refusal(query, None, 0).startswith("environment: tensors on cpu")
        assert not core.runs_kernel("auto", query, None, 0)
        with pytest.raises(ValueError, match=r"rel_pos.implementation='triton' cannot run here: tensors on cpu; the "
                                             r"kernels run on CUDA"):
            core.runs_kernel("triton", query, None, 0)


@pytest.mark.slow  # (5 s: two models interpreted, training and generate)
def test_a_model_with_the_kernels_equals_the_pytorch_path_in_loss_gradients_and_generate():
    """Encoder (padding) and decoder (causal) self-attention, a table per head, k = 2: the same loss and gradients,
    the kernels on every layer; and the same beams from `generate` with a cache (one query after the cached ones:
    T = 1, offset = the cached length)."""
    models = {}
    for implementation in ("eager", "triton"):
        torch.manual_seed(0)
        config = HeadAttnMBartConfig(**TINY, init_std=0.5, rel_pos={
            "max_relative_position": 2, "decoder_layers": "all", "implementation": implementation})
        models[implementation] = HeadAttnMBartForConditionalGeneration(config).eval()
    calls = []
    launch = tiled.tiled_relative_attention
    with mock.patch.object(tiled, "tiled_relative_attention", lambda *a, **kw: calls.append(1) or launch(*a, **kw)):
        losses = {name: model(**batch()).loss for name, model in models.items()}
    assert len(calls) == 4  # two encoder layers, two decoder layers
    torch.testing.assert_close(losses["triton"], losses["eager"], atol=1e-5, rtol=1e-5)
    for loss in losses.values():
        loss.backward()
    for (name, ours), (_, theirs) in zip(models["triton"].named_parameters(), models["eager"].named_parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=5e-5, rtol=1e-4, msg=name)  # (float32, std 0.5)
    assert models["triton"].model.encoder.layers[0].self_attn.rel_pos.relative_values.grad.abs().sum() > 0
    inputs = batch()
    with mock.patch.object(tiled, "tiled_relative_attention", lambda *a, **kw: calls.append(a[0].shape[2]) or
                           launch(*a, **kw)):
        beams = {name: model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=2,
                                      max_new_tokens=4, do_sample=False) for name, model in models.items()}
    assert beams["triton"].tolist() == beams["eager"].tolist() and calls[-1] == 1


@pytest.mark.slow  # (a compile)
def test_the_operators_compile_without_a_graph_break():
    """`fullgraph=True` (a break raises) through the forward and backward operators, whose fake implementations give
    the kernels' shapes and layouts (aot_eager runs the traced graph): the same output and gradients as eager."""
    tensors = [t.float().requires_grad_() for t in inputs(17, 17, 2, "layer", None)[0]]
    function = lambda *x: tiled.tiled_relative_attention(*x, None, SCALING, 0, 2, blocks=(16, 16))  # noqa: E731
    compiled = torch.compile(function, backend="aot_eager", fullgraph=True)
    upstream = torch.randn(B, H, 17, D, generator=torch.Generator().manual_seed(2))
    ours, ours_grads = grads_of(compiled, tensors, upstream)
    expected, expected_grads = grads_of(function, tensors, upstream)
    for a, b in zip([ours, *ours_grads], [expected, *expected_grads]):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
