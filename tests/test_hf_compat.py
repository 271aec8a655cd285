"""One contract test per assumption of :mod:`hf_headattn.hf_compat` about transformers', torch's and datasets'
internals: ``test_<name>`` fails when a release breaks the assumption behind ``hf_compat.<name>``."""

import copy
import dataclasses
import importlib.util
import inspect
import json
import os
import pickle
import subprocess
import sys
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
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)
from transformers.modeling_outputs import Seq2SeqModelOutput

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartForConditionalGeneration, hf_compat

ROOT = Path(__file__).resolve().parents[1]


def stock_mbart(**overrides):
    torch.manual_seed(0)
    return MBartForConditionalGeneration(MBartConfig(**TINY, **overrides)).eval()


def stock_models():
    """A tiny stock mBART and Marian model (the two families the package builds on)."""
    torch.manual_seed(0)
    return stock_mbart(), MarianMTModel(MarianConfig(**TINY)).eval()


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


def test_init_values__init_identity_(tmp_path):
    """``init_values_`` / ``init_identity_`` (transformers' ``copy_``) set a new tensor, broadcasting the values, and
    skip the weights ``from_pretrained`` loaded; values that do not broadcast, or a non-square identity, are refused."""

    class WithExtra(MBartForConditionalGeneration):
        def __init__(self, config):
            super().__init__(config)
            self.mix = nn.Parameter(torch.full((3, 3), 7.0))
            self.row = nn.Parameter(torch.full((2, 3), 7.0))
            self.post_init()

        def initialize_weights(self):
            super().initialize_weights()
            if hasattr(self, "mix"):
                hf_compat.init_identity_(self.mix)
                hf_compat.init_values_(self.row, [1.0, 2.0, 3.0])

    model = WithExtra(MBartConfig(**TINY))
    assert torch.equal(model.mix, torch.eye(3)) and torch.equal(model.row, torch.tensor([[1.0, 2.0, 3.0]] * 2))
    with torch.no_grad():
        model.mix.fill_(5.0)
        model.row.fill_(6.0)
    model.save_pretrained(tmp_path / "extra")
    loaded = WithExtra.from_pretrained(tmp_path / "extra")
    assert loaded.mix.eq(5.0).all() and loaded.row.eq(6.0).all()
    with pytest.raises(ValueError, match=r"values of shape \(2,\) do not broadcast to the tensor's shape \(2, 3\)"):
        hf_compat.init_values_(torch.zeros(2, 3), [1.0, 2.0])
    with pytest.raises(ValueError, match=r"square matrix \(n, n\), got shape \(2, 3\)"):
        hf_compat.init_identity_(torch.zeros(2, 3))


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


def test_config_attributes():
    """A config keeps its attributes in the mapping: ``to_dict`` copies it whole (an attribute written there is
    saved), copies and pickles carry it; written there, a value skips the config's ``__setattr__`` (the strict
    dataclass's validators), and read there its ``attribute_map``."""
    config = MBartConfig(**TINY)
    attributes = hf_compat.config_attributes(config)
    assert attributes["d_model"] == config.hidden_size == 16 and "hidden_size" not in attributes
    attributes["probe"] = {"a": 1}
    assert config.probe == {"a": 1} and config.to_dict()["probe"] == {"a": 1}
    assert copy.deepcopy(config).probe == pickle.loads(pickle.dumps(config)).probe == {"a": 1}
    attributes["d_model"] = "unchecked"  # config.d_model = "unchecked" fails the strict dataclass's validation
    assert config.d_model == "unchecked"


