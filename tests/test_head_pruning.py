"""Head masks and head pruning: masks scale heads exactly, their gradient is Michel et al.'s importance,
pruning equals masking for every method, and pruned models round-trip."""

import subprocess
import sys

import pytest
import torch
from transformers import MBartConfig, MBartForConditionalGeneration

from conftest import TINY, batch
from hf_headattn import (
    HeadAttnMarianConfig,
    HeadAttnMarianMTModel,
    HeadAttnMBartConfig,
    HeadAttnMBartForConditionalGeneration,
)
from hf_headattn.head_masks import masked_logits
from hf_headattn.syntax_inputs import NOT_IN_PHRASE

METHODS = {
    "off": {},
    "dhicm": {"dhicm": {"encoder_layers": [-1], "decoder_layers": [0, 1]}},
    "dhicm_scaled_out_proj": {"dhicm": {"encoder_layers": [0], "decoder_layers": [-1], "mode": "scaled_out_proj"}},
    "eadra": {"eadra": {"encoder": {"heads": [0, 2]}, "decoder": {"num_heads": 3}, "cross": {}, "alpha_scale": 1.0}},
    "eadra_default": {"eadra": {"encoder": {}, "decoder": {}, "cross": {}, "alpha_scale": 1.0}},
    "eadra_heads": {"eadra": {"encoder": {"heads": [1, 3]}, "decoder": {"heads": [0, 3]}, "cross": {"heads": [1, 2]},
                              "alpha_scale": 1.0}},
    "dea_rhe": {"sea": {"type": "dea", "encoder_layers": [0, 1]}},
    "lpea_rhe": {"sea": {"type": "lpea", "encoder_layers": [1]}},
    "rhe_prune": {"sea": {"prune": True}},
    "localness_rhe": {"localness": {"head_selection": "redundant", "encoder_layers": [0, 1], "predictor": "head"}},
}
#: Heads to prune (original numbers) and the same as masks.
PRUNE = {"encoder.layers.1.self_attn": [0, 2], "encoder.layers.0.self_attn": [3],
         "decoder.layers.0.self_attn": [1], "decoder.layers.1.encoder_attn": [0, 1, 3]}
#: Pruning patterns: :data:`PRUNE`, and one whose layers keep as many heads as each other but not the same ones (so
#: EaDRA's default first 3 heads leave 3 regularized heads in one layer and 2 in the other).
PATTERNS = {
    "mixed": PRUNE,
    "per_layer": {"encoder.layers.0.self_attn": [3], "encoder.layers.1.self_attn": [0],
                  "decoder.layers.0.self_attn": [3], "decoder.layers.1.self_attn": [0],
                  "decoder.layers.0.encoder_attn": [0], "decoder.layers.1.encoder_attn": [3]},
}
#: Heads masked on top of either pattern (a pruned model given a head mask).
FURTHER = {"encoder.layers.1.self_attn": [1], "decoder.layers.0.self_attn": [2], "decoder.layers.0.encoder_attn": [1]}


def union(*patterns):
    return {name: sorted({h for p in patterns for h in p.get(name, [])}) for name in {n for p in patterns for n in p}}


def masks_of(pruned, batch_size=None):
    """The head-mask forward arguments that mask the heads ``pruned`` names."""
    sites = {"head_mask": ("encoder", "self_attn"), "decoder_head_mask": ("decoder", "self_attn"),
             "cross_attn_head_mask": ("decoder", "encoder_attn")}
    masks = {}
    for argument, (side, attention) in sites.items():
        mask = torch.ones(2, 4)
        for layer in range(2):
            mask[layer, pruned.get(f"{side}.layers.{layer}.{attention}", [])] = 0.0
        masks[argument] = mask if batch_size is None else mask.expand(batch_size, 2, 4).clone()
    return masks


def model_with(settings, seed=0, family="mbart"):
    config_cls, model_cls = ((HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration) if family == "mbart"
                             else (HeadAttnMarianConfig, HeadAttnMarianMTModel))
    torch.manual_seed(seed)
    model = model_cls(config_cls(**TINY, init_std=0.5, dropout=0.0, attention_dropout=0.0, **settings)).eval()
    return model


