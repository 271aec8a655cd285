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
  ``before`` may add a bias or hard mask to some heads' scores (SEA; :meth:`AttentionCall.add_score_bias`, made into
  the backend's mask or flex ``score_mod`` by :mod:`hf_headattn.scores`) or take over some heads' attention
  (:meth:`AttentionCall.take_over`), the backend computes the output of the other heads, ``after`` may read q/k
  (EaDRA recomputes probabilities only for its heads) and transform the per-head output (DHICM). Two methods' changes
  compose; a combination that cannot is refused, naming both.

Per-forward state (loss terms, read-outs) travels in a :class:`HeadAttnContext` passed as the ``headattn_context``
keyword, which transformers forwards from the model to every attention call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface

from .flex import FLEX, dense_mask, flex_attention_with, is_block_mask
from .head_masks import module_head_mask, scale_heads, scale_weights
from .hf_compat import (
    ALL_ATTENTION_FUNCTIONS,
    ConfigStandIn,
    additive_mask_allowed,
    attention_implementation,
    attention_query_input,
    eager_attention_forward,
)
from .scores import (
    ScoreBias,
    ScoreMod,
    biased_mask,
    biased_score_mod,
    compose_score_mods,
    head_numbers,
    on_heads,
    score_bias,
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


_CONSTANTS: dict[tuple, torch.Tensor] = {}


def constant(values: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """``values`` (host numbers or flags) as a 1-D tensor on ``device``, made once per (values, dtype, device): one
    made at every call would be a copy to the device each time. Under torch.compile a constant of the graph (filling
    the cache would change what the compiled graph guards on, and recompile it)."""
    if torch.compiler.is_compiling():
        return torch.tensor(values, dtype=dtype, device=device)
    key = (values, dtype, torch.device(device))
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.tensor(values, dtype=dtype, device=device)
    return _CONSTANTS[key]


class HeadIndex:
    """Head numbers kept as a tuple, with their index tensor made once per device (:func:`constant`).

    Not a buffer: ``from_pretrained`` builds the modules on the meta device and leaves a non-persistent buffer made
    in ``__init__`` uninitialised."""

    def __init__(self, numbers):
        self.numbers = tuple(int(number) for number in numbers)

    def on(self, device: torch.device) -> torch.Tensor:
        """The numbers as a LongTensor on ``device`` (:func:`constant`)."""
        return constant(self.numbers, torch.long, device)

    def __len__(self) -> int:
        return len(self.numbers)

    def __repr__(self) -> str:
        return repr(list(self.numbers))


#: What a method that takes over heads computes for them (:meth:`AttentionCall.take_over`), called as transformers
#: calls an attention function: ``attend(module, query, key, value, attention_mask, dropout=, scaling=)`` ->
#: ``(output (B, T, h, D), weights (B, h, T, S) or None)``.
Attend = Callable[..., tuple]


@dataclass
class AttentionCall:
    """What a method sees of one attention call (shapes as transformers passes them), and the hooks it changes the
    call's attention with.

    query: (B, H, T, D); key, value: (B, H, S, D) (H: the module's heads, fewer once pruned; head numbers below are
    places in this dimension); attention_mask: what transformers passes: None, bool (True = attend) or additive float
    (``finfo.min`` where masked), broadcastable to (B, H, T, >= S), or on flex attention a ``BlockMask``
    (:attr:`mask_tensor` gives it as a tensor; with SDPA, None may stand for a causal mask, ``is_causal``);
    hidden_states: (B, T, d_model), the module's query-side input; ``implementation``: the model's backend ("sdpa",
    "eager", "flex_attention"; None where a test made the call).

    A method's ``before`` changes the attention through the hooks, which compose (two methods' changes both apply, in
    the order the methods run; a combination that cannot compose is refused naming both methods):

    * :meth:`add_score_bias`: a bias (and/or a hard mask) on the scores of some heads, per sentence if need be (SEA;
      a Gaussian locality bias; a relative-position bias); on SDPA/eager it reaches the backend inside the mask, on
      flex attention as a ``score_mod`` (:mod:`hf_headattn.scores`);
    * :meth:`add_score_mod`: on flex attention only, any ``score_mod`` (composed with the others);
    * :meth:`take_over`: the method computes the attention of some heads itself (a value term needs the
      probabilities, which SDPA does not return); the backend runs on the other heads only.

    Replacing ``attention_mask`` (or q/k/v) in ``before`` still works: the hooks apply to the mask as the backend then
    gets it.
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
    implementation: str | None = None
    #: the score changes (ScoreBias, or (owner, score_mod) on flex) and the heads taken over ((owner, numbers,
    #: attend)), in the order added; the method whose hook runs (errors name it); the mask made for the backend
    _scores: list = field(default_factory=list, repr=False)
    _taken: list = field(default_factory=list, repr=False)
    _method: str | None = field(default=None, repr=False)
    _made_mask: tuple | None = field(default=None, repr=False)

    @property
    def is_cross(self) -> bool:
        return self.module.headattn_kind == "cross"

    @property
    def is_decoder(self) -> bool:
        return self.module.headattn_side == "decoder"

    @property
    def is_flex(self) -> bool:
        """Whether flex attention runs the call (transformers then passes a ``BlockMask``)."""
        return self.implementation == FLEX or is_block_mask(self.attention_mask)

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
        """The mask as a tensor, as the backend applies it: on SDPA/eager ``attention_mask`` with the score biases
        added so far in it (:func:`~.scores.biased_mask`; ``attention_mask`` itself while there is none), on flex
        attention the BlockMask as the bool mask (B, 1, T, S) SDPA would get (made once per forward and block mask,
        :func:`~.flex.dense_mask`), with the score biases added so far in it as SDPA would get them (so a method
        reading it sees the same on every backend); refused once a method added a raw ``score_mod``
        (:meth:`add_score_mod`), which has no tensor form."""
        if self.is_flex:
            if self._scores and all(isinstance(change, ScoreBias) for change in self._scores):
                return self._biased_mask(boolean=True)
            if self._scores:
                raise ValueError(
                    f"{self.module.headattn_name}: a method's flex score_mod (from {self._owners(self._scores)}) "
                    f"changed this call's mask, which {self._method or 'a method'!r} reads as a tensor; expected "
                    "attn_implementation 'sdpa' or 'eager' for this combination"
                )
            return self._base_mask()
        return self._backend_mask()

    @property
    def score_mod(self):
        raise AttributeError("AttentionCall.score_mod is gone: a method adds a score_mod with call.add_score_mod(...) "
                             "(flex attention) or a bias with call.add_score_bias(...), which compose")

    @score_mod.setter
    def score_mod(self, value) -> None:
        raise ValueError(f"{self._method or 'a method'}: setting call.score_mod would overwrite another method's; "
                         "expected call.add_score_mod(score_mod) (flex attention) or call.add_score_bias(bias, "
                         "allowed=, heads=), which compose")

    def add_score_bias(self, bias: torch.Tensor | None = None, *, allowed: torch.Tensor | None = None,
                       heads: torch.Tensor | Sequence[int] | None = None) -> None:
        """Add ``bias`` to the attention scores (q k^T * scaling) of ``heads`` and mask them where not ``allowed``;
        on every backend, summed with the other methods' biases.

        Parameters
        ----------
        bias : None or float tensor broadcastable to (B, h, T, S), finite
            Added to the scores (trainable: its gradient flows through every backend; on flex attention only where
            torch differentiates a ``score_mod``'s captured tensors, a GPU).
        allowed : None or bool tensor broadcastable to (B, h, T, S)
            A hard mask: False = the key is masked (-inf) for that query. A query row where it allows no key that
            the call's mask allows (e.g. a padding row) keeps the call's mask alone on these heads, ``bias`` left out.
        heads : None (every head: h = H), a bool tensor (H,) or (B, H) (the heads it applies to, per sentence
            where (B, H): h = H), or a sequence of head numbers (h of them: the bias's head dimension follows their
            order)

        Notes
        -----
        The backend then gets (:mod:`hf_headattn.scores`): SDPA a bool mask where the call's one bias is a hard
        mask and the call's mask is bool or None, else an additive float mask (``finfo.min`` where masked), eager
        always that; either (B, H, T, S) only where a bias applies to some heads or differs between heads; flex
        attention a ``score_mod`` reading the tensors by index (no (B, H, T, S) tensor), the padding staying in the
        block mask. A ``ValueError`` names the method and the bad argument.
        """
        batch, num_heads, length, _ = self.query.shape
        shape = (batch, num_heads, length, self.key.shape[2])
        self._scores.append(score_bias(self._method or "a method", bias, allowed, heads, shape))

    def add_score_mod(self, score_mod: ScoreMod) -> None:
        """Flex attention only: apply ``score_mod(score, batch, head, query, key) -> score`` (torch's flex
        signature, the indices over the call's (B, H, T, S)) after the score changes added before it. On SDPA or
        eager a ``ValueError`` asks for :meth:`add_score_bias` (which a mask carries there)."""
        if not self.is_flex:
            raise ValueError(
                f"{self._method or 'a method'}: add_score_mod needs attn_implementation 'flex_attention', got "
                f"{self.implementation!r}; expected call.add_score_bias(bias, allowed=, heads=) on SDPA or eager"
            )
        self._scores.append((self._method or "a method", score_mod))

    def take_over(self, heads: Sequence[int], attend: Attend) -> None:
        """Compute the attention of ``heads`` (head numbers) with ``attend`` instead of the backend, which then runs
        on the other heads only (all of them taken: it does not run).

        ``attend`` is called as transformers calls an attention function, on those heads:
        ``attend(module, query, key, value, attention_mask, dropout=, scaling=)`` with query (B, h, T, D), key and
        value (B, h, S, D) of the heads in the order given, ``attention_mask`` a tensor for them: None (every key),
        bool (True = attend) or additive float (``finfo.min`` where masked), broadcastable to (B, h, T, S), with
        causality explicit and the other methods' score biases on these heads in it (on flex attention too);
        ``dropout`` the attention dropout probability (0 in eval). It returns ``(output (B, T, h, D), weights)``,
        weights (B, h, T, S) or None; the call returns weights only where every part has them as (B, ., T, S).
        Heads taken over by two methods, or a flex ``score_mod`` (:meth:`add_score_mod`) beside taken-over heads
        (it has no tensor form), are refused naming both methods."""
        owner = self._method or "a method"
        numbers = head_numbers(owner, heads, self.query.shape[1])
        for other, taken, _ in self._taken:
            if set(numbers) & set(taken):
                raise ValueError(f"{self.module.headattn_name}: {owner!r} takes over heads {list(numbers)} and "
                                 f"{other!r} heads {list(taken)}; expected each head taken over by one method")
        if not callable(attend):
            raise ValueError(f"{owner}: take_over needs a function attend(module, query, key, value, "
                             f"attention_mask, dropout=, scaling=), got {type(attend).__name__}")
        self._taken.append((owner, numbers, attend))

    @staticmethod
    def _owners(changes) -> str:
        names = dict.fromkeys(change.owner if isinstance(change, ScoreBias) else change[0] for change in changes)
        return ", ".join(repr(name) for name in names)

    def _base_mask(self) -> torch.Tensor | None:
        """``attention_mask`` as a tensor, as transformers gave it (a BlockMask as bool (B, 1, T, S))."""
        cache = None if self.context is None else self.context.cache
        return dense_mask(self.attention_mask, self.query.shape[2], self.key.shape[2], cache)

    def _explicit_mask(self) -> torch.Tensor | None:
        """The call's mask as a tensor cut to the keys, with causality explicit: SDPA's None on a causal module is
        the causal mask its ``is_causal`` stands for (as transformers' ``sdpa_attention_forward`` decides it)."""
        mask, length, key_length = self._base_mask(), self.query.shape[2], self.key.shape[2]
        if mask is not None:
            return mask if mask.shape[-1] == key_length else mask[..., :key_length]
        causal = self.kwargs.get("is_causal")
        causal = getattr(self.module, "is_causal", True) if causal is None else causal
        if self.implementation != "sdpa" or length == 1 or not causal:
            return None
        device = self.query.device
        return (torch.arange(length, device=device)[:, None] >= torch.arange(key_length, device=device))[None, None]

    def _biased_mask(self, boolean: bool) -> torch.Tensor | None:
        """:meth:`_explicit_mask` with the score biases in it (the mask itself without any)."""
        biases = [change for change in self._scores if isinstance(change, ScoreBias)]
        if len(biases) < len(self._scores):
            raise ValueError(f"{self.module.headattn_name}: a flex score_mod from {self._owners(self._scores)} has no "
                             f"tensor form, which the heads {self._owners_of_taken()} take over need; expected "
                             "call.add_score_bias(...) for such a combination")
        mask = self._explicit_mask()
        return mask if not biases else biased_mask(mask, biases, self.query.dtype, boolean)

    def _owners_of_taken(self) -> str:
        return ", ".join(repr(owner) for owner, _, _ in self._taken)

    def _backend_mask(self) -> torch.Tensor | None:
        """What SDPA or eager receives: ``attention_mask`` unchanged without score biases, else
        :meth:`_biased_mask` (made once per call and mask)."""
        if not self._scores:
            return self.attention_mask
        made = self._made_mask
        if made is None or made[0] is not self.attention_mask or made[1] != len(self._scores):
            made = (self.attention_mask, len(self._scores), self._biased_mask(self.implementation == "sdpa"))
            self._made_mask = made
        return made[2]

    def _flex_score_mod(self) -> ScoreMod | None:
        """The score changes as one flex ``score_mod`` (None: none), in the order added."""
        if not self._scores:
            return None
        needs_mask = any(isinstance(change, ScoreBias) and change.allowed is not None for change in self._scores)
        allowed = key_allowed(self._base_mask(), self.key.shape[2]) if needs_mask else None
        score_mods, biases = [], []
        for change in [*self._scores, None]:  # consecutive biases make one score_mod
            if isinstance(change, ScoreBias):
                biases.append(change)
                continue
            if biases:
                score_mods.append(biased_score_mod(biases, allowed))
                biases = []
            if change is not None:
                score_mods.append(change[1])
        return compose_score_mods(score_mods)


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
        head_mask, implementation=implementation,
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
    for name, method in zip(module.headattn_methods, methods):
        call._method = name
        method.before(call)
    call._method = None
    attn_output, attn_weights = run_attention(call, backend, dropout)  # attn_output: (B, T, H, D)
    if head_mask is not None:
        attn_output, attn_weights = scale_heads(attn_output, head_mask), scale_weights(attn_weights, head_mask)
    for name, method in zip(module.headattn_methods, methods):
        call._method = name
        attn_output = method.after(call, attn_output)
    return attn_output, attn_weights


def run_attention(call: AttentionCall, backend, dropout: float) -> tuple[torch.Tensor, Any]:
    """The call's attention after the methods' ``before`` hooks: the backend with their score changes on the heads
    no method took over, each taken-over group of heads by its method's ``attend``, put back in head order. Without
    a taken-over head this is the backend alone (its mask unchanged where no method changed the scores).

    The heads are cut and joined as :class:`HeadSplit` plans it: where every group is a run of consecutive heads in
    ascending order (e.g. heads 0-1 taken over, 2-3 the backend's), q/k/v are split into views and the outputs only
    concatenated in the order of their first heads; other groups are gathered with index tensors made once."""
    if not call._taken:
        return backend_on_heads(call, backend, None, dropout)
    num_heads = call.query.shape[1]
    taken = {head for _, numbers, _ in call._taken for head in numbers}
    rest = tuple(head for head in range(num_heads) if head not in taken)
    split = HeadSplit.of(((rest,) if rest else ()) + tuple(numbers for _, numbers, _ in call._taken))
    queries, keys, values = (split.parts(tensor, 1) for tensor in (call.query, call.key, call.value))
    # the taken-over heads' mask (None, or (B, 1 or H, T, S)): the backend's where it has the biases in it
    mask = call._backend_mask() if call._scores and not call.is_flex else call._biased_mask(boolean=True)
    outputs, weights = [], []
    if rest:
        output, weight = backend_on_heads(call, backend, split, dropout, (queries[0], keys[0], values[0]))
        outputs.append(output)
        weights.append(weight)
    for i, (owner, numbers, attend_heads) in enumerate(call._taken, len(outputs)):
        query, key, value = queries[i], keys[i], values[i]
        output, weight = attend_heads(call.module, query, key, value, split.part(mask, 1, i), dropout=dropout,
                                      scaling=call.scaling)
        expected = (query.shape[0], query.shape[2], len(numbers), value.shape[3])
        if tuple(output.shape) != expected:
            raise ValueError(f"{call.module.headattn_name}: {owner!r} returned an output of shape "
                             f"{tuple(output.shape)} for the heads it took over, {list(numbers)}; expected (batch, "
                             f"query, heads, head_dim) = {expected}")
        outputs.append(output)
        weights.append(weight)
    output = split.join(outputs, 2)
    if not output.is_contiguous():  # (one part, e.g. a transposed (B, H, T, D)): per-head outputs are contiguous
        output = output.contiguous()
    if any(weight is None or weight.dim() != 4 for weight in weights):
        return output, None
    return output, split.join(weights, 1)


def backend_on_heads(call: AttentionCall, backend, split: HeadSplit | None, dropout: float, qkv=None):
    """The backend with the methods' score changes (SDPA/eager with the mask made for them,
    :meth:`AttentionCall._backend_mask`; flex attention with their ``score_mod``): on every head (``split`` None), or
    on the first group of ``split`` (the heads no method took over), whose q/k/v are ``qkv``."""
    query, key, value = (call.query, call.key, call.value) if qkv is None else qkv
    if call.is_flex:
        score_mod = call._flex_score_mod()
        if score_mod is not None:
            score_mod = score_mod if split is None else on_heads(score_mod, split.index(0, query.device))
            return flex_attention_with(call.module, query, key, value, call.attention_mask, score_mod, call.scaling,
                                       dropout)
        mask = call.attention_mask
    else:
        mask = call._backend_mask()
        if split is not None and mask is not None and mask.dim() == 4:
            mask = split.part(mask, 1, 0)
    return backend(call.module, query, key, value, mask, dropout=dropout, scaling=call.scaling, **call.kwargs)


class HeadSplit:
    """How a call's heads are cut into groups (the backend's heads, each method's taken-over heads: tuples of head
    numbers that together hold every head once) and their per-head results put back in head order.

    A group of consecutive ascending heads is cut as a view (``narrow``), another one with ``index_select``. Where
    every group is such a run, q/k/v are cut in one ``split`` (its backward: one ``cat``) and the groups' results,
    concatenated in the order of their first heads, are in head order: one ``cat``, or none for a single group;
    else they are concatenated and put in head order with an ``index_select``. Index tensors are made once per
    device (:class:`HeadIndex`), a split once per grouping (:meth:`of`)."""

    _made: dict[tuple[tuple[int, ...], ...], HeadSplit] = {}

    def __init__(self, groups: tuple[tuple[int, ...], ...]):
        self.groups = groups
        self.run = [group == tuple(range(group[0], group[0] + len(group))) for group in groups]
        self.runs = all(self.run)
        self.by_first = sorted(range(len(groups)), key=lambda i: groups[i][0])
        self.sizes = [len(groups[i]) for i in self.by_first]
        self.indexes = [HeadIndex(group) for group in groups]
        order = [head for group in groups for head in group]
        self.place = None if self.runs else HeadIndex(sorted(range(len(order)), key=order.__getitem__))

    @classmethod
    def of(cls, groups: tuple[tuple[int, ...], ...]) -> HeadSplit:
        """The split of ``groups``, made once (and afresh while torch.compile traces: a constant of the graph)."""
        if torch.compiler.is_compiling():
            return cls(groups)
        made = cls._made.get(groups)
        if made is None:
            if len(cls._made) >= 1024:  # (groupings chosen per call, e.g. by the data, must not grow it forever)
                cls._made.clear()
            made = cls._made[groups] = cls(groups)
        return made

    def index(self, i: int, device: torch.device) -> torch.Tensor:
        """Group ``i``'s head numbers as a LongTensor on ``device``."""
        return self.indexes[i].on(device)

    def part(self, tensor: torch.Tensor | None, dim: int, i: int) -> torch.Tensor | None:
        """Group ``i``'s heads of ``tensor`` along ``dim`` (``tensor`` itself where it is None or has size 1 there:
        it broadcasts)."""
        group = self.groups[i]
        if tensor is None or tensor.shape[dim] == 1:
            return tensor
        if not self.run[i]:
            return tensor.index_select(dim, self.index(i, tensor.device))
        return tensor if len(group) == tensor.shape[dim] else tensor.narrow(dim, group[0], len(group))

    def parts(self, tensor: torch.Tensor | None, dim: int) -> list:
        """Every group's heads of ``tensor`` along ``dim``, in the groups' order (``tensor`` itself for each where it
        is None or has size 1 there)."""
        if tensor is None or tensor.shape[dim] == 1:
            return [tensor] * len(self.groups)
        if not self.runs or len(self.groups) == 1:
            return [self.part(tensor, dim, i) for i in range(len(self.groups))]
        parts = [None] * len(self.groups)
        for i, part in zip(self.by_first, tensor.split_with_sizes(self.sizes, dim)):
            parts[i] = part
        return parts

    def join(self, parts: list[torch.Tensor], dim: int) -> torch.Tensor:
        """The groups' results (in the groups' order, each with its heads along ``dim``) as one, in head order."""
        if self.runs:
            return parts[0] if len(parts) == 1 else torch.cat([parts[i] for i in self.by_first], dim)
        joined = parts[0] if len(parts) == 1 else torch.cat(parts, dim)
        return joined.index_select(dim, self.place.on(joined.device))


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
    #: why the module's heads cannot be pruned with this method on it (None: they can); ``prune_heads`` then refuses
    #: the model with it, naming the module, before anything changes
    pruning_refused: str | None = None

    def init_weights(self, std: float) -> None:
        """Initialise the method's own ``nn.Parameter``s with transformers' initialisers (``hf_compat.init_normal_``,
        ``init_zeros_``, ``init_ones_``, which skip parameters loaded from a checkpoint); ``std`` is the model's
        ``init_std``."""

    def prune_heads(self, keep: torch.Tensor) -> None:
        """The module keeps only the heads ``keep`` (current numbers, sorted): drop per-head state of the others."""

    def before(self, call: AttentionCall) -> None:
        """Runs before the backend, on q/k/v (B, H, T or S, D) and the mask as transformers passes them (None, bool
        True = attend, or additive float with ``finfo.min``; a BlockMask on flex attention). Changes the attention
        with the call's hooks, which compose with the other methods': ``call.add_score_bias(bias, allowed=,
        heads=)`` (a bias or hard mask on some heads' scores, every backend), ``call.add_score_mod(score_mod)``
        (flex attention only), ``call.take_over(heads, attend)`` (computes those heads itself); or replaces
        ``call.attention_mask`` (or q/k/v). See :class:`AttentionCall`."""

    def after(self, call: AttentionCall, attn_output: torch.Tensor) -> torch.Tensor:
        """Runs after the backend on the per-head output (B, T, H, D), contiguous, every head's (the taken-over ones
        put back in place), scaled by the head mask; returns what ``out_proj`` receives. ``call.mask_tensor`` is then
        the mask with the score biases in it (refused on flex attention once a method added a raw ``score_mod``)."""
        return attn_output


AttentionInterface.register(ATTENTION_NAME, headattn_attention_forward)
