"""LoRA with methods on: the methods' parameters train and save; adapters reload and merge to the same outputs."""

import pytest
import torch
from peft import PeftModel, get_peft_model

from conftest import TINY, batch
from hf_headattn import (
    HeadAttnMarianConfig,
    HeadAttnMarianMTModel,
    HeadAttnMBartConfig,
    HeadAttnMBartForConditionalGeneration,
)
from hf_headattn.experiment.peft_utils import lora_config, method_modules_to_save

FAMILIES = {"mbart": (HeadAttnMBartForConditionalGeneration, HeadAttnMBartConfig),
            "marian": (HeadAttnMarianMTModel, HeadAttnMarianConfig)}
METHODS = dict(dropout=0.0, dhicm={"encoder_layers": [-1], "decoder_layers": [-1]})


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lora_trains_method_parameters_and_round_trips(tmp_path, family):
    model_cls, config_cls = FAMILIES[family]
    torch.manual_seed(0)
    model_cls(config_cls(**TINY, **METHODS)).save_pretrained(tmp_path / "base")
    base = model_cls.from_pretrained(tmp_path / "base")
    assert method_modules_to_save(base) == ["dhicm"]
    peft_model = get_peft_model(base, lora_config(base, r=4, init_lora_weights=False))
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any(".dhicm." in n for n in trainable) and any("lora_A" in n for n in trainable)
    assert not any(n.endswith("fc1.weight") for n in trainable)
    dhicm_before = {n: p.detach().clone() for n, p in peft_model.named_parameters()
                    if ".dhicm." in n and p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    peft_model.train()
    peft_model(**batch()).loss.backward()
    optimizer.step()
    peft_model.eval()
    assert any(not torch.equal(p, dhicm_before[n]) for n, p in peft_model.named_parameters() if n in dhicm_before)
    with torch.no_grad():
        expected = peft_model(**batch()).logits
    peft_model.save_pretrained(tmp_path / "adapter")

    reloaded = PeftModel.from_pretrained(model_cls.from_pretrained(tmp_path / "base"), tmp_path / "adapter").eval()
    merged = reloaded.merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch()).logits, expected)
        torch.testing.assert_close(merged(**batch()).logits, expected, atol=1e-5, rtol=1e-4)
        again = model_cls.from_pretrained(tmp_path / "merged").eval()
        torch.testing.assert_close(again(**batch()).logits, expected, atol=1e-5, rtol=1e-4)


def test_unknown_lora_target_is_named():
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY))
    with pytest.raises(ValueError, match=r"LoRA target modules \['query'\] are not linear layers.*'q_proj'"):
        lora_config(model, target_modules=["q_proj", "query"])


def _prune_through_peft_model(peft_model, heads):
    return peft_model.prune_heads(heads)


def _prune_through_inner_model(peft_model, heads):
    return peft_model.base_model.model.prune_heads(heads)


def _prune_through_function(peft_model, heads):
    from hf_headattn.pruning import prune_heads
    return prune_heads(peft_model, heads)


@pytest.mark.parametrize("targets", [None, ["out_proj"]], ids=["qkvo", "out_proj"])
@pytest.mark.parametrize("prune", [_prune_through_peft_model, _prune_through_inner_model, _prune_through_function])
def test_pruning_a_peft_model_is_refused_before_anything_changes(targets, prune):
    """Regression: a raw KeyError ("attribute 'weight' already exists") left q/k/v cut and out_proj whole."""
    torch.manual_seed(0)
    base = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **METHODS))
    kwargs = {} if targets is None else {"target_modules": targets}
    peft_model = get_peft_model(base, lora_config(base, r=4, init_lora_weights=False, **kwargs)).eval()
    with torch.no_grad():
        expected = peft_model(**batch()).logits
    shapes = {name: p.shape for name, p in peft_model.named_parameters()}
    with pytest.raises(ValueError, match=r"carries PEFT adapters.*nothing was pruned\. Prune first, then attach the "
                                         r"adapters.*merge_and_unload\(\)"):
        prune(peft_model, {"encoder.layers.0.self_attn": [1], "decoder.layers.1.self_attn": [0]})
    assert {name: p.shape for name, p in peft_model.named_parameters()} == shapes
    assert base.config.pruned_heads is None
    with torch.no_grad():
        torch.testing.assert_close(peft_model(**batch()).logits, expected)
    # the order the message names: merge, prune, attach new adapters
    merged = peft_model.merge_and_unload()
    merged.prune_heads({"encoder.layers.0.self_attn": [1]})
    again = get_peft_model(merged, lora_config(merged, r=4, **kwargs))
    assert again(**batch()).logits.shape == expected.shape