def syntax(batch_size=2, length=6):
    g = torch.Generator().manual_seed(3)
    dependency = torch.rand(batch_size, length, length, generator=g) < 0.4
    positions = torch.randint(-3, 4, (batch_size, length, length), generator=g)
    positions[torch.rand(batch_size, length, length, generator=g) < 0.3] = NOT_IN_PHRASE
    return {"dependency_mask": dependency, "phrase_positions": positions}


def inputs_for(name):
    return {**batch(), **(syntax() if name in ("dea_rhe", "lpea_rhe", "rhe_prune", "localness_rhe") else {})}


def run(model, inputs, **extra):
    with torch.no_grad():
        return model(**inputs, **extra)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_all_ones_masks_give_exactly_the_unmasked_model(name, attn):
    model = model_with(METHODS[name])
    model.set_attn_implementation(attn)
    inputs = inputs_for(name)
    ones = {argument: torch.ones_like(mask) for argument, mask in masks_of({}).items()}
    plain, masked = run(model, inputs), run(model, inputs, **ones)
    assert torch.equal(plain.logits, masked.logits) and torch.equal(plain.loss, masked.loss)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("name", sorted(METHODS))
def test_pruning_equals_masking_logits_loss_and_generated_tokens(name, pattern):
    prune = PATTERNS[pattern]
    model = model_with(METHODS[name])
    inputs = inputs_for(name)
    masked = run(model, inputs, **masks_of(prune))
    assert not torch.allclose(masked.logits, run(model, inputs).logits)  # the masks matter
    generate_inputs = {k: v for k, v in inputs.items() if k != "labels"}
    model.set_head_mask("encoder", masks_of(prune)["head_mask"])
    model.set_head_mask("decoder", masks_of(prune)["decoder_head_mask"])
    model.set_head_mask("cross", masks_of(prune)["cross_attn_head_mask"])
    kept = run(model, inputs)
    masked_tokens = model.generate(**generate_inputs, num_beams=3, max_new_tokens=8, do_sample=False)
    for component in ("encoder", "decoder", "cross"):
        model.set_head_mask(component, None)
    before = sum(p.numel() for p in model.parameters())
    model.prune_heads(prune)
    pruned = run(model, inputs)
    torch.testing.assert_close(pruned.logits, masked.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pruned.loss, masked.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kept.logits, masked.logits, rtol=0, atol=0)  # a kept mask = the forward argument
    for field in ("dhicm_kl", "eadra_loss", "eadra_terms"):
        if getattr(masked, field, None) is not None:
            torch.testing.assert_close(getattr(pruned, field), getattr(masked, field), rtol=1e-5, atol=1e-6)
    assert torch.equal(model.generate(**generate_inputs, num_beams=3, max_new_tokens=8, do_sample=False),
                       masked_tokens)
    modules = dict(model.model.named_modules())
    for name, heads in prune.items():
        module, width = modules[name], (4 - len(heads)) * 4
        assert module.num_heads == 4 - len(heads)
        assert [p.out_features for p in (module.q_proj, module.k_proj, module.v_proj)] == [width] * 3
        paper_dhicm = getattr(getattr(module, "dhicm", None), "mode", None) == "paper"  # out_proj is W_s (d_m in)
        assert module.out_proj.in_features == (16 if paper_dhicm else width)
    assert before - sum(p.numel() for p in model.parameters()) > 0


