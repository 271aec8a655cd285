"""Issue #18: no host-device synchronisation in a training step, counted on the CPU as the operators that read a
tensor's value on the host (each one a synchronisation on a GPU)."""

import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from operator_count import sync_operators  # noqa: E402


def syntax_batch():
    inputs = batch()
    B, S = inputs["input_ids"].shape
    near = (torch.arange(S)[None, :] - torch.arange(S)[:, None]).abs() <= 1  # each token related to its neighbours
    inputs["dependency_mask"] = near.expand(B, S, S)
    inputs["phrase_positions"] = (torch.arange(S)[None, :] - torch.arange(S)[:, None]).clamp(-2, 2).expand(B, S, S)
    return inputs


SETTINGS = {
    "off": {},
    "dhicm": {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1]}},
    "eadra": {"eadra": {"encoder": {}, "decoder": {}, "cross": {}}},
    "dea-rhe": {"sea": {"type": "dea", "layers": [0, 1]}},
    "lpea-rhe": {"sea": {"type": "lpea", "layers": [0, 1]}},
}


def syncs(settings):
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **settings)).train()
    inputs = syntax_batch() if "sea" in settings else batch()
    model(**inputs).loss.backward()  # warm-up
    # on the path an accelerator takes: SEA's value check of phrase_positions reads them on the host only on the CPU
    return sync_operators(lambda: model(**inputs).loss.backward())


def test_the_counter_sees_host_reads():
    t = torch.tensor([1, 0, 2])
    assert sync_operators(lambda: (t[0].item(), bool(t.any()), t.nonzero(), t[t > 0], torch.unique(t))) == [
        "aten._local_scalar_dense.default", "aten._local_scalar_dense.default", "aten.nonzero.default",
        "aten.index.Tensor", "aten._unique2.default"]
    assert sync_operators(lambda: (t + 1, t[t.argsort()], t.masked_fill(t > 0, 0), t.repeat_interleave(2))) == []


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_training_step_reads_no_value_on_the_host_beyond_stock(name):
    assert syncs(SETTINGS[name]) == syncs({})  # (what HF itself does, if anything, is the same for every row)


def test_bad_phrase_positions_still_raise_once_per_forward():
    inputs = syntax_batch()
    inputs["phrase_positions"] = inputs["phrase_positions"].clone()
    inputs["phrase_positions"][0, 0, 1] = 10000
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **SETTINGS["lpea-rhe"]))
    with pytest.raises(ValueError, match="phrase_positions contains 10000"):
        model(**inputs)


def test_dhicm_and_eadra_compile_without_graph_breaks():
    torch.manual_seed(0)
    settings = {**SETTINGS["dhicm"], **SETTINGS["eadra"]}
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **settings)).train()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(lambda **inputs: model(**inputs).loss)(**batch())
    torch._dynamo.reset()
    assert explanation.graph_break_count == 0, explanation.break_reasons
