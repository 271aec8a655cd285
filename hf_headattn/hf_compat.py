"""Every assumption hf-headattn makes about transformers', torch's and datasets' internals, in one place.

The rest of the package uses the libraries' public modules (an allow-list, `tests/internal_names.py`) and takes
anything beyond them from here: their internals, and the structure of HF's models and checkpoints (the attribute
names of their parts, the files of a Trainer checkpoint). Each assumption below is one name, and
`tests/test_hf_compat.py` holds one contract test per name (`test_<name>`): a release that breaks one fails that
test, which says what to adapt. `tests/test_architecture.py` fails when another module imports a module of theirs
off the allow-list, reads a private name of theirs (`x._name`, `torch._*`) or spells one of HF's names kept here
(`q_proj`, `trainer_state.json`, ...).

Transformers' open PR #48333 (Bart-family attention through `ALL_ATTENTION_FUNCTIONS`, hyperparameters read from
the config) would change `eager_attention_forward`, `attention_query_input` and `ConfigStandIn`'s
reason to exist at once.
"""

from __future__ import annotations

import importlib
import re
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.dynamic_module_utils import get_relative_import_files
from transformers.initialization import copy_ as _init_copy_
from transformers.initialization import normal_ as init_normal_
from transformers.initialization import ones_ as init_ones_
from transformers.initialization import zeros_ as init_zeros_
from transformers.integrations import is_deepspeed_zero3_enabled as zero3_enabled
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # the attention registry's instance (not exported)
from transformers.models.marian.modeling_marian import MarianDecoder, MarianEncoder
from transformers.models.marian.modeling_marian import shift_tokens_right as marian_shift_tokens_right
from transformers.models.mbart.modeling_mbart import MBartDecoder, MBartEncoder, eager_attention_forward
from transformers.trainer_pt_utils import nested_gather

__all__ = [
    "ALL_ATTENTION_FUNCTIONS", "eager_attention_forward", "MBartEncoder", "MBartDecoder", "MarianEncoder",
    "MarianDecoder", "marian_shift_tokens_right", "nested_gather", "init_normal_", "init_ones_", "init_zeros_",
    "init_values_", "init_identity_", "ConfigStandIn", "attention_implementation", "attention_backend",
    "attention_query_input", "dict_outputs",
    "transformers_forward", "config_fields", "legacy_gradient_checkpointing", "CACHE_NAMES", "cache_argument",
    "replace_stack", "softmax_backward", "cpu_flash_attention", "cpu_flash_attention_backward", "assert_async",
    "linear_cross_entropy", "derived_fingerprint",
    "random_fingerprint", "get_relative_import_files", "flex_attention_function", "INPUT_PROJECTIONS",
    "OUTPUT_PROJECTION", "set_num_heads", "STACK_LAYERS", "BLOCK_ATTENTION", "logits_bias",
    "additive_mask_allowed", "config_attributes", "TRAINER_STATE_FILE", "TRAINING_STATE_FILES", "checkpoint_world_size",
    "ZERO_TO_FP32", "zero3_enabled", "zero3_partitioned", "parameter_count",
]

# --- transformers: names it does not export at the top level, and what its internals do -----------------------------
# ALL_ATTENTION_FUNCTIONS: the registry (``get_interface(name, default)``, ``[name]``) an attention module reads its
#   function from, by ``module.config._attn_implementation``.
# eager_attention_forward: mBART's eager attention function (Marian's is the same code), the "eager" backend.
# MBartEncoder, MBartDecoder, MarianEncoder, MarianDecoder: the stacks, subclassed so that ``get_encoder()`` of a model
#   with methods is a class that reloads them.
# marian_shift_tokens_right: Marian's label shift (mBART's is ours, ``modeling``).
# nested_gather: the Trainer's gather of a tensor over processes (the logged loss components).
# init_normal_, init_ones_, init_zeros_: transformers' initialisers, which skip a tensor loaded from a checkpoint
#   (marked ``_is_hf_initialized``), so a method's ``init_weights`` initialises exactly its new parameters.
# init_values_, init_identity_: the same for any values, through transformers' ``copy_`` (which skips them too).
# get_relative_import_files: the modules a checkpoint's remote code carries with a module (those it imports relatively,
#   ``from .x import``, anywhere in its text, recursively), what ``save_pretrained`` copies and its loader fetches.