def test_INPUT_PROJECTIONS_OUTPUT_PROJECTION():
    """An attention module's projections are these ``nn.Linear`` modules, each head a block of ``head_dim`` rows of
    the input projections and the same columns of the output projection: swapping two heads' blocks in all four
    changes nothing, and leaving a head's value rows out equals leaving its output columns out."""
    for model in stock_models():
        attention = model.model.encoder.layers[0].self_attn
        projections = [getattr(attention, name) for name in (*hf_compat.INPUT_PROJECTIONS, hf_compat.OUTPUT_PROJECTION)]
        assert all(type(linear) is nn.Linear and linear.weight.shape == (16, 16) for linear in projections)
        hidden, size = torch.randn(2, 3, TINY["d_model"]), attention.head_dim
        expected = attention(hidden)[0]
        swapped, value_left_out, output_left_out = (copy.deepcopy(attention) for _ in range(3))
        order = torch.cat([torch.arange(size, 2 * size), torch.arange(size), torch.arange(2 * size, 16)])
        with torch.no_grad():
            for name in hf_compat.INPUT_PROJECTIONS:
                linear = getattr(swapped, name)
                linear.weight.copy_(linear.weight[order]), linear.bias.copy_(linear.bias[order])
            output = getattr(swapped, hf_compat.OUTPUT_PROJECTION)
            output.weight.copy_(output.weight[:, order])
            value = getattr(value_left_out, hf_compat.INPUT_PROJECTIONS[2])
            value.weight[size:2 * size], value.bias[size:2 * size] = 0, 0
            getattr(output_left_out, hf_compat.OUTPUT_PROJECTION).weight[:, size:2 * size] = 0
        torch.testing.assert_close(swapped(hidden)[0], expected)
        torch.testing.assert_close(value_left_out(hidden)[0], output_left_out(hidden)[0])
        assert not torch.allclose(value_left_out(hidden)[0], expected)


def test_set_num_heads():
    """An attention module told its new head count after its projections lost head 1 (its rows of the input
    projections, its columns of the output projection) computes what the whole module computes without head 1."""
    attention = stock_mbart().model.encoder.layers[0].self_attn
    assert attention.num_heads == TINY["encoder_attention_heads"]
    size = attention.head_dim
    rows = torch.cat([torch.arange(size), torch.arange(2 * size, 4 * size)])
    pruned, masked = copy.deepcopy(attention), copy.deepcopy(attention)
    for name in hf_compat.INPUT_PROJECTIONS:
        linear = getattr(pruned, name)
        linear.weight, linear.bias = nn.Parameter(linear.weight[rows]), nn.Parameter(linear.bias[rows])
    output = getattr(pruned, hf_compat.OUTPUT_PROJECTION)
    output.weight = nn.Parameter(output.weight[:, rows])
    hf_compat.set_num_heads(pruned, 3)
    assert pruned.num_heads == 3
    with torch.no_grad():
        getattr(masked, hf_compat.OUTPUT_PROJECTION).weight[:, size:2 * size] = 0
    hidden = torch.randn(2, 3, TINY["d_model"])
    torch.testing.assert_close(pruned(hidden)[0], masked(hidden)[0])


def test_STACK_LAYERS_BLOCK_ATTENTION():
    """Each stack keeps one block a layer in a ``ModuleList`` under ``STACK_LAYERS``; a block its self-attention and
    (a decoder's) cross-attention, the one a forward gives the encoder's states, under ``BLOCK_ATTENTION``; and
    together they make the modules' paths in the base model."""
    calls = []

    def record(module, args, kwargs):
        calls.append((module.probe_kind, kwargs.get("key_value_states") is not None))

    for model in stock_models():
        base = model.model
        paths = {module: path for path, module in base.named_modules()}
        for side, kinds in (("encoder", ("self",)), ("decoder", ("self", "cross"))):
            blocks = getattr(getattr(base, side), hf_compat.STACK_LAYERS)
            assert type(blocks) is nn.ModuleList and len(blocks) == TINY[f"{side}_layers"]
            assert not hasattr(blocks[0], hf_compat.BLOCK_ATTENTION["cross"]) or side == "decoder"
            for kind in kinds:
                attention = getattr(blocks[1], hf_compat.BLOCK_ATTENTION[kind])
                assert hasattr(attention, hf_compat.OUTPUT_PROJECTION)
                assert paths[attention] == f"{side}.{hf_compat.STACK_LAYERS}.1.{hf_compat.BLOCK_ATTENTION[kind]}"
                attention.probe_kind = kind
                attention.register_forward_pre_hook(record, with_kwargs=True)
        model(**batch())
    assert sorted(set(calls)) == [("cross", True), ("self", False)] and len(calls) == 2 * 3


