"""The models' outputs and signatures behave as HF's: tuples with ``return_dict=False``, HF's fields first,
``**kwargs: Unpack[TransformersKwargs]`` in ``forward``, and a saved encoder/decoder keeps its methods' weights."""

import inspect
import typing

import pytest
import torch
from transformers import (
    MarianConfig,
    MarianModel,
    MarianMTModel,
    MBartConfig,
    MBartForConditionalGeneration,
    MBartModel,
)
from transformers.utils import TransformersKwargs

import hf_headattn
from conftest import TINY, batch

FAMILIES = {
    "mbart": (MBartConfig, MBartModel, MBartForConditionalGeneration, hf_headattn.HeadAttnMBartConfig,
              hf_headattn.HeadAttnMBartModel, hf_headattn.HeadAttnMBartForConditionalGeneration),
    "marian": (MarianConfig, MarianModel, MarianMTModel, hf_headattn.HeadAttnMarianConfig,
               hf_headattn.HeadAttnMarianModel, hf_headattn.HeadAttnMarianMTModel),
}
DHICM = {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1]}}
METHODS = {
    "off": {},
    "dhicm": DHICM,
    "eadra": {"eadra": {"encoder": {}, "decoder": {}, "cross": {}}},
    "lpea": {"sea": {"type": "lpea", "head_selection": "all"}},
}
PREFIX = {"dhicm": ".dhicm.", "lpea": ".sea."}  # the methods with weights, and the name their weights carry


def syntax_inputs(input_ids):
    """SEA inputs for ``input_ids``: each token related to itself and its neighbours, phrase positions j - i."""
    length = input_ids.shape[1]
    positions = torch.arange(length)
    relative = positions[None, :] - positions[:, None]
    return {
        "dependency_mask": (relative.abs() <= 1).expand(len(input_ids), -1, -1).clone(),
        "phrase_positions": relative.clamp(-6, 6).expand(len(input_ids), -1, -1).clone(),
    }


def stock_and_ours(family, model_kind, settings=None, **config_kwargs):
    """(stock, ours) with the same weights; ``model_kind`` "base" or "lm"."""
    stock_config, stock_base, stock_lm, our_config, our_base, our_lm = FAMILIES[family]
    stock_cls, our_cls = (stock_base, our_base) if model_kind == "base" else (stock_lm, our_lm)
    torch.manual_seed(0)
    stock = stock_cls(stock_config(**TINY, **config_kwargs)).eval()
    ours = our_cls(our_config(**TINY, **(settings or {}), **config_kwargs)).eval()
    ours.load_state_dict(stock.state_dict(), strict=False)
    return stock, ours


def inputs_for(model_kind):
    inputs = batch()
    if model_kind == "base":
        inputs["decoder_input_ids"] = inputs.pop("labels").clamp(min=1)
    return inputs


def assert_tuples_close(got, expected):
    assert isinstance(got, tuple) and isinstance(expected, tuple)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        else:
            assert type(a) is type(b)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("model_kind", ["base", "lm"])
@pytest.mark.parametrize("where", ["argument", "config"])
def test_return_dict_false_returns_the_stock_tuple(family, model_kind, where):
    """Regression: `return_dict=False` gave an output object; `config.return_dict=False` crashed.

    (Stock MarianModel/MarianMTModel themselves crash with `config.return_dict=False` in transformers 5.23, so the
    expected tuple is the stock model's with the argument.)"""
    stock, ours = stock_and_ours(family, model_kind)
    call_kwargs = {"return_dict": False}
    if where == "config":
        ours.config.return_dict, call_kwargs = False, {}
    inputs = inputs_for(model_kind)
    with torch.no_grad():
        expected, got = stock(**inputs, return_dict=False), ours(**inputs, **call_kwargs)
    assert ours.config.return_dict is (where != "config")  # restored after the call
    if model_kind == "lm":  # ours adds nll_loss after HF's fields
        torch.testing.assert_close(got[-1], expected[0])
        got = got[:-1]
    assert_tuples_close(got, expected)


