"""Issue #18: no host-device synchronisation in a training step, counted on the CPU as the operators that read a
tensor's value on the host (each one a synchronisation on a GPU)."""

import pytest
import torch
import torch._dynamo
from torch.utils._python_dispatch import TorchDispatchMode

import hf_headattn.sea
from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration

SYNC = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.is_nonzero", "aten.equal")


class CountSyncs(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(SYNC):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def syntax_batch():
    inputs = batch()
    B, S = inputs["input_ids"].shape
    near = (torch.arange(S)[None, :] - torch.arange(S)[:, None]).abs() <= 1  # each token related to its neighbours
    inputs["dependency_mask"] = near.expand(B, S, S)
    inputs["phrase_positions"] = (torch.arange(S)[None, :] - torch.arange(S)[:, None]).clamp(-2, 2).expand(B, S, S)
    return inputs


SETTINGS = {
    "off": {},
    "dhicm": {"dhicm_encoder_layers": [-1], "dhicm_decoder_layers": [-1]},
    "eadra": {"eadra": {"encoder": {}, "decoder": {}, "cross": {}}},
    "dea-rhe": {"sea_type": "dea", "sea_layers": [0, 1]},
    "lpea-rhe": {"sea_type": "lpea", "sea_layers": [0, 1]},
}


def syncs(settings):
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **settings)).train()
    inputs = syntax_batch() if "sea_type" in settings else batch()
    model(**inputs).loss.backward()  # warm-up
    with CountSyncs() as counter:
        model(**inputs).loss.backward()
    return counter.ops


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_training_step_reads_no_value_on_the_host_beyond_stock(name, monkeypatch):
    # SEA's value check reads phrase_positions on the host only on the CPU, where that costs nothing: check the path
    # an accelerator takes (a device-side assertion)
    monkeypatch.setattr(hf_headattn.sea, "_checks_on_host", lambda tensor: False)
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
