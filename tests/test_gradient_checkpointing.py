"""Gradient checkpointing: the methods' loss terms keep their gradients, or the run is refused (never silently lost)."""

import pytest
import torch

from conftest import TINY, batch
from hf_headattn import HeadAttnMarianConfig, HeadAttnMarianMTModel

SETTINGS = dict(dhicm={"encoder_layers": [-1], "decoder_layers": [-1]}, eadra={"encoder": {}, "decoder": {}, "cross": {}})


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
