"""Shaw et al.'s compared model (§4.1-4.2): relative positions on encoder and decoder self-attention, a table per
layer and head, no absolute positions (``absolute_positions=False``, a ``MethodSpec.prepare_stack`` change): padding
side no longer matters, generation with a cache equals the full forward, checkpoints load, old configs keep shared
tables, and the ``rel_pos_shaw`` preset at Transformer-base."""

import pytest
import torch
from test_rel_pos import checkpoint, stock  # noqa: F401 (fixture)

from conftest import TINY, greedy_by_full_forward
from hf_headattn import (
    HeadAttnMarianConfig,
    HeadAttnMarianMTModel,
    HeadAttnMBartConfig,
    HeadAttnMBartForConditionalGeneration,
)
from hf_headattn.experiment.presets import MODEL_SHAPES, preset
from hf_headattn.model_hooks import is_muted

PUBLISHED = {"max_relative_position": 2, "tables": "head", "encoder_layers": "all", "decoder_layers": "all",
             "absolute_positions": False}


def load(path, **settings):
    model, info = HeadAttnMBartForConditionalGeneration.from_pretrained(
        path, rel_pos={**PUBLISHED, **settings}, output_loading_info=True)
    assert not info["unexpected_keys"] and all(".rel_pos." in key for key in info["missing_keys"])
    g = torch.Generator().manual_seed(1)
    for name, parameter in model.named_parameters():
        if ".rel_pos." in name:
            parameter.data = torch.randn(parameter.shape, generator=g) * 0.5
    return model.eval()


def padded(side):
    """One 4-token sentence beside a 6-token one, the short one padded on ``side``."""
    sentence, other = torch.tensor([5, 6, 7, 2]), torch.tensor([8, 9, 10, 11, 12, 2])
    pad = torch.full((2,), TINY["pad_token_id"])
    short = torch.cat([sentence, pad]) if side == "right" else torch.cat([pad, sentence])
    real = (short != TINY["pad_token_id"])
    return {"input_ids": torch.stack([short, other]), "attention_mask": torch.stack([real, torch.ones(6, dtype=bool)])
            .long()}, real


@pytest.mark.parametrize("absolute", [False, True])
def test_without_absolute_positions_the_padding_side_does_not_matter(checkpoint, absolute):  # noqa: F811
    model = load(checkpoint, absolute_positions=absolute)
    assert is_muted(model.model.encoder.embed_positions) == (not absolute)
    assert is_muted(model.model.decoder.embed_positions) == (not absolute)
    outputs = {}
    for side in ("right", "left"):
        inputs, real = padded(side)
        with torch.no_grad():
            outputs[side] = model.get_encoder()(**inputs).last_hidden_state[0, real]  # (4, d): the real tokens
    if absolute:  # mBART's learned positions move with the padding
        assert (outputs["right"] - outputs["left"]).abs().max() > 1e-3
    else:
        torch.testing.assert_close(outputs["right"], outputs["left"], atol=1e-5, rtol=1e-5)


def test_position_embeddings_contribute_nothing_and_keep_their_weights(checkpoint, tmp_path):  # noqa: F811
    model = load(checkpoint)
    embeddings = model.model.encoder.embed_positions
    assert torch.equal(embeddings.weight, stock(checkpoint).model.encoder.embed_positions.weight)
    with torch.no_grad():
        assert embeddings(torch.ones(2, 5, dtype=torch.long)).abs().max() == 0
    model.save_pretrained(tmp_path)
    again = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert is_muted(again.model.encoder.embed_positions) and again.config.rel_pos["absolute_positions"] is False
    inputs, _ = padded("right")
    with torch.no_grad():
        torch.testing.assert_close(again(**inputs, labels=inputs["input_ids"]).logits,
                                   model(**inputs, labels=inputs["input_ids"]).logits, atol=0, rtol=0)


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_generate_with_a_cache_equals_the_full_forward(checkpoint, attn_implementation):  # noqa: F811
    model = load(checkpoint)
    model.set_attn_implementation(attn_implementation)
    inputs, _ = padded("left")
    tokens = model.generate(**inputs, num_beams=1, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert torch.equal(tokens, greedy_by_full_forward(model, inputs, 6))


def test_marian_mutes_its_sinusoidal_positions():
    model = HeadAttnMarianMTModel(HeadAttnMarianConfig(**TINY, rel_pos={**PUBLISHED, "decoder_layers": None}))
    assert is_muted(model.model.encoder.embed_positions) and not is_muted(model.model.decoder.embed_positions)


def test_old_saved_configs_keep_tables_shared_by_the_heads():
    old = HeadAttnMBartConfig.from_dict({**TINY, "model_type": "headattn_mbart", "headattn_version": "0.3.0",
                                         "rel_pos": {"max_relative_position": 2}})
    assert old.headattn_settings["rel_pos"].tables == "layer"
    model = HeadAttnMBartForConditionalGeneration(old)
    assert model.model.encoder.layers[0].self_attn.rel_pos.relative_keys.shape == (5, 4)
    assert HeadAttnMBartConfig(**TINY, rel_pos={}).headattn_settings["rel_pos"].tables == "head"


def test_the_shaw_preset_at_transformer_base_has_a_table_per_layer_and_head():
    settings = preset("rel_pos_shaw").method_overrides["rel_pos"]
    with torch.device("meta"):
        model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(
            **MODEL_SHAPES["base"], vocab_size=100, rel_pos=settings))
    for stack in (model.model.encoder, model.model.decoder):
        assert is_muted(stack.embed_positions)
        assert all(layer.self_attn.rel_pos.relative_keys.shape == (8, 33, 64) for layer in stack.layers)
    assert not hasattr(model.model.decoder.layers[0].encoder_attn, "rel_pos")
