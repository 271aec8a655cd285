"""Relative positions (Shaw et al. 2018) in the models: what they change in the attention weights, generation with a
cache, RHE's selection with real inputs, checkpoints, settings errors."""

import inspect

import pytest
import torch
from transformers import MBartConfig, MBartForConditionalGeneration

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.hf_compat import CACHE_NAMES, cache_argument

K = 2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A stock mBART checkpoint with large random weights (init_std 0.5), so that attention changes the logits."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("rel-pos-mbart")
    MBartForConditionalGeneration(MBartConfig(**TINY, init_std=0.5)).save_pretrained(path)
    return path


def load(path, attn_implementation="sdpa", **settings):
    """The checkpoint with ``config.rel_pos`` (k = 2 unless given), its tables drawn with std 0.5 (seeded)."""
    torch.manual_seed(1)
    return HeadAttnMBartForConditionalGeneration.from_pretrained(
        path, attn_implementation=attn_implementation, rel_pos={"max_relative_position": K, **settings}).eval()


def stock(path, attn_implementation="sdpa"):
    return MBartForConditionalGeneration.from_pretrained(path, attn_implementation=attn_implementation).eval()


@pytest.mark.parametrize("tables", ["head", "layer"])
@pytest.mark.parametrize("values", [True, False])
def test_each_rows_log_weights_change_by_the_key_term(checkpoint, values, tables):
    """Eager, output_attentions=True, layer 0 (same inputs with the method on and off): within each row the
    log-weights differ by q_i . w^K_{clip(j - i, k)} * scaling up to a row constant, on the real keys; with a table
    per head, each head's own (the terms differ between the heads of the layer)."""
    model = load(checkpoint, "eager", encoder_layers=[0], values=values, tables=tables)
    plain = stock(checkpoint, "eager")
    inputs = batch()
    with torch.no_grad():
        on = model(**inputs, output_attentions=True, output_hidden_states=True)
        off = plain(**inputs, output_attentions=True)
        layer = model.model.encoder.layers[0]
        attention = layer.self_attn
        hidden = layer.self_attn_layer_norm(on.encoder_hidden_states[0])
        B, T, _ = hidden.shape
        query = attention.q_proj(hidden).view(B, T, -1, attention.head_dim).transpose(1, 2)  # (B, H, T, D)
        table = attention.rel_pos.relative_keys
        labels = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).clamp(-K, K) + K
        if tables == "head":
            assert table.shape == (4, 2 * K + 1, attention.head_dim)
            expected = torch.einsum("bhtd,htsd->bhts", query, table[:, labels]) * attention.scaling
            assert (expected[:, 0] - expected[:, 1]).abs().max() > 0.1  # heads differ
        else:
            expected = torch.einsum("bhtd,tsd->bhts", query, table[labels]) * attention.scaling
    real = inputs["attention_mask"].bool()[:, None, None, :]  # (B, 1, 1, S)
    difference = (on.encoder_attentions[0].log() - off.encoder_attentions[0].log() - expected).masked_fill(~real, 0)
    centred = difference - difference.sum(-1, keepdim=True) / real.sum(-1, keepdim=True)
    assert centred.masked_fill(~real, 0).abs().max() < 1e-4
    assert expected.abs().max() > 0.1  # (a term that matters)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_generate_with_beams_and_cache_equals_no_cache(checkpoint, backend):
    """Relative positions in every encoder and decoder self-attention layer: one step after a cache is the full
    forward's last row (the query's position is the key length - 1), and beam search with the cache gives what it
    gives without."""
    model = load(checkpoint, backend, decoder_layers=[0, 1])
    inputs = batch()
    decoder_ids = torch.tensor([[0, 13, 14, 15], [0, 16, 17, 18]])
    with torch.no_grad():
        full = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                     decoder_input_ids=decoder_ids).logits
        first = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                      decoder_input_ids=decoder_ids[:, :3], use_cache=True)
        name = next(name for name in CACHE_NAMES if name in inspect.signature(model.forward).parameters)  # 5.24: cache
        step = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                     decoder_input_ids=decoder_ids[:, 3:], **{name: cache_argument(first)}).logits
    torch.testing.assert_close(step[:, -1], full[:, -1], atol=1e-5, rtol=1e-5)
    generate = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"], "num_beams": 3,
                "max_new_tokens": 8, "output_scores": True, "return_dict_in_generate": True}
    cached, uncached = model.generate(**generate), model.generate(**generate, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, atol=1e-5, rtol=1e-5)
    # a static cache: its keys include empty slots, each query's position comes from its causal mask
    static = model.generate(**generate, cache_implementation="static")
    assert torch.equal(static.sequences, uncached.sequences)
    torch.testing.assert_close(static.sequences_scores, uncached.sequences_scores, atol=1e-5, rtol=1e-5)
    assert not torch.equal(cached.sequences, stock(checkpoint, backend).generate(**generate).sequences)


