"""Fixed attention (Raganato, Scherrer & Tiedemann 2020): the patterns against a float64 loop on padded batches, the
fast outputs against the dense weights, gradients to V, the attached module (fixed heads token-independent, the
learnable head unchanged), pruning, save/load, generate with beams and a cache, and the settings' errors."""

import pytest
import torch

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.methods.fixed_attention.core import FixedAttention
from hf_headattn.methods.fixed_attention.equations import (
    CAUSAL,
    CONTEXT,
    PATTERNS,
    POINT,
    WEIGHTS,
    fixed_outputs,
    make_plan,
    pattern_weights,
)

NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0)
#: (B, S): right padding, left padding, a gap, one real token
REAL = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [1, 0, 1, 1, 0, 1],
                     [0, 0, 1, 0, 0, 0]], dtype=torch.bool)


def loop_weights(pattern, real, length, causal, weights="cubic", positions=None):
    """One pattern's weights (B, T, S) by a loop over sentences and queries, float64: the rules of
    hf_headattn/methods/fixed_attention/equations.py written out. Cubic: a spread pattern's keys, in order from the
    end of its span farthest from the anchor, weigh 1, 8, 27, ... (m^3), normalised; causal ``start`` is one-hot.
    ``positions``: the queries' positions, (T,) or (B, T) (None: the last T of the S keys)."""
    batch_size, key_length = real.shape
    out = torch.zeros(batch_size, length, key_length, dtype=torch.float64)
    for b in range(batch_size):
        keys = [j for j in range(key_length) if real[b, j]]
        for t in range(length):
            if positions is None:
                p = key_length - length + t
            else:
                p = int(positions[t] if positions.dim() == 1 else positions[b, t])
            if p in keys:
                nearest = p
            else:
                allowed = [j for j in keys if j <= p] if causal else keys
                nearest = min(allowed, key=lambda j: (abs(j - p), j)) if allowed else p
            spread = weights == "cubic" and pattern in ("left", "right", "end") + (() if causal else ("start",))
            before, after = [j for j in keys if j < p], [j for j in keys if j > p]
            chosen = {
                "current": [p] if p in keys else [],
                "previous": before[-1:],
                "next": after[:1],
                "left": before,
                "right": after,
                "start": (keys if spread else keys[:1]) if keys and (not causal or keys[0] <= p) else [],
                "end": keys if spread else keys[-1:],
            }[pattern]
            if not chosen:
                out[b, t, nearest] = 1
                continue
            if not spread:
                for j in chosen:
                    out[b, t, j] = 1 / len(chosen)
                continue
            far_first = pattern in ("left", "end")  # the span's far end is its first key (else its last)
            ranks = [index + 1 if far_first else len(chosen) - index for index in range(len(chosen))]
            total = sum(m ** 3 for m in ranks)
            for j, m in zip(chosen, ranks):
                out[b, t, j] = m ** 3 / total
    return out


