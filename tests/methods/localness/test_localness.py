"""Localness in the models: the bias the layer adds (float64 loop, padding), the log-weights' concave quadratic,
SDPA = eager (values and gradients), checkpoints, generation, RHE's per-sentence selection, SEA on the same layer,
settings errors."""

import pytest
import torch
from test_localness_math import loop_bias
from transformers import MBartConfig, MBartForConditionalGeneration

from conftest import TINY, batch, greedy_by_full_forward
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.attention import AttentionCall
from hf_headattn.biased_attention import BiasedAttention
from hf_headattn.methods.localness import core as localness_core
from hf_headattn.methods.localness.equations import centre_and_window, sentence_positions

LAYER0 = "encoder.layers.0.self_attn"
KEYS = {f"model.{LAYER0}.localness.{n}" for n in ("weight", "centre_vector", "window_vector")}
REAL = batch()["attention_mask"].bool()  # (2, 6): sentence 1 has 4 real tokens


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A stock mBART checkpoint with large random weights (init_std 0.5), so that attention changes the logits."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("localness-mbart")
    MBartForConditionalGeneration(MBartConfig(**TINY, init_std=0.5, attention_dropout=0.0)).save_pretrained(path)
    return path


def load(path, attn_implementation="sdpa", settings=None, **others):
    """The checkpoint with ``config.localness = settings`` (None: off; the per-head reading unless ``settings`` names
    a predictor: test_localness_query.py tests the authors' layout), Localness's parameters set to moderate values
    (windows of a few tokens: no weight underflows to 0)."""
    if settings is not None:
        settings = {"predictor": "head", **settings}
    model = HeadAttnMBartForConditionalGeneration.from_pretrained(
        path, attn_implementation=attn_implementation, localness=settings, **others).eval()
    g = torch.Generator().manual_seed(1)
    for name, parameter in model.named_parameters():
        if ".localness." in name:
            parameter.data = torch.randn(parameter.shape, generator=g) * 0.5
    return model


def related(rows):
    """A dependency_mask for :func:`batch`: sentences in ``rows`` relate every real token to every other (no head
    redundant), the others each token to itself only (every head redundant)."""
    both = REAL[:, :, None] & REAL[:, None, :]
    chosen = torch.tensor([b in rows for b in range(2)])[:, None, None]
    return (both & chosen) | torch.eye(6, dtype=torch.bool)


@pytest.fixture
def captured(monkeypatch):
    """The score biases added to the calls, with the call's query: [(method, query, bias, heads)]."""
    seen = []
    add = AttentionCall.add_score_bias

    def add_and_keep(call, bias=None, *, allowed=None, heads=None, masked=False):
        seen.append((call._method, call.query.detach(), bias, heads))
        return add(call, bias, allowed=allowed, heads=heads, masked=masked)

    monkeypatch.setattr(AttentionCall, "add_score_bias", add_and_keep)
    return seen


def run(model, **extra):
    with torch.no_grad():
        return model(**batch(), **extra)


def layer_weights(model, **extra):
    """Encoder layer 0's attention weights (B, H, T, S) on eager, float64."""
    return run(model, output_attentions=True, **extra).encoder_attentions[0].double()


def test_the_layer_adds_the_papers_bias(checkpoint, captured):
    model = load(checkpoint, settings={"encoder_layers": [0]})
    run(model)
    (method, query, bias, heads), = captured
    assert method == "localness" and heads is None and bias.shape == (2, 4, 6, 6)
    module = model.model.encoder.layers[0].self_attn.localness
    parameters = [p.detach().double() for p in (module.weight, module.centre_vector, module.window_vector)]
    expected = loop_bias(query.double(), *parameters, REAL)
    keys = REAL[:, None, None, :].expand_as(bias)
    torch.testing.assert_close(bias[keys].double(), expected[keys], rtol=1e-4, atol=1e-4)
    assert torch.isfinite(bias).all()