def test_logits_bias():
    """The generation models' logits are their output projection's plus the bias, a (1, V) buffer."""
    for model in stock_models():
        bias = hf_compat.logits_bias(model)
        assert bias.shape == (1, TINY["vocab_size"]) and any(bias is buffer for buffer in model.buffers())
        with torch.no_grad():
            bias.normal_()
            out = model(**batch(), output_hidden_states=True)
        torch.testing.assert_close(out.logits, model.lm_head(out.decoder_hidden_states[-1]) + bias)


def test_additive_mask_allowed():
    """The eager backend's masks are float, 0 where a key is allowed and ``finfo.min`` where it is masked: padding in
    the encoder, the future in the decoder."""
    model, masks = stock_mbart(attn_implementation="eager"), {}

    def recorder(side):
        def record(module, args, kwargs):
            masks.setdefault(side, kwargs["attention_mask"])

        return record

    for side in ("encoder", "decoder"):
        getattr(model.model, side).layers[0].self_attn.register_forward_pre_hook(recorder(side), with_kwargs=True)
    inputs = batch()
    model(**inputs)
    for mask in masks.values():
        assert mask.is_floating_point() and set(mask.unique().tolist()) == {0.0, torch.finfo(mask.dtype).min}
    encoder, decoder = masks["encoder"], masks["decoder"]
    padding = inputs["attention_mask"].bool()[:, None, None, :].expand_as(encoder)
    assert torch.equal(hf_compat.additive_mask_allowed(encoder), padding)
    assert torch.equal(hf_compat.additive_mask_allowed(encoder + 3.0), padding)  # a bias on top
    causal = torch.ones(decoder.shape[-2:], dtype=torch.bool).tril().expand_as(decoder)
    assert torch.equal(hf_compat.additive_mask_allowed(decoder), causal)