@pytest.mark.parametrize("kind", WEIGHTS)
@pytest.mark.parametrize("causal", [False, True])
def test_patterns_match_a_loop_on_padded_batches(causal, kind):
    """Every pattern's dense weights are the loop's (with a cache: the last 2 of 6 keys are the queries), and the
    fast outputs (gathers and cumulative sums, no (T, S) tensor) are those weights times V, float64."""
    patterns = CAUSAL if causal else PATTERNS
    for length in (6, 2) if causal else (6,):
        weights = pattern_weights(patterns, REAL, length, causal, torch.float64, kind)
        expected = torch.stack([loop_weights(p, REAL, length, causal, kind) for p in patterns], 1)
        torch.testing.assert_close(weights, expected, rtol=0, atol=1e-12)
        if causal:  # no key after the query
            assert not weights.triu(diagonal=1 + REAL.shape[1] - length).any()
        real_queries = REAL[:, REAL.shape[1] - length:]  # (B, T): padding never gets a real query's weight
        assert not (weights * ~REAL[:, None, None, :]).transpose(1, 2)[real_queries].any()
        # in any order: the heads of a module come in head order, the context heads among the point heads
        points = [p for p in patterns if p in POINT]
        contexts = [p for p in patterns if p in CONTEXT]
        for order in (patterns, [*points, *contexts], [*contexts, *points], [contexts[0], *points, *contexts[1:]]):
            value = torch.randn(REAL.shape[0], len(order), REAL.shape[1], 3, dtype=torch.float64)
            plan = make_plan(order, REAL, length, causal, torch.float64, 3, kind)
            ordered = torch.stack([loop_weights(p, REAL, length, causal, kind) for p in order], 1)
            torch.testing.assert_close(fixed_outputs(value, plan), ordered @ value, rtol=1e-12, atol=1e-12)
        alike = [["left", "current", "left"]] if causal else [["right", "end", "right"], ["next", "left", "left"]]
        for order in (points, contexts, *alike):  # point heads alone, context heads alone, contexts of one side
            value = torch.randn(REAL.shape[0], len(order), REAL.shape[1], 3, dtype=torch.float64)
            plan = make_plan(order, REAL, length, causal, torch.float64, 3, kind)
            ordered = torch.stack([loop_weights(p, REAL, length, causal, kind) for p in order], 1)
            torch.testing.assert_close(fixed_outputs(value, plan), ordered @ value, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", WEIGHTS)
@pytest.mark.parametrize("causal", [False, True])
def test_patterns_at_given_query_positions_match_the_loop(causal, kind):
    """Queries at given positions, not the last T keys (a static cache's: its later slots are keys too), shared (T,)
    or per sentence (B, T): the dense weights and the fast outputs are the loop's, float64."""
    patterns = CAUSAL if causal else PATTERNS
    shared = torch.tensor([1, 3, 4])
    per_sentence = torch.tensor([[0, 2, 3], [5, 1, 2], [2, 2, 4], [1, 3, 0], [4, 5, 3]])
    for positions in (shared, per_sentence):
        expected = torch.stack([loop_weights(p, REAL, 3, causal, kind, positions) for p in patterns], 1)
        weights = pattern_weights(patterns, REAL, 3, causal, torch.float64, kind, positions)
        torch.testing.assert_close(weights, expected, rtol=0, atol=1e-12)
        value = torch.randn(REAL.shape[0], len(patterns), REAL.shape[1], 3, dtype=torch.float64)
        plan = make_plan(patterns, REAL, 3, causal, torch.float64, 3, kind, positions)
        torch.testing.assert_close(fixed_outputs(value, plan), expected @ value, rtol=1e-12, atol=1e-12)
    last = torch.stack([loop_weights(p, REAL, 3, causal, kind) for p in patterns], 1)
    assert not torch.allclose(expected, last)  # (the positions matter)


def test_gradients_flow_to_v():
    """float64 gradcheck of the fixed heads' outputs with respect to V, every pattern, padded batch: the pure
    function, and the module's ``attend`` (its real keys read from an eager-style additive padding mask, heads in
    the order taken over), which is the weights times V."""
    plan = make_plan(PATTERNS, REAL, 6, False, torch.float64, 2)
    value = torch.randn(REAL.shape[0], len(PATTERNS), 6, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: fixed_outputs(v, plan), (value,))
    fixed = FixedAttention(["left", "next", "right", "end"], [3, 0, 2, 1], causal=False)
    assert (fixed.taken, fixed.taken_patterns) == ((0, 1, 2, 3), ("next", "end", "right", "left"))
    mask = torch.zeros(REAL.shape[0], 1, 6, 6, dtype=torch.float64)
    mask = mask.masked_fill(~REAL[:, None, None, :], torch.finfo(torch.float64).min)
    value = torch.randn(REAL.shape[0], 4, 6, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: fixed.attend(v, 6, mask, None, None), (value,))
    weights = pattern_weights(["next", "end", "right", "left"], REAL, 6, False, torch.float64)
    torch.testing.assert_close(fixed.attend(value, 6, mask, None, None), (weights @ value).transpose(1, 2))


def model(backend="eager", on=True, **settings):
    """A tiny mBART with fixed attention's ``settings`` (``on=False``: the method off), seed 0."""
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, **NO_DROPOUT, **({"fixed_attention": settings} if on else {}))
    made = HeadAttnMBartForConditionalGeneration(config).eval()
    made.set_attn_implementation(backend)
    return made


