"""Two registered methods on one attention module (issue #62): every pair either composes, with the same loss and
logits on SDPA, eager and flex attention (with labels, and without: the path ``generate`` and evaluation take), or is
refused when the config is built, naming both methods and the module; the commands turn that into a usage error.
A method that masks keys never leaves a real query weight on padding (fixed attention beside SEA's DEA mask), and the
docs' compatibility table is the registry's."""

import itertools
import re
from pathlib import Path

import pytest
import torch

from conftest import TINY, syntax_batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.experiment.compatibility import BEGIN, END, compatibility_table
from hf_headattn.flex import FLEX
from hf_headattn.methods.fixed_attention.equations import pattern_weights
from hf_headattn.registry import registered_methods

ROOT = Path(__file__).resolve().parents[1]
#: Each method on encoder layer 0's self-attention (4 heads): fixed attention on heads 0-2, EaDRA on head 3 (the one
#: fixed attention leaves learnable), SEA's DEA mask on every head (so on the fixed heads too).
ON_LAYER_0 = {
    "dhicm": {"encoder_layers": [0]},
    "eadra": {"encoder": {"layers": [0], "heads": [3]}},
    "fixed_attention": {"patterns": ["left", "previous", "start"], "encoder_layers": [0]},
    "localness": {"encoder_layers": [0]},
    "rel_pos": {"encoder_layers": [0]},
    "sea": {"type": "dea", "head_selection": "all", "encoder_layers": [0]},
}
#: The pairs refused on one layer with those settings (both take over heads 0-2).
REFUSED = {("fixed_attention", "rel_pos")}
PAIRS = [pair for pair in itertools.combinations(sorted(ON_LAYER_0), 2) if pair not in REFUSED]


def test_every_registered_method_is_in_the_matrix():
    assert {spec.name for spec in registered_methods()} == set(ON_LAYER_0)


def pair_model(first, second, **settings):
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, dropout=0.0, attention_dropout=0.0,
                                 **{first: ON_LAYER_0[first], second: ON_LAYER_0[second]}, **settings)
    return HeadAttnMBartForConditionalGeneration(config).eval()


def run(model, backend, labels=True):
    """(loss, logits) with labels, or the logits without (the decoder's input given: the path of ``generate`` and
    evaluation), on ``backend``."""
    model.set_attn_implementation(backend)
    inputs = syntax_batch()
    if not labels:
        inputs["decoder_input_ids"] = inputs.pop("labels").clamp(min=0)
    with torch.no_grad():
        output = model(**inputs)
    return (output.loss, output.logits) if labels else (output.logits,)


