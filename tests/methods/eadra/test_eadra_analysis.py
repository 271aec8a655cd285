"""The encoder-entropy analysis (EaDRA Table 2, Figure 1) on a tiny model."""

import json
import math

import pytest
import torch

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.experiment.analysis import encoder_attention_entropy, write_entropy_report


def tiny_model():
    torch.manual_seed(0)
    return HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, attention_dropout=0.0))


def batches():
    second = {"input_ids": torch.tensor([[20, 21, 2]]), "attention_mask": torch.tensor([[1, 1, 1]])}
    return [batch(), second]


def loop_means(model):
    """Per (layer, head): mean over real source tokens of H(a_i) / log(#real keys), by loops over eager maps."""
    model.set_attn_implementation("eager")
    sums, count = {}, 0
    for inputs in batches():
        with torch.no_grad():
            maps = model.get_encoder()(**inputs, output_attentions=True).attentions
        for b, mask in enumerate(inputs["attention_mask"].tolist()):
            keys = [j for j, m in enumerate(mask) if m]
            for i in keys:
                count += 1
                for layer, a in enumerate(maps):
                    for head in range(a.shape[1]):
                        p = a[b, head, i].tolist()
                        h = -sum(p[j] * math.log(p[j]) for j in keys if p[j] > 0) / math.log(len(keys))
                        sums[layer, head] = sums.get((layer, head), 0.0) + h
    layers, heads = len(maps), maps[0].shape[1]
    return [[sums[layer, head] / count for head in range(heads)] for layer in range(layers)]


def test_head_means_match_a_loop_and_the_backend_is_restored():
    model = tiny_model()
    result = encoder_attention_entropy(model, batches())
    assert model.config._attn_implementation == "sdpa" and model.training
    expected = loop_means(tiny_model())
    assert len(result["entropy"]) == 2 and len(result["entropy"][0]) == 4
    for got, want in zip(result["entropy"], expected):
        assert got == pytest.approx(want, rel=1e-5)
    flat = [v for row in expected for v in row]
    assert result["min"] == pytest.approx(min(flat)) and result["max"] == pytest.approx(max(flat))
    assert result["avg"] == pytest.approx(sum(flat) / len(flat))
    assert result["num_tokens"] == 6 + 4 + 3 and result["num_sentences"] == 3
    assert 0 <= result["min"] <= result["avg"] <= result["max"] <= 1


def test_uniform_attention_has_entropy_one():
    model = tiny_model()
    for layer in model.model.encoder.layers:  # zero queries: every score 0, attention uniform over real keys
        torch.nn.init.zeros_(layer.self_attn.q_proj.weight)
        torch.nn.init.zeros_(layer.self_attn.q_proj.bias)
    result = encoder_attention_entropy(model, batches())
    assert result["min"] == pytest.approx(1.0) and result["max"] == pytest.approx(1.0)


def test_report_writes_json_and_png(tmp_path):
    result = encoder_attention_entropy(tiny_model(), batches())
    json_path, png_path = write_entropy_report(result, tmp_path / "report", title="tiny")
    assert json.loads(json_path.read_text()) == result
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png_path.stat().st_size > 1000


def test_no_tokens_is_an_error():
    empty = [{"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.tensor([[0, 0]])}]
    with pytest.raises(ValueError, match="no real source token"):
        encoder_attention_entropy(tiny_model(), empty)


def test_a_model_with_pruned_encoder_heads_reports_the_heads_it_kept(tmp_path):
    """Pruned heads leave layers of different head counts (#64: the analysis failed on them); each layer lists its
    kept heads, with the values of the unpruned model's heads where pruning does not change the layer's maps."""
    model = tiny_model()
    whole = encoder_attention_entropy(model, batches())
    model.prune_heads({"encoder.layers.1.self_attn": [0, 2]})
    result = encoder_attention_entropy(model, batches())
    assert [len(layer) for layer in result["entropy"]] == [4, 2]
    assert result["entropy"][0] == pytest.approx(whole["entropy"][0], rel=1e-5)
    assert result["entropy"][1] == pytest.approx([whole["entropy"][1][1], whole["entropy"][1][3]], rel=1e-5)
    assert write_entropy_report(result, tmp_path)[1].stat().st_size > 1000