def test_fixed_heads_attend_with_their_patterns_whatever_the_tokens():
    """On eager, ``output_attentions`` gives the patterns exactly for the fixed heads (here heads 3, 0, 2: previous,
    next, left), the same for other tokens with the same padding; the previous- and next-token heads put all their
    weight on i-1 and i+1 inside the sentence; the learnable head (1) depends on the tokens."""
    fixed = model(patterns=["previous", "next", "left"], heads=[3, 0, 2])
    inputs = batch()
    real = inputs["attention_mask"].bool()
    other = {**inputs, "input_ids": torch.where(real, inputs["input_ids"] + 20, inputs["input_ids"])}
    with torch.no_grad():
        first, second = (fixed(**x, output_attentions=True).encoder_attentions for x in (inputs, other))
    expected = pattern_weights(["previous", "next", "left"], real, real.shape[1], False)
    for layer in range(TINY["encoder_layers"]):
        torch.testing.assert_close(first[layer][:, [3, 0, 2]], expected, rtol=0, atol=0)
        torch.testing.assert_close(second[layer][:, [3, 0, 2]], expected, rtol=0, atol=0)
        assert not torch.allclose(first[layer][:, 1], second[layer][:, 1])
    previous, following = first[0][:, 3], first[0][:, 0]
    for b, length in enumerate(real.sum(1).tolist()):
        for i in range(1, length - 1):
            assert previous[b, i, i - 1] == 1 and following[b, i, i + 1] == 1


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_the_learnable_head_is_unchanged(backend):
    """Layer 0's learnable head (same weights, same input) attends as with the method off: its output is the stock
    model's on that head (eager: its weights too), and only the fixed heads' outputs differ."""
    fixed, stock = model(backend, patterns=["current", "previous", "right"]), model(backend, on=False)
    stock.load_state_dict(fixed.state_dict())
    captured = {}

    def keep(name):
        def hook(module, args, kwargs, output):
            captured[name] = (output[0].detach(), output[1])
        return hook

    for name, made in (("fixed", fixed), ("stock", stock)):
        made.model.encoder.layers[0].self_attn.out_proj.register_forward_pre_hook(
            lambda module, args, name=name: captured.__setitem__(name + "_heads", args[0].detach()))
        made.model.encoder.layers[0].self_attn.register_forward_hook(keep(name), with_kwargs=True)
        with torch.no_grad():
            made(**batch(), output_attentions=backend == "eager")
    heads = captured["fixed_heads"].unflatten(-1, (4, -1))
    plain = captured["stock_heads"].unflatten(-1, (4, -1))
    torch.testing.assert_close(heads[:, :, 3], plain[:, :, 3], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(heads[:, :, :3], plain[:, :, :3])
    if backend == "eager":
        torch.testing.assert_close(captured["fixed"][1][:, 3], captured["stock"][1][:, 3])


@pytest.mark.parametrize("settings", [
    {"patterns": ["right", "end", "next"], "heads": [2, 0, -1]},  # (-1: the last head, 3)
    {"patterns": ["previous", "left", "next"]},  # a context head between point heads, one run of fixed heads
    {"patterns": ["start", "left", "previous"], "decoder_layers": "all"},
    {"patterns": ["end", "start"], "cross_layers": [-1], "encoder_layers": None},
])
def test_eager_and_sdpa_agree(settings):
    """Eager runs the fixed heads in its own product (zero query, the pattern as a hard mask), SDPA takes them over
    (gathers and cumulative sums): the same loss and gradients on a padded batch."""
    results = []
    for backend in ("eager", "sdpa"):
        made = model(backend, **settings).train()
        loss = made(**batch()).loss
        loss.backward()
        results.append((loss.detach(), {name: p.grad for name, p in made.named_parameters() if p.grad is not None}))
    (eager_loss, eager_grads), (sdpa_loss, sdpa_grads) = results
    torch.testing.assert_close(sdpa_loss, eager_loss, rtol=1e-5, atol=1e-6)
    assert sdpa_grads.keys() == eager_grads.keys()
    for name in sdpa_grads:
        torch.testing.assert_close(sdpa_grads[name], eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_pruning_a_fixed_head_equals_masking_it():
    """Pruning encoder layer 0's head 1 (fixed: next) and head 3 (learnable) gives the logits of the unpruned model
    with those heads masked; the other fixed heads keep their patterns, renumbered."""
    fixed = model(patterns=["previous", "next", "left"])
    mask = torch.ones(TINY["encoder_layers"], 4)
    mask[0, [1, 3]] = 0
    with torch.no_grad():
        masked = fixed(**batch(), head_mask=mask).logits
        fixed.prune_heads({"encoder.layers.0.self_attn": [1, 3]})
        pruned = fixed(**batch(), output_attentions=True)
    torch.testing.assert_close(pruned.logits, masked, rtol=1e-5, atol=1e-5)
    module = fixed.model.encoder.layers[0].self_attn.fixed_attention
    assert (module.heads, module.patterns) == ((0, 1), ("previous", "left"))
    real = batch()["attention_mask"].bool()
    expected = pattern_weights(["previous", "left"], real, real.shape[1], False)
    torch.testing.assert_close(pruned.encoder_attentions[0], expected)


def test_save_load_round_trip(tmp_path):
    made = model("sdpa", patterns=["start", "previous"], encoder_layers=[-1], heads=[2, 1])
    made.save_pretrained(tmp_path)
    loaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.config.fixed_attention == {"patterns": ["start", "previous"], "encoder_layers": [-1],
                                             "heads": [2, 1]}
    assert not hasattr(loaded.model.encoder.layers[0].self_attn, "fixed_attention")
    assert loaded.model.encoder.layers[1].self_attn.fixed_attention.heads == (2, 1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch()).logits, made(**batch()).logits)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_generate_with_beams_and_cache(backend):
    """Decoder self-attention and cross-attention fixed too (causal and position-free patterns): beam search with
    the cache gives the tokens and scores of beam search without it (every step recomputed)."""
    made = model(backend, patterns=["start", "previous"], decoder_layers="all")
    both = model(backend, patterns=["start"], decoder_layers="all", cross_layers="all")
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    for one in (made, both):
        kwargs = dict(num_beams=3, max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True)
        cached = one.generate(**inputs, use_cache=True, **kwargs)
        fresh = one.generate(**inputs, use_cache=False, **kwargs)
        assert torch.equal(cached.sequences, fresh.sequences)
        torch.testing.assert_close(cached.sequences_scores, fresh.sequences_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("patterns", [["previous", "left", "start"], ["left", "current", "start"]])
def test_generate_with_a_static_and_a_dynamic_cache_equals_the_full_forward(backend, patterns):
    """Decoder self-attention fixed (the causal patterns, cubic ``left`` and ``start``): greedy generation with a
    dynamic cache and with a static one (whose S keys are the cache's slots, the query at position past + t, not
    S - T + t) scores as the full forward at each step (no cache), on sdpa and eager (whose weights are the dense
    patterns: ``output_attentions`` also equal)."""
    made = model(backend, patterns=patterns, encoder_layers=[], decoder_layers="all")
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    kwargs = dict(num_beams=1, max_new_tokens=6, min_new_tokens=6, do_sample=False, output_scores=True,
                  return_dict_in_generate=True, output_attentions=backend == "eager")
    fresh = made.generate(**inputs, use_cache=False, **kwargs)
    for cache in ({}, {"cache_implementation": "static"}):
        cached = made.generate(**inputs, **kwargs, **cache)
        assert torch.equal(cached.sequences, fresh.sequences), cache
        torch.testing.assert_close(torch.stack(cached.scores), torch.stack(fresh.scores), rtol=1e-5, atol=1e-5)
        if backend == "eager":  # each step's last query row, the fixed heads' patterns over the keys so far
            for step, (one, full) in enumerate(zip(cached.decoder_attentions[1:], fresh.decoder_attentions[1:]), 1):
                for layer in range(2):
                    torch.testing.assert_close(one[layer][:, :, -1, :step + 1], full[layer][:, :, -1],
                                               rtol=1e-5, atol=1e-5)
                    assert not one[layer][:, :len(patterns), -1, step + 1:].any()  # no weight on empty slots


def test_settings_errors():
    def config(**settings):
        return HeadAttnMBartConfig(**TINY, fixed_attention=settings)

    with pytest.raises(ValueError, match=r"fixed_attention.patterns has 7 patterns, but encoder self-attention has 4 "
                                         r"heads: expected fewer patterns than heads"):
        config()
    with pytest.raises(ValueError, match=r"fixed_attention.patterns must be a list of \(one of 'current', 'previous'"
                                         r".*got \['previous', 'diagonal'\]"):
        config(patterns=["previous", "diagonal"])
    with pytest.raises(ValueError, match=r"fixed_attention.patterns must name at least one pattern"):
        config(patterns=[])
    with pytest.raises(ValueError, match=r"fixed_attention.patterns contains \['next'\], which "
                                         r"fixed_attention.decoder_layers='all' cannot use: decoder self-attention "
                                         r"is causal"):
        config(patterns=["previous", "next"], decoder_layers="all")
    with pytest.raises(ValueError, match=r"fixed_attention.patterns contains \['previous'\], which "
                                         r"fixed_attention.cross_layers='all' cannot use"):
        config(patterns=["previous", "start"], cross_layers="all")
    with pytest.raises(ValueError, match=r"fixed_attention.heads must be 2 distinct head numbers in \[-4, 3\] "
                                         r"\(encoder self-attention; .*\), one per pattern, got \[1, -3\]"):
        config(patterns=["previous", "next"], heads=[1, -3])
    with pytest.raises(ValueError, match=r"fixed_attention.heads must be 2 distinct head numbers in \[-4, 3\].*got "
                                         r"\[0, 4\]"):
        config(patterns=["previous", "next"], heads=[0, 4])
    with pytest.raises(ValueError, match=r"fixed_attention.encoder_layers contains 2, but the model has 2 layers"):
        config(patterns=["previous"], encoder_layers=[2])
    with pytest.raises(ValueError, match=r"fixed_attention.decoder_layers must be a list of \(an integer\) or one of "
                                         r"'all' or None, got True"):
        config(patterns=["previous"], decoder_layers=True)


@pytest.mark.slow
@pytest.mark.lowest_only  # torch's flex kernels / compiler: tests/conftest.py's LOWEST_ONLY
def test_flex_attention_equals_sdpa():
    """Flex attention (a forward: the CPU has no flex backward, and torch 2.13's CPU flex fails in beam search even on
    the modules without a method) takes the fixed heads over as SDPA does, their real keys from the context: SDPA's
    logits."""
    from hf_headattn.flex import FLEX

    torch.compiler.reset()
    try:
        settings = {"patterns": ["next", "left", "start"], "heads": [1, 2, 3]}
        flex, sdpa = model(FLEX, **settings), model("sdpa", **settings)
        with torch.no_grad():
            torch.testing.assert_close(flex(**batch()).logits, sdpa(**batch()).logits, rtol=1e-5, atol=1e-5)
    finally:
        torch.compiler.reset()


def test_a_config_saved_before_the_weights_setting_loads_with_uniform_weights(tmp_path):
    """A checkpoint saved by release 0.3 before ``weights`` existed (its config.json records no ``weights``) loads
    with the reading it was trained with, "uniform" (its logits are a uniform model's, not a cubic one's); a config
    built in Python without ``weights`` gets "cubic", and saving it records that."""
    import json

    settings = {"patterns": ["left", "right", "start"]}
    uniform, cubic = model("sdpa", **settings, weights="uniform"), model("sdpa", **settings)
    assert cubic.config.headattn_settings["fixed_attention"].weights == "cubic"
    cubic.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["headattn_defaults"] == {"fixed_attention": {"weights": "cubic"}}
    assert HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).config.fixed_attention == settings
    del saved["headattn_defaults"]  # as release 0.3 wrote it
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.config.headattn_settings["fixed_attention"].weights == "uniform"
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch()).logits, uniform(**batch()).logits)
        assert not torch.allclose(loaded(**batch()).logits, cubic(**batch()).logits)


