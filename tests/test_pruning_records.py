"""prune_heads resolves every name to its module before anything changes: the returned record, config.pruned_heads
and the modules agree after every call shape the API accepts, and a save reloads with equal outputs (regression: one
module under its two names recorded both lists but pruned one, and the saved model did not reload)."""

import pytest
import torch

from conftest import FAMILIES, TINY, batch

ENC0, CROSS1 = "encoder.layers.0.self_attn", "decoder.layers.1.encoder_attn"

#: Call sequences the API accepts, and the record they leave.
ACCEPTED = {
    "aliases": ([{ENC0: [0], f"model.{ENC0}": [1]}], {ENC0: [0, 1]}),
    "overlapping_aliases": ([{ENC0: [0, 1], f"model.{ENC0}": [1, 2]}], {ENC0: [0, 1, 2]}),
    "peft_path": ([{f"base_model.model.model.{CROSS1}": [2]}], {CROSS1: [2]}),
    "repeated_calls": ([{CROSS1: [3]}, {f"model.{CROSS1}": [0]}, {CROSS1: [2], ENC0: [1]}],
                       {CROSS1: [0, 2, 3], ENC0: [1]}),
    "all_but_one_in_steps": ([{ENC0: [3]}, {f"model.{ENC0}": [0], ENC0: [1]}], {ENC0: [0, 1, 3]}),
    "all_but_one_at_once": ([{ENC0: [0, 1, 2], CROSS1: [1, 2, 3]}], {ENC0: [0, 1, 2], CROSS1: [1, 2, 3]}),
    "empty_list": ([{ENC0: [2]}, {f"model.{ENC0}": []}], {ENC0: [2]}),
}
#: Call sequences whose last call is refused (naming why), leaving the model as the calls before it left it.
REFUSED = {
    "already_pruned_again": ([{ENC0: [1]}, {f"model.{ENC0}": [1, 2]}], r"heads \[1\] are already pruned"),
    "aliases_remove_every_head": ([{ENC0: [0, 1], f"model.{ENC0}": [2, 3]}],
                                  r"prune_heads\['encoder.layers.0.self_attn'\] and prune_heads\['model.encoder.layers"
                                  r".0.self_attn'\] \(both 'encoder.layers.0.self_attn'\) would remove all 4 heads"),
    "calls_remove_every_head": ([{ENC0: [0, 1]}, {f"model.{ENC0}": [2, 3]}],
                                r"with the heads pruned before would remove all 4 heads"),
    "one_bad_key_among_good": ([{CROSS1: [0], "encoder.layers.0.fc1": [0]}], r"'encoder.layers.0.fc1' is no attention"),
    "unknown_prefix": ([{f"decoder.{ENC0}": [1]}], r"'decoder.encoder.layers.0.self_attn' is no attention module"),
}


def tiny(family):
    model_cls = FAMILIES[family][2]
    torch.manual_seed(0)
    config = model_cls.config_class(**TINY, dropout=0.0, attention_dropout=0.0)
    return model_cls(config).eval()


def held(model) -> dict[str, list[int]]:
    """The heads each attention module lacks, read from its projections' shapes and its head numbers."""
    found = {}
    for name, module in model.named_modules():
        if hasattr(module, "headattn_layer"):
            kept = module.q_proj.weight.shape[0] // module.head_dim
            numbers = range(4) if module.headattn_heads is None else module.headattn_heads.numbers
            assert kept == module.num_heads == len(numbers) == module.k_proj.weight.shape[0] // module.head_dim
            if kept < 4:
                found[module.headattn_name] = sorted(set(range(4)) - set(numbers))
    return found


def assert_saved_model_reloads(model, tmp_path):
    model.save_pretrained(tmp_path)
    again = type(model).from_pretrained(tmp_path).eval()
    assert (again.config.pruned_heads or {}) == (model.config.pruned_heads or {}) == held(again)
    with torch.no_grad():
        torch.testing.assert_close(again(**batch()).logits, model(**batch()).logits)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("shape", sorted(ACCEPTED))
def test_record_config_and_modules_agree_and_reload(family, shape, tmp_path):
    calls, expected = ACCEPTED[shape]
    model = tiny(family)
    for heads in calls:
        record = model.prune_heads(heads)
        assert record == model.config.pruned_heads == held(model)
    assert record == expected
    assert_saved_model_reloads(model, tmp_path)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("shape", sorted(REFUSED))
def test_a_refused_call_changes_nothing_and_the_model_still_reloads(family, shape, tmp_path):
    *before, last = REFUSED[shape][0]
    model = tiny(family)
    for heads in before:
        model.prune_heads(heads)
    record, shapes = dict(model.config.pruned_heads or {}), {n: p.shape for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match=REFUSED[shape][1]):
        model.prune_heads(last)
    assert (model.config.pruned_heads or {}) == record == held(model)
    assert {n: p.shape for n, p in model.named_parameters()} == shapes
    assert_saved_model_reloads(model, tmp_path)


def test_a_record_edited_behind_the_models_back_is_refused_before_pruning():
    """Regression: prune_heads took an edited config.pruned_heads as what was pruned, so the config named heads the
    modules still had, and the next forward's check passed (the record and the model were updated together)."""
    model = tiny("marian")
    model.config.pruned_heads = {CROSS1: [0]}
    with pytest.raises(ValueError, match=r"config.pruned_heads was changed .* records \[0\] for "
                                         r"'decoder.layers.1.encoder_attn', whose module has pruned \[\]"):
        model.prune_heads({ENC0: [1]})
    assert held(model) == {}
