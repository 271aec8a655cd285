"""One contract test per assumption of :mod:`hf_headattn.hf_compat` about transformers' and torch's internals:
``test_<name>`` fails when a release breaks the assumption behind ``hf_compat.<name>``."""

import dataclasses

import pytest
import torch
from transformers import (AttentionInterface, MarianConfig, MarianMTModel, MBartConfig, MBartForConditionalGeneration,
                          MBartModel)
from transformers.modeling_outputs import Seq2SeqModelOutput

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartForConditionalGeneration, hf_compat


def stock_mbart(**overrides):
    torch.manual_seed(0)
    return MBartForConditionalGeneration(MBartConfig(**TINY, **overrides)).eval()


@pytest.fixture
def recording_function():
    """A registered attention function that records its calls' keyword arguments and runs SDPA."""
    calls = []

    def record(module, query, key, value, attention_mask, **kwargs):
        calls.append({"module": module, **kwargs})
        return hf_compat.ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("test-hf-compat-recorder", record)
    yield "test-hf-compat-recorder", calls


def test_ALL_ATTENTION_FUNCTIONS(recording_function):
    """What ``AttentionInterface.register`` adds is in the registry instance, by item and by ``get_interface``, which
    gives its default for "eager" (not registered: each model brings its own)."""
    name, _ = recording_function
    registry = hf_compat.ALL_ATTENTION_FUNCTIONS
    assert callable(registry["sdpa"]) and registry.get_interface(name, None) is registry[name]
    eager = hf_compat.eager_attention_forward
    assert registry.get_interface("eager", eager) is eager


def test_eager_attention_forward():
    """(module, query, key, value, mask, scaling=, dropout=) -> (output (B, T, H, D), weights (B, H, T, S))."""
    module = stock_mbart().model.encoder.layers[0].self_attn
    query, key = torch.randn(2, 4, 3, 4), torch.randn(2, 4, 5, 4)
    output, weights = hf_compat.eager_attention_forward(module, query, key, key, None, scaling=0.5, dropout=0.0)
    assert output.shape == (2, 3, 4, 4) and weights.shape == (2, 4, 3, 5)
    torch.testing.assert_close(weights, torch.softmax(query @ key.transpose(-1, -2) * 0.5, -1))


def test_MBartEncoder_MBartDecoder_MarianEncoder_MarianDecoder():
    """The stacks the models build are these classes (our models subclass them)."""
    mbart = stock_mbart().model
    marian = MarianMTModel(MarianConfig(**TINY)).model
    assert type(mbart.encoder) is hf_compat.MBartEncoder and type(mbart.decoder) is hf_compat.MBartDecoder
    assert type(marian.encoder) is hf_compat.MarianEncoder and type(marian.decoder) is hf_compat.MarianDecoder


def test_marian_shift_tokens_right():
    labels = torch.tensor([[5, 6, 2], [7, 2, -100]])
    shifted = hf_compat.marian_shift_tokens_right(labels, 1, 0)
    assert shifted.tolist() == [[0, 5, 6], [0, 7, 2]]


def test_nested_gather():
    """In one process the gather returns the tensor itself (the Trainer's ``parallel_mode`` NOT_PARALLEL)."""
    from transformers.training_args import ParallelMode

    value = torch.tensor(3.0)
    assert hf_compat.nested_gather(value, ParallelMode.NOT_PARALLEL) is value


def test_ConfigStandIn(recording_function):
    """An attention module reads its function from ``self.config._attn_implementation`` at each call, and reads
    nothing from its config that the stand-in does not pass through."""
    name, calls = recording_function
    model = stock_mbart()
    inputs = batch()
    expected = model(**inputs).logits
    layer = model.model.encoder.layers[0].self_attn
    layer.config = type("Recording", (hf_compat.ConfigStandIn,), {"_attn_implementation": name})(model.config)
    assert layer.config.d_model == model.config.d_model and model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(model(**inputs).logits, expected)
    assert [call["module"] for call in calls] == [layer]


def test_attention_query_input(recording_function):
    """An attention module's first parameter is ``hidden_states``, and keyword arguments given to the model's forward
    reach every attention function (how the per-forward context travels)."""
    import inspect

    name, calls = recording_function
    model = stock_mbart(attn_implementation=name)
    attention = model.model.encoder.layers[0].self_attn
    assert next(iter(inspect.signature(attention.forward).parameters)) == "hidden_states"
    hidden = torch.randn(2, 3, TINY["d_model"])
    assert hf_compat.attention_query_input((hidden,), {}) is hidden
    assert hf_compat.attention_query_input((), {"hidden_states": hidden}) is hidden
    model(**batch(), probe="reached")
    layers = TINY["encoder_layers"] + 2 * TINY["decoder_layers"]
    assert len(calls) == layers and all(call.get("probe") == "reached" for call in calls)


def test_dict_outputs():
    """HF's forward reads ``config.return_dict`` at the call: tuples with False, output objects inside."""
    model = MBartModel(MBartConfig(**TINY, return_dict=False)).eval()
    inputs = {key: value for key, value in batch().items() if key != "labels"}
    assert isinstance(model(**inputs), tuple)
    with hf_compat.dict_outputs(model.config):
        assert isinstance(model(**inputs), Seq2SeqModelOutput)
    assert model.config.return_dict is False


def test_transformers_forward():
    assert hf_compat.transformers_forward(HeadAttnMBartForConditionalGeneration) is \
        MBartForConditionalGeneration.forward


def test_config_fields():
    """Configs are dataclasses whose ``__post_init__`` gets the keyword arguments that are no field."""
    assert dataclasses.is_dataclass(MBartConfig) and {"d_model", "encoder_layers"} <= hf_compat.config_fields(MBartConfig)
    received = {}

    @dataclasses.dataclass(repr=False)
    class Probe(MBartConfig):
        def __post_init__(self, **kwargs):
            received.update(kwargs)
            super().__post_init__(**kwargs)

    Probe(**TINY, no_such_field=1)
    assert received.get("no_such_field") == 1


def test_softmax_backward():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 5, dtype=torch.float64)
    probs = torch.softmax(x, -1)
    (expected,) = torch.autograd.grad(probs, x, grad)
    torch.testing.assert_close(hf_compat.softmax_backward(grad, probs.detach()), expected)


def test_assert_async():
    hf_compat.assert_async(torch.tensor(True), "never")
    with pytest.raises(RuntimeError):
        hf_compat.assert_async(torch.tensor(False), "fails on the CPU at once")
