"""The plug-in surface beyond the template (``hf_headattn.plugin``): the positions of a call's queries and keys (a
non-linear relative bias right in ``generate`` with a dynamic and a static cache), head mixing (talking-heads
attention against a float64 loop, composed with another method's score bias), initialisers that leave loaded
weights alone, and ``MethodSpec`` defaults (placements from the settings' layer fields, no collect)."""

import ast
import dataclasses
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

import surface_plugins
from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, plugin
from hf_headattn.attention import AttentionCall, AttentionMethod, attach_method, headattn_attention_forward
from hf_headattn.positions import query_positions

B, H, T, D = 2, 4, 5, 4
SCALING = D ** -0.5
REAL = torch.tensor([[True] * 5, [True, True, True, False, False]])  # (B, S)


@pytest.fixture
def plugins():
    for spec in (surface_plugins.DISTANCE_BIAS, surface_plugins.TALKING_HEADS):
        plugin.register_method(spec)
    yield
    for spec in (surface_plugins.DISTANCE_BIAS, surface_plugins.TALKING_HEADS):
        plugin.unregister_method(spec.name)


def model_with(backend="sdpa", **settings):
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, attention_dropout=0.0, dropout=0.0, **settings)
    model = HeadAttnMBartForConditionalGeneration(config).eval()
    model.set_attn_implementation(backend)
    return model


def test_the_plugins_import_only_the_plugin_path():
    source = Path(surface_plugins.__file__).read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert {name for name in imported if name and name.startswith("hf_headattn")} == {"hf_headattn.plugin"}


def test_query_positions_with_an_offset_a_mask_or_neither():
    torch.testing.assert_close(query_positions(2, 7, "cpu", offset=3), torch.tensor([3, 4]))  # a static cache
    torch.testing.assert_close(query_positions(2, 5, "cpu", offset=3), torch.tensor([3, 4]))  # a dynamic one
    allowed = torch.arange(7)[None, None, None, :] <= torch.tensor([[2, 3], [1, 2]])[:, None, :, None]  # (B, 1, 2, 7)
    torch.testing.assert_close(query_positions(2, 7, "cpu", allowed=allowed), torch.tensor([[2, 3], [1, 2]]))
    torch.testing.assert_close(query_positions(2, 7, "cpu"), torch.tensor([5, 6]))  # the last T of S
    torch.testing.assert_close(query_positions(5, 5, "cpu", offset=0), torch.arange(5))


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_a_non_linear_relative_bias_is_right_in_generate_with_a_dynamic_and_a_static_cache(plugins, backend,
                                                                                           monkeypatch):
    """f(j - i) on every self-attention: greedy generation with a dynamic cache and with a static one scores as the
    full forward at each step (no cache); with the queries taken as the last keys (what a static cache breaks) it
    does not, so the comparison can fail."""
    model = model_with(backend, distance_bias={})
    assert len(model.model.decoder.layers[1].self_attn.headattn_methods) == 1  # placed by the default placements
    inputs = batch()
    generate = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"], "max_new_tokens": 6,
                "min_new_tokens": 6, "num_beams": 1, "do_sample": False, "output_scores": True,
                "return_dict_in_generate": True}
    uncached = model.generate(**generate, use_cache=False)
    for cache in ({}, {"cache_implementation": "static"}):
        cached = model.generate(**generate, **cache)
        assert torch.equal(cached.sequences, uncached.sequences), cache
        torch.testing.assert_close(scores(cached), scores(uncached), atol=1e-5, rtol=1e-5)

    def last_keys(call):  # the queries as the last T of the S keys: right without a cache, wrong in a static one
        length, key_length = call.query.shape[2], call.key.shape[2]
        return torch.arange(key_length - length, key_length)

    monkeypatch.setattr(AttentionCall, "query_positions", property(last_keys))
    wrong = model.generate(**generate, cache_implementation="static")
    assert (scores(wrong) - scores(uncached)).abs().max() > 1e-4


def scores(generated) -> torch.Tensor:
    """The step scores of a generation (steps, B, vocabulary), -inf (a token ruled out) as -1e4."""
    return torch.stack(generated.scores).clamp_min(-1e4)