@pytest.mark.parametrize("model_kind", ["base", "lm"])
def test_method_fields_follow_hf_fields(model_kind):
    """Regression: with a method on, `outputs[0]` was the method's field (dhicm_kl), not HF's first field."""
    _, ours = stock_and_ours("mbart", model_kind, DHICM)
    inputs = inputs_for(model_kind)
    with torch.no_grad():
        output, as_tuple = ours(**inputs), ours(**inputs, return_dict=False)
    first = output.loss if model_kind == "lm" else output.last_hidden_state
    assert output.dhicm_kl is not None
    assert output[0] is first
    torch.testing.assert_close(as_tuple[0], first)
    names = list(output.keys())  # to_tuple keeps this order: HF's fields, then the methods'
    assert names.index("dhicm_kl") > max(names.index(n) for n in names
                                         if n in type(output).__mro__[2].__dataclass_fields__)
    torch.testing.assert_close(as_tuple[names.index("dhicm_kl")], output.dhicm_kl)


@pytest.mark.parametrize("cls", [cls for family in FAMILIES.values() for cls in family[4:]], ids=lambda c: c.__name__)
def test_forward_declares_transformers_kwargs(cls):
    """Regression: `**kwargs` had no `Unpack[TransformersKwargs]`, so HF's tooling (e.g. the eager-vs-SDPA test)
    concluded that the models cannot output attentions."""
    annotation = inspect.signature(cls.forward).parameters["kwargs"].annotation
    assert typing.get_origin(annotation) is typing.Unpack
    assert typing.get_args(annotation) == (TransformersKwargs,)
    assert "output_attentions" in typing.get_args(annotation)[0].__annotations__


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_output_attentions_with_a_method(family):
    _, ours = stock_and_ours(family, "lm", DHICM, attn_implementation="eager")
    with torch.no_grad():
        output = ours(**batch(), output_attentions=True)
    assert len(output.encoder_attentions) == len(output.decoder_attentions) == len(output.cross_attentions) == 2
    assert output.encoder_attentions[0].shape == (2, 4, 6, 6)


@pytest.mark.parametrize("method", sorted(PREFIX))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_saved_encoder_and_decoder_keep_method_weights(family, method, tmp_path):
    """Regression: a saved `get_encoder()`/`get_decoder()` reloaded as the stock class and dropped the methods'
    weights silently."""
    _, ours = stock_and_ours(family, "base", METHODS[method])
    for name in ours.state_dict():  # make the method weights differ from a fresh initialisation
        if PREFIX[method] in name:
            ours.state_dict()[name].add_(0.5)
    inputs = inputs_for("base")
    syntax = syntax_inputs(inputs["input_ids"]) if method == "lpea" else {}
    with torch.no_grad():
        expected = ours(**inputs, **syntax).encoder_last_hidden_state
    encoder, decoder = ours.get_encoder(), ours.get_decoder()
    encoder.save_pretrained(tmp_path / "encoder")
    decoder.save_pretrained(tmp_path / "decoder")
    reloaded_encoder, info = type(encoder).from_pretrained(tmp_path / "encoder", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        got = reloaded_encoder.eval()(inputs["input_ids"], attention_mask=inputs["attention_mask"], **syntax)
    torch.testing.assert_close(got.last_hidden_state, expected)
    reloaded_decoder, info = type(decoder).from_pretrained(tmp_path / "decoder", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    method_keys = {k for k in decoder.state_dict() if PREFIX[method] in k}
    assert method_keys == {k for k in reloaded_decoder.state_dict() if PREFIX[method] in k}
    for key in method_keys:
        torch.testing.assert_close(reloaded_decoder.state_dict()[key], decoder.state_dict()[key])


def test_stacks_stay_stock_with_every_method_off():
    _, ours = stock_and_ours("mbart", "base")
    assert type(ours.get_encoder()).__name__ == "MBartEncoder" and type(ours.get_decoder()).__name__ == "MBartDecoder"
