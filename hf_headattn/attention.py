"""How the methods reach the attention modules of mBART and Marian.

The HF attention modules (``MBartAttention``, ``MarianAttention``: the same code) compute q/k/v, call the attention
function registered under ``config._attn_implementation`` and apply ``out_proj``. We keep that forward untouched and
hook in at the one place transformers 5 designed for it, the attention registry:

* an attention module that carries a method keeps its HF class and ``forward``; it gets a forward pre-hook that hands
  its query-side input on to the attention function as a keyword (as peft hands on its adapter arguments), and a
  small stand-in for its ``config`` whose ``_attn_implementation`` is :data:`ATTENTION_NAME` (every other attribute
  reads through to the model config). Every other module is left exactly as HF built it (so with every method off,
  nothing changes), and the model config keeps the backend the user chose: ``model.config._attn_implementation``
  still reads ``"sdpa"``/``"eager"``, ``set_attn_implementation`` switches the backend under the methods, and
  ``config.output_attentions`` and HF's own attention tests work as on the stock model (a model-wide registered name
  would break all three);
* that function runs the methods attached to the module around the backend the *model* is configured with (SDPA,
  eager or flex attention, :mod:`hf_headattn.flex`; others are refused, and a method may refuse one: ``backends``):
  ``before`` may change the mask (SEA), the backend computes the output, ``after`` may read q/k (EaDRA recomputes
  probabilities only for its heads) and transform the per-head output (DHICM).

Per-forward state (loss terms, read-outs) travels in a :class:`HeadAttnContext` passed as the ``headattn_context``
keyword, which transformers forwards from the model to every attention call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface

from .flex import FLEX, dense_mask, flex_attention_with
from .head_masks import module_head_mask, scale_heads, scale_weights
from .hf_compat import (
    ALL_ATTENTION_FUNCTIONS,
    ConfigStandIn,
    additive_mask_allowed,
    attention_implementation,
    attention_query_input,
    eager_attention_forward,
)
from .sites import AttentionSite

#: The registry name of our attention function, unique to this copy of the code: a checkpoint loaded with
#: ``trust_remote_code`` brings its own copy of this module, which registers its own function under its own name, so
#: loading it never changes the function that models built from another copy run.
ATTENTION_NAME = f"headattn:{__name__}"
#: The model backends the methods run around (tested); others are refused with an error naming these.
SUPPORTED_BACKENDS = ("sdpa", "eager", FLEX)


class HeadAttnContext:
    """State of one forward pass, shared by all attention modules that carry a method.

    ``flags``: the read-out flags (``MethodSpec.flags``) set in this forward, e.g. ``"output_head_importance"``.

    ``record(key, value)`` collects, per key, one entry per module call (e.g. ``"dhicm_kl"``: ``(name, tensor)`` pairs);
    the model reduces them into output fields after the forward. ``source_mask`` (B, S) and ``target_mask`` (B, T)
    are True at real (non-padding) tokens; ``None`` means every token is real. ``grad_enabled``: whether the forward
    that created the context records gradients (see :func:`check_loss_terms_get_gradients`). ``compute_losses``: False
    when no loss is needed (``generate``, inference without labels): the regularizers then do no work.

    Deliberately not a dataclass: FSDP2 (``fully_shard``) rebuilds the dataclasses, dicts and lists among a sharded
    layer's arguments that hold tensors needing gradients, so a later layer would record into a copy (and a
    ``defaultdict`` cannot even be rebuilt); a plain object is passed through as it is.
    """

    def __init__(self, flags=frozenset(), source_mask: torch.Tensor | None = None,
                 target_mask: torch.Tensor | None = None):
        self.flags = frozenset(flags)
        self.source_mask, self.target_mask = source_mask, target_mask
        self._chains: dict[str, tuple] = {}  # key -> (last value, (the one before, (...))): see record()
        self.cache: dict[Any, Any] = {}  # what the model computes once per forward (e.g. the target tokens)
        self.grad_enabled = torch.is_grad_enabled()
        self.compute_losses = True

    def record(self, key: str, value: Any) -> None:
        """Add ``value`` to the records of ``key`` (read back in order with :attr:`records`).

        Kept as a chain of pairs (value, the chain before), not as a list: torch.compile guards on the length of a
        list that a compiled frame appends to, so under regional compilation (one code object for every layer)
        each layer would compile a version of its own and exhaust dynamo's recompile limit; a new pair needs no
        guard on the values before it."""
        self._chains[key] = (value, self._chains.get(key))

    def has(self, key: str) -> bool:
        """Whether anything was recorded under ``key`` in this forward."""
        return key in self._chains

    def recorded(self, key: str) -> list:
        """The values recorded under ``key``, in the order recorded (``[]``: none), what a ``collect`` reads."""
        values, chain = [], self._chains.get(key)
        while chain is not None:
            value, chain = chain
            values.append(value)
        return values[::-1]

    @property
    def records(self) -> dict[str, list]:
        """``{key: [values in the order recorded]}`` for every key (:meth:`recorded` reads one)."""
        return {key: self.recorded(key) for key in self._chains}

    def target_tokens(self) -> torch.Tensor | None:
        """The batch's real target tokens, ``target_mask.sum()`` (None without a target mask), counted once per
        forward for every method that normalises by it."""
        if self.target_mask is None:
            return None
        if "target_tokens" not in self.cache:
            self.cache["target_tokens"] = self.target_mask.sum()
        return self.cache["target_tokens"]


class HeadIndex:
    """Head numbers kept as a tuple, with their index tensor made once per device.

    Not a buffer: ``from_pretrained`` builds the modules on the meta device and leaves a non-persistent buffer made
    in ``__init__`` uninitialised."""

    def __init__(self, numbers):
        self.numbers = tuple(int(number) for number in numbers)
        self._tensors: dict[torch.device, torch.Tensor] = {}

    def on(self, device: torch.device) -> torch.Tensor:
        """The numbers as a LongTensor on ``device`` (made once per device; a constant of the graph under
        torch.compile, where filling the cache would change what the compiled graph guards on and recompile it)."""
        if torch.compiler.is_compiling():
            return torch.tensor(self.numbers, dtype=torch.long, device=device)
        if device not in self._tensors:
            self._tensors[device] = torch.tensor(self.numbers, dtype=torch.long, device=device)
        return self._tensors[device]

    def __len__(self) -> int:
        return len(self.numbers)

    def __repr__(self) -> str:
        return repr(list(self.numbers))


@dataclass
class AttentionCall:
    """What a method sees of one attention call (shapes as transformers passes them).

    query: (B, H, T, D); key, value: (B, H, S, D); attention_mask: None, bool (True = attend) or additive float,
    broadcastable to (B, H, T, S); hidden_states: (B, T, d_model), the module's query-side input.
    """

    module: nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attention_mask: torch.Tensor | None
    scaling: float
    hidden_states: torch.Tensor
    context: HeadAttnContext | None
    kwargs: dict[str, Any]
    head_mask: torch.Tensor | None = None  # (1 or B, H), already applied to the per-head output ``after`` gets
    state: dict[str, Any] = field(default_factory=dict)  # what a method's ``before`` leaves for its ``after``
    #: flex attention only: a ``score_mod`` a method's ``before`` sets (SEA); the call then runs torch's flex attention
    #: with it and the block mask (:func:`~.flex.flex_attention_with`)
    score_mod: Any = None

    @property
    def is_cross(self) -> bool:
        return self.module.headattn_kind == "cross"

    @property
    def is_decoder(self) -> bool:
        return self.module.headattn_side == "decoder"

    @property
    def query_mask(self) -> torch.Tensor | None:
        """(B, T) bool, True at real query tokens (``None``: all real, or no context)."""
        if self.context is None:
            return None
        mask = self.context.target_mask if self.is_decoder else self.context.source_mask
        return None if mask is None or mask.shape[1] != self.query.shape[2] else mask

    @property
    def key_mask(self) -> torch.Tensor | None:
        """(B, S) bool, True at real key tokens (``None``: all real, or no context); causality is not included."""
        if self.context is None:
            return None
        mask = self.context.target_mask if self.is_decoder and not self.is_cross else self.context.source_mask
        return None if mask is None or mask.shape[1] != self.key.shape[2] else mask

    @property
    def mask_tensor(self) -> torch.Tensor | None:
        """``attention_mask`` as a tensor: flex attention's BlockMask as the bool mask (B, 1, T, S) SDPA would get
        (made once per forward and block mask, :func:`~.flex.dense_mask`), any other mask as it is. Refused once a
        method set a ``score_mod``: the mask it stands for is then no tensor."""
        if self.score_mod is not None:
            raise ValueError(
                f"{self.module.headattn_name}: a method's flex score_mod changed this call's mask, which another "
                "method reads as a tensor; expected attn_implementation 'sdpa' or 'eager' for this combination"
            )
        cache = None if self.context is None else self.context.cache
        return dense_mask(self.attention_mask, self.query.shape[2], self.key.shape[2], cache)


def key_allowed(attention_mask: torch.Tensor | None, key_length: int) -> torch.Tensor | None:
    """The keys a query may attend to by the mask transformers passes to the attention function, as bool.

    Parameters
    ----------
    attention_mask : None, BoolTensor (True = attend) or additive float tensor, shape (B, 1 or H, T, >= S)
        SDPA gets bool; eager gets ``finfo.min`` where masked (:func:`~.hf_compat.additive_mask_allowed`).
    key_length : int
        S; longer masks are cut to it, as the HF backends do.

    Returns
    -------
    None (every key allowed) or BoolTensor, shape (B, 1 or H, T, S)
    """
    if attention_mask is None:
        return None
    attention_mask = attention_mask[..., :key_length]
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return additive_mask_allowed(attention_mask)


def check_loss_terms_get_gradients(module: nn.Module, context: HeadAttnContext | None, methods) -> None:
    """Refuse an attention call that would record loss terms without gradients: the model's forward records
    gradients but this layer runs without, as under reentrant gradient checkpointing
    (``activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})``, and ``{}`` where
    torch defaults to it). Its recomputation in the backward pass comes too late for the loss, so ``dhicm_kl`` and
    ``eadra_loss`` would silently get no gradient."""
    if context is None or not context.grad_enabled or torch.is_grad_enabled() or not module.training:
        return
    terms = [type(method).__name__ for method in methods if method.records_loss_terms]
    if terms:
        raise ValueError(
            f"{getattr(module, 'headattn_name', type(module).__name__)} runs without gradients inside a forward that "
            f"records them (reentrant gradient checkpointing), so the loss terms of {terms} would get none; expected "
            "activation_checkpointing_kwargs={'use_reentrant': False} (transformers' default when none are given)"
        )


class _RoutedConfig(ConfigStandIn, attention_function=ATTENTION_NAME):
    """The ``config`` of a routed attention module: it reads its attention function from :data:`ATTENTION_NAME`."""


def _pass_query_input(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook of an attention module that carries a method: hand its query-side input
    (``hidden_states``, HF's first parameter) on to the attention function as ``headattn_hidden_states``.

    HF's attention ``forward`` passes its ``**kwargs`` on to the attention function, as peft passes its adapter
    arguments; so nothing of HF's signature is restated here beyond the name and place of that first parameter.
    """
    return args, {**kwargs, "headattn_hidden_states": attention_query_input(args, kwargs)}