class Bias(AttentionMethod):
    def __init__(self, bias, heads):
        super().__init__()
        self.bias, self.heads = bias, heads

    def before(self, call):
        call.add_score_bias(self.bias, heads=self.heads)


class Mix(AttentionMethod):
    """Mixes with the matrices it holds (set per test: gradcheck replaces them)."""

    def __init__(self, score_mix, weight_mix):
        super().__init__()
        self.score_mix, self.weight_mix = score_mix, weight_mix

    def before(self, call):
        if self.score_mix is not None:
            call.mix_scores(self.score_mix)
        if self.weight_mix is not None:
            call.mix_weights(self.weight_mix)


def reference(query, key, value, allowed, score_mix, weight_mix, bias, bias_heads):
    """Talking-heads attention by a float64 loop over (sentence, head, query): the scores mixed, the bias of
    ``bias_heads`` (h of them, in that order) and the mask added to the mixed scores, softmax, the weights mixed."""
    query, key, value = query.double(), key.double(), value.double()
    output = torch.zeros(B, H, T, D, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            scores = [query[b, h, t] @ key[b, h].T * SCALING for h in range(H)]  # each (S,)
            probs = []
            for h in range(H):
                mixed = sum(score_mix[h, j].double() * scores[j] for j in range(H))
                if h in bias_heads:
                    mixed = mixed + bias[bias_heads.index(h), t].double()
                probs.append(mixed.masked_fill(~allowed[b], float("-inf")).softmax(-1))
            for h in range(H):
                weights = sum(weight_mix[h, j].double() * probs[j] for j in range(H))
                output[b, h, t] = weights @ value[b, h]
    return output.transpose(1, 2)  # (B, T, H, D)


def encoder_module(backend):
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, attention_dropout=0.0)).eval()
    model.set_attn_implementation(backend)
    return model.model.encoder.layers[0].self_attn


def mask_for(backend, dtype):
    """The padding mask as transformers passes it to ``backend``: bool (SDPA), additive (eager), a BlockMask (flex)."""
    allowed = REAL[:, None, None, :].expand(B, 1, T, T)
    if backend == "flex_attention":
        return create_block_mask(lambda b, h, q, kv: REAL[b, kv], B=B, H=None, Q_LEN=T, KV_LEN=T, device="cpu")
    if backend == "sdpa":
        return allowed
    return torch.zeros(B, 1, T, T, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex_attention"])
@pytest.mark.parametrize("mix_first", [True, False])
def test_head_mixing_against_a_float64_loop_composed_with_a_score_bias(backend, mix_first):
    """Mixing and another method's bias on heads [3, 1] compose in either order: the bias is on the mixed scores."""
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(B, H, T, D, generator=generator) for _ in range(3))
    score_mix, weight_mix = torch.randn(H, H, generator=generator), torch.randn(H, H, generator=generator) / H
    bias = torch.randn(2, T, T, generator=generator)
    module = encoder_module(backend)
    methods = [("mix", Mix(score_mix, weight_mix)), ("bias", Bias(bias, [3, 1]))]
    for name, method in methods if mix_first else methods[::-1]:
        attach_method(module, name, method)
    output, weights = headattn_attention_forward(module, query, key, value, mask_for(backend, torch.float32),
                                                 scaling=SCALING)
    expected = reference(query, key, value, REAL, score_mix, weight_mix, bias, [3, 1])
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)
    assert weights.shape == (B, H, T, T)


