"""Gradient checkpointing: the methods' loss terms keep their gradients, or the run is refused (never silently lost)."""

import pytest
import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from conftest import FAMILIES, TINY, batch
from hf_headattn import HeadAttnMarianConfig, HeadAttnMarianMTModel

SETTINGS = dict(dhicm={"encoder_layers": [-1], "decoder_layers": [-1]},
                eadra={"encoder": {}, "decoder": {}, "cross": {}})


def model_of(checkpointing_kwargs=None, enable=True):
    torch.manual_seed(0)
    model = HeadAttnMarianMTModel(HeadAttnMarianConfig(**TINY, **SETTINGS)).train()
    if enable:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpointing_kwargs)
    return model


def gradients(model):
    torch.manual_seed(1)  # the same dropout masks
    out = model(**batch())
    assert out.dhicm_kl.requires_grad and out.eadra_loss.requires_grad
    out.loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("kwargs", [None, {"use_reentrant": False}])
def test_non_reentrant_checkpointing_gives_the_gradients_of_a_plain_backward(kwargs):
    reference = gradients(model_of(enable=False))
    checkpointed = gradients(model_of(kwargs))
    assert any("dhicm" in name for name in reference) and reference.keys() == checkpointed.keys()
    for name, grad in reference.items():
        torch.testing.assert_close(checkpointed[name], grad, msg=name)


def test_reentrant_checkpointing_is_refused_instead_of_dropping_the_terms():
    # regression: dhicm_kl and eadra_loss came back without gradients (the layers run under no_grad)
    with pytest.raises(ValueError, match=r"reentrant gradient checkpointing.*use_reentrant.: False"):
        model_of({"use_reentrant": True})(**batch())


def test_empty_kwargs_either_work_or_are_refused():
    """``{}`` leaves use_reentrant to torch's default, which changed across versions."""
    model = model_of({})
    try:
        checkpointed = gradients(model)
    except ValueError as error:
        assert "use_reentrant" in str(error)
        return
    for name, grad in gradients(model_of(enable=False)).items():
        torch.testing.assert_close(checkpointed[name], grad, msg=name)


def test_no_grad_and_eval_are_not_refused():
    model = model_of({"use_reentrant": True})
    with torch.no_grad():
        assert torch.isfinite(model(**batch()).loss)  # training mode, but no gradients asked for
    assert model.eval()(**batch()).dhicm_kl.requires_grad  # eval: no checkpointing, the terms keep gradients


def build(family, settings, how, path, checkpointing):
    """A model in training mode with transformers' legacy flag when asked: built from a config, loaded with a config
    given, or loaded from a config.json that holds the flag (as older checkpoints do)."""
    model_cls = FAMILIES[family][2]
    flag = {"gradient_checkpointing": True} if checkpointing else {}
    torch.manual_seed(0)
    if how == "config":
        return model_cls(model_cls.config_class(**TINY, **settings, **flag)).train()
    path = path / str(checkpointing)
    if not path.exists():
        torch.manual_seed(0)
        model = model_cls(model_cls.config_class(**TINY, **settings))
        if how == "config.json":
            model.config.update(flag)  # saved with the flag, as older checkpoints are
        model.save_pretrained(path)
    if how == "config.json":
        return model_cls.from_pretrained(path).train()
    config = model_cls.config_class.from_pretrained(path)
    config.update(flag)  # (from_pretrained(path, gradient_checkpointing=True) is a TypeError, as for HF's models)
    return model_cls.from_pretrained(path, config=config).train()


@pytest.mark.parametrize("how", ["config", "from_pretrained_config", "config.json"])
@pytest.mark.parametrize("settings", [SETTINGS, {}], ids=["methods", "no_methods"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_legacy_config_flag_checkpoints_every_stack(family, settings, how, tmp_path):
    """Regression: with ``gradient_checkpointing=True`` in the config, the stacks rebuilt for the methods (and
    Marian's decoder, even without methods) ran without checkpointing, silently."""
    model = build(family, settings, how, tmp_path, checkpointing=True)
    stacks = [model.get_encoder(), model.get_decoder()]
    layers = {name: module for name, module in model.named_modules() if isinstance(module, GradientCheckpointingLayer)}
    assert len(layers) == 4 and all(stack.gradient_checkpointing for stack in stacks)
    assert all(layer.gradient_checkpointing for layer in layers.values())
    assert not hasattr(model.config, "gradient_checkpointing")  # consumed, not saved
    calls = []
    for name, layer in layers.items():  # checkpointing actually runs: each layer goes through the checkpoint function
        layer._gradient_checkpointing_func = _counted(layer._gradient_checkpointing_func, name, calls)
    reference = build(family, settings, how, tmp_path, checkpointing=False)
    checkpointed, plain = ({name: p.grad for name, p in m.named_parameters()} for m in (
        _backward(model), _backward(reference)))
    assert sorted(set(calls)) == sorted(layers)
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, msg=name)


def _counted(function, name, calls):
    def run(*args, **kwargs):
        calls.append(name)
        return function(*args, **kwargs)
    return run


def _backward(model):
    torch.manual_seed(1)  # the same dropout masks
    model(**batch()).loss.backward()
    return model