def route(module: nn.Module, model_config, side: str, layer: int, kind: str) -> None:
    """Route an HF attention module's calls to :data:`ATTENTION_NAME` (a :class:`~.hf_compat.ConfigStandIn` for its
    ``config``), and tag it:
    ``headattn_side`` ("encoder"/"decoder"), ``headattn_layer``, ``headattn_kind`` ("self"/"cross"),
    ``headattn_name`` (its path in the base model), the buffer ``headattn_head_mask`` (the mask kept on the model,
    :mod:`hf_headattn.head_masks`) and ``headattn_heads`` (its heads' original numbers once pruned, a
    :class:`HeadIndex`, :mod:`hf_headattn.pruning`), both ``None`` at first. Every attention module of an
    hf-headattn model is routed: without a method or a head mask, the function calls the backend unchanged.
    Idempotent."""
    if isinstance(module.config, ConfigStandIn):
        return
    module.headattn_side, module.headattn_layer, module.headattn_kind = side, layer, kind
    module.headattn_name = AttentionSite(side, layer, kind).name
    module.headattn_methods = ()
    module.register_buffer("headattn_head_mask", None, persistent=False)
    module.headattn_heads = None  # a HeadIndex once pruned
    module.config = _RoutedConfig(model_config)


def attach_method(module: nn.Module, name: str, method: nn.Module) -> None:
    """Attach ``method`` (an ``nn.Module`` with ``before``/``after`` hooks) to a routed HF attention module as
    ``name``.

    Its parameters appear under ``<module path>.<name>.*`` (e.g. ``...self_attn.dhicm.w``), so they are saved, loaded
    and selected for optimizer groups or PEFT by name. The module keeps its HF class and ``forward``; the first method
    attached adds the pre-hook :func:`_pass_query_input`.
    """
    if not module.headattn_methods:
        module.register_forward_pre_hook(_pass_query_input, with_kwargs=True)
    module.add_module(name, method)
    module.headattn_methods = (*module.headattn_methods, name)


