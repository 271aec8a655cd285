"""Head importance criteria, each against an independent computation, and the choice of heads."""

import math
import re

import numpy as np
import pytest
import torch

from conftest import batch
from hf_headattn.experiment.analysis import count_redundant_heads, mean_head_importance
from hf_headattn.experiment.analysis.head_ranking import common_heads, criteria, heads_to_prune, score_heads
from test_head_pruning import METHODS, model_with, syntax


def batches():
    """Two batches: the conftest batch (padding in row 2) and its first row alone."""
    first = {k: v[:1] for k, v in batch().items()}
    return [batch(), first]


def by_sentence():
    return [{k: v[i:i + 1] for k, v in b.items()} for b in batches() for i in range(b["input_ids"].shape[0])]


def unpadded(sentence):
    """One sentence without its padding."""
    real = sentence["attention_mask"][0].bool()
    labels = sentence["labels"][0]
    return {"input_ids": sentence["input_ids"][:, real], "attention_mask": sentence["attention_mask"][:, real],
            "labels": labels[labels.ne(-100)][None]}


def test_gradient_is_michel_et_al_per_sentence_and_layer_normalised():
    model = model_with(METHODS["dhicm"])
    got = score_heads(model, batches(), ["gradient"])["gradient"]
    expected = {component: np.zeros((2, 4)) for component in got}
    arguments = {"encoder": "head_mask", "decoder": "decoder_head_mask", "cross": "cross_attn_head_mask"}
    for sentence in by_sentence():  # one sentence at a time, without padding: |dL/dxi| by autograd on (L, H) masks
        sentence = unpadded(sentence)
        masks = {component: torch.ones(2, 4, requires_grad=True) for component in got}
        out = model(**sentence, **{arguments[component]: mask for component, mask in masks.items()})
        (out.nll_loss * sentence["labels"].numel()).backward()
        for component, mask in masks.items():
            expected[component] += mask.grad.abs().numpy()
    for component in got:
        table = expected[component] / 3
        table = table / np.linalg.norm(table, axis=1, keepdims=True)
        np.testing.assert_allclose(got[component].numpy(), table, rtol=1e-4, atol=1e-6)