def test_the_default_on_a_20_token_sentence():
    """The default (the 7 patterns, cubic weights) on a 20-token sentence beside a padded one, as eager returns the
    weights: exactly three heads have zero entropy (current, previous, next: all weight on i, i-1, i+1); the left
    context rises towards the query, the right context falls away from it, start falls from the first token and end
    rises to the last; no real query puts weight on padding."""
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**{**TINY, "encoder_attention_heads": 8, "decoder_attention_heads": 8},
                                 **NO_DROPOUT, fixed_attention={})
    made = HeadAttnMBartForConditionalGeneration(config).eval()
    made.set_attn_implementation("eager")
    input_ids = torch.full((2, 20), 5)
    input_ids[1, 12:] = 1  # the second sentence: 12 real tokens, 8 padding
    with torch.no_grad():
        weights = made(input_ids=input_ids, attention_mask=input_ids.ne(1).long(), decoder_input_ids=input_ids[:, :2],
                       output_attentions=True).encoder_attentions[0][0, :7]  # (7 fixed heads, T, S), sentence 0
    entropy = -(weights * weights.clamp(min=1e-30).log2()).sum(-1)  # (7, T)
    assert (entropy == 0).all(-1).tolist() == [True, True, True, False, False, False, False]
    current, previous, following, left, right, start, end = weights
    i = torch.arange(20)
    assert (current[i, i] == 1).all() and (previous[i[1:], i[1:] - 1] == 1).all()
    assert (following[i[:-1], i[:-1] + 1] == 1).all()
    for q in range(1, 19):  # (the first token has no left context, the last no right one: they attend to themselves)
        assert (left[q, 1:q] > left[q, :q - 1]).all() and left[q, :q].sum() > 0.999 and not left[q, q:].any()
        assert (right[q, q + 1:-1] > right[q, q + 2:]).all() and right[q, q + 1:].sum() > 0.999
    assert left[0, 0] == 1 and right[19, 19] == 1
    assert (start[:, :-1] > start[:, 1:]).all() and (end[:, 1:] > end[:, :-1]).all()
    assert 0 < entropy[3:].max() < 4.0  # spread, and below the uniform head's log2(19)
    with torch.no_grad():
        padded = made(input_ids=input_ids, attention_mask=input_ids.ne(1).long(), decoder_input_ids=input_ids[:, :2],
                      output_attentions=True).encoder_attentions[0][1, :7, :12]  # sentence 1's real queries
    assert not padded[..., 12:].any() and torch.allclose(padded.sum(-1), torch.ones(7, 12))