@pytest.mark.parametrize("dtype", [None, torch.float32])
def test_attention_probabilities_against_a_float64_loop(dtype):
    """softmax(q k^T * scaling + mask) per (sentence, head, query), bool or additive mask; bf16 inputs, the result in
    bf16 or the dtype asked for, each row summing to 1 with no weight on a masked key."""
    generator = torch.Generator().manual_seed(3)
    query, key = (torch.randn(B, H, T, D, generator=generator) for _ in range(2))
    expected = torch.zeros(B, H, T, T, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                scores = query[b, h, t].double() @ key[b, h].double().T * SCALING
                expected[b, h, t] = scores.masked_fill(~REAL[b], float("-inf")).softmax(-1)
    for mask in (REAL[:, None, None, :], mask_for("eager", torch.float32)):
        probs = plugin.attention_probabilities(query, key, SCALING, mask, dtype=dtype)
        assert probs.dtype == torch.float32
        torch.testing.assert_close(probs.double(), expected, atol=1e-6, rtol=1e-5)
    low = plugin.attention_probabilities(query.bfloat16(), key.bfloat16(), SCALING, REAL[:, None, None, :],
                                         dtype=dtype)
    assert low.dtype == (dtype or torch.bfloat16)
    torch.testing.assert_close(low.double(), expected, atol=2e-2, rtol=0)
    assert (low[1, :, :, 3:] == 0).all()


def test_two_mixings_compose_and_the_identity_changes_nothing():
    generator = torch.Generator().manual_seed(1)
    query, key, value = (torch.randn(B, H, T, D, generator=generator) for _ in range(3))
    first, second = torch.randn(H, H, generator=generator), torch.randn(H, H, generator=generator)
    plain = headattn_attention_forward(encoder_module("eager"), query, key, value, mask_for("eager", torch.float32),
                                       scaling=SCALING)[0]
    module = encoder_module("eager")
    attach_method(module, "identity", Mix(torch.eye(H), torch.eye(H)))
    same = headattn_attention_forward(module, query, key, value, mask_for("eager", torch.float32), scaling=SCALING)[0]
    torch.testing.assert_close(same, plain)
    module = encoder_module("eager")
    attach_method(module, "a", Mix(first, None))
    attach_method(module, "b", Mix(second, None))
    output = headattn_attention_forward(module, query, key, value, mask_for("eager", torch.float32), scaling=SCALING)[0]
    expected = reference(query, key, value, REAL, second @ first, torch.eye(H), torch.zeros(1, T, T), [])
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)


def test_head_mixing_gradchecks():
    generator = torch.Generator().manual_seed(2)
    query, key, value = (torch.randn(1, H, 3, D, generator=generator, dtype=torch.float64) for _ in range(3))
    module = encoder_module("eager").double()
    mix = Mix(None, None)
    attach_method(module, "mix", mix)

    def run(score_mix, weight_mix, query):
        mix.score_mix, mix.weight_mix = score_mix, weight_mix
        return headattn_attention_forward(module, query, key, value, None, scaling=SCALING)[0]

    matrices = [torch.randn(H, H, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    assert torch.autograd.gradcheck(run, (*matrices, query.requires_grad_()))


def test_mixing_beside_taken_over_heads_or_a_bad_matrix_is_refused():
    class TakeOver(AttentionMethod):
        def before(self, call):
            call.take_over([0], lambda *args, **kwargs: None)

    query, key, value = (torch.randn(B, H, T, D) for _ in range(3))
    module = encoder_module("eager")
    attach_method(module, "mixer", Mix(torch.eye(H), None))
    attach_method(module, "taker", TakeOver())
    with pytest.raises(ValueError, match=r"'mixer' mixes the heads.*and 'taker' takes over heads"):
        headattn_attention_forward(module, query, key, value, None, scaling=SCALING)
    class FlexScoreMod(AttentionMethod):
        def before(self, call):
            call.add_score_mod(lambda score, b, h, q, kv: score)

    module = encoder_module("flex_attention")
    attach_method(module, "mixer", Mix(torch.eye(H), None))
    attach_method(module, "modder", FlexScoreMod())
    with pytest.raises(ValueError, match=r"'mixer' mixes the heads, and a flex score_mod from 'modder' has no tensor"):
        headattn_attention_forward(module, query, key, value, mask_for("flex_attention", torch.float32),
                                   scaling=SCALING)
    module = encoder_module("eager")
    attach_method(module, "mixer", Mix(torch.eye(3), None))
    expected = (r"mixer: mix_scores needs a float matrix of shape \(heads, heads\) = \(4, 4\) on "
                r"encoder.layers.0.self_attn, got torch.float32 of shape \(3, 3\)")
    with pytest.raises(ValueError, match=expected):
        headattn_attention_forward(module, query, key, value, None, scaling=SCALING)


def test_talking_heads_start_as_the_stock_model_and_keep_loaded_weights(plugins, tmp_path):
    """Identity mixings (init_identity_): the stock model's logits; a saved model's mixings load as saved
    (the initialisers leave loaded weights alone), and its outputs with them."""
    model = model_with(talking_heads={})
    stock = model_with()
    stock.load_state_dict(model.state_dict(), strict=False)
    inputs = batch()
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, stock(**inputs).logits, atol=1e-5, rtol=1e-5)
        mixing = model.model.encoder.layers[1].self_attn.talking_heads
        torch.testing.assert_close(mixing.score_mix, torch.eye(H))
        mixing.score_mix.copy_(torch.randn(H, H))
        mixing.weight_mix.copy_(torch.randn(H, H) / H)
        changed = model(**inputs).logits
        mixed, plain = (attention_output(each, inputs) for each in (model, stock))
    assert (mixed - plain).abs().max() > 0.1 * plain.abs().max()  # (the tiny model's logits change little)
    assert model.model.decoder.layers[0].self_attn.headattn_methods == ()  # decoder_layers=[]: none
    model.save_pretrained(tmp_path)
    loaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    loaded_mixing = loaded.model.encoder.layers[1].self_attn.talking_heads
    torch.testing.assert_close(loaded_mixing.score_mix, mixing.score_mix)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, changed, atol=1e-5, rtol=1e-5)


