"""Head-mask checks (values, per-sentence batch) and masks that leave a module no head."""

import pytest
import torch

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, head_masks
from test_head_pruning import METHODS, model_with, run

ARGUMENTS = ("head_mask", "decoder_head_mask", "cross_attn_head_mask")


def ones_with(value, layer=1, head=2):
    mask = torch.ones(2, 4)
    mask[layer, head] = value
    return mask


@pytest.mark.parametrize("value", [float("nan"), -1.0, 1.5, float("inf")])
@pytest.mark.parametrize("argument", ARGUMENTS)
@pytest.mark.parametrize("name", ["off", "dhicm", "eadra"])
def test_mask_values_outside_0_1_raise(name, argument, value):
    model = model_with(METHODS[name])
    with pytest.raises(ValueError, match=rf"^{argument} must hold finite values in \[0, 1\] .* got 1 value\(s\) "
                                         rf"outside it: {value}$"):
        run(model, batch(), **{argument: ones_with(value)})


@pytest.mark.parametrize("component", ["encoder", "decoder", "cross"])
def test_kept_mask_values_are_checked(component):
    model = model_with({})
    with pytest.raises(ValueError, match=rf"set_head_mask\('{component}', \.\.\.\) must hold finite values in "
                                         r"\[0, 1\] .* got 2 value\(s\) outside it: -0.5, nan$"):
        model.set_head_mask(component, torch.tensor([[1.0, -0.5, 1.0, 1.0], [1.0, 1.0, float("nan"), 0.0]]))
    assert model.get_head_mask(component) is None


def test_generate_and_the_encoder_alone_check_the_encoder_mask():
    model = model_with({})
    source = batch()["input_ids"]
    with pytest.raises(ValueError, match=r"head_mask must hold finite values .* outside it: 2.0$"):
        model.generate(source, max_new_tokens=2, head_mask=ones_with(2.0, layer=0))
    with pytest.raises(ValueError, match=r"head_mask must hold finite values .* outside it: -1.0$"):
        model.get_encoder()(input_ids=source, head_mask=ones_with(-1.0))
    with pytest.raises(ValueError, match=r"head_mask has one mask per sentence for a batch of 3 .* gets a batch of 2"):
        model.get_encoder()(input_ids=source, head_mask=torch.ones(3, 2, 4))


def test_mask_values_are_checked_once_per_forward(monkeypatch):
    """One fused check (one host sync) for all the forward's masks, none again in the encoder's pre-hook."""
    calls = []
    check = head_masks.check_values
    monkeypatch.setattr(head_masks, "check_values", lambda masks: calls.append(sorted(masks)) or check(masks))
    run(model_with(METHODS["dhicm"]), batch(), **{argument: torch.ones(2, 4) for argument in ARGUMENTS})
    assert calls == [sorted(ARGUMENTS)]


@pytest.mark.slow
def test_value_check_keeps_gradients_and_compiles_without_graph_break():
    config = HeadAttnMBartConfig(**TINY)
    mask = torch.full((2, 4), 0.5, requires_grad=True)
    values = {"input_ids": batch()["input_ids"], "head_mask": mask}
    head_masks.check_forward_masks(values, config)
    assert values["head_mask"] is mask and mask.grad is None

    def scaled(m):
        head_masks.check_forward_masks({"input_ids": torch.ones(2, 3), "head_mask": m}, config)
        return m * 2

    compiled = torch.compile(scaled, fullgraph=True, backend="eager")  # fullgraph: a graph break raises
    torch.testing.assert_close(compiled(torch.full((2, 4), 2.0)), torch.full((2, 4), 4.0))  # not checked compiled


@pytest.mark.parametrize("argument", ARGUMENTS)
def test_per_sentence_mask_of_another_batch_raises(argument):
    model = model_with({})
    with pytest.raises(ValueError, match=rf"^{argument} has one mask per sentence for a batch of 3 \(shape "
                                         r"\(3, 2, 4\)\), but its attention gets a batch of 2; expected \(2, 2, 4\)"):
        run(model, batch(), **{argument: torch.ones(3, 2, 4)})


