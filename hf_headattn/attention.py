"""How the methods reach the attention modules of mBART and Marian.

The HF attention modules (`MBartAttention`, `MarianAttention`: the same code) compute q/k/v, call the attention
function registered under `config._attn_implementation` and apply `out_proj`. We keep that forward untouched and
hook in at the one place transformers 5 designed for it, the attention registry:

* an attention module that carries a method keeps its HF class and `forward`; it gets a forward pre-hook that hands
  its query-side input on to the attention function as a keyword (as peft hands on its adapter arguments), and a
  small stand-in for its `config` whose `_attn_implementation` is `ATTENTION_NAME` (every other attribute
  reads through to the model config). Every other module is left exactly as HF built it (so with every method off,
  nothing changes), and the model config keeps the backend the user chose: `model.config._attn_implementation`
  still reads `"sdpa"`/`"eager"`, `set_attn_implementation` switches the backend under the methods, and
  `config.output_attentions` and HF's own attention tests work as on the stock model (a model-wide registered name
  would break all three);
* that function runs the methods attached to the module around the backend the *model* is configured with (SDPA,
  eager or flex attention, `hf_headattn.flex`; others are refused, and a method may refuse one: `backends`):
  `before` may add a bias or hard mask to some heads' scores (SEA;
  [`AttentionCall.add_score_bias`][hf_headattn.attention_call.AttentionCall.add_score_bias], made into the backend's
  mask or flex `score_mod` by `hf_headattn.scores`) or take over some heads' attention
  ([`AttentionCall.take_over`][hf_headattn.attention_call.AttentionCall.take_over]), the backend computes the output of
  the other heads, `after` may read q/k (EaDRA recomputes probabilities only for its heads) and transform the per-head
  output (DHICM). Two methods' changes compose; a combination that cannot is refused, naming both.

Per-forward state (loss terms, read-outs) travels in a [`HeadAttnContext`][hf_headattn.context.HeadAttnContext] passed
as the `headattn_context` keyword, which transformers forwards from the model to every attention call.

This module is the routing (`route`, `attach_method`, the attention function and how it runs the backend
and the methods' hooks). The rest lives in modules of one concern each, whose public names are re-exported here:
`context` (the per-forward context), `attention_call` ([`AttentionCall`][hf_headattn.attention_call.AttentionCall]
and its hooks), `head_split` (head numbers on a device, cutting and joining heads),
`positions` (the query and key positions of a call), `probabilities` (scores ->
mask -> softmax, for every method that needs probabilities, and the head-mixing path), `scores`
(score biases made into each backend's mask or `score_mod`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface

from .attention_call import Attend, AttentionCall, key_allowed
from .biased_attention import biased_sdpa
from .context import HeadAttnContext
from .flex import FLEX, flex_attention_with
from .head_masks import module_head_mask, scale_heads, scale_weights
from .head_split import HeadIndex, HeadSplit, constant
from .hf_compat import (
    ALL_ATTENTION_FUNCTIONS,
    ConfigStandIn,
    attention_implementation,
    attention_query_input,
    eager_attention_forward,
)
from .probabilities import mixed_attention
from .scores import ScoreBias, on_heads
from .sites import AttentionSite

__all__ = [
    "ATTENTION_NAME", "SUPPORTED_BACKENDS", "Attend", "AttentionCall", "AttentionMethod", "HeadAttnContext",
    "HeadIndex", "HeadSplit", "attach_method", "backend_on_heads", "check_loss_terms_get_gradients", "constant",
    "headattn_attention_forward", "key_allowed", "route", "run_attention", "run_mixed",
]
"""Re-exported: the names other modules (and plug-ins, through [`hf_headattn.plugin`][hf_headattn.plugin]) import from
here."""

ATTENTION_NAME = f"headattn:{__name__}"
"""The registry name of our attention function, unique to this copy of the code: a checkpoint loaded with
`trust_remote_code` brings its own copy of this module, which registers its own function under its own name, so
loading it never changes the function that models built from another copy run."""
SUPPORTED_BACKENDS = ("sdpa", "eager", FLEX)
"""The model backends the methods run around (tested); others are refused with an error naming these."""


def check_loss_terms_get_gradients(module: nn.Module, context: HeadAttnContext | None, methods) -> None:
    """Refuse an attention call that would record loss terms without gradients: the model's forward records
    gradients but this layer runs without, as under reentrant gradient checkpointing
    (`activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})`, and `{}` where
    torch defaults to it). Its recomputation in the backward pass comes too late for the loss, so `dhicm_kl` and
    `eadra_loss` would silently get no gradient."""
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
    """The `config` of a routed attention module: it reads its attention function from `ATTENTION_NAME`."""


def _pass_query_input(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook of an attention module that carries a method: hand its query-side input
    (`hidden_states`, HF's first parameter) on to the attention function as `headattn_hidden_states`.

    HF's attention `forward` passes its `**kwargs` on to the attention function, as peft passes its adapter
    arguments; so nothing of HF's signature is restated here beyond the name and place of that first parameter.
    """
    return args, {**kwargs, "headattn_hidden_states": attention_query_input(args, kwargs)}


