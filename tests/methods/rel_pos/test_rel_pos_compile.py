"""torch.compile with relative positions (tests/test_compile.py's checks, aot_eager on the CPU): loss and gradients
equal eager ones, no graph break, no recompilation across steps of one shape, once more at most over varying
lengths; with the value term (every head taken over) and with RHE's per-sentence selection. Flex attention's
forward (compiled by transformers) gives SDPA's logits."""

import copy

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from compile_check import NO_DROPOUT, fresh_batch
from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration

pytestmark = pytest.mark.slow  # every test compiles

CASES = {
    "keys-values": {"max_relative_position": 2, "decoder_layers": [-1]},
}  # (head_selection="redundant": the same code with RHE's selection, which SEA's compile tests cover; time budget)


def step(model, inputs):
    model.zero_grad(set_to_none=True)
    loss = model(**{key: value.clone() for key, value in inputs.items()}).loss
    loss.backward()
    return loss.detach(), {name.removeprefix("_orig_mod."): p.grad for name, p in model.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_without_breaks_or_recompiles_and_equals_eager(name):
    """Two steps of one shape, then two of other lengths (dynamic: one more graph at most); 1 + 1 layers. (The key
    term alone is a score bias, SEA's path in tests/test_compile.py.)"""
    torch.manual_seed(0)
    eager = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(
        **{**TINY, "encoder_layers": 1, "decoder_layers": 1}, **NO_DROPOUT, rel_pos=CASES[name]))
    eager.train()
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    counters.clear()
    run, graphs = torch.compile(model, backend="aot_eager"), []
    try:
        for seed, size in enumerate([(4, 8, 7)] * 2 + [(3, 12, 5), (2, 6, 11)]):
            inputs = fresh_batch(seed, eager.config, "cpu", sea=name == "redundant", size=size)
            inputs.pop("phrase_positions", None)
            (eager_loss, eager_grads), (loss, grads) = step(eager, inputs), step(run, inputs)
            torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
            assert grads.keys() == eager_grads.keys()
            for key in grads:
                torch.testing.assert_close(grads[key], eager_grads[key], rtol=1e-4, atol=1e-6, msg=key)
            graphs.append(counters["stats"]["unique_graphs"])
        assert sum(counters["graph_break"].values()) == 0
    finally:
        torch._dynamo.reset()
    assert graphs[0] >= 1 and graphs[1] == graphs[0], graphs  # nothing compiled after the first step
    assert graphs[2] <= graphs[0] + 1 and graphs[-1] == graphs[2], graphs


@pytest.mark.parametrize("values", [True])  # (values=False: a score bias alone, as Localness's flex test)
def test_flex_attention_gives_sdpas_logits(values):
    """Flex attention (forward: the CPU has no flex backward): with the value term the heads are taken over (their
    mask from the block mask), without it the key term is a score_mod reading the bias by index."""
    torch.compiler.reset()
    try:
        torch.manual_seed(0)
        settings = {"max_relative_position": 2, "decoder_layers": "all", "values": values}
        model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, init_std=0.5, rel_pos=settings))
        model.eval()
        with torch.no_grad():
            expected = model(**batch()).logits
            model.set_attn_implementation("flex_attention")
            torch.testing.assert_close(model(**batch()).logits, expected, atol=1e-5, rtol=1e-5)
    finally:
        torch.compiler.reset()