def test_per_sentence_masks_with_beams_compare_with_the_expanded_batch():
    """Beam search over a batch with one mask per sentence (``generate`` expands them with the beams) gives each
    sentence the tokens it gets alone with its own mask; the masks matter (a sentence with the other's mask, or none,
    gets other tokens), so beams given the wrong sentence's mask would show."""
    model = model_with(METHODS["dhicm"])
    source = {k: v for k, v in batch().items() if k != "labels"}
    masks = {argument: torch.ones(2, 2, 4) for argument in ARGUMENTS}
    masks["decoder_head_mask"][0, 1, 2] = 0.0
    masks["cross_attn_head_mask"][0, :, 1:] = 0.0
    masks["head_mask"][1, 0, :3] = 0.0
    search = dict(num_beams=3, max_new_tokens=6, do_sample=False)
    tokens = model.generate(**source, **search, **masks)
    assert tokens.shape[0] == 2
    for i in range(2):
        alone = {key: value[i:i + 1] for key, value in source.items()}  # (its padding kept: the same numbers)
        own = model.generate(**alone, **search, **{key: mask[i:i + 1] for key, mask in masks.items()})[0]
        assert tokens[i, :len(own)].tolist() == own.tolist()
        assert (tokens[i, len(own):] == model.config.pad_token_id).all()
        other = model.generate(**alone, **search, **{key: mask[1 - i:2 - i] for key, mask in masks.items()})[0]
        assert other.tolist() != own.tolist() and model.generate(**alone, **search)[0].tolist() != own.tolist()


@pytest.mark.parametrize("per_sentence", [False, True])
@pytest.mark.parametrize("kl_reduction", ["per_batch", "per_token"])
@pytest.mark.parametrize("mode", ["paper", "scaled_out_proj"])
def test_dhicm_module_with_every_head_masked_adds_kl_0_and_finite_gradients(mode, kl_reduction, per_sentence):
    """The module mixes nothing (output 0 before out_proj, as the off model's), its KL is 0 there; loss and every
    gradient (parameters, the mask itself) finite."""
    settings = {"dhicm": {"encoder_layers": [1], "mode": mode, "kl_reduction": kl_reduction}}
    model = model_with(settings)
    mask = torch.ones(2, 2, 4) if per_sentence else torch.ones(2, 4)
    mask[..., 1, :] = 0.0  # every head of encoder layer 1, the DHICM module
    if per_sentence:
        mask[1] = 1.0  # the second sentence unmasked
    mask.requires_grad_()
    output = model(**batch(), head_mask=mask)
    assert torch.isfinite(output.loss) and torch.isfinite(output.logits).all()
    if per_sentence:
        alone = model(**{k: v[1:] for k, v in batch().items()})  # the unmasked sentence's KL, over its tokens
        assert 0 < output.dhicm_kl < alone.dhicm_kl or mode == "scaled_out_proj"  # (U = 0: uniform, KL 0)
    else:
        assert output.dhicm_kl == 0
    output.loss.backward()
    assert torch.isfinite(mask.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_scale_weights_scales_weights_and_passes_the_flex_log_sum_exp_unchanged():
    """Eager's weights (B, H, T, S) are scaled per head (one mask or one per sentence); flex attention's log-sum-exp
    (B, H, T), its second output on CUDA, and SDPA's None come back as they are."""
    weights, lse = torch.rand(2, 4, 3, 5), torch.randn(2, 4, 3)
    shared, per_sentence = torch.tensor([[1.0, 0.0, 0.5, 1.0]]), torch.rand(2, 4)
    for mask in (shared, per_sentence):
        expected = torch.stack([torch.stack([weights[b, h] * mask[b % mask.shape[0], h] for h in range(4)])
                                for b in range(2)])
        torch.testing.assert_close(head_masks.scale_weights(weights, mask), expected, rtol=0, atol=0)
        assert head_masks.scale_weights(lse, mask) is lse
        assert head_masks.scale_weights(None, mask) is None
