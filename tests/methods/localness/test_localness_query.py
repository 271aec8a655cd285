"""Localness as the authors' code has it (``predictor="query"``, the default): the whole-query predictor against a
float64 loop (padding, the first n heads, the fixed window), gradcheck, the layer's bias in the model, SDPA = eager,
generation with a cache, pruning refused, and old saved configs keeping the per-head reading they were trained with."""

import math

import pytest
import torch
from test_localness import REAL, captured, checkpoint, related, run  # noqa: F401 (fixtures)

from conftest import TINY, batch, greedy_by_full_forward
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.methods.localness.equations import gaussian_bias, query_centre_and_window, sentence_positions

B, T, D_MODEL, HIDDEN = 3, 6, 8, 6
NAMES = ("hidden_weight", "hidden_bias", "output_weight", "output_bias")
#: padding on the right (sentence 1), on the left (sentence 2), none (sentence 0)
PADDED = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [False] + [True] * 5])


def predictor(heads, fixed, seed=0):
    g = torch.Generator().manual_seed(seed)
    outputs = heads * (1 if fixed else 2)
    return [torch.randn(*shape, generator=g, dtype=torch.float64)
            for shape in ((B, T, D_MODEL), (HIDDEN, D_MODEL), (HIDDEN,), (outputs, HIDDEN), (outputs,))]


def loop_bias(query, hidden_weight, hidden_bias, output_weight, output_bias, real, heads, window=None):
    """G[b, h, i, j] as the authors' code computes it, one scalar at a time: P = (I - 1) sigmoid, D = I sigmoid + 0.1
    (or the fixed window), G = -2 ((P - j) / D)^2 over the real tokens' positions (0 at padding keys)."""
    batch_size, length, width = query.shape
    bias = torch.zeros(batch_size, heads, length, length, dtype=torch.float64)
    for b in range(batch_size):
        reals = [s for s in range(length) if real[b, s]]
        size = len(reals)
        for i in range(length):
            hidden = [math.tanh(sum(hidden_weight[r, c].item() * query[b, i, c].item() for c in range(width))
                                + hidden_bias[r].item()) for r in range(hidden_weight.shape[0])]

            def gate(row):
                logit = sum(output_weight[row, r].item() * hidden[r] for r in range(len(hidden))) + output_bias[row]
                return 1 / (1 + math.exp(-logit))

            for h in range(heads):
                centre = (size - 1) * gate(h)
                span = window if window is not None else size * gate(heads + h) + 0.1
                for j in range(length):
                    if real[b, j]:
                        bias[b, h, i, j] = -2 * ((centre - reals.index(j)) / span) ** 2
    return bias


@pytest.mark.parametrize("heads, window", [(3, None), (2, 10.0)])
def test_the_authors_predictor_against_a_float64_loop_with_padding(heads, window):
    query, *weights = predictor(heads, window is not None)
    positions, lengths = sentence_positions(PADDED)
    centre, width = query_centre_and_window(query, *weights, lengths.double(), window)
    assert centre.shape == width.shape == (B, heads, T)
    assert (centre >= 0).all() and (centre <= (lengths - 1)[:, None, None]).all()
    assert (width >= 0.1).all() if window is None else (width == window).all()
    bias = gaussian_bias(centre, width, positions)
    expected = loop_bias(query, *weights, PADDED, heads, window)
    keys = PADDED[:, None, None, :].expand_as(bias)
    torch.testing.assert_close(bias[keys], expected[keys], rtol=1e-12, atol=1e-12)


def test_the_authors_predictor_gradchecks():
    positions, lengths = sentence_positions(PADDED)
    for window in (None, 10.0):
        inputs = [tensor[:, :3].clone() if i == 0 else tensor for i, tensor in enumerate(predictor(2, window))]
        inputs = [tensor.requires_grad_(True) for tensor in inputs]

        def bias(query, *weights):
            return gaussian_bias(*query_centre_and_window(query, *weights, lengths.double(), window),
                                 positions.double()[:, :T])

        assert torch.autograd.gradcheck(bias, tuple(inputs))


def load(path, attn_implementation="sdpa", settings=None, seed=1):
    """The checkpoint with the authors' layout, its parameters moderate (windows of a few tokens)."""
    model = HeadAttnMBartForConditionalGeneration.from_pretrained(
        path, attn_implementation=attn_implementation, localness=settings).eval()
    g = torch.Generator().manual_seed(seed)
    for name, parameter in model.named_parameters():
        if ".localness." in name:
            parameter.data = torch.randn(parameter.shape, generator=g) * 0.5
    return model