def test_talking_heads_meet_a_score_bias_and_refuse_heads_taken_over(plugins):
    """Beside Rel_Pos's key term (a score bias), identity mixings give Rel_Pos's own outputs (the bias reaches the
    mixed scores); beside its value term (every head taken over) the config refuses the pair, naming both."""
    inputs = batch()
    with torch.no_grad():
        alone = attention_output(model_with(rel_pos={"values": False}), inputs, 0)
        both = model_with(rel_pos={"values": False}, talking_heads={"encoder_layers": [0]})
        assert both.model.encoder.layers[0].self_attn.headattn_methods == ("rel_pos", "talking_heads")
        torch.testing.assert_close(attention_output(both, inputs, 0), alone, atol=1e-6, rtol=1e-5)
    expected = (r"talking_heads mixes heads \[0, 1, 2, 3\] of encoder.layers.0.self_attn, which needs every head's "
                r"scores, and rel_pos takes over heads \[0, 1, 2, 3\]")
    with pytest.raises(ValueError, match=expected):
        HeadAttnMBartConfig(**TINY, rel_pos={}, talking_heads={"encoder_layers": [0]})


def attention_output(model, inputs, layer=1) -> torch.Tensor:
    """The output of encoder layer ``layer``'s self-attention in a forward of ``model`` on ``inputs``."""
    seen = []
    attention = model.model.encoder.layers[layer].self_attn
    handle = attention.register_forward_hook(lambda module, args, out: seen.append(out[0]))
    try:
        model(**inputs)
    finally:
        handle.remove()
    return seen[0]


def test_init_values_broadcasts_checks_and_skips_a_loaded_tensor():
    tensor = torch.zeros(2, 3)
    plugin.init_values_(tensor, [1.0, 2.0, 3.0])
    torch.testing.assert_close(tensor, torch.tensor([[1.0, 2.0, 3.0]] * 2))
    tensor._is_hf_initialized = True  # what transformers marks a tensor loaded from a checkpoint with
    plugin.init_values_(tensor, 7.0)
    plugin.init_identity_(torch.zeros(3, 3))
    torch.testing.assert_close(tensor, torch.tensor([[1.0, 2.0, 3.0]] * 2))
    with pytest.raises(ValueError, match=r"values of shape \(2,\) do not broadcast to the tensor's shape \(2, 3\)"):
        plugin.init_values_(torch.zeros(2, 3), [1.0, 2.0])
    with pytest.raises(ValueError, match=r"init_identity_ needs a square matrix \(n, n\), got shape \(2, 3\)"):
        plugin.init_identity_(torch.zeros(2, 3))


