"""Localness on flex attention (its bias a score_mod reading the (B, H, T, S) tensor by index) equals the SDPA path:
alone, and as Localness+RHE beside LPEA+RHE on one layer (both biases, one RHE selection), padding included."""

import pytest
import torch

from conftest import TINY, syntax_batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration

pytestmark = pytest.mark.slow  # transformers' flex function compiles


def test_localness_rhe_beside_lpea_rhe_on_flex_equals_sdpa():
    """(One case: 20-40 s on a CPU core, the flex function's compilation; it covers the bias on chosen heads per
    sentence, beside another method's.)"""
    settings = {"localness": {"head_selection": "redundant"}, "sea": {"type": "lpea", "max_relative_position": 2}}
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, init_std=0.5, dropout=0.0, attention_dropout=0.0, **settings)
    model = HeadAttnMBartForConditionalGeneration(config).eval()
    inputs = syntax_batch()
    with torch.no_grad():
        expected = model(**inputs)
        model.set_attn_implementation("flex_attention")
        out = model(**inputs)
    for field in ("encoder_last_hidden_state", "logits", "loss"):
        torch.testing.assert_close(out[field], expected[field], atol=1e-5, rtol=1e-4, msg=field)