def loss_and_gradients(model, inputs, masks):
    model.zero_grad()
    output = model(**inputs, **masks)
    output.loss.backward()
    return output, {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("further", [False, True], ids=["pruned", "pruned_and_masked"])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("name", sorted(METHODS))
def test_pruning_equals_masking_terms_and_gradients(name, pattern, further):
    """Loss, the methods' terms and the gradients of the parameters both models have (same name and shape) of a
    pruned model, given a head mask or not, equal the unpruned model's with all those heads masked. Regressions: with
    two layers of one component keeping as many heads but different numbers of regularized ones, EaDRA gave them all
    the first layer's number (another loss than masking), and crashed with a head mask."""
    prune, extra = PATTERNS[pattern], FURTHER if further else {}
    inputs = inputs_for(name)
    masked, masked_grads = loss_and_gradients(model_with(METHODS[name]), inputs, masks_of(union(prune, extra)))
    model = model_with(METHODS[name])
    model.prune_heads(prune)
    pruned, pruned_grads = loss_and_gradients(model, inputs, masks_of(extra) if further else {})
    torch.testing.assert_close(pruned.loss, masked.loss, rtol=1e-5, atol=1e-6)
    for field in ("dhicm_kl", "eadra_loss", "eadra_terms"):
        assert (getattr(pruned, field) is None) == (getattr(masked, field) is None)
        if getattr(masked, field) is not None:
            torch.testing.assert_close(getattr(pruned, field), getattr(masked, field), rtol=1e-5, atol=1e-6)
    shared = [n for n, g in pruned_grads.items() if g is not None and masked_grads[n] is not None
              and g.shape == masked_grads[n].shape]
    assert len(shared) > len(pruned_grads) // 2
    for parameter in shared:  # float32 sums in another order: DHICM's embed_positions gradient differs by 1.6e-5
        torch.testing.assert_close(pruned_grads[parameter], masked_grads[parameter], rtol=1e-4, atol=5e-5,
                                   msg=lambda text: f"{parameter}: {text}")


def test_per_sentence_masks_equal_one_mask_per_sentence():
    model = model_with(METHODS["dhicm"])
    inputs = batch()
    masks = masks_of(PRUNE, batch_size=2)
    for mask in masks.values():
        mask[1] = 1.0  # the second sentence unmasked
    both = run(model, inputs, **masks)
    first = run(model, inputs, **masks_of(PRUNE))
    plain = run(model, inputs)
    torch.testing.assert_close(both.logits[0], first.logits[0])
    torch.testing.assert_close(both.logits[1], plain.logits[1])
    # generate expands per-sentence masks for beams
    tokens = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=2,
                            max_new_tokens=5, **masks)
    assert tokens.shape[0] == 2


@pytest.mark.parametrize("name", ["off", "dhicm", "dhicm_scaled_out_proj", "eadra"])
def test_mask_gradient_is_exact_float64(name):
    """Michel et al.'s importance is the gradient of the loss to the mask: gradcheck in float64, at ones and at a
    fractional mask (EaDRA computes its terms in float32: a float32 tolerance for its total loss). Ones are probed
    just below 1: masks must lie in [0, 1], and so must gradcheck's central differences. At 0, where a head leaves
    DHICM's softmax (not differentiable there), the gradient is finite."""
    model = model_with(METHODS[name]).double()
    inputs = batch()
    for start in (torch.ones(2, 4), torch.tensor([[1.0, 0.2, 0.5, 1.0], [0.3, 1.0, 0.9, 0.7]])):
        mask = start.double().clamp(max=1 - 2e-3).requires_grad_()
        assert torch.autograd.gradcheck(lambda m: model(**inputs, decoder_head_mask=m).nll_loss, (mask,))
        tolerance = {"eps": 1e-3, "atol": 1e-3, "rtol": 1e-3} if name == "eadra" else {}
        assert torch.autograd.gradcheck(lambda m: model(**inputs, cross_attn_head_mask=m).loss, (mask,), **tolerance)
    mask = torch.tensor([[1.0, 0.0, 0.5, 1.0], [0.0, 1.0, 1.0, 0.7]], dtype=torch.float64, requires_grad=True)
    model(**inputs, head_mask=mask, decoder_head_mask=mask, cross_attn_head_mask=mask).loss.backward()
    assert torch.isfinite(mask.grad).all() and mask.grad.abs().sum() > 0


def test_masked_logits_by_hand():
    scores = torch.tensor([[[1.0, 2.0, 3.0]]], dtype=torch.float64)  # (B, T, H)
    mask = torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64)
    weights = masked_logits(scores, mask).softmax(-1)
    expected = torch.tensor([1.0 * torch.e ** 1, 0.0, 0.5 * torch.e ** 3], dtype=torch.float64)
    torch.testing.assert_close(weights[0, 0], expected / expected.sum())
    assert torch.equal(masked_logits(scores, None), scores)


def test_eager_attention_weights_are_scaled_like_transformers_4():
    model = model_with({})
    model.set_attn_implementation("eager")
    masks = masks_of(PRUNE)
    plain = run(model, batch(), output_attentions=True)
    masked = run(model, batch(), output_attentions=True, **masks)
    expected = plain.encoder_attentions[0] * masks["head_mask"][0][None, :, None, None]  # (layer 1's inputs differ)
    assert not torch.equal(expected, plain.encoder_attentions[0])
    torch.testing.assert_close(masked.encoder_attentions[0], expected)


