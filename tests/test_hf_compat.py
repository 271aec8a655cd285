"""One contract test per assumption of :mod:`hf_headattn.hf_compat` about transformers', torch's and datasets'
internals: ``test_<name>`` fails when a release breaks the assumption behind ``hf_compat.<name>``."""

import dataclasses
import inspect
from pathlib import Path

import datasets
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    AttentionInterface,
    MarianConfig,
    MarianMTModel,
    MBartConfig,
    MBartForConditionalGeneration,
    MBartModel,
)
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

    class Recording(hf_compat.ConfigStandIn, attention_function=name):
        pass

    layer.config = Recording(model.config)
    assert layer.config._attn_implementation == name and model.config._attn_implementation == "sdpa"
    assert layer.config.d_model == model.config.d_model
    torch.testing.assert_close(model(**inputs).logits, expected)
    assert [call["module"] for call in calls] == [layer]


def test_attention_implementation():
    """The backend a config selects (SDPA by default) is ``config._attn_implementation``, on the model config and on
    the config every attention module shares with it, also after ``set_attn_implementation``."""
    model = stock_mbart()
    attention = model.model.decoder.layers[0].encoder_attn
    assert hf_compat.attention_implementation(model.config) == "sdpa"
    model.set_attn_implementation("eager")
    assert hf_compat.attention_implementation(model.config) == "eager" == model.config._attn_implementation
    assert hf_compat.attention_implementation(attention.config) == "eager"
    assert hf_compat.attention_implementation(stock_mbart(attn_implementation="eager").config) == "eager"


def test_attention_backend():
    """Inside, the model runs the backend asked for (eager: attention weights, which SDPA does not return); after,
    also after an error, the one it had."""
    model = stock_mbart()
    inputs = batch()
    with hf_compat.attention_backend(model, "eager"):
        assert model.config._attn_implementation == "eager"
        assert model(**inputs, output_attentions=True).encoder_attentions[0] is not None
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(KeyError), hf_compat.attention_backend(model, "eager"):
        raise KeyError("inside")
    assert model.config._attn_implementation == "sdpa"


def test_init_normal__init_ones__init_zeros_(tmp_path):
    """transformers' initialisers fill a new tensor, and skip the weights ``from_pretrained`` loaded: a subclass that
    initialises its new parameters with them in ``initialize_weights`` (as our models do) gets them initialised where
    the checkpoint lacks them, and loaded where it has them."""
    initialisers = {"normal": hf_compat.init_normal_, "ones": hf_compat.init_ones_, "zeros": hf_compat.init_zeros_}

    class WithExtra(MBartForConditionalGeneration):
        def __init__(self, config):
            super().__init__(config)
            self.extra = nn.ParameterDict({name: nn.Parameter(torch.full((64,), 7.0)) for name in initialisers})
            self.post_init()

        def initialize_weights(self):
            super().initialize_weights()
            for name, initialise in initialisers.items() if hasattr(self, "extra") else ():
                initialise(self.extra[name], **({"std": 0.02} if name == "normal" else {}))

    def check_initialised(model):
        extra = model.extra
        assert 0 < extra["normal"].std() < 0.1 and extra["ones"].eq(1).all() and extra["zeros"].eq(0).all()

    check_initialised(WithExtra(MBartConfig(**TINY)))
    stock_mbart().save_pretrained(tmp_path / "stock")
    check_initialised(WithExtra.from_pretrained(tmp_path / "stock"))
    model = WithExtra(MBartConfig(**TINY))
    with torch.no_grad():
        for parameter in model.extra.values():
            parameter.fill_(3.0)
    model.save_pretrained(tmp_path / "extra")
    loaded = WithExtra.from_pretrained(tmp_path / "extra")
    assert all(parameter.eq(3.0).all() for parameter in loaded.extra.values())


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
    assert dataclasses.is_dataclass(MBartConfig)
    assert {"d_model", "encoder_layers"} <= hf_compat.config_fields(MBartConfig)
    received = {}

    @dataclasses.dataclass(repr=False)
    class Probe(MBartConfig):
        def __post_init__(self, **kwargs):
            received.update(kwargs)
            super().__post_init__(**kwargs)

    Probe(**TINY, no_such_field=1)
    assert received.get("no_such_field") == 1


def test_legacy_gradient_checkpointing():
    """``post_init`` honours a config's ``gradient_checkpointing=True`` for the model as built, then deletes it."""
    config = MBartConfig(**TINY, gradient_checkpointing=True)
    assert hf_compat.legacy_gradient_checkpointing(config)
    assert not hf_compat.legacy_gradient_checkpointing(MBartConfig(**TINY))
    model = MBartForConditionalGeneration(config)
    assert model.is_activation_checkpointing and not hf_compat.legacy_gradient_checkpointing(model.config)


def test_CACHE_NAMES_cache_argument():
    """The forward takes the key/value cache under one of ``CACHE_NAMES`` and returns it under one of them: a step
    with the cache of the prefix gives the logits of the whole."""
    forward = inspect.signature(MBartForConditionalGeneration.forward).parameters
    (argument,) = [name for name in hf_compat.CACHE_NAMES if name in forward]
    model = stock_mbart()
    source = {key: value for key, value in batch().items() if key != "labels"}
    target = torch.tensor([[0, 13, 14, 15], [0, 16, 17, 18]])
    output = model(**source, decoder_input_ids=target[:, :-1], use_cache=True)
    (returned,) = [name for name in hf_compat.CACHE_NAMES if name in output.keys()]  # (5.24 aliases the old one)
    cache = output[returned]
    assert hf_compat.cache_argument({argument: cache, "use_cache": True}) is cache
    assert hf_compat.cache_argument({argument: None}) is None and hf_compat.cache_argument({}) is None
    step = model(**source, decoder_input_ids=target[:, -1:], **{argument: cache})
    full = model(**source, decoder_input_ids=target, use_cache=False)
    torch.testing.assert_close(step.logits[:, -1], full.logits[:, -1])


