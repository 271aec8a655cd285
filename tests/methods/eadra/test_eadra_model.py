"""EaDRA inside the models: terms equal to a reference from eager attention maps, SDPA = eager, the loss, gradients
through q/k only, the KV cache, generation, half precision."""


import pytest
import torch
from test_eadra_math import (
    distance_regularizer,
    eadra_regularizers,
    loop_reference,
    peak_regularizer,
    sentence_regularizer,
)

from conftest import TINY, batch
from hf_headattn import (
    HeadAttnMarianConfig,
    HeadAttnMarianMTModel,
    HeadAttnMBartConfig,
    HeadAttnMBartForConditionalGeneration,
)
from hf_headattn.attention import AttentionCall, HeadAttnContext
from hf_headattn.hf_compat import CACHE_NAMES
from hf_headattn.methods.eadra import core as eadra
from hf_headattn.methods.eadra import equations as eadra_math
from operator_count import count_operators

MODELS = {"mbart": (HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration),
          "marian": (HeadAttnMarianConfig, HeadAttnMarianMTModel)}
ALL = {"encoder": {}, "decoder": {}, "cross": {}, "dist_reduction": "sum"}  # the loop reference sums Eq. 8
MIXED = {  # vary every setting: heads, layers, alphas
    "dist_reduction": "sum", "alpha_scale": 0.5,
    "encoder": {"num_heads": 3, "layers": [-1], "alpha_peak": 0.5},
    "decoder": {"num_heads": 1, "alpha_dist": 0.3},
    "cross": {"num_heads": 4, "layers": [0], "alpha_sent": 2.0, "alpha_dist": 0.0},
}


def model_of(settings, family="mbart", impl="sdpa", seed=0):
    config_cls, model_cls = MODELS[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**TINY, dropout=0.0, attention_dropout=0.0, eadra=settings)).eval()
    model.set_attn_implementation(impl)
    return model


def supports(inputs):
    """Per component: (support (B, T, S), real queries (B, T)) from the batch's masks."""
    source, target = inputs["attention_mask"].bool(), inputs["labels"].ne(-100)
    S, T = source.shape[1], target.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return {
        "encoder": (source[:, None, :].expand(-1, S, S), source),
        "decoder": (target[:, None, :] & causal, target),
        "cross": (source[:, None, :].expand(-1, T, S), target),
    }