def dependency(related_rows):
    """dependency_mask for :func:`batch` (6 tokens): sentences in ``related_rows`` relate every pair (no head
    redundant), the others each token to itself only (every head redundant)."""
    related = torch.tensor([b in related_rows for b in range(2)])[:, None, None]
    return related.expand(2, 6, 6) | torch.eye(6, dtype=torch.bool)


def test_redundant_heads_are_chosen_per_sentence(checkpoint):
    """head_selection="redundant" with RHE on real inputs: a sentence with every head redundant gets what
    head_selection="all" gives it, one with none the plain model's logits; a missing dependency_mask is a clear
    error."""
    everywhere = load(checkpoint, encoder_layers=[0])
    rhe = load(checkpoint, encoder_layers=[0], head_selection="redundant")
    rhe.load_state_dict(everywhere.state_dict())
    inputs = batch()
    with torch.no_grad():
        mixed = rhe(**inputs, dependency_mask=dependency(related_rows=(0,))).logits
        all_heads = everywhere(**inputs).logits
        plain = stock(checkpoint)(**inputs).logits
    torch.testing.assert_close(mixed[0], plain[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed[1], all_heads[1], atol=1e-5, rtol=1e-5)
    assert (all_heads[0] - plain[0]).abs().max() > 1e-2
    with pytest.raises(ValueError,
                       match="rel_pos with head_selection='redundant' needs the forward argument dependency_mask"):
        rhe(**inputs)
    with pytest.raises(ValueError, match=r"rel_pos: dependency_mask must be a bool tensor of shape \(batch, src_len, "
                                         r"src_len\) = \(2, 6, 6\), got torch.int64"):
        rhe(**inputs, dependency_mask=dependency(()).long())


def test_save_and_load_keep_the_tables(checkpoint, tmp_path):
    model = load(checkpoint, decoder_layers=[-1], values=True)
    model.save_pretrained(tmp_path)
    again = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert again.config.rel_pos == model.config.rel_pos and again.config.headattn_settings["rel_pos"].tables == "head"
    names = {name for name, _ in again.named_parameters() if ".rel_pos." in name}
    assert names == {f"model.{side}.layers.{layer}.self_attn.rel_pos.relative_{table}"
                     for side, layers in (("encoder", (0, 1)), ("decoder", (1,))) for layer in layers
                     for table in ("keys", "values")}
    with torch.no_grad():
        torch.testing.assert_close(again(**batch()).logits, model(**batch()).logits, atol=0, rtol=0)


@pytest.mark.parametrize("settings, message", [
    ({"max_relative_position": 0}, r"rel_pos.max_relative_position must be an integer >= 1, got 0"),
    ({"max_relative_position": 2.0}, r"rel_pos.max_relative_position must be an integer, got 2.0"),
    ({"tables": "shared"}, r"rel_pos.tables must be one of 'head', 'layer', got 'shared'"),
    ({"absolute_positions": "no"}, r"rel_pos.absolute_positions must be True or False, got 'no'"),
    ({"values": 1}, r"rel_pos.values must be True or False, got 1"),
    ({"encoder_layers": [2]}, r"rel_pos.encoder_layers contains 2, but the model has 2 layers"),
    ({"encoder_layers": "some"}, r"rel_pos.encoder_layers must be a list of \(an integer\) or one of 'all' or None, "
                                 r"got 'some'"),
    ({"encoder_layers": None}, r"places rel_pos on no attention module"),
    ({"head_selection": "redundant", "decoder_layers": [0]},
     r"rel_pos.head_selection='redundant' needs RHE's dependency_mask of the source, which the decoder's "
     r"self-attention has none of"),
    ({"head_selection": "redundant", "decoder_layers": "all"},
     r"rel_pos.head_selection='redundant' needs RHE's dependency_mask"),
    ({"head_selection": "some"}, r"rel_pos.head_selection must be one of 'all', 'redundant', got 'some'"),
    ({"implementation": "cuda"}, r"rel_pos.implementation must be one of 'auto', 'eager', 'triton', got 'cuda'"),
])
def test_settings_errors_name_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        HeadAttnMBartConfig(**TINY, rel_pos=settings)


@pytest.mark.parametrize("tables", ["head", "layer"])
def test_pruning_equals_masking(checkpoint, tables):
    """Pruning heads (whose outputs the value term adds to; per-head tables lose theirs) gives the logits of masking
    them."""
    model = load(checkpoint, decoder_layers="all", tables=tables)
    prune = {"encoder.layers.0.self_attn": [1], "decoder.layers.1.self_attn": [0, 2]}
    head_mask, decoder_head_mask = torch.ones(2, 4), torch.ones(2, 4)
    head_mask[0, 1], decoder_head_mask[1, [0, 2]] = 0, 0
    with torch.no_grad():
        masked = model(**batch(), head_mask=head_mask, decoder_head_mask=decoder_head_mask).logits
        assert not torch.allclose(masked, model(**batch()).logits)
        model.prune_heads(prune)
        torch.testing.assert_close(model(**batch()).logits, masked, atol=1e-5, rtol=1e-5)