def test_TRAINER_STATE_FILE_TRAINING_STATE_FILES_checkpoint_world_size(tmp_path):
    """A Trainer checkpoint (one step, one process) holds the model's files and the Trainer's own, which
    ``TRAINING_STATE_FILES`` names (the trainer state among them); its RNG state says one process."""
    inputs = batch()
    rows = [{key: value[i] for key, value in inputs.items()} for i in range(2)]
    args = Seq2SeqTrainingArguments(str(tmp_path), max_steps=1, save_steps=1, per_device_train_batch_size=2,
                                    report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no")
    Seq2SeqTrainer(model=stock_mbart(), args=args, train_dataset=rows).train()
    folder = tmp_path / "checkpoint-1"
    files = {file.name for file in folder.iterdir()}
    trainers = {name for name in files if hf_compat.TRAINING_STATE_FILES.fullmatch(name)}
    assert files - trainers == {"config.json", "generation_config.json", "model.safetensors"}
    assert json.loads((folder / hf_compat.TRAINER_STATE_FILE).read_text())["global_step"] == 1
    assert hf_compat.checkpoint_world_size(folder) == 1 and hf_compat.checkpoint_world_size(tmp_path) is None


@pytest.fixture(scope="module")
def deepspeed_contract(tmp_path_factory):
    """``tests/scripts/deepspeed_contract.py``'s findings: a tiny mBART built under DeepSpeed ZeRO-3 in one process,
    one Trainer step with a checkpoint, DeepSpeed's script run on it (a subprocess, which imports DeepSpeed)."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed (the dev extra installs it: pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("deepspeed")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "deepspeed_contract.py"), str(out)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "contract.json").read_text())


@pytest.mark.slow
def test_TRAINING_STATE_FILES_of_a_deepspeed_checkpoint(deepspeed_contract):
    """With DeepSpeed the Trainer's checkpoint holds the model's files, the Trainer's and DeepSpeed's (``latest``, its
    scripts), which ``TRAINING_STATE_FILES`` names, and the folder of DeepSpeed's states; its RNG state says one
    process."""
    files = deepspeed_contract["files"]
    assert [name for name in files if not hf_compat.TRAINING_STATE_FILES.fullmatch(name)] == [
        "config.json", "generation_config.json", "global_step1/", "model.safetensors"]
    assert {"latest", hf_compat.ZERO_TO_FP32, "rng_state.pth"} <= set(files)


@pytest.mark.slow
def test_ZERO_TO_FP32(deepspeed_contract):
    """Each DeepSpeed checkpoint holds the script, which (``python <folder>/zero_to_fp32.py <folder> <output>``)
    writes the full weights, those the Trainer gathered into ``model.safetensors``, as ``pytorch_model.bin``."""
    assert hf_compat.ZERO_TO_FP32 in deepspeed_contract["files"]
    assert deepspeed_contract["converted"] == ["pytorch_model.bin"] and deepspeed_contract["converted_equal"]


@pytest.mark.slow
def test_zero3_enabled(deepspeed_contract):
    """False in a process without a DeepSpeed config (this one, and the subprocess before its training arguments),
    True while training arguments with a ZeRO-3 config live, and ``from_pretrained`` then builds the model partitioned
    (``test_zero3_partitioned``)."""
    assert hf_compat.zero3_enabled() is False
    assert deepspeed_contract["enabled"] == [False, True]


@pytest.mark.slow
def test_zero3_partitioned(deepspeed_contract):
    """None for a model DeepSpeed never touched; for one ``from_pretrained`` built under ZeRO-3, its first parameter:
    every parameter holds an empty placeholder and ``ds_numel`` elements, whole inside ``GatheredParameters``."""
    assert hf_compat.zero3_partitioned(stock_mbart()) is None
    contract = deepspeed_contract
    assert contract["partitioned"] == contract["first"] and contract["placeholders"] and contract["whole"]
    assert contract["counted"] == [0, stock_mbart().num_parameters()]  # (test_parameter_count)


def test_parameter_count():
    """Every parameter once (the tied embeddings too), as ``num_parameters()`` counts them; a ZeRO-3 placeholder (an
    empty tensor carrying ``ds_numel``, ``test_zero3_partitioned``), which ``num_parameters()`` counts as 0, whole."""
    model = stock_mbart()
    expected = sum(p.numel() for p in {id(p): p for _, p in model.named_parameters(remove_duplicate=False)}.values())
    assert hf_compat.parameter_count(model) == model.num_parameters() == expected
    for parameter in model.parameters():
        parameter.ds_numel, parameter.data = parameter.numel(), torch.empty(0)
    assert model.num_parameters() == 0 and hf_compat.parameter_count(model) == expected


def test_softmax_backward():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 5, dtype=torch.float64)
    probs = torch.softmax(x, -1)
    (expected,) = torch.autograd.grad(probs, x, grad)
    torch.testing.assert_close(hf_compat.softmax_backward(grad, probs.detach()), expected)


def test_cpu_flash_attention_cpu_flash_attention_backward():
    """SDPA's CPU kernel with a float mask, and its backward: SDPA's values and q/k/v gradients."""
    g = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 3, 4, 5, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.randn(2, 3, 4, 4, generator=g)
    output, log_sum_exp = hf_compat.cpu_flash_attention(query, key, value, mask, 0.5)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.5)
    torch.testing.assert_close(output, expected)
    scores = query @ key.mT * 0.5 + mask
    torch.testing.assert_close(log_sum_exp, scores.logsumexp(-1))
    grad = torch.randn(output.shape, generator=g)
    grads = hf_compat.cpu_flash_attention_backward(grad, query, key, value, output, log_sum_exp, mask, 0.5)
    torch.testing.assert_close(grads, torch.autograd.grad(expected, (query, key, value), grad))


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
    helpers = {"annotations", "contextmanager", "Path"}
    defined = {name for name, value in vars(hf_compat).items()
               if not name.startswith("_") and not inspect.ismodule(value) and name not in helpers}
    assert defined == set(hf_compat.__all__)
    tests = [name[len("test_"):] for name in globals() if name.startswith("test_")]
    assert [name for name in hf_compat.__all__ if not any(name in test for test in tests)] == []