def route(module: nn.Module, model_config, side: str, layer: int, kind: str) -> None:
    """Route an HF attention module's calls to `ATTENTION_NAME` (a `ConfigStandIn` for its
    `config`), and tag it:
    `headattn_side` ("encoder"/"decoder"), `headattn_layer`, `headattn_kind` ("self"/"cross"),
    `headattn_name` (its path in the base model), the buffer `headattn_head_mask` (the mask kept on the model,
    [`hf_headattn.head_masks`][hf_headattn.head_masks]) and `headattn_heads` (its heads' original numbers once pruned, a
    [`HeadIndex`][hf_headattn.head_split.HeadIndex], [`hf_headattn.pruning`][hf_headattn.pruning]), both `None` at
    first. Every attention module of an hf-headattn model is routed: without a method or a head mask, the function calls
    the backend unchanged. Idempotent."""
    if isinstance(module.config, ConfigStandIn):
        return
    module.headattn_side, module.headattn_layer, module.headattn_kind = side, layer, kind
    module.headattn_name = AttentionSite(side, layer, kind).name
    module.headattn_methods = ()
    module.register_buffer("headattn_head_mask", None, persistent=False)
    module.headattn_heads = None  # a HeadIndex once pruned
    module.config = _RoutedConfig(model_config)


def attach_method(module: nn.Module, name: str, method: nn.Module) -> None:
    """Attach `method` (an `nn.Module` with `before`/`after` hooks) to a routed HF attention module as
    `name`.

    Its parameters appear under `<module path>.<name>.*` (e.g. `...self_attn.dhicm.w`), so they are saved, loaded
    and selected for optimizer groups or PEFT by name. The module keeps its HF class and `forward`; the first method
    attached adds the pre-hook `_pass_query_input`.
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
    """The attention function registered as `ATTENTION_NAME`: the model's backend, with the module's head mask
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
    """The call's attention after the methods' `before` hooks: the backend with their score changes on the heads
    no method took over, each taken-over group of heads by its method's `attend`, put back in head order. Without
    a taken-over head this is the backend alone (its mask unchanged where no method changed the scores).

    The heads are cut and joined as `HeadSplit` plans it: where every group is a run of consecutive heads in
    ascending order (e.g. heads 0-1 taken over, 2-3 the backend's), q/k/v are split into views and the outputs only
    concatenated in the order of their first heads; other groups are gathered with index tensors made once. Once a
    method mixed heads, every head runs on the mixing path instead (`run_mixed`)."""
    if call._mixes:
        return run_mixed(call, dropout)
    if not call._taken:
        return backend_on_heads(call, backend, None, dropout)
    num_heads = call.query.shape[1]
    taken = {head for _, numbers, _ in call._taken for head in numbers}
    rest = tuple(head for head in range(num_heads) if head not in taken)
    split = HeadSplit.of(((rest,) if rest else ()) + tuple(numbers for _, numbers, _ in call._taken))
    queries, keys, values = split.parts_of((call.query, call.key, call.value), 1)
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