@pytest.mark.parametrize("window", ["predicted", 3])
def test_log_weights_change_by_a_concave_quadratic_per_row(checkpoint, captured, window):
    """log a_on - log a_off = -(j - P_i)^2 / (2 sigma_i^2) + c_i over each real row's real keys: fitted by least
    squares, the quadratic term is negative, the residual vanishes and P_i, sigma_i are the layer's prediction."""
    on = load(checkpoint, "eager", {"encoder_layers": [0], "window": window})
    off = load(checkpoint, "eager")
    difference = (layer_weights(on).log() - layer_weights(off).log())  # (B, H, T, S)
    (_, query, _, _), = captured
    module = on.model.encoder.layers[0].self_attn.localness
    positions, lengths = sentence_positions(REAL)
    vector = None if window != "predicted" else module.window_vector.detach().double()
    centre, width = centre_and_window(query.double(), module.weight.detach().double(),
                                      module.centre_vector.detach().double(), vector, lengths.double(),
                                      None if window == "predicted" else window)
    for b in range(2):
        j = positions[b, REAL[b]].double()
        design = torch.stack([j ** 2, j, torch.ones_like(j)], dim=1)  # (n, 3)
        for h in range(4):
            for i in torch.nonzero(REAL[b]).flatten().tolist():
                row = difference[b, h, i, REAL[b]]
                fit = torch.linalg.lstsq(design, row[:, None]).solution[:, 0]
                a, linear = fit[0], fit[1]
                assert (design @ fit - row).abs().max() < 1e-4
                assert a < 0  # concave: sigma_i > 0
                torch.testing.assert_close(-1 / (2 * a), (width[b, h, i] / 2) ** 2, rtol=1e-3, atol=1e-4)
                torch.testing.assert_close(-linear / (2 * a), centre[b, h, i], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("settings", [{}, {"window": 2}, {"head_selection": "redundant"}], ids=str)
def test_sdpa_and_eager_agree_and_only_the_lower_layers_carry_it(checkpoint, settings):
    sdpa, eager = load(checkpoint, "sdpa", settings), load(checkpoint, "eager", settings)
    carriers = {n for n, m in sdpa.named_modules() if "localness" in getattr(m, "headattn_methods", ())}
    assert carriers == {f"model.{LAYER0}"}  # the lower half of 2 layers
    extra = {"dependency_mask": related((0,))}
    a, b = run(sdpa, **extra), run(eager, **extra)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
    plain = run(load(checkpoint)).logits
    assert (a.logits - plain).abs().max() > 1e-3
    assert HeadAttnMBartConfig(**{**TINY, "encoder_layers": 6}, localness={}).headattn_settings  # builds
    six = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**{**TINY, "encoder_layers": 6}, localness={}))
    assert [i for i, layer in enumerate(six.model.encoder.layers) if hasattr(layer.self_attn, "localness")] == [0, 1, 2]


def test_save_load_round_trip(checkpoint, tmp_path):
    model = load(checkpoint, settings={"window": 4})
    model.save_pretrained(tmp_path)
    again, info = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert again.config.localness == {"predictor": "head", "window": 4}
    saved = {k: v for k, v in model.state_dict().items() if ".localness." in k}
    assert set(saved) == KEYS - {f"model.{LAYER0}.localness.window_vector"}
    for key, value in saved.items():
        assert torch.equal(again.state_dict()[key], value), key
    torch.testing.assert_close(run(again.eval()).logits, run(model).logits)



@pytest.mark.parametrize("heads", ["all", "redundant"])
def test_generate_with_beams_and_cache(checkpoint, heads):
    model = load(checkpoint, settings={"head_selection": heads})
    inputs = {k: v for k, v in batch().items() if k != "labels"} | {"dependency_mask": related((0,))}
    settings = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert torch.equal(model.generate(**inputs, num_beams=1, **settings), greedy_by_full_forward(model, inputs, 5))
    beams = model.generate(**inputs, num_beams=3, **settings)
    assert torch.equal(beams, model.generate(**inputs, num_beams=3, use_cache=False, **settings))