def test_replace_stack():
    """A stack rebuilt from the config is the one the model's forward runs, and ``post_init`` ties its embeddings."""

    class Recording(hf_compat.MBartEncoder):
        calls = 0

        def forward(self, *args, **kwargs):
            Recording.calls += 1
            return super().forward(*args, **kwargs)

    model = MBartModel(MBartConfig(**TINY)).eval()
    hf_compat.replace_stack(model, "encoder", Recording, model.config)
    model.post_init()
    assert model.get_encoder() is model.encoder and type(model.encoder) is Recording
    assert model.encoder.embed_tokens.weight is model.shared.weight
    model(**{key: value for key, value in batch().items() if key != "labels"})
    assert Recording.calls == 1


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


def test_linear_cross_entropy():
    """torch (>= 2.13, the oldest ``pyproject`` declares) has it: the summed cross-entropy of ``hidden @ weight.T +
    bias`` in chunks of ``batch_chunk_size`` rows, ``ignore_index`` rows left out."""
    function, options = hf_compat.linear_cross_entropy()
    hidden, weight = torch.randn(7, 5, dtype=torch.float64), torch.randn(11, 5, dtype=torch.float64)
    bias = torch.randn(11, dtype=torch.float64)
    labels = torch.tensor([3, -100, 0, 10, 4, -100, 7])
    total = function(hidden, weight, labels, linear_bias=bias, reduction="sum", ignore_index=-100,
                     options=options(batch_chunk_size=3, allow_retain_graph=False))
    torch.testing.assert_close(total, F.cross_entropy(F.linear(hidden, weight, bias), labels, reduction="sum"))


@pytest.mark.slow
def test_flex_attention_function():
    """Compiles flex attention (CPU: forward only) and runs it with a score_mod and a block mask, returning the output
    (B, H, T, D): softmax(q k^T * scale + bias, where allowed) v, checked densely."""
    from torch.nn.attention.flex_attention import create_block_mask

    torch.compiler.reset()  # compiled afresh, and for nobody after: see tests/test_flex.py's fresh_compiles
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 2, 4, 8) for _ in range(3))
    bias = torch.randn(2, 4, 4)
    allowed = torch.tensor([[True] * 4, [True, True, True, False]])  # (B, S)
    block = create_block_mask(lambda b, h, q, kv: allowed[b, kv], B=2, H=None, Q_LEN=4, KV_LEN=4, device="cpu")
    output = hf_compat.flex_attention_function()(
        query, key, value, score_mod=lambda score, b, h, q, kv: score + bias[b, q, kv], block_mask=block, scale=0.5,
        training=False)
    scores = query @ key.transpose(-1, -2) * 0.5 + bias[:, None]  # (B, H, T, S)
    scores = scores.masked_fill(~allowed[:, None, None, :], -float("inf"))
    torch.testing.assert_close(output, scores.softmax(-1) @ value, atol=1e-5, rtol=1e-5)
    torch.compiler.reset()


def test_derived_fingerprint():
    """Deterministic, one per dataset and parts, and ``map(new_fingerprint=...)`` gives the new dataset that one."""
    dataset = datasets.Dataset.from_dict({"text": ["a", "b"]})
    other = datasets.Dataset.from_dict({"text": ["a", "c"]})
    fingerprint = hf_compat.derived_fingerprint(dataset, "parse", 1)
    assert fingerprint == hf_compat.derived_fingerprint(dataset, "parse", 1)
    assert len({fingerprint, hf_compat.derived_fingerprint(dataset, "parse", 2),
                hf_compat.derived_fingerprint(other, "parse", 1)}) == 3
    mapped = dataset.map(lambda row: {"n": len(row["text"])}, new_fingerprint=fingerprint)
    assert mapped._fingerprint == fingerprint
    assert hf_compat.derived_fingerprint(mapped, "parse", 1) != fingerprint


def test_random_fingerprint():
    first, second = hf_compat.random_fingerprint(), hf_compat.random_fingerprint()
    assert isinstance(first, str) and first != second
    dataset = datasets.Dataset.from_dict({"text": ["a"]}).map(lambda row: row, new_fingerprint=first)
    assert dataset._fingerprint == first


def test_get_relative_import_files(tmp_path):
    """The modules a module imports relatively, inside a function too, and recursively: what a checkpoint's remote
    code carries with it (``hf_headattn.remote_code``)."""
    (tmp_path / "entry.py").write_text("import os\n\ndef f():\n    from .middle import g\n")
    (tmp_path / "middle.py").write_text("from .leaf import h\n")
    (tmp_path / "leaf.py").write_text("h = 1\n")
    (tmp_path / "other.py").write_text("x = 1\n")
    found = {Path(file).name for file in hf_compat.get_relative_import_files(str(tmp_path / "entry.py"))}
    assert found == {"middle.py", "leaf.py"}


def test_every_name_has_its_contract_test():
    """``__all__`` names every assumption the module defines, and each has its ``test_<name>`` here (several names
    may share one test, ``test_<name>_<name>``)."""
    helpers = {"annotations", "contextmanager"}
    defined = {name for name, value in vars(hf_compat).items()
               if not name.startswith("_") and not inspect.ismodule(value) and name not in helpers}
    assert defined == set(hf_compat.__all__)
    tests = [name[len("test_"):] for name in globals() if name.startswith("test_")]
    assert [name for name in hf_compat.__all__ if not any(name in test for test in tests)] == []