@pytest.mark.parametrize("value, layers", [
    ("all", [0, 1, 2]), (None, []), ([], []), ([0], [0]), ([-1, 0, 2], [0, 2]), ((1, -2), [1]), ("lower", [0, 1]),
])
def test_the_placement_vocabulary_reads_every_value_kind(value, layers):
    """layers_of: "all", None (not placed), numbers (negative from the end; sorted, distinct), a method's own layout;
    heads_of: "all" or head numbers; bad values name the field, the value and what was expected."""
    assert plugin.layers_of(value, 3, "m.encoder_layers", {"lower": lambda count: range(count - 1)}) == layers
    assert plugin.heads_of("all", 3, "m.heads") == [0, 1, 2] and plugin.heads_of([2, -3, 2], 3, "m.heads") == [0, 2]


@pytest.mark.parametrize("call, message", [
    (lambda: plugin.layers_of([3], 3, "m.encoder_layers"),
     r"m.encoder_layers contains 3, but the model has 3 layers: expected integers in \[-3, 2\]"),
    (lambda: plugin.layers_of([True], 3, "m.encoder_layers"), r"m.encoder_layers contains True"),
    (lambda: plugin.layers_of("lower", 3, "m.cross_layers"),
     r"m.cross_layers must be 'all', a list of layer numbers in \[-3, 2\] or None \(not placed\), got 'lower'"),
    (lambda: plugin.layers_of(2, 3, "m.cross_layers", {"lower": range}), r"must be 'all', 'lower', a list .*got 2"),
    (lambda: plugin.heads_of([4], 4, "m.heads"),
     r"m.heads must be 'all' or a non-empty list of head numbers in \[-4, 3\], got \[4\]"),
    (lambda: plugin.heads_of([], 4, "m.heads"), r"m.heads must be 'all' or a non-empty list .*got \[\]"),
    (lambda: plugin.heads_of(2, 4, "m.heads"), r"m.heads must be 'all' or a non-empty list .*got 2"),
    (lambda: plugin.check_head_selection("some", "m.head_selection"),
     r"m.head_selection must be one of \('all', 'redundant'\) .*got 'some'"),
])
def test_the_placement_vocabulary_names_bad_values(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_method_spec_defaults():
    """Placements from the settings' layer fields (the shared vocabulary: "all", layer numbers, None or []: none),
    no collect; a spec without build is refused."""
    spec = surface_plugins.DISTANCE_BIAS
    config = HeadAttnMBartConfig(**TINY)
    placements = spec.placements(surface_plugins.DistanceBiasSettings(), config)
    assert placements == [("encoder", 0, "self"), ("encoder", 1, "self"), ("decoder", 0, "self"),
                          ("decoder", 1, "self")]
    assert spec.placements(surface_plugins.DistanceBiasSettings([-1], []), config) == [("encoder", 1, "self")]
    assert spec.placements(surface_plugins.DistanceBiasSettings(None, [0]), config) == [("decoder", 0, "self")]
    with pytest.raises(ValueError, match=r"distance_bias.encoder_layers must be 'all', a list of layer numbers in "
                                         r"\[-2, 1\] or None \(not placed\), got 'every'"):
        spec.placements(surface_plugins.DistanceBiasSettings("every"), config)
    with pytest.raises(ValueError, match=r"distance_bias.decoder_layers contains 3, but the model has 2 layers"):
        spec.placements(surface_plugins.DistanceBiasSettings(None, [3]), config)
    renamed = dataclasses.replace(spec, name="other")
    with pytest.raises(ValueError, match=r"other.decoder_layers contains 3"):
        renamed.placements(surface_plugins.DistanceBiasSettings(None, [3]), config)
    assert spec.collect(None, surface_plugins.DistanceBiasSettings()) == ({}, None)
    with pytest.raises(ValueError, match=r"method 'nothing': MethodSpec needs build="):
        plugin.MethodSpec("nothing", surface_plugins.DistanceBiasSettings)
