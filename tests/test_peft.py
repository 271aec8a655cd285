"""LoRA with methods on: the methods' parameters train and save; adapters reload and merge to the same outputs."""

import pytest
import torch
from peft import PeftModel, get_peft_model

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, HeadAttnMarianConfig, HeadAttnMarianMTModel
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
    dhicm_before = {n: p.detach().clone() for n, p in peft_model.named_parameters() if ".dhicm." in n and p.requires_grad}
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