@pytest.mark.parametrize("heads, window", [("all", "predicted"), ([3, -3], "predicted"), ([0, 1, 2], 10)])
def test_the_layer_adds_the_loop_bias_on_its_heads(checkpoint, captured, heads, window):  # noqa: F811
    """On every head or on the heads named (any numbers: [3, -3] is heads 1 and 3)."""
    model = load(checkpoint, settings={"encoder_layers": [0], "heads": heads, "window": window})
    module = model.model.encoder.layers[0].self_attn.localness
    count = 4 if heads == "all" else len(heads)
    assert module.hidden_weight.shape == (count * 4, 16) and module.output_weight.shape[0] == count * (
        1 if window == 10 else 2)
    run(model)
    (method, query, bias, selected), = captured
    assert method == "localness" and bias.shape == (2, count, 6, 6)
    assert selected == (None if heads == "all" else tuple(sorted(head % 4 for head in heads)))
    whole = query.double().transpose(1, 2).flatten(2)  # (B, T, H d_h)
    expected = loop_bias(whole, *[getattr(module, n).detach().double() for n in NAMES], REAL, count,
                         None if window == "predicted" else window)
    keys = REAL[:, None, None, :].expand_as(bias)
    torch.testing.assert_close(bias[keys].double(), expected[keys], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("settings", [{}, {"heads": [0, 1]}, {"head_selection": "redundant"}], ids=str)
def test_sdpa_equals_eager_and_gradients_reach_every_parameter(checkpoint, settings):  # noqa: F811
    extra = {"dependency_mask": related((0,))}
    sdpa, eager = load(checkpoint, "sdpa", settings), load(checkpoint, "eager", settings)
    torch.testing.assert_close(run(sdpa, **extra).logits, run(eager, **extra).logits, atol=1e-4, rtol=1e-4)
    assert (run(sdpa, **extra).logits - run(load(checkpoint), **extra).logits).abs().max() > 1e-3
    sdpa.train()
    sdpa(**batch(), **extra).loss.backward()
    grads = {n.rsplit(".", 1)[1]: p.grad for n, p in sdpa.named_parameters() if ".layers.0.self_attn.localness." in n}
    assert set(grads) == set(NAMES) and all(g is not None and g.abs().sum() > 0 for g in grads.values())


def test_generate_with_a_cache_equals_the_full_forward(checkpoint):  # noqa: F811
    model = load(checkpoint, settings={"heads": [0, 1, 2]})
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    tokens = model.generate(**inputs, num_beams=1, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert torch.equal(tokens, greedy_by_full_forward(model, inputs, 5))


def test_pruning_is_refused_naming_the_predictor(checkpoint):  # noqa: F811
    model = load(checkpoint, settings={"encoder_layers": [0]})
    with pytest.raises(ValueError, match=r"predictor='query' reads every head's query.*predictor='head'"):
        model.prune_heads({"encoder.layers.0.self_attn": [1]})
    assert model.model.encoder.layers[0].self_attn.q_proj.out_features == 16  # nothing was pruned


def test_old_saved_configs_keep_the_per_head_reading_new_ones_the_authors(checkpoint, tmp_path):  # noqa: F811
    """A config.json saved before ``predictor`` existed (its localness dict lacks it, the file records no default for
    it) was trained with the per-head reading and loads with it; ``to_dict`` records the default the dict relies on,
    so a new file keeps the authors' layout, and the dict saves as given."""
    old = HeadAttnMBartConfig.from_dict({**TINY, "model_type": "headattn_mbart", "headattn_version": "0.3.0",
                                         "localness": {"window": 4}})
    assert old.headattn_settings["localness"].predictor == "head"
    assert HeadAttnMBartConfig(**TINY, localness={"window": 4}).headattn_settings["localness"].predictor == "query"
    model = load(checkpoint, settings={"window": 4})
    model.save_pretrained(tmp_path)
    again = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert again.config.localness == {"window": 4} and again.config.headattn_settings["localness"].predictor == "query"
    assert again.config.to_dict()["headattn_defaults"] == {"localness": {"predictor": "query"}}
    torch.testing.assert_close(run(again).logits, run(model).logits)
