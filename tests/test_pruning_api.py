"""prune_heads' arguments: head numbers as ints, numpy integers or integer tensors; clear errors for anything else."""

import numpy as np
import pytest
import torch

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.pruning import prune_heads

NAME = "encoder.layers.0.self_attn"


def tiny_model():
    torch.manual_seed(0)
    return HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, dropout=0.0)).eval()


@pytest.mark.parametrize("heads", [
    [np.int64(1), 2], np.array([1, 2]), np.array([2, 1], dtype=np.int32), [np.array(1), np.int8(2)],
    torch.tensor([1, 2]), [torch.tensor(1), torch.tensor(2)], (1, 2), {2, 1},
], ids=repr)
def test_head_numbers_may_be_numpy_or_torch_integers(heads, tmp_path):
    model = tiny_model()
    assert model.prune_heads({NAME: heads}) == {NAME: [1, 2]}
    assert all(type(h) is int for h in model.config.pruned_heads[NAME])
    model.save_pretrained(tmp_path)  # the record is plain JSON
    reloaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch()).logits, model(**batch()).logits)


@pytest.mark.parametrize("heads", [
    [1.0], np.array([1.0]), torch.tensor([1.0]), [np.float32(1)], [True], np.array([True]), torch.tensor([True]),
    np.int64(1), torch.tensor(1), np.array([[1]]),
], ids=repr)
def test_floats_bools_and_scalars_are_refused(heads):
    model = tiny_model()
    with pytest.raises(ValueError, match=r"prune_heads\['encoder.layers.0.self_attn'\] must be a list of head numbers "
                                         r"in \[0, 3\] .*got"):
        model.prune_heads({NAME: heads})
    assert model.config.pruned_heads is None and model.model.encoder.layers[0].self_attn.num_heads == 4


@pytest.mark.parametrize("heads", [[NAME], NAME, None], ids=repr)
def test_a_non_mapping_is_refused_naming_what_was_given(heads):
    with pytest.raises(ValueError, match=r"prune_heads expects a dict \{module name: \[head numbers\]\}.*got a "):
        tiny_model().prune_heads(heads)


def test_the_pruning_function_leaves_a_model_that_runs():
    """Regression: ``hf_headattn.pruning.prune_heads(model, ...)`` recorded the heads in the config only, and the
    next forward refused (\"config.pruned_heads was changed after the model was built\")."""
    model, reference = tiny_model(), tiny_model()
    prune_heads(model, {NAME: [1]})
    reference.prune_heads({NAME: [1]})
    with torch.no_grad():
        torch.testing.assert_close(model(**batch()).logits, reference(**batch()).logits)


@pytest.mark.parametrize("part", ["get_encoder", "base_model"])
def test_pruning_a_part_leaves_the_whole_model_runnable_and_saved(part, tmp_path):
    """Regression: pruning through a part (``prune_heads(model.get_encoder(), ...)``, or the base model's own
    ``prune_heads``) recorded the heads in the shared config but left the outer model's record stale, and its next
    forward refused ("config.pruned_heads was changed after the model was built")."""
    model, reference = tiny_model(), tiny_model()
    target = model.get_encoder() if part == "get_encoder" else model.model
    prune_heads(target, {NAME: [1]})
    reference.prune_heads({NAME: [1]})
    assert model.config.pruned_heads == {NAME: [1]}
    with torch.no_grad():
        torch.testing.assert_close(model(**batch()).logits, reference(**batch()).logits)
    model.save_pretrained(tmp_path)
    reloaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert reloaded.config.pruned_heads == {NAME: [1]}
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch()).logits, reference(**batch()).logits)
    model.config.pruned_heads = {NAME: [2]}  # an edit the modules do not hold is still refused
    with pytest.raises(ValueError, match=r"config.pruned_heads was changed after the model was built \(to "
                                         r"\{'encoder.layers.0.self_attn': \[2\]\}, the model's modules have "
                                         r"\{'encoder.layers.0.self_attn': \[1\]\} pruned\)"):
        model(**batch())


def zero3_marked(model):
    """``model`` with a parameter marked as DeepSpeed ZeRO-3 marks the parameters it partitions (``ds_numel``; the
    real thing: tests/test_deepspeed.py)."""
    model.model.shared.weight.ds_numel = model.model.shared.weight.numel()
    return model


def test_a_zero3_partitioned_model_is_neither_pruned_nor_saved(tmp_path):
    """Pruning would cut this process's shard, ``save_pretrained`` write empty tensors: both refuse, nothing changed
    or written; ``save_pretrained`` with the gathered weights (``state_dict=``, as the Trainer passes them) saves."""
    model = zero3_marked(tiny_model())
    with pytest.raises(ValueError, match=r"prune_heads: the model's weights are partitioned by DeepSpeed ZeRO-3 "
                                         r"\(model.shared.weight holds only this process's shard\); nothing was "
                                         r"pruned\. Prune the full weights: save the model \(trainer.save_model"):
        model.prune_heads({NAME: [1]})
    assert model.config.pruned_heads is None and model.model.encoder.layers[0].self_attn.num_heads == 4
    with pytest.raises(ValueError, match=r"save_pretrained: the model's weights are partitioned by DeepSpeed ZeRO-3 "
                                         r".*so it would save empty tensors; nothing was written\. Save with "
                                         r"trainer.save_model\(output_dir\)"):
        model.save_pretrained(tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    model.save_pretrained(tmp_path / "gathered", state_dict=tiny_model().state_dict())
    assert HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path / "gathered").config.pruned_heads is None
