"""LoRA with methods on: the methods' parameters train and save; adapters reload and merge to the same outputs."""

import pytest
import torch
from peft import PeftModel, get_peft_model
from safetensors.torch import load_file

from conftest import TINY, batch
from hf_headattn import (
    HeadAttnMarianConfig,
    HeadAttnMarianMTModel,
    HeadAttnMBartConfig,
    HeadAttnMBartForConditionalGeneration,
)
from hf_headattn.experiment.kit import kits
from hf_headattn.experiment.peft_utils import lora_config, method_modules_to_save
from hf_headattn.experiment.presets import method_settings
from hf_headattn.registry import registered_methods

FAMILIES = {"mbart": (HeadAttnMBartForConditionalGeneration, HeadAttnMBartConfig),
            "marian": (HeadAttnMarianMTModel, HeadAttnMarianConfig)}
METHODS = dict(dropout=0.0, dhicm={"encoder_layers": [-1], "decoder_layers": [-1]})


#: One recipe setting of each built-in method (every method on mBART; Marian, whose attention is a copy of mBART's,
#: with DHICM): rel_pos with its value term, SEA's LPEA on the redundant heads, Localness's query-specific window
#: (the authors' whole-query predictor).
CASES = [("mbart", "dhicm"), ("marian", "dhicm"), ("mbart", "eadra"), ("mbart", "lpea_rhe"),
         ("mbart", "fixed_attention"), ("mbart", "rel_pos"), ("mbart", "localness")]
#: The methods' own parameters in those settings (each attention module's ``<method>.<parameter>``); EaDRA and fixed
#: attention have none.
OWN_PARAMETERS = {"dhicm": {"w", "u", "v"}, "sea": {"lpea_embeddings", "lpea_weight", "lpea_bias", "lpea_projection"},
                  "rel_pos": {"relative_keys", "relative_values"},
                  "localness": {"hidden_weight", "hidden_bias", "output_weight", "output_bias"}}


def method_of(recipe):
    """The registered method a recipe name switches on (the one config field its settings set)."""
    (name,) = method_settings(recipe)
    return next(spec for spec in registered_methods() if spec.name == name)


def test_every_built_in_method_has_a_lora_case():
    assert sorted({method_of(recipe).name for _, recipe in CASES}) == sorted(spec.name for spec in registered_methods())


def loss_terms(out, spec):
    """The method's logged output tensors (dict fields' values as ``<field>/<key>``) that carry gradients."""
    terms = {}
    for field in spec.logged:
        assert out[field] is not None, field
        values = out[field].items() if isinstance(out[field], dict) else [(None, out[field])]
        terms.update({field if key is None else f"{field}/{key}": value
                      for key, value in values if value.requires_grad})
    return terms


@pytest.mark.parametrize(("family", "recipe"), CASES, ids=[f"{family}-{recipe}" for family, recipe in CASES])
def test_lora_trains_method_parameters_and_round_trips(tmp_path, family, recipe):
    """The method's own parameters (if any) are PEFT's ``modules_to_save``: trained (their gradients come through
    the copy the forward uses) and saved with the adapter; its loss terms (if any) reach the loss; the adapter
    reloads, and merges and saves, to the same logits."""
    model_cls, config_cls = FAMILIES[family]
    spec, kit = method_of(recipe), next(kit for kit in kits() if recipe in kit.method_names)
    torch.manual_seed(0)
    inputs = {**batch(), **(kit.example_inputs(*batch()["input_ids"].shape) if kit.example_inputs else {})}
    model_cls(config_cls(**TINY, dropout=0.0, **method_settings(recipe))).save_pretrained(tmp_path / "base")
    base = model_cls.from_pretrained(tmp_path / "base")
    own = [name for name, _ in base.named_parameters() if f".{spec.name}." in name]
    assert {name.rsplit(".", 1)[-1] for name in own} == OWN_PARAMETERS.get(spec.name, set())
    assert method_modules_to_save(base) == ([spec.name] if own else [])
    peft_model = get_peft_model(base, lora_config(base, r=4, init_lora_weights=False))
    trainable = {n: p for n, p in peft_model.named_parameters() if p.requires_grad}
    # PEFT trains a copy of each module to save: <path>.<method>.modules_to_save.default.<parameter>
    copies = ["base_model.model." + name.replace(f".{spec.name}.", f".{spec.name}.modules_to_save.default.")
              for name in own]
    assert set(copies) <= set(trainable)
    lora = [n for n in trainable if "lora_A" in n or "lora_B" in n]
    assert lora and set(trainable) == {*copies, *lora}  # nothing else trains (fc1, embeddings, the originals)
    before = {n: p.detach().clone() for n, p in trainable.items()}
    optimizer = torch.optim.AdamW(trainable.values(), lr=1e-2)
    peft_model.train()
    out = peft_model(**inputs)
    # the method's logged terms are in the output and in the loss (the loss's gradient reaches them: DHICM's KL is
    # too near 0 at initialisation to tell the two losses apart), the loss is the NLL alone otherwise (label
    # smoothing 0)
    terms = loss_terms(out, spec)
    assert bool(terms) == bool(spec.logged)
    if not terms:
        assert out.loss.item() == out.nll_loss.item()
    for term in terms.values():
        term.retain_grad()
    out.loss.backward()
    assert not [name for name, term in terms.items() if term.grad is None]  # terms the loss does not reach
    assert not terms or any(term.grad.any() for term in terms.values())
    no_gradient = [n for n, p in trainable.items() if p.grad is None or not p.grad.any()]
    assert not no_gradient, no_gradient
    optimizer.step()
    peft_model.eval()
    assert all(not torch.equal(p, before[n]) for n, p in trainable.items())
    with torch.no_grad():
        expected = peft_model(**inputs).logits
    peft_model.save_pretrained(tmp_path / "adapter")
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert {f"base_model.model.{name}" for name in own} <= set(saved)

    reloaded = PeftModel.from_pretrained(model_cls.from_pretrained(tmp_path / "base"), tmp_path / "adapter").eval()
    merged = reloaded.merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, expected)
        torch.testing.assert_close(merged(**inputs).logits, expected, atol=1e-5, rtol=1e-4)
        again = model_cls.from_pretrained(tmp_path / "merged").eval()
        torch.testing.assert_close(again(**inputs).logits, expected, atol=1e-5, rtol=1e-4)


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