def attention_by_hand(model, sentence):
    """Per component, per layer, (H, T, S) eager attention weights of one unpadded sentence (numpy)."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(**sentence, output_attentions=True)
    model.set_attn_implementation("sdpa")
    return {"encoder": [a[0].numpy() for a in out.encoder_attentions],
            "decoder": [a[0].numpy() for a in out.decoder_attentions],
            "cross": [a[0].numpy() for a in out.cross_attentions]}


def test_confidence_and_entropy_by_hand():
    model = model_with(METHODS["eadra"])
    got = score_heads(model, batches(), ["confidence", "entropy"])
    eos = model.config.eos_token_id
    sums = {name: {component: np.zeros((2, 4)) for component in got["confidence"]} for name in got}
    counts = {component: 0 for component in got["confidence"]}
    for sentence in by_sentence():
        sentence = unpadded(sentence)
        decoder_inputs = model.prepare_decoder_input_ids_from_labels(labels=sentence["labels"])[0]
        weights = attention_by_hand(model, sentence)
        for component, layers in weights.items():
            tokens = sentence["input_ids"][0] if component == "encoder" else decoder_inputs
            for layer, probs in enumerate(layers):
                for query in range(probs.shape[1]):
                    if tokens[query] == eos:
                        continue
                    seen = query + 1 if component == "decoder" else probs.shape[2]
                    for head in range(4):
                        row = probs[head, query, :seen]
                        sums["confidence"][component][layer, head] += row.max()
                        entropy = -(row * np.log(np.maximum(row, 1e-38))).sum()
                        sums["entropy"][component][layer, head] += 1 - (entropy / math.log(seen) if seen > 1 else 0.0)
                    counts[component] += 1 if layer == 0 else 0
    for name in got:
        for component in got[name]:
            np.testing.assert_allclose(got[name][component].numpy(), sums[name][component] / counts[component],
                                       rtol=1e-5, atol=1e-6)


def test_method_criteria_read_the_methods_read_outs():
    model = model_with({**METHODS["dhicm"], "sea": {"type": "dea"}})
    data = [{**b, **{k: v[:b["input_ids"].shape[0]] for k, v in syntax().items()}} for b in batches()]
    assert {"dhicm", "rhe"} <= set(criteria())
    got = score_heads(model, data, ["dhicm", "rhe"])
    means = mean_head_importance(model, data)
    for name, values in means.items():
        component = component_of_name(name)
        np.testing.assert_allclose(got["dhicm"][component][int(name.split(".")[2])].numpy(), values, rtol=1e-5)
    assert torch.isnan(got["dhicm"]["encoder"][0]).all()  # no DHICM in encoder layer 0
    with torch.no_grad():
        report = count_redundant_heads(model(**b, output_redundant_heads=True).redundant_heads for b in data)
    frequency = report["modules"]["encoder.layers.0.self_attn"]["redundant_frequency"]
    np.testing.assert_allclose(got["rhe"]["encoder"][0].numpy(), 1 - np.array(frequency), rtol=1e-5)
    assert torch.isnan(got["rhe"]["decoder"]).all()


def test_padding_never_counts_and_pruned_heads_are_nan():
    model = model_with(METHODS["dhicm"])
    padded = []
    for b in batches():  # two more padding columns in the source and the labels
        padded.append({"input_ids": torch.nn.functional.pad(b["input_ids"], (0, 2), value=1),
                       "attention_mask": torch.nn.functional.pad(b["attention_mask"], (0, 2)),
                       "labels": torch.nn.functional.pad(b["labels"], (0, 2), value=-100)})
    names = ["gradient", "confidence", "entropy", "dhicm"]
    plain, more = score_heads(model, batches(), names), score_heads(model, padded, names)
    for name in names:
        for component in plain[name]:
            torch.testing.assert_close(more[name][component], plain[name][component], rtol=1e-4, atol=1e-6,
                                       equal_nan=True)
    model.prune_heads({"encoder.layers.1.self_attn": [2]})
    pruned = score_heads(model, batches(), [*names, "random"], seed=3)
    for name in [*names, "random"]:
        assert torch.isnan(pruned[name]["encoder"][1, 2]) and not torch.isnan(pruned[name]["encoder"][1, 0])
    again = score_heads(model, batches(), ["random"], seed=3)["random"]
    assert torch.equal(again["decoder"], pruned["random"]["decoder"])
    assert model.training is False and model.config._attn_implementation == "sdpa"


def test_heads_to_prune_takes_the_least_important_and_never_a_last_head():
    model = model_with({})
    model.prune_heads({"decoder.layers.0.encoder_attn": [0, 1]})
    importance = {component: torch.full((2, 4), 10.0) for component in ("encoder", "decoder", "cross")}
    importance["cross"][0] = torch.tensor([float("nan"), float("nan"), 0.1, 0.2])  # two left: one may go
    importance["encoder"][1] = torch.tensor([0.3, 0.05, 5.0, float("nan")])
    chosen = heads_to_prune(model, importance, 4)  # 0.05, 0.1, (0.2: the cross module's last head), 0.3, 5.0
    assert chosen == {"encoder.layers.1.self_attn": [0, 1, 2], "decoder.layers.0.encoder_attn": [2]}
    assert heads_to_prune(model, {"encoder": importance["encoder"]}, 100) == {"encoder.layers.1.self_attn": [0, 1, 2],
                                                                            "encoder.layers.0.self_attn": [0, 1, 2]}
    model.prune_heads(chosen)
    # the same importance again (as iterative pruning without recomputing uses it): the pruned heads are skipped
    again = heads_to_prune(model, importance, 2)
    assert again == {"decoder.layers.1.encoder_attn": [0, 1]}  # ties at 10.0: the first component, layer and heads
    model.prune_heads(again)


def test_common_heads_limit_the_candidates_to_what_every_criterion_scores():
    model = model_with(METHODS["dhicm"])  # DHICM in encoder layer 1 and both decoder layers (self and cross)
    scores = score_heads(model, batches(), ["gradient", "dhicm"])
    among = common_heads(scores)
    assert among["encoder"].tolist() == [[False] * 4, [True] * 4]
    assert among["decoder"].all() and among["cross"].all()
    assert common_heads({"gradient": scores["gradient"]})["encoder"].all()
    chosen = heads_to_prune(model, scores["gradient"], 3, among)  # 3: no module's last head can be among them
    assert sum(map(len, chosen.values())) == 3 and not any(name.startswith("encoder.layers.0.") for name in chosen)
    allowed = sorted(value for component, table in scores["gradient"].items()
                     for value in table[among[component]].tolist())
    assert sorted(scores["gradient"][component_of_name(name)][int(name.split(".")[2]), head].item()
                  for name, heads in chosen.items() for head in heads) == allowed[:3]
    everything = heads_to_prune(model, scores["gradient"], 100, among)
    assert len(everything) == 5 and all(len(heads) == 3 for heads in everything.values())  # never a last head


def component_of_name(name: str) -> str:
    return "cross" if "encoder_attn" in name else name.split(".")[0]


def test_bad_criteria():
    model = model_with({})
    with pytest.raises(ValueError, match=r"unknown head importance criteria \['michel'\]; expected some of"):
        score_heads(model, batches(), ["michel"])
    with pytest.raises(ValueError, match=r"the criterion 'dhicm' needs dhicm switched on"):
        score_heads(model, batches(), ["dhicm"])
    with pytest.raises(ValueError, match=r"needs batches with labels"):
        score_heads(model, [{"input_ids": batch()["input_ids"]}], ["gradient"])


@pytest.mark.parametrize("count", [-1, -5, 1.5, 2.0, "3", True, None, np.float64(2), torch.tensor(-1)], ids=repr)
def test_heads_to_prune_refuses_a_count_that_is_no_non_negative_integer(count):
    """Regression: count=-1 returned every prunable head."""
    importance = {component: torch.rand(2, 4) for component in ("encoder", "decoder", "cross")}
    with pytest.raises(ValueError, match=r"count must be a non-negative integer .*, got " + re.escape(repr(count))):
        heads_to_prune(model_with({}), importance, count)


def test_heads_to_prune_takes_numpy_counts_and_zero():
    importance = {component: torch.rand(2, 4) for component in ("encoder", "decoder", "cross")}
    assert heads_to_prune(model_with({}), importance, 0) == {}
    for count in (np.int64(2), torch.tensor(2)):
        assert sum(map(len, heads_to_prune(model_with({}), importance, count).values())) == 2