def headattn_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    headattn_hidden_states: torch.Tensor | None = None,
    headattn_context: HeadAttnContext | None = None,
    **kwargs,
):
    """The attention function registered as :data:`ATTENTION_NAME`: the model's backend, with the module's head mask
    and methods around it (the backend alone, unchanged, when the module has neither)."""
    implementation = attention_implementation(module.config.model_config)
    head_mask = module_head_mask(module, kwargs)
    if not module.headattn_methods:
        backend = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        attn_output, attn_weights = backend(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        if head_mask is None:
            return attn_output, attn_weights
        return scale_heads(attn_output, head_mask), scale_weights(attn_weights, head_mask)
    if implementation not in SUPPORTED_BACKENDS:
        raise ValueError(
            f"attn_implementation={implementation!r} is not supported with hf-headattn's methods on (they need the "
            f"backend's inputs and per-head outputs as {SUPPORTED_BACKENDS} give them); load or build the model with "
            f"attn_implementation in {SUPPORTED_BACKENDS}, or switch the methods off"
        )
    backend = eager_attention_forward if implementation == "eager" else ALL_ATTENTION_FUNCTIONS[implementation]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    call = AttentionCall(
        module, query, key, value, attention_mask, scaling, headattn_hidden_states, headattn_context, kwargs,
        head_mask,
    )
    methods = [getattr(module, name) for name in module.headattn_methods]
    refused = [name for name, method in zip(module.headattn_methods, methods) if implementation not in method.backends]
    if refused:
        raise ValueError(
            f"attn_implementation={implementation!r} is not supported by {refused} on {module.headattn_name} (expected "
            f"attn_implementation in {getattr(module, refused[0]).backends}); load or build the model with one of "
            "those, or switch the method off"
        )
    check_loss_terms_get_gradients(module, headattn_context, methods)
    for method in methods:
        method.before(call)
    if call.score_mod is None:
        attn_output, attn_weights = backend(
            module, call.query, call.key, call.value, call.attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )  # attn_output: (B, T, H, D)
    else:
        attn_output, attn_weights = flex_attention_with(
            module, call.query, call.key, call.value, call.attention_mask, call.score_mod, scaling, dropout
        )
    if head_mask is not None:
        attn_output, attn_weights = scale_heads(attn_output, head_mask), scale_weights(attn_weights, head_mask)
    for method in methods:
        attn_output = method.after(call, attn_output)
    return attn_output, attn_weights


class AttentionMethod(nn.Module):
    """Base class of a method attached to an attention module: both hooks do nothing by default.

    ``records_loss_terms``: whether the method records terms of the training objective (they need gradients).
    ``out_proj_per_head``: whether the module's ``out_proj`` still reads the concatenated heads (pruning then takes
    its columns of the pruned heads). ``backends``: the model backends the method runs on (a call on another is
    refused with an error naming them); on flex attention ``call.attention_mask`` is a BlockMask, which
    ``call.mask_tensor`` gives as a tensor.

    Head masks and pruning (:mod:`hf_headattn.head_masks`, :mod:`hf_headattn.pruning`): ``after`` gets the per-head
    output already scaled by the call's ``head_mask``; a method that mixes heads or keeps per-head state treats a
    head masked with 0 as pruned (so that pruning it gives the same outputs and loss), and :meth:`prune_heads` drops
    the per-head state of pruned heads.
    """

    records_loss_terms = False
    backends = SUPPORTED_BACKENDS
    out_proj_per_head = True

    def init_weights(self, std: float) -> None:
        """Initialise the method's own ``nn.Parameter``s with transformers' initialisers (``hf_compat.init_normal_``,
        ``init_zeros_``, ``init_ones_``, which skip parameters loaded from a checkpoint); ``std`` is the model's
        ``init_std``."""

    def prune_heads(self, keep: torch.Tensor) -> None:
        """The module keeps only the heads ``keep`` (current numbers, sorted): drop per-head state of the others."""

    def before(self, call: AttentionCall) -> None:
        """Runs before the backend; may replace ``call.attention_mask`` (or q/k/v)."""

    def after(self, call: AttentionCall, attn_output: torch.Tensor) -> torch.Tensor:
        """Runs after the backend on the per-head output (B, T, H, D); returns what ``out_proj`` receives."""
        return attn_output


AttentionInterface.register(ATTENTION_NAME, headattn_attention_forward)