def test_off_model_equals_stock_with_masks_and_pruning():
    """Stock models have no head masks in transformers 5: a pruned stock-equivalent model equals the stock model
    with those heads' q/k/v rows zeroed, checked through the masks instead."""
    torch.manual_seed(0)
    stock = MBartForConditionalGeneration(MBartConfig(**TINY)).eval()
    ours = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY)).eval()
    ours.load_state_dict(stock.state_dict())
    assert torch.equal(run(stock, batch()).logits, run(ours, batch()).logits)
    with torch.no_grad():  # zero head 2's value rows in encoder layer 0: its output is zero, as masked
        stock.model.encoder.layers[0].self_attn.v_proj.weight[8:12] = 0
        stock.model.encoder.layers[0].self_attn.v_proj.bias[8:12] = 0
    mask = torch.ones(2, 4)
    mask[0, 2] = 0
    torch.testing.assert_close(run(ours, batch(), head_mask=mask).logits, run(stock, batch()).logits)


def test_pruned_model_round_trips_and_static_cache(tmp_path):
    model = model_with(METHODS["eadra"])
    model.prune_heads(PRUNE)
    model.save_pretrained(tmp_path)
    again = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert again.config.pruned_heads == {name: sorted(heads) for name, heads in PRUNE.items()}
    assert again.model.encoder.layers[1].self_attn.q_proj.weight.shape == (8, 16)
    assert again.model.encoder.layers[1].self_attn.eadra.heads is None  # heads [0, 2] minus pruned 0 and 2 ...
    assert again.model.encoder.layers[1].self_attn.eadra.num_heads == 0  # ... leave none regularized there
    assert list(again.model.encoder.layers[0].self_attn.eadra.heads.numbers) == [0, 2]
    torch.testing.assert_close(run(again, batch()).logits, run(model, batch()).logits, rtol=0, atol=0)
    source = {k: v for k, v in batch().items() if k != "labels"}
    dynamic = again.generate(**source, max_new_tokens=6, do_sample=False)
    static = again.generate(**source, max_new_tokens=6, do_sample=False, cache_implementation="static")
    assert torch.equal(dynamic, static)


def test_a_stack_saved_alone_keeps_its_pruned_heads(tmp_path):
    from hf_headattn.modeling import HeadAttnMBartEncoder

    model = model_with({})
    model.prune_heads({"encoder.layers.0.self_attn": [1]})
    encoder = model.get_encoder()  # (the stock class when pruned after building: its config records the heads)
    encoder.save_pretrained(tmp_path)
    again = HeadAttnMBartEncoder.from_pretrained(tmp_path).eval()
    ids = batch()["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids).last_hidden_state, encoder(input_ids=ids).last_hidden_state)


def test_eadra_heads_survive_from_pretrained(tmp_path):
    """Regression: EaDRA's chosen heads were a non-persistent buffer, left uninitialised by from_pretrained."""
    model = model_with({"eadra": {"encoder": {"heads": [1, 3]}}})
    model.save_pretrained(tmp_path)
    again = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path)
    assert list(again.model.encoder.layers[0].self_attn.eadra.heads.numbers) == [1, 3]


@pytest.mark.slow
def test_pruned_marian_and_remote_code(tmp_path):
    model = model_with(METHODS["dhicm"], family="marian")
    model.prune_heads({"model.decoder.layers.1.self_attn": [2]})
    model.save_pretrained(tmp_path / "model")
    torch.save(batch(), tmp_path / "inputs.pt")
    code = ("import sys, torch; sys.modules['hf_headattn'] = None\n"
            "from transformers import AutoModelForSeq2SeqLM\n"
            "m = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()\n"
            "with torch.no_grad(): torch.save(m(**torch.load(sys.argv[2])).logits, sys.argv[3])")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "model"), str(tmp_path / "inputs.pt"),
                    str(tmp_path / "out.pt")], check=True, capture_output=True)
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), run(model, batch()).logits)