class ConfigStandIn:
    """Stands in for `config` inside one attention module: `_attn_implementation` answers the name a subclass
    gives as `class Routed(ConfigStandIn, attention_function="name")`, every other attribute reads through to the
    model config (so later changes of the model config are seen). (A class attribute, not one per object:
    `torch.compile` then guards on the class that all the layers share, and compiles one version for them, not one
    per layer.)

    The assumption: an HF attention module reads its attention function from `self.config._attn_implementation`
    at each call, and nothing else of it needs the real config object."""

    _attn_implementation: str

    def __init_subclass__(cls, attention_function: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if attention_function is not None:
            cls._attn_implementation = attention_function

    def __init__(self, model_config):
        self.model_config = model_config

    def __getattr__(self, name: str):
        if name == "model_config":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.model_config, name)


def attention_implementation(config) -> str | None:
    """The attention backend ("sdpa", "eager", ...) an HF config selects, `config._attn_implementation` (no public
    getter; `set_attn_implementation` is the public setter)."""
    return config._attn_implementation


@contextmanager
def attention_backend(model, name: str):
    """Run the block with `model.set_attn_implementation(name)`, then give the model back the backend it had (e.g.
    "eager" for attention weights, which SDPA does not return)."""
    previous = attention_implementation(model.config)
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def attention_query_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The query-side input of an HF attention module's call: its first parameter, `hidden_states`, passed by
    position or by name. (The module passes its own `**kwargs` on to the attention function, which is how our
    inputs, e.g. the per-forward context, reach it from the model's forward.)"""
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


@contextmanager
def dict_outputs(config):
    """Let an HF forward return output objects even when `config.return_dict` is False: HF's bodies (and its
    encoders/decoders) read `config.return_dict` at the call; with False, MBart returns tuples we cannot add fields
    to and Marian crashes. The flag is set for the call and restored; nothing changes when it is True."""
    if config.return_dict:
        yield
        return
    config.return_dict = True
    try:
        yield
    finally:
        config.return_dict = False


def transformers_forward(cls: type):
    """The `forward` of the first class in `cls.__mro__` that transformers defines (whose signature ours
    extends)."""
    return next(base for base in cls.__mro__ if base.__module__.startswith("transformers.")).forward


def config_fields(config_class: type) -> set[str]:
    """The fields a transformers 5 config class declares (they are dataclasses; `__post_init__(**kwargs)` receives
    the keyword arguments that are no field)."""
    return set(config_class.__dataclass_fields__)


def legacy_gradient_checkpointing(config) -> bool:
    """Whether `config` carries transformers' backward-compatible `gradient_checkpointing=True`, which
    `post_init` consumes: it switches checkpointing on for the model as built, then deletes the flag."""
    return bool(getattr(config, "gradient_checkpointing", False))


# The key/value cache's forward argument and output field: ``cache`` since transformers 5.24, ``past_key_values``
#   before (and a deprecated alias until 5.40).
CACHE_NAMES = ("past_key_values", "cache")


def cache_argument(arguments: dict):
    """The key/value cache among a forward's `arguments` (by either name), or None."""
    return next((arguments[name] for name in CACHE_NAMES if arguments.get(name) is not None), None)


def replace_stack(base_model, side: str, stack_class: type, config) -> None:
    """Rebuild `base_model`'s `side` ("encoder"/"decoder") as `stack_class(config)`. The assumption: an HF
    seq2seq base model keeps its stacks as the attributes `encoder`/`decoder` (its forward reads them there),
    builds each from the config alone, and ties their token embeddings to `shared` in `post_init` (which the
    caller runs afterwards)."""
    setattr(base_model, side, stack_class(config))


def config_attributes(config) -> dict:
    """The attributes an HF config holds, as stored: its `__dict__`, which `to_dict` (so `save_pretrained`)
    copies whole and copies and pickles carry. Read or written there, a value bypasses the config's
    `__getattribute__` and `__setattr__` (`attribute_map`, the strict dataclass's validators, and a subclass's
    own checks, e.g. while a copy is restored)."""
    return config.__dict__


# --- transformers: the parts of its Bart-family models (mBART, Marian), by the names they keep them under -----------

INPUT_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
"""An attention module's query, key and value projections, in that order: `nn.Linear` (d_model -> heads *
head_dim), head h in the rows h * head_dim to (h + 1) * head_dim."""
OUTPUT_PROJECTION = "out_proj"
"""An attention module's output projection: `nn.Linear` (heads * head_dim -> d_model) over the concatenated heads,
head h in the same columns."""
STACK_LAYERS = "layers"
"""An encoder's or decoder's blocks, one per layer (an `nn.ModuleList`)."""
BLOCK_ATTENTION = {"self": "self_attn", "cross": "encoder_attn"}
"""A block's attention modules by kind: its self-attention, and a decoder block's cross-attention. With the stacks'
`encoder`/`decoder` and `STACK_LAYERS` they make a module's path in the base model
(`decoder.layers.1.encoder_attn`)."""


def set_num_heads(module, count: int) -> None:
    """Record that an attention module whose projections now hold `count` heads has that many. The assumption: its
    forward reshapes by `head_dim` alone (`(..., -1, head_dim)`), so its `num_heads`, which the code that counts
    its heads reads (ours, PEFT's), is all there is to update."""
    module.num_heads = count


def logits_bias(model) -> torch.Tensor:
    """The LM bias of mBART's and Marian's generation models, a buffer (1, V) their forward adds to the output
    projection's: `logits = lm_head(h) + final_logits_bias`."""
    return model.final_logits_bias


def additive_mask_allowed(attention_mask: torch.Tensor) -> torch.BoolTensor:
    """Where a float attention mask of transformers' (the eager backend's) lets a query attend to a key: its masks are
    added to the scores, `torch.finfo(dtype).min` where a key is masked and 0 where it is allowed, so anything above
    half the minimum is allowed (a bias added to an allowed entry stays there)."""
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


# --- transformers' Trainer: the files of a checkpoint folder (``checkpoint-<step>``) --------------------------------

TRAINER_STATE_FILE = "trainer_state.json"
"""The Trainer's state (`global_step`, the log history, the callbacks' states), JSON; written after the model's."""
ZERO_TO_FP32 = "zero_to_fp32.py"
"""DeepSpeed's script in each checkpoint folder of a Trainer run with `deepspeed` that writes the full weights from
the partitioned states it keeps there (in `global_step<N>`, which its file `latest` names):
`python <folder>/zero_to_fp32.py <folder> <output folder> --safe_serialization` (`model.safetensors`)."""
TRAINING_STATE_FILES = re.compile(
    rf"(optimizer|scheduler|scaler)\.pt|rng_state.*\.pth|{re.escape(TRAINER_STATE_FILE)}|training_args\.bin"
    rf"|latest|{re.escape(ZERO_TO_FP32)}|zero_to_torch\.py")
"""The Trainer's own files in a checkpoint folder, beside the model's and the tokenizer's: optimizer, scheduler and
scaler states, the RNG states, the trainer state and the training arguments; with DeepSpeed also its `latest`
and its scripts, `ZERO_TO_FP32` and `zero_to_torch.py` (its states are in a folder)."""


def checkpoint_world_size(folder) -> int | None:
    """How many processes wrote a checkpoint folder, by its RNG states: the Trainer saves `rng_state.pth` when it
    runs in one process and `rng_state_<rank>.pth` per process with several; None where the folder holds none."""
    folder = Path(folder)
    per_rank = list(folder.glob("rng_state_*.pth"))
    return len(per_rank) if per_rank else (1 if (folder / "rng_state.pth").is_file() else None)


# --- DeepSpeed ZeRO-3 (through transformers): partitioned weights ---------------------------------------------------
# zero3_enabled: transformers' ``is_deepspeed_zero3_enabled``, whether a DeepSpeed ZeRO-3 config is alive in this
#   process (training arguments with one, or an ``HfDeepSpeedConfig``), so that ``from_pretrained`` builds a model
#   partitioned over the processes (under ``deepspeed.zero.Init``, a collective call).


def zero3_partitioned(model) -> str | None:
    """The name of the first parameter of `model` that DeepSpeed ZeRO-3 manages (partitions over the processes),
    None where it manages none. ZeRO-3 (`deepspeed.initialize` with stage 3, `deepspeed.zero.Init`) gives each
    parameter it takes `ds_numel` (the whole tensor's size) and leaves an empty tensor as its data, whole only while
    gathered (in a forward, a `deepspeed.zero.GatheredParameters` block). Read without importing DeepSpeed."""
    return next((name for name, parameter in model.named_parameters() if hasattr(parameter, "ds_numel")), None)


def parameter_count(model) -> int:
    """The number of parameters of `model` (each shared one once), those DeepSpeed ZeRO-3 partitions counted whole
    (their `ds_numel`: `zero3_partitioned`), where `model.num_parameters()` counts the empty placeholders
    (0 under ZeRO-3)."""
    return sum(getattr(parameter, "ds_numel", parameter.numel()) for parameter in model.parameters())


# --- torch: operators outside the documented API --------------------------------------------------------------------


def softmax_backward(grad: torch.Tensor, probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The gradient through `probs = softmax(x, dim)` of `grad` (one fused operator)."""
    return torch.ops.aten._softmax_backward_data(grad, probs, dim, probs.dtype)


def cpu_flash_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA's CPU kernel (what `F.scaled_dot_product_attention` runs on CPU tensors without dropout), returning the
    output (B, H, T, D) and each row's log-sum-exp (B, H, T) for `cpu_flash_attention_backward`."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, attn_mask=mask, scale=scale)


def cpu_flash_attention_backward(grad_output, query, key, value, output, log_sum_exp, mask, scale) -> tuple:
    """The gradients of q, k and v through `cpu_flash_attention` (its kernel's backward, laid out as the
    inputs)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_output, query, key, value, output, log_sum_exp, 0.0, False, attn_mask=mask, scale=scale)


def assert_async(condition: torch.Tensor, message: str) -> None:
    """Fail on the device when `condition` is False, without synchronising the host."""
    torch._assert_async(condition, message)


def flex_attention_function():
    """transformers' `compile_friendly_flex_attention` (`transformers.integrations.flex_attention`, not exported at
    the top level): torch's `flex_attention` compiled once per process as transformers' own flex backend runs it,
    called as `(query, key, value, score_mod=, block_mask=, scale=, training=)` and returning the output
    (B, H, T, D) when no log-sum-exp is asked for. Imported at the call: it imports torch's flex attention."""
    return importlib.import_module("transformers.integrations.flex_attention").compile_friendly_flex_attention


def linear_cross_entropy():
    """`(F.linear_cross_entropy, torch.nn.LinearCrossEntropyOptions)`: torch's chunked linear + cross-entropy and
    its options (`batch_chunk_size`, `allow_retain_graph`), new in torch 2.13 and not yet in its documented API;
    None where torch lacks them."""
    function, options = getattr(F, "linear_cross_entropy", None), getattr(torch.nn, "LinearCrossEntropyOptions", None)
    return None if function is None or options is None else (function, options)


# --- datasets: fingerprints (``Dataset.map``'s cache keys) ----------------------------------------------------------


def derived_fingerprint(dataset, *parts) -> str:
    """A fingerprint for a `map` of `dataset` determined by `parts`: the dataset's own (private
    `_fingerprint`) hashed with them by datasets' `Hasher`."""
    return _datasets_fingerprint_module().Hasher.hash([dataset._fingerprint, *parts])


def random_fingerprint() -> str:
    """A fresh fingerprint (`new_fingerprint=` of a `map` whose inputs would cost more to hash than to map)."""
    return _datasets_fingerprint_module().generate_random_fingerprint()


def _datasets_fingerprint_module():
    """`datasets.fingerprint`, imported at the first use and not by an import statement: transformers checks that
    the packages a checkpoint's remote code imports (this module among them) are installed, and the model core needs
    no `datasets`."""
    return importlib.import_module("datasets.fingerprint")


def init_values_(tensor: torch.Tensor, values) -> torch.Tensor:
    """Set `tensor` to `values` (a tensor or nested numbers broadcastable to its shape), unless it was loaded from
    a checkpoint (transformers' `initialization.copy_`, which skips those as `init_normal_` does): for a method's
    `init_weights`, e.g. a head-mixing matrix started at the identity. `ValueError` where `values` does not
    broadcast to the tensor's shape."""
    values = torch.as_tensor(values, dtype=tensor.dtype, device=tensor.device)
    try:
        values = values.expand(tensor.shape)
    except RuntimeError:
        raise ValueError(f"init_values_: values of shape {tuple(values.shape)} do not broadcast to the tensor's shape "
                         f"{tuple(tensor.shape)}; expected sizes 1 or those sizes") from None
    return _init_copy_(tensor, values)


def init_identity_(tensor: torch.Tensor) -> torch.Tensor:
    """Set a square matrix (n, n) to the identity, unless it was loaded from a checkpoint
    ([`init_values_`][hf_headattn.hf_compat.init_values_])."""
    if tensor.dim() != 2 or tensor.shape[0] != tensor.shape[1]:
        raise ValueError(f"init_identity_ needs a square matrix (n, n), got shape {tuple(tensor.shape)}")
    return init_values_(tensor, torch.eye(tensor.shape[0]))