def test_redundant_heads_select_per_sentence(checkpoint, monkeypatch):
    everywhere = load(checkpoint, "eager", {"encoder_layers": [0]})
    rhe = load(checkpoint, "eager", {"encoder_layers": [0], "head_selection": "redundant"})
    off = load(checkpoint, "eager")
    extra = {"dependency_mask": related((0,))}
    # RHE itself: no head redundant in sentence 0 (the plain model there), every head in sentence 1 (on all heads)
    torch.testing.assert_close(run(rhe, **extra).logits[0], run(off).logits[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(run(rhe, **extra).logits[1], run(everywhere).logits[1], atol=1e-5, rtol=0)
    # a hand-made selection: the bias exactly on those (sentence, head) pairs
    chosen = torch.tensor([[True, False, True, False], [False, False, False, True]])
    seen = []

    def select(call, dependency_mask):
        seen.append(dependency_mask)
        return chosen

    monkeypatch.setattr(localness_core, "redundant_heads_of", select)
    got, on, plain = layer_weights(rhe, **extra), layer_weights(everywhere), layer_weights(off)
    assert len(seen) == 1 and seen[0] is extra["dependency_mask"]
    for b in range(2):
        for h in range(4):
            torch.testing.assert_close(got[b, h], (on if chosen[b, h] else plain)[b, h], atol=1e-6, rtol=0)


def test_with_sea_on_the_same_layer_both_biases_apply(checkpoint, captured, monkeypatch):
    both = load(checkpoint, "eager", {"encoder_layers": [0]}, sea={"type": "dea", "head_selection": "all"})
    sea = load(checkpoint, "eager", sea={"type": "dea", "head_selection": "all"})
    dependency = related(())  # each token related to itself only, plus the neighbours below
    neighbours = torch.ones(5, dtype=torch.bool)
    dependency = dependency | torch.diag(neighbours, 1) | torch.diag(neighbours, -1)
    extra = {"dependency_mask": dependency}
    weights, without = layer_weights(both, **extra), layer_weights(sea, **extra)
    owners = [entry[0] for entry in captured]
    assert owners == ["sea", "localness", "sea"]  # (both's call: SEA then Localness; then SEA's model alone)
    allowed = (dependency & REAL[:, None, :])[:, None].expand_as(weights).clone()
    real_rows = REAL[:, None, :, None].expand_as(weights)
    assert (weights[real_rows & ~allowed] == 0).all()  # SEA's hard mask
    query = captured[1][1]
    bias = both.model.encoder.layers[0].self_attn.localness.bias(query, REAL).double()
    difference = weights.log() - without.log() - bias  # a constant c_i over each row's allowed keys
    for b in range(2):
        for h in range(4):
            for i in torch.nonzero(REAL[b]).flatten().tolist():
                row = difference[b, h, i, allowed[b, h, i]]
                assert (row - row[0]).abs().max() < 1e-4
    # Localness+RHE beside SEA+RHE: one RHE selection per call, shared
    from hf_headattn import redundancy

    calls = []
    monkeypatch.setattr(redundancy, "_redundant_heads_of", lambda call, mask: calls.append(1) or redundancy.
                        redundant_heads(*[torch.zeros(2, 4)] * 2))
    run(load(checkpoint, settings={"head_selection": "redundant", "encoder_layers": [0]}, sea={"type": "dea"}), **extra)
    assert len(calls) == 1


@pytest.mark.parametrize("settings, message", [
    ({"encoder_layers": [2]}, r"localness.encoder_layers contains 2, but the model has 2 layers: expected integers in "
                              r"\[-2, 1\]"),
    ({"window": 0}, r"localness.window must be 'predicted' or an integer >= 1 .*got 0"),
    ({"window": "fixed"}, r"localness.window must be an integer or one of 'predicted', got 'fixed'"),
    ({"heads": "some"}, r"localness.heads must be a list of \(an integer\) or one of 'all', got 'some'"),
    ({"heads": [5]}, r"localness.heads must be 'all' or a non-empty list of head numbers in \[-4, 3\], got \[5\]"),
    ({"predictor": "full"}, r"localness.predictor must be one of 'query', 'head', got 'full'"),
    ({"width": 3}, r"localness has unknown settings \['width'\]"),
])
def test_bad_settings_name_field_value_and_expectation(settings, message):
    with pytest.raises(ValueError, match=message):
        HeadAttnMBartConfig(**TINY, localness=settings)


def test_redundant_heads_need_the_dependency_mask(checkpoint):
    model = load(checkpoint, settings={"head_selection": "redundant"})
    with pytest.raises(ValueError, match=r"head_selection='redundant' needs the forward argument dependency_mask"):
        run(model)
    with pytest.raises(ValueError, match=r"dependency_mask has shape \(2, 5, 5\).*expected .* = \(2, 6, 6\)"):
        run(model, dependency_mask=torch.ones(2, 5, 5, dtype=torch.bool))
    run(load(checkpoint, settings={}))  # head_selection="all" needs none


def test_parameters_get_gradients_through_the_backend(checkpoint, monkeypatch):
    """SDPA (the bias's gradient from biased_attention's backward, on the padded batch) gives every parameter eager's
    gradient (autograd through the probabilities)."""
    fast = []
    apply = BiasedAttention.apply
    monkeypatch.setattr(BiasedAttention, "apply", lambda *args: fast.append(1) or apply(*args))
    grads = {}
    for backend in ("sdpa", "eager"):
        model = load(checkpoint, backend, {"encoder_layers": [0]}).train()
        torch.manual_seed(0)
        model(**batch()).loss.backward()
        grads[backend] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert fast == [1]  # SDPA's layer 0 took it
    ours = {n: g for n, g in grads["sdpa"].items() if ".localness." in n}
    assert set(ours) == KEYS and all(g.abs().sum() > 0 for g in ours.values())
    assert grads["sdpa"].keys() == grads["eager"].keys()
    for name, grad in grads["sdpa"].items():
        torch.testing.assert_close(grad, grads["eager"][name], atol=1e-5, rtol=1e-4, msg=name)
    # on the redundant heads only: no head redundant, no gradient (zeros, never None)
    for backend in ("sdpa", "eager"):
        model = load(checkpoint, backend, {"encoder_layers": [0], "head_selection": "redundant"}).train()
        model(**batch(), dependency_mask=related((0, 1))).loss.backward()
        assert all(p.grad is None or p.grad.abs().sum() == 0 for n, p in model.named_parameters()
                   if ".localness." in n)


def test_half_precision_stays_finite_with_a_collapsed_window(checkpoint, monkeypatch, captured):
    model = load(checkpoint, settings={"encoder_layers": [0]}).half()
    predict = localness_core.centre_and_window

    def collapsed(*args):  # D_i = 0 (a window whose sigmoid underflowed): the floor keeps the float16 bias finite
        centre, width = predict(*args)
        return centre, torch.zeros_like(width)

    monkeypatch.setattr(localness_core, "centre_and_window", collapsed)
    out = run(model)
    (_, _, bias, _), = captured
    assert bias.dtype == torch.float16 and torch.isfinite(bias).all() and bias.min() == -1e4
    assert out.logits.dtype == torch.float16 and torch.isfinite(out.logits).all()


def test_the_first_n_heads_get_the_per_head_bias_and_pruning_follows_them(checkpoint, captured):
    """heads=[0, 1] with the per-head reading: the bias of the loop on heads 0-1 only; pruning head 0 leaves the bias
    on the head that was 1, as masking head 0 does."""
    model = load(checkpoint, settings={"encoder_layers": [0], "heads": [0, 1]})
    run(model)
    (_, query, bias, heads), = captured
    assert heads == (0, 1) and bias.shape == (2, 2, 6, 6)
    module = model.model.encoder.layers[0].self_attn.localness
    parameters = [p.detach().double() for p in (module.weight, module.centre_vector, module.window_vector)]
    expected = loop_bias(query[:, :2].double(), *parameters, REAL)
    keys = REAL[:, None, None, :].expand_as(bias)
    torch.testing.assert_close(bias[keys].double(), expected[keys], rtol=1e-4, atol=1e-4)
    mask = torch.ones(2, 4)
    mask[0, 0] = 0
    masked = run(model, head_mask=mask).logits
    model.prune_heads({LAYER0: [0]})
    assert module.local_heads == (0,)
    torch.testing.assert_close(run(model).logits, masked, atol=1e-5, rtol=1e-5)