def test_kept_masks_round_trip_and_move_with_the_model():
    model = model_with({})
    model.prune_heads({"decoder.layers.1.self_attn": [0]})
    mask = torch.rand(2, 4) * 0.9 + 0.1  # in (0, 1]
    model.set_head_mask("decoder", mask)
    expected = mask.clone()
    expected[1, 0] = 0.0  # pruned
    torch.testing.assert_close(model.get_head_mask("decoder"), expected)
    assert model.get_head_mask("encoder") is None
    model.to(torch.float64)
    assert model.model.decoder.layers[0].self_attn.headattn_head_mask.dtype == torch.float64
    model.set_head_mask("decoder", None)
    assert model.get_head_mask("decoder") is None


@pytest.mark.parametrize("call, message", [
    (lambda m: m(**batch(), head_mask=torch.ones(3, 4)),
     r"head_mask has shape \(3, 4\), expected \(layers, heads\) = \(2, 4\) or \(batch, layers, heads\)"),
    (lambda m: m(**batch(), decoder_head_mask=torch.ones(2, 4, dtype=torch.long)),
     r"decoder_head_mask must be a floating tensor .* got a torch.int64 tensor"),
    (lambda m: m(**batch(), cross_attn_head_mask=[[1.0] * 4] * 2), r"cross_attn_head_mask must be a floating tensor"),
    (lambda m: m.generate(batch()["input_ids"], num_beams=2, max_new_tokens=2, head_mask=torch.ones(2, 4)),
     r"head_mask has shape \(4, 4\).*generate repeats a \(layers, heads\) mask for beams"),
    (lambda m: m.set_head_mask("self", torch.ones(2, 4)),
     r"component must be one of \['encoder', 'decoder', 'cross'\]"),
    (lambda m: m.set_head_mask("encoder", torch.ones(1, 2, 4)), r"expected \(layers, heads\) = \(2, 4\)$"),
    (lambda m: m.prune_heads({"encoder.layers.5.self_attn": [0]}), r"'encoder.layers.5.self_attn' is no attention"),
    (lambda m: m.prune_heads({"encoder.layers.0.fc1": [0]}), r"is no attention module of this model"),
    (lambda m: m.prune_heads({"encoder.layers.0.self_attn": [4]}), r"head numbers in \[0, 3\].*got \[4\]"),
    (lambda m: m.prune_heads({"encoder.layers.0.self_attn": [0, 1, 2, 3]}), r"would remove all 4 heads"),
    (lambda m: m.prune_heads({"encoder.layers.0.self_attn": "0"}), r"must be a list of head numbers"),
])
def test_bad_masks_and_prunings_raise_clear_errors(call, message):
    model = model_with({})
    with pytest.raises(ValueError, match=message):
        call(model)


def test_pruning_twice_and_config_edits():
    model = model_with(METHODS["dhicm"])
    model.prune_heads({"encoder.layers.0.self_attn": [1]})
    with pytest.raises(ValueError, match=r"heads \[1\] are already pruned"):
        model.prune_heads({"encoder.layers.0.self_attn": [1, 2]})
    with pytest.raises(ValueError, match=r"with the heads pruned before would remove all 4 heads"):
        model.prune_heads({"encoder.layers.0.self_attn": [0, 2, 3]})
    model.prune_heads({"encoder.layers.0.self_attn": [3]})  # original numbers, not the current ones
    assert model.config.pruned_heads == {"encoder.layers.0.self_attn": [1, 3]}
    assert list(model.model.encoder.layers[0].self_attn.headattn_heads.numbers) == [0, 2]
    with pytest.raises(TypeError, match="read-only"):
        model.config.pruned_heads["encoder.layers.0.self_attn"].append(0)
    model.config.pruned_heads = {"encoder.layers.1.self_attn": [0]}
    with pytest.raises(ValueError, match="config.pruned_heads was changed after the model was built"):
        model(**batch())
    with pytest.raises(ValueError, match=r"pruned_heads has the key 'layers.0'"):
        HeadAttnMBartConfig(**TINY, pruned_heads={"layers.0": [1]})
    with pytest.raises(ValueError, match=r"the decoder has 2 layers"):
        HeadAttnMBartConfig(**TINY, pruned_heads={"decoder.layers.2.encoder_attn": [1]})
