"""Importing or calling hf-headattn changes no process-wide setting: a user's other models keep their numerics (TF32,
float32 matmul precision, deterministic algorithms, default dtype, SDPA backends, ...) and their libraries' logging
and progress bars. A switch our code needs (TF32 products of half-precision EaDRA heads on CUDA) is set for the
duration of our call only."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY, syntax_batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.methods.eadra.equations import _matmul_precision
from process_state import process_state

EVERY_METHOD = dict(dhicm={"encoder_layers": [-1], "decoder_layers": [-1]},
                    eadra={"encoder": {}, "decoder": {}, "cross": {}}, sea={"type": "lpea"})


def test_a_forward_backward_and_generate_leave_the_process_state_as_it_was():
    """Every method on, their read-outs, a backward pass and beam search: no process-wide switch changed after."""
    before = process_state()
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **EVERY_METHOD))
    inputs = syntax_batch()
    model(**inputs, output_head_importance=True, output_redundant_heads=True).loss.backward()
    model.eval()
    source = {key: inputs[key] for key in ("input_ids", "attention_mask", "dependency_mask", "phrase_positions")}
    model.generate(**source, max_new_tokens=3, num_beams=2)
    assert process_state() == before


@pytest.mark.parametrize("user_setting", ["highest", "medium"])
def test_tf32_for_half_precision_heads_is_set_for_the_call_only(user_setting):
    """EaDRA's (and the loss's) TF32 products on CUDA switch the float32 matmul precision inside the call, and give
    the user's setting back after it, also after an error; on the CPU and for float32 heads nothing switches."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(user_setting)
    try:
        with _matmul_precision(torch.bfloat16, torch.device("cuda")):
            assert torch.get_float32_matmul_precision() == "high"
        assert torch.get_float32_matmul_precision() == user_setting
        with pytest.raises(KeyError), _matmul_precision(torch.float16, torch.device("cuda")):
            raise KeyError("inside")
        assert torch.get_float32_matmul_precision() == user_setting
        for dtype, device in ((torch.bfloat16, "cpu"), (torch.float32, "cuda")):
            with _matmul_precision(dtype, torch.device(device)):
                assert torch.get_float32_matmul_precision() == user_setting
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.slow
def test_importing_the_package_leaves_the_process_state_as_it_was():
    """In a fresh interpreter: the state after importing torch, transformers and datasets equals the state after
    importing every module of the package (the kit included; ``tests/process_state.py``)."""
    script = Path(__file__).with_name("process_state.py")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = json.loads(result.stdout.splitlines()[-1])
    assert after == before