def assert_same(result, expected):
    for got, want in zip(result, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("first, second", PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_the_pairs_that_compose_agree_on_sdpa_and_eager(first, second):
    model = pair_model(first, second)
    for labels in (True, False):
        assert_same(run(model, "eager", labels), run(model, "sdpa", labels))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")  # (unfused: on purpose)
def test_the_pairs_that_compose_agree_on_flex():
    """Flex attention (forward only on the CPU) gives SDPA's loss and logits for every pair that composes: one
    forward each, without labels where DHICM is in the pair (its fused path), else with them (the methods' terms).

    Flex runs unfused here (torch.compiler's "force_eager" stance; tests/test_flex.py checks each method on the
    compiled kernel): each pair's new closures, shapes and head slices recompile the kernel, dynamo's recompile limit
    (8) is reached by the third pair and the rest ran unfused anyway (torch's "flex_attention called without
    torch.compile()" warning), in 17 s against 3.5 s on the CPU."""
    torch.compiler.reset()  # (torch 2.13's CPU flex recompile bug, see tests/test_flex.py)
    try:
        with torch.compiler.set_stance("force_eager"):
            for first, second in PAIRS:
                model = pair_model(first, second)
                labels = "dhicm" not in (first, second)
                assert_same(run(model, FLEX, labels), run(model, "sdpa", labels))
    finally:
        torch.compiler.reset()


def test_rel_pos_and_dhicm_generate_on_a_padded_batch():
    """Rel_Pos takes over every head (its output a transposed view) and DHICM's fused mixing reads it: generate
    without labels on a padded batch runs (it raised "view size is not compatible") and equals a full recompute."""
    model = pair_model("dhicm", "rel_pos")
    inputs = syntax_batch()
    model.set_attn_implementation("sdpa")
    tokens = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=3,
                            num_beams=1, do_sample=False)
    assert tokens.shape[0] == 2 and tokens.shape[1] >= 2


@pytest.mark.parametrize("settings, message", [
    ({"fixed_attention": {"patterns": ["previous", "next"]}, "rel_pos": {}},
     r"rel_pos and fixed_attention both take over heads \[0, 1\] of encoder\.layers\.0\.self_attn"),
    ({"fixed_attention": {"patterns": ["previous", "next"], "encoder_layers": [1]},
      "eadra": {"encoder": {"num_heads": 2}}},
     r"eadra reads the attention probabilities of heads \[0, 1\] of encoder\.layers\.1\.self_attn, which "
     r"fixed_attention fixes"),
])
def test_pairs_that_cannot_compose_are_refused_when_the_config_is_built(settings, message):
    with pytest.raises(ValueError, match=message):
        HeadAttnMBartConfig(**TINY, **settings)
    config = HeadAttnMBartConfig(**TINY)
    for key, value in settings.items():  # assigned one by one: refused at the second, the config unchanged
        if key == list(settings)[-1]:
            with pytest.raises(ValueError, match=message):
                setattr(config, key, value)
            assert getattr(config, key) is None
        else:
            setattr(config, key, value)


def test_the_same_pairs_compose_on_other_heads_or_layers():
    """Rel_Pos's key term alone (no value term) takes over no head, EaDRA on the learnable head and fixed attention
    on another layer meet nothing: all accepted."""
    fixed = {"patterns": ["previous", "next"]}
    HeadAttnMBartConfig(**TINY, fixed_attention=fixed, rel_pos={"values": False})
    HeadAttnMBartConfig(**TINY, fixed_attention=fixed, eadra={"encoder": {"heads": [2, 3]}})
    HeadAttnMBartConfig(**TINY, fixed_attention={**fixed, "encoder_layers": [0]}, rel_pos={"encoder_layers": [1]})


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_fixed_heads_beside_sea_keep_their_patterns_and_no_weight_lands_on_padding(backend):
    """Fixed attention with SEA's DEA mask on every head (each token related only to its neighbours, so the start
    head's anchor is masked for most queries): the fixed heads keep their patterns (their weights are fixed), the
    learnable head attends within SEA's mask, and no real query puts weight on a padding key; eager's weights say so,
    and SDPA's output is eager's."""
    model = pair_model("fixed_attention", "sea")
    model.set_attn_implementation("eager")
    inputs = syntax_batch()
    with torch.no_grad():
        weights = model(**inputs, output_attentions=True).encoder_attentions[0]  # (B, H, T, S)
    real = inputs["attention_mask"].bool()
    expected = pattern_weights(ON_LAYER_0["fixed_attention"]["patterns"], real, real.shape[1])
    torch.testing.assert_close(weights[:, :3], expected)
    padding_keys = weights * ~real[:, None, None, :]
    assert not padding_keys.transpose(1, 2)[real].any()  # the real queries' rows, every head
    learnable = weights[:, 3]
    assert not (learnable * ~inputs["dependency_mask"])[real].any()  # within SEA's mask
    if backend == "sdpa":
        assert_same(run(model, "sdpa"), run(model, "eager"))


def test_the_docs_compatibility_table_is_the_registrys():
    text = (ROOT / "docs" / "design.md").read_text()
    found = re.search(re.escape(BEGIN) + ".*?" + re.escape(END), text, re.S)
    assert found is not None, f"docs/design.md has no {BEGIN}"
    assert found.group(0) == compatibility_table(), "regenerate: compatibility.compatibility_table()"