def reference_terms(model, inputs):
    """EaDRA terms from the eager model's ``output_attentions`` maps, by the loop reference."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    maps = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions, "cross": out.cross_attentions}
    tokens = inputs["labels"].ne(-100).sum()
    terms = {}
    for component in model.headattn_settings["eadra"].components:
        settings = model.headattn_settings["eadra"].components[component]
        support, queries = supports(inputs)[component]
        total = sum(
            loop_reference(maps[component][layer][:, : settings.num_heads].double(), support, queries)
            for layer in settings.layers
        ).sum((0, 1))  # (3,): summed over sentences, heads and layers
        terms.update({f"{component}/{name}": value / tokens for name, value in zip(("peak", "sent", "dist"), total)})
    return terms


@pytest.mark.parametrize("settings", [ALL, MIXED], ids=["all", "mixed"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_terms_equal_reference_from_eager_attention_maps(settings, impl):
    model = model_of(settings, impl=impl)
    with torch.no_grad():
        out = model(**batch())
    expected = reference_terms(model, batch())
    assert set(out.eadra_terms) == set(expected)
    for name, value in expected.items():
        assert out.eadra_terms[name].item() == pytest.approx(value.item(), rel=1e-5, abs=1e-6), name
    assert out.eadra_terms["decoder/dist"] > 0 and out.eadra_terms["encoder/sent"] < 0


@pytest.mark.parametrize("family", ["mbart", "marian"])
def test_sdpa_and_eager_give_the_same_terms_and_gradients(family):
    results = {}
    for impl in ("sdpa", "eager"):
        model = model_of(ALL, family, impl)
        out = model(**batch(), decoder_attention_mask=batch()["labels"].ne(-100).long())
        out.eadra_loss.backward()
        grad = model.model.encoder.layers[0].self_attn.q_proj.weight.grad
        results[impl] = (out.eadra_terms, out.eadra_loss.detach(), grad)
    for name, value in results["sdpa"][0].items():
        torch.testing.assert_close(value, results["eager"][0][name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results["sdpa"][1], results["eager"][1])
    torch.testing.assert_close(results["sdpa"][2], results["eager"][2], rtol=1e-4, atol=1e-7)


def test_loss_is_nll_plus_the_weighted_terms():
    model, stock = model_of(MIXED), model_of(None)
    stock.load_state_dict(model.state_dict())  # EaDRA has no parameters: the same weights
    out, off = model(**batch()), stock(**batch())
    weighted = 0.5 * sum(  # alpha_scale 0.5
        getattr(model.headattn_settings["eadra"].components[name.split("/")[0]], f"alpha_{name.split('/')[1]}") * value
        for name, value in out.eadra_terms.items()
    )
    assert out.eadra_loss.item() == pytest.approx(weighted.item(), rel=1e-6)
    assert (out.loss - off.loss).item() == pytest.approx(out.eadra_loss.item(), rel=1e-5)
    assert out.eadra_terms["encoder/peak"] != 0 and out.eadra_loss.requires_grad
    torch.testing.assert_close(out.logits, off.logits)  # the method never changes the attention output


def test_gradient_flows_through_queries_and_keys_of_the_regularized_layer_only():
    model = model_of({"encoder": {"layers": [0], "num_heads": 2}, "dist_reduction": "sum", "alpha_scale": 1.0})
    inputs = batch()
    model(**inputs).eadra_loss.backward()
    attn = [layer.self_attn for layer in model.model.encoder.layers]
    assert attn[0].q_proj.weight.grad.abs().sum() > 0 and attn[0].k_proj.weight.grad.abs().sum() > 0
    for param in (attn[0].v_proj.weight, attn[0].out_proj.weight, attn[1].q_proj.weight, attn[1].k_proj.weight):
        assert param.grad is None or param.grad.abs().sum() == 0
    # the same gradient as autograd through the definitions applied to the eager probabilities of those heads
    fused = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.set_attn_implementation("eager")
    out = model(**inputs, output_attentions=True)
    support, queries = supports(inputs)["encoder"]
    a = out.encoder_attentions[0][:, :2]
    total = (peak_regularizer(a, support[:, None], queries[:, None]) * 0.0
             + sentence_regularizer(a, support[:, None], queries[:, None]) * 0.8
             + distance_regularizer(a, queries[:, None]) * 0.02).sum() / inputs["labels"].ne(-100).sum()
    total.backward()
    for name, grad in fused.items():
        torch.testing.assert_close(grad, dict(model.named_parameters())[name].grad, rtol=1e-4, atol=1e-7, msg=name)


def test_zero_weighted_terms_are_reported_but_not_in_the_objective():
    model = model_of({"encoder": {"alpha_sent": 0.0, "alpha_dist": 0.0}})
    out = model(**batch())
    assert out.eadra_loss.item() == 0 and not out.eadra_loss.requires_grad
    assert out.eadra_terms["encoder/sent"] < 0


def test_no_context_means_no_work(monkeypatch):
    model = model_of(ALL)

    def fail(*args):
        raise AssertionError("EaDRA ran without a context")

    monkeypatch.setattr(eadra, "layer_regularizers", fail)
    inputs = batch()
    encoder_out = model.get_encoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    assert torch.isfinite(encoder_out.last_hidden_state).all()


def test_cached_decoding_step_uses_the_causal_offset():
    model = model_of({"decoder": {"num_heads": 2}})
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    decoder_ids = torch.tensor([[0, 13, 14, 15], [0, 16, 17, 18]])
    with torch.no_grad():
        first = model(**inputs, decoder_input_ids=decoder_ids[:, :3], use_cache=True)
    # without labels the terms are computed only with gradients on (no loss is needed otherwise)
    cache = next(name for name in reversed(CACHE_NAMES) if name in first.keys())  # "cache" since transformers 5.24
    step = model(encoder_outputs=(first.encoder_last_hidden_state,), attention_mask=inputs["attention_mask"],
                 decoder_input_ids=decoder_ids[:, 3:], **{cache: first[cache]}, use_cache=True)
    with torch.no_grad():
        model.set_attn_implementation("eager")
        full = model(**inputs, decoder_input_ids=decoder_ids, output_attentions=True)
    last_rows = torch.stack([a[:, :2, 3] for a in full.decoder_attentions])  # (layers, B, h, 4): query 3, 4 keys
    entropy = -(last_rows * last_rows.log()).sum(-1) / torch.log(torch.tensor(4.0))
    # the one cached query per sentence is its own "mean over queries" and the batch has B target tokens
    assert step.eadra_terms["decoder/peak"].item() == pytest.approx(entropy.sum().item() / 2, rel=1e-5)
    assert step.eadra_terms["decoder/sent"].item() == pytest.approx(-entropy.sum().item() / 2, rel=1e-5)
    assert step.eadra_terms["decoder/dist"].item() == 0  # no pair of consecutive queries in one step


def test_no_loss_needed_means_no_work(monkeypatch):
    """generate and inference without labels compute no regularizer (no operator over methods off)."""
    model = model_of(ALL)
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    kwargs = dict(max_new_tokens=4, min_new_tokens=4, num_beams=1, do_sample=False)
    counts = []
    for m in (model, model_of(None)):
        with torch.no_grad():
            counts.append(count_operators(lambda: m.generate(**inputs, **kwargs)))
    assert counts[0] == counts[1]
    monkeypatch.setattr(eadra, "layer_regularizers", lambda *a: pytest.fail("EaDRA ran without a loss"))
    with torch.no_grad():
        out = model(**inputs, decoder_input_ids=batch()["labels"].clamp(min=0))
        model.generate(**inputs, **kwargs)
    assert out.eadra_loss is None and out.eadra_terms is None


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_with_cache_is_unchanged(num_beams):
    model, stock = model_of(ALL), model_of(None)
    stock.load_state_dict(model.state_dict())
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    kwargs = dict(max_new_tokens=6, num_beams=num_beams, do_sample=False, use_cache=True)
    assert torch.equal(model.generate(**inputs, **kwargs), stock.generate(**inputs, **kwargs))


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_with_a_static_cache_equals_the_stock_model(num_beams):
    # regression: generate passes a 4-D (B, 1, T, S) decoder_attention_mask with a static cache, which was taken for
    # the (B, T) target mask and crashed the EaDRA terms
    model, stock = model_of(ALL), model_of(None)
    stock.load_state_dict(model.state_dict())
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    kwargs = dict(max_new_tokens=6, num_beams=num_beams, do_sample=False, output_scores=True,
                  return_dict_in_generate=True)
    static = model.generate(**inputs, **kwargs, cache_implementation="static")
    references = stock.generate(**inputs, **kwargs, cache_implementation="static"), model.generate(**inputs, **kwargs)
    for reference in references:
        assert torch.equal(static.sequences, reference.sequences)
        torch.testing.assert_close(torch.stack(static.scores), torch.stack(reference.scores))


def test_a_4d_decoder_attention_mask_is_not_taken_for_the_target_mask():
    model = model_of({"decoder": {}})
    inputs = {**batch(), "labels": torch.tensor([[13, 14, 15, 2], [16, 17, 18, 2]])}  # no target padding
    B, T = inputs["labels"].shape
    causal = torch.ones(T, T, dtype=torch.bool).tril().expand(B, 1, T, T)
    with torch.no_grad():
        out = model(**inputs, decoder_attention_mask=causal)  # its 10 True entries per sentence were "tokens"
        reference = model(**inputs, decoder_attention_mask=torch.ones(B, T, dtype=torch.long))
    assert out.eadra_loss.item() == pytest.approx(reference.eadra_loss.item(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_autocast_gives_finite_terms_and_gradients(dtype):
    model = model_of(ALL).train()
    with torch.autocast("cpu", dtype=dtype):
        out = model(**batch())
    out.loss.backward()
    assert all(torch.isfinite(v) for v in out.eadra_terms.values()) and torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bf16_model_weights_give_finite_terms():
    model = model_of(ALL).to(torch.bfloat16)
    out = model(**batch())
    assert out.eadra_loss.dtype == torch.float32 and torch.isfinite(out.eadra_loss)
    out.loss.backward()
    assert all(torch.isfinite(p.grad.float()).all() for p in model.parameters() if p.grad is not None)


def fake_call(kind, side, T, S, attention_mask=None, source_mask=None, target_mask=None, heads=3):
    module = torch.nn.Module()
    module.headattn_kind, module.headattn_side = kind, side
    g = torch.Generator().manual_seed(0)
    query, key = torch.randn(2, heads, T, 4, generator=g), torch.randn(2, heads, S, 4, generator=g)
    context = HeadAttnContext(source_mask=source_mask, target_mask=target_mask)
    return AttentionCall(module, query, key, key, attention_mask, 0.5, None, context, {})


def head_scores(call, num_heads: int):
    """The test's reference: float32 scores ``q k^T * scaling`` (B, h, T, S) of the first ``num_heads`` heads of one
    attention call, plus its additive mask if any, with its support and real queries (:func:`eadra.head_support`)."""
    bias, support, queries = eadra.head_support(eadra._Call.of(call, "", num_heads))
    query, key = call.query[:, :num_heads].float(), call.key[:, :num_heads].float()
    scores = torch.matmul(query * call.scaling, key.transpose(-1, -2))
    return (scores if bias is None else scores + bias), support, queries


def test_support_combines_mask_causality_with_offset_and_key_padding():
    target = torch.tensor([[True] * 5, [False, True, True, True, True]])  # left padding in the second row
    call = fake_call("self", "decoder", 2, 5, target_mask=target)  # 2 new queries after 3 cached keys, no mask
    scores, support, queries = head_scores(call, 2)
    assert scores.shape == (2, 2, 2, 5)
    torch.testing.assert_close(scores, (call.query[:, :2] @ call.key[:, :2].transpose(-1, -2)) * 0.5)
    causal = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(support[0, 0], causal) and torch.equal(support[1, 0], causal & target[1])
    assert queries.all()  # the query mask does not apply: it covers 5 positions, the call has 2 queries


def test_support_from_bool_and_additive_masks():
    source = torch.tensor([[True] * 4, [True, True, False, False]])
    allowed = source[:, None, None, :].expand(2, 1, 3, 4)
    bool_call = fake_call("cross", "decoder", 3, 4, allowed, source_mask=source)
    bias = torch.zeros(2, 3, 3, 4).masked_fill(~allowed, torch.finfo(torch.float32).min)
    bias[:, :, 0, 0] = 1.5  # an additive bias on a visible key (per head, as SEA may add)
    float_call = fake_call("cross", "decoder", 3, 4, bias, source_mask=source)
    s_bool, support_bool, _ = head_scores(bool_call, 2)
    s_float, support_float, _ = head_scores(float_call, 2)
    assert torch.equal(support_bool.expand(2, 2, 3, 4), support_float.expand(2, 2, 3, 4))
    assert torch.equal(support_bool[:, 0], allowed[:, 0])
    torch.testing.assert_close(s_float[:, :, 0, 0], s_bool[:, :, 0, 0] + 1.5)
    torch.testing.assert_close(s_float[:, :, 1:, :2], s_bool[:, :, 1:, :2])


def test_padding_queries_and_empty_rows_do_not_count():
    source = torch.tensor([[True, True, True], [False, False, False]])  # an all-padding sentence
    call = fake_call("self", "encoder", 3, 3, source_mask=source)
    scores, support, queries = head_scores(call, 1)
    assert queries[0].all() and not queries[1].any()
    out = torch.stack(eadra_regularizers(scores, support, queries), -1)
    assert torch.isfinite(out).all() and out[1].eq(0).all()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_components_in_one_fused_pass_equal_separate_passes(monkeypatch, impl):
    """Encoder (6 x 6), decoder (4 x 4) and cross-attention (4 x 6) go through one padded pass; their terms, loss and
    gradients equal those of one pass per component (MAX_PADDING < 0: no fusion)."""
    passes = []
    fused_pass = eadra.layer_regularizers
    monkeypatch.setattr(eadra, "layer_regularizers",
                        lambda *args, **kwargs: passes.append(1) or fused_pass(*args, **kwargs))
    results = []
    for max_padding in (eadra.MAX_PADDING, -1.0):
        monkeypatch.setattr(eadra, "MAX_PADDING", max_padding)
        model = model_of(ALL, impl=impl)
        passes.clear()
        out = model(**batch())
        out.eadra_loss.backward()
        grads = [p.grad for name, p in model.named_parameters() if "self_attn.q_proj.weight" in name or
                 "encoder_attn.k_proj.weight" in name]
        results.append((out.eadra_terms, out.eadra_loss, grads, len(passes)))
    (fused, fused_loss, fused_grads, fused_passes), (apart, apart_loss, apart_grads, apart_passes) = results
    assert (fused_passes, apart_passes) == (1, 3)
    for name, value in apart.items():
        torch.testing.assert_close(fused[name], value, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(fused_loss, apart_loss)
    for got, expected in zip(fused_grads, apart_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)


def test_components_with_other_head_shapes_get_their_own_pass(monkeypatch):
    """Encoder 4 heads of 4, decoder 2 heads of 8: one regularized head each, but no shared pass (other shapes)."""
    passes = []
    fused_pass = eadra.layer_regularizers
    monkeypatch.setattr(eadra, "layer_regularizers",
                        lambda *args, **kwargs: passes.append(1) or fused_pass(*args, **kwargs))
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**{**TINY, "decoder_attention_heads": 2}, dropout=0.0, attention_dropout=0.0,
                                 eadra={c: {"num_heads": 1} for c in ("encoder", "decoder", "cross")})
    model = HeadAttnMBartForConditionalGeneration(config)
    out = model(**batch())
    out.loss.backward()
    assert len(passes) == 2 and torch.isfinite(out.eadra_loss)
    assert model.model.decoder.layers[0].self_attn.q_proj.weight.grad is not None


@pytest.mark.parametrize("alphas, skipped", [
    ({"encoder": {}, "decoder": {}}, ["peak"]),  # the defaults weigh no R_peak
    ({"encoder": {"alpha_peak": 0.5}, "decoder": {}}, []),  # one component weighs it: computed for all layers
    ({"encoder": {"alpha_sent": 0.0, "alpha_peak": 0.0}, "decoder": {"alpha_sent": 0.0}}, ["peak", "sent"]),
])
def test_terms_no_component_weighs_get_no_backward(monkeypatch, alphas, skipped):
    """The fused backward receives None (and computes nothing) for the terms outside the objective."""
    received = []
    backward = eadra_math.scores_gradient  # (the eager pass's, lean.py)
    monkeypatch.setattr(eadra_math, "scores_gradient", lambda *args: received.append(args[-3:]) or backward(*args))
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, eadra=alphas))
    out = model(**batch())
    out.eadra_loss.backward()
    (grads,) = received
    assert [name for name, grad in zip(eadra.TERMS, grads) if grad is None] == skipped
    assert all(torch.isfinite(out.eadra_terms[f"encoder/{name}"]) for name in eadra.TERMS)


def _fused_nodes(loss):
    """The backward nodes of EaDRA's fused pass in ``loss``'s graph."""
    found, stack, seen = [], [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__ == "_LayerRegularizersBackward":
            found.append(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def test_the_backward_recomputes_the_probabilities_instead_of_keeping_them(monkeypatch):
    """Nothing of size (L, B, h, T, S) is kept for the backward pass (the queries and keys it keeps are the
    attention's own); the gradients equal those of the pass that keeps the probabilities."""
    fused_pass = eadra.layer_regularizers
    grads = []
    for recompute in (True, False):
        monkeypatch.setattr(eadra, "layer_regularizers",
                            lambda *args, **kwargs: fused_pass(*args, **kwargs, recompute=recompute))
        torch.manual_seed(0)
        config = HeadAttnMBartConfig(**TINY, dropout=0.0, attention_dropout=0.0, eadra={
            c: {"alpha_dist": 0.5, "alpha_sent": 0.3, "alpha_peak": 0.2} for c in ("encoder", "decoder", "cross")})
        model = HeadAttnMBartForConditionalGeneration(config)
        out = model(**batch())
        (node,) = _fused_nodes(out.eadra_loss)
        largest = max(t.numel() for t in node.saved_tensors if t is not None)
        score_map = 6 * 2 * 3 * 6 * 6  # layers (one fused pass) x batch x regularized heads x T x S (padded to 6)
        assert (largest < score_map) == recompute
        out.eadra_loss.backward()
        grads.append([p.grad for p in model.parameters() if p.grad is not None])
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected)