def run_mixed(call: AttentionCall, dropout: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The call's attention once a method mixed heads
    ([`AttentionCall.mix_scores`][hf_headattn.attention_call.AttentionCall.mix_scores] / `mix_weights`): every head on
    the mixing path (`mixed_attention`), the score biases and the mask in one tensor on the mixed scores. Heads taken
    over, or a raw flex `score_mod` (no tensor form), beside a mixing are refused."""
    mixers = ", ".join(repr(name) for name in dict.fromkeys(owner for _, owner, _ in call._mixes))
    if call._taken:
        raise ValueError(f"{call.module.headattn_name}: {mixers} mixes the heads, which needs every head's scores, "
                         f"and {call._owners_of_taken()} takes over heads; expected the two on different layers")
    if any(not isinstance(change, ScoreBias) for change in call._scores):
        raise ValueError(f"{call.module.headattn_name}: {mixers} mixes the heads, and a flex score_mod from "
                         f"{call._owners(call._scores)} has no tensor form to apply to the mixed scores; expected "
                         "call.add_score_bias(...) for such a combination")
    mask = call._biased_mask(boolean=False)  # None or (B or 1, 1 or H, T, S), causality explicit
    return mixed_attention(call.module, call.query, call.key, call.value, mask, call.scaling, dropout,
                           call.head_mix("scores"), call.head_mix("weights"))


def backend_on_heads(call: AttentionCall, backend, split: HeadSplit | None, dropout: float, qkv=None):
    """The backend with the methods' score changes (SDPA/eager with the mask made for them,
    `AttentionCall._backend_mask`; flex attention with their `score_mod`): on every head (`split` None), or
    on the first group of `split` (the heads no method took over), whose q/k/v are `qkv`."""
    query, key, value = (call.query, call.key, call.value) if qkv is None else qkv
    if call.is_flex:
        score_mod = call._flex_score_mod()
        if score_mod is not None:
            score_mod = score_mod if split is None else on_heads(score_mod, split.index(0, query.device))
            return flex_attention_with(call.module, query, key, value, call.attention_mask, score_mod, call.scaling,
                                       dropout)
        mask = call.attention_mask
    else:
        fast = call._trainable_bias(dropout) if split is None else None
        if fast is not None:  # one trainable bias on every head (CPU): SDPA's kernel forward, the backward recomputing
            bias, allowed, masked = fast
            output = biased_sdpa(query, key, value, bias, allowed, call.scaling, masked)
            return output.transpose(1, 2).contiguous(), None
        mask = call._backend_mask()
        if split is not None and mask is not None and mask.dim() == 4:
            mask = split.part(mask, 1, 0)
    return backend(call.module, query, key, value, mask, dropout=dropout, scaling=call.scaling, **call.kwargs)



class AttentionMethod(nn.Module):
    """Base class of a method attached to an attention module: both hooks do nothing by default.

    `records_loss_terms`: whether the method records terms of the training objective (they need gradients).
    `out_proj_per_head`: whether the module's `out_proj` still reads the concatenated heads (pruning then takes
    its columns of the pruned heads). `backends`: the model backends the method runs on (a call on another is
    refused with an error naming them); on flex attention `call.attention_mask` is a BlockMask, which
    `call.mask_tensor` gives as a tensor.

    Head masks and pruning ([`hf_headattn.head_masks`][hf_headattn.head_masks],
    [`hf_headattn.pruning`][hf_headattn.pruning]): `after` gets the per-head output already scaled by the call's
    `head_mask`; a method that mixes heads or keeps per-head state treats a head masked with 0 as pruned (so that
    pruning it gives the same outputs and loss), and [`prune_heads`][hf_headattn.attention.AttentionMethod.prune_heads]
    drops the per-head state of pruned heads.
    """

    records_loss_terms = False
    backends = SUPPORTED_BACKENDS
    out_proj_per_head = True
    pruning_refused: str | None = None
    """why the module's heads cannot be pruned with this method on it (None: they can); `prune_heads` then refuses
    the model with it, naming the module, before anything changes"""

    def init_weights(self, std: float) -> None:
        """Initialise the method's own `nn.Parameter`s with transformers' initialisers (`hf_compat.init_normal_`,
        `init_zeros_`, `init_ones_`, which skip parameters loaded from a checkpoint); `std` is the model's
        `init_std`."""

    def prune_heads(self, keep: torch.Tensor) -> None:
        """The module keeps only the heads `keep` (current numbers, sorted): drop per-head state of the others."""

    def before(self, call: AttentionCall) -> None:
        """Runs before the backend, on q/k/v (B, H, T or S, D) and the mask as transformers passes them (None, bool
        True = attend, or additive float with `finfo.min`; a BlockMask on flex attention). Changes the attention
        with the call's hooks, which compose with the other methods': `call.add_score_bias(bias, allowed=,
        heads=)` (a bias or hard mask on some heads' scores, every backend), `call.add_score_mod(score_mod)`
        (flex attention only), `call.take_over(heads, attend)` (computes those heads itself),
        `call.mix_scores(matrix)` / `call.mix_weights(matrix)` (mixes the heads before / after the softmax); or
        replaces `call.attention_mask` (or q/k/v). `call.query_positions` / `key_positions` /
        `relative_positions` give the tokens' positions (right under a cache). See
        [`AttentionCall`][hf_headattn.attention_call.AttentionCall]."""

    def after(self, call: AttentionCall, attn_output: torch.Tensor) -> torch.Tensor:
        """Runs after the backend on the per-head output (B, T, H, D), contiguous, every head's (the taken-over ones
        put back in place), scaled by the head mask; returns what `out_proj` receives. `call.mask_tensor` is then
        the mask with the score biases in it (refused on flex attention once a method added a raw `score_mod`)."""
        return attn_output


AttentionInterface.register(ATTENTION_NAME, headattn_attention_forward)
