"""HeadAttn mBART and Marian models: the HF models with the methods attached to their attention modules.

Identical to the HF parents except:
* `__init__` routes the attention modules to our attention function and attaches the configured methods to the
  chosen ones (`hf_headattn.attention`), then prunes the heads `config.pruned_heads` names
  ([`hf_headattn.pruning`][hf_headattn.pruning]); with every method off nothing is attached and no head is pruned, and
  the model computes exactly what the HF model does (same modules and weights; the function calls the backend
  unchanged);
* it keeps head masks ([`set_head_mask`][hf_headattn.head_masks.set_head_mask],
[`hf_headattn.head_masks`][hf_headattn.head_masks]) and prunes heads ([`prune_heads`][hf_headattn.pruning.prune_heads]);
* `forward` creates a [`HeadAttnContext`][hf_headattn.context.HeadAttnContext], passes it (and the syntax inputs) down
with
  the keyword arguments transformers already forwards to every attention call, and returns the methods' terms and
  read-outs; the LM heads compute label-smoothed cross-entropy themselves and add the methods' terms to `loss`.
"""

# No `from __future__ import annotations`: HF's tooling reads `**kwargs: Unpack[TransformersKwargs]` from the
# signature (e.g. to know that the models can output attentions), which needs evaluated annotations.
import inspect
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn
from transformers import MarianModel, MarianMTModel, MBartForConditionalGeneration, MBartModel, PreTrainedModel
from transformers.modeling_outputs import Seq2SeqLMOutput, Seq2SeqModelOutput

from .attention import AttentionMethod, HeadAttnContext, attach_method, route
from .configuration import HeadAttnMarianConfig, HeadAttnMBartConfig
from .head_masks import ARGUMENTS as HEAD_MASK_ARGUMENTS
from .head_masks import ARGUMENTS_BY_COMPONENT as HEAD_MASK_ARGUMENTS_BY_COMPONENT
from .head_masks import check_forward_masks, check_head_mask, get_head_mask, set_head_mask
from .hf_compat import (
    MarianDecoder,
    MarianEncoder,
    MBartDecoder,
    MBartEncoder,
    cache_argument,
    dict_outputs,
    legacy_gradient_checkpointing,
    logits_bias,
    marian_shift_tokens_right,
    replace_stack,
    transformers_forward,
    zero3_partitioned,
)
from .losses import IGNORE_INDEX, label_smoothed_nll_loss, linear_label_smoothed_nll_loss, total_objective
from .pruning import apply_pruned_heads, modules_record, prune_heads
from .registry import method_inputs, readout_flags, registered_methods
from .sites import AttentionSite


def _method_output_fields(cls: type) -> type:
    """`cls` with one field per output field of the registered methods (`MethodSpec.outputs`), sorted by name,
    default None, each described in the docstring by its method's spec (applied before `@dataclass`; the built-in
    methods are registered by then, through the import of the configs). Fields of methods registered later are set
    as items (and so attributes) of the output (`with_method_fields`)."""
    descriptions = {name: text for spec in registered_methods() for name, text in spec.outputs.items()}
    for name in sorted(descriptions):
        cls.__annotations__[name] = torch.Tensor | dict | None
        setattr(cls, name, None)
    cls.__doc__ += "".join(f"\n    {name}: {descriptions[name]}." for name in sorted(descriptions))
    return cls


@dataclass
@_method_output_fields
class HeadAttnOutputMixin:
    """The registered methods' output fields, each `None` when its method is off or it was not asked for:"""


# The HF class comes last in the bases so that its fields come first: `outputs[0]` and `to_tuple()` start as HF's.
@dataclass
class HeadAttnSeq2SeqModelOutput(HeadAttnOutputMixin, Seq2SeqModelOutput):
    """`Seq2SeqModelOutput` plus the methods' fields."""


@dataclass
class HeadAttnSeq2SeqLMOutput(HeadAttnOutputMixin, Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` whose `loss` is the total objective, plus `nll_loss` (mean token NLL, unsmoothed)
    and the methods' fields."""

    nll_loss: torch.FloatTensor | None = None


def attach_methods(base_model: nn.Module, config, settings: dict, sides=("encoder", "decoder")) -> None:
    """Route every attention module of `sides` to our attention function (`route`), attach every
    method switched on (`settings`: {name: resolved settings}) to its modules, run the methods' `prepare_stack`
    on the stacks of the sides they are placed on, then prune the heads `config.pruned_heads` names
    ([`hf_headattn.pruning`][hf_headattn.pruning])."""
    for site in AttentionSite.in_model(base_model, sides):
        route(site.module(base_model), config, *site)
    for spec in registered_methods():
        if spec.name not in settings:
            continue
        for side, layer, kind in spec.placements(settings[spec.name], config):
            if side in sides:
                module = AttentionSite(side, layer, kind).module(base_model)
                attach_method(module, spec.name, spec.make(settings[spec.name], config, module))
    for spec in registered_methods():  # changes outside attention (MethodSpec.prepare_stack)
        if spec.name in settings and spec.prepare_stack is not None:
            placed = {side for side, _, _ in spec.placements(settings[spec.name], config)}
            for side in (side for side in sides if side in placed):
                spec.prepare_stack(settings[spec.name], config, side, getattr(base_model, side))
    for side in sides:
        apply_pruned_heads(getattr(base_model, side), config.pruned_heads or {})


def collect_method_outputs(context: HeadAttnContext, settings: dict) -> tuple[dict, torch.Tensor | None]:
    """Reduce what the attention calls recorded into output fields and the methods' (weighted) objective term."""
    fields, objective = {}, None
    for spec in registered_methods():
        if spec.name not in settings:
            continue
        method_fields, term = spec.collect(context, settings[spec.name])
        fields.update(method_fields)
        if term is not None:
            objective = term if objective is None else objective + term
    return fields, objective


def with_method_fields(output, fields: dict):
    """`output` with the methods' fields set (as items, so that fields no dataclass declares are kept too)."""
    for name, value in fields.items():
        output[name] = value
    return output


def _token_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """A (B, L) padding mask as bool; `None` for none, and for a 4-D (B, 1, T, S) attention mask (e.g. what
    `generate(..., cache_implementation="static")` passes as `decoder_attention_mask`), which is no per-token mask:
    the methods then read the padding from the mask each attention call gets."""
    return mask.bool() if mask is not None and mask.dim() == 2 else None


def forward_signature(cls, extra: tuple = ()) -> inspect.Signature:
    """The forward signature of the HF model `cls` derives from, as the installed transformers release defines it,
    plus the registered methods' inputs (default None) and read-out flags (default False), and `extra`.

    Nothing of HF's signature is restated here: `generate` and the Trainer read this one (`__signature__`), so
    they pass the methods' inputs on, and a release that renames an HF argument (5.24: `past_key_values` ->
    `cache`) needs no change here.
    """
    parameters = list(inspect.signature(transformers_forward(cls)).parameters.values())
    var_keyword = [p for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
    ours = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
            for names, default in ((method_inputs(), None), (readout_flags(), False),
                                   ((*HEAD_MASK_ARGUMENTS, *extra), None))
            for name in names]
    return inspect.Signature([p for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
                             + ours + var_keyword)


class _DerivedForwardSignature:
    """Gives each model class that defines `_headattn_forward` a `forward` of its own (unless it writes one)
    whose `__signature__` is `forward_signature`; it is recomputed when a model is built, so that methods
    registered after the class was made are named too. `_bind` reads the arguments by that signature."""

    forward_extra: tuple[str, ...] = ()
    _headattn_forward = None  # the models' forward body (HF's signature plus the methods'): set by the model classes

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if getattr(cls, "_headattn_forward", None) is None or not issubclass(cls, PreTrainedModel):
            return  # a mixin, or a stack (encoder/decoder: HF's forward)
        if "forward" not in cls.__dict__:
            def forward(self, *args, **kwargs):
                return self._headattn_forward(*args, **kwargs)

            forward.__doc__, forward.derived_signature = cls._headattn_forward.__doc__, True
            cls.forward = forward
        cls._refresh_forward_signature()

    @classmethod
    def _refresh_forward_signature(cls) -> None:
        cls._forward_signature = forward_signature(cls, cls.forward_extra)
        if getattr(cls.forward, "derived_signature", False):
            cls.forward.__signature__ = cls._forward_signature

    def _bind(self, args: tuple, kwargs: dict) -> dict:
        """The forward's arguments by name (those given), the HF ones and ours alike, with `**kwargs` merged in."""
        arguments = self._forward_signature.bind(self, *args, **kwargs).arguments
        arguments.pop("self")
        for parameter in self._forward_signature.parameters.values():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(arguments.pop(parameter.name, {}))
        return arguments


def check_length(config, name: str, positions: int) -> None:
    """A clear error, instead of an IndexError deep in the position embeddings, for an over-long sequence."""
    limit = config.max_position_embeddings
    if positions > limit:
        raise ValueError(
            f"The {name} sequence has {positions} positions, more than the model's max_position_embeddings={limit}; "
            f"truncate it (e.g. tokenizer(..., truncation=True, max_length={limit})) or generate fewer tokens"
        )


def check_encoder_inputs(encoder: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of the encoder: the source's length against the position embeddings, and the encoder's head
    mask (shape, batch, values) where the encoder runs outside the model's forward, which checks it already
    (`generate` runs the encoder directly)."""
    source = kwargs.get("input_ids", args[0] if args else None)
    source = kwargs.get("inputs_embeds") if source is None else source
    if source is not None:
        check_length(encoder.config, "source", source.shape[1])
    argument = HEAD_MASK_ARGUMENTS_BY_COMPONENT["encoder"]
    if kwargs.get(argument) is not None and kwargs.get("headattn_context") is None:
        check_head_mask(kwargs[argument], encoder.config, "encoder", argument,
                        batch=None if source is None else source.shape[0])


class HeadAttnPreTrainedMixin(_DerivedForwardSignature):
    """What the base model and the LM model share: method attachment, weight init, context creation."""

    # Trainer then passes `num_items_in_batch`, and the loss is normalised by it (see `losses.total_objective`).
    accepts_loss_kwargs = True

    def __init__(self, config):
        # transformers' backward-compatible `config.gradient_checkpointing=True`: HF's post_init (inside
        # super().__init__) switches checkpointing on for the stacks HF built (Marian's encoder deletes the flag before
        # its decoder is built) and deletes it; the stacks _attach_methods rebuilds would stay off
        legacy_checkpointing = legacy_gradient_checkpointing(config)
        super().__init__(config)
        # resolved and validated by the config when set; the model keeps the objects its methods are built with
        self.headattn_settings, self.headattn_pruned_heads = config.headattn_settings, config.pruned_heads
        self._attach_methods(config)
        if hasattr(self, "_forward_signature"):
            self._refresh_forward_signature()
            self.get_encoder().register_forward_pre_hook(check_encoder_inputs, with_kwargs=True)
        self.post_init()  # initialises the new method parameters (HF skips what is already initialised)
        if legacy_checkpointing and self.supports_gradient_checkpointing:
            self.activation_checkpointing_enable()  # every stack and layer, as the flag asks

    def _attach_methods(self, config) -> None:
        """Rebuild each encoder/decoder that carries methods or pruned heads as our stack class, which attaches its
        side's methods and prunes its heads; route the attention modules of the others (`attach_methods`).

        So `model.get_encoder()` (or `get_decoder()`) is a real `HeadAttnMBartEncoder` (...), and saved on its
        own it reloads with its methods' weights and shapes (the stock `MBartEncoder` would drop them). The stock
        stack HF built is replaced before any weight is loaded (`from_pretrained` builds on the meta device)."""
        base = self.base_model
        ours = {side for spec in registered_methods() if spec.name in self.headattn_settings
                for side, _, _ in spec.placements(self.headattn_settings[spec.name], config)}
        ours |= {name.split(".", 1)[0] for name in config.pruned_heads or {}}
        for side in sorted(ours):
            replace_stack(base, side, STACK_CLASSES[type(getattr(base, side))], config)
        attach_methods(base, config, {}, sides=tuple(side for side in ("encoder", "decoder") if side not in ours))

    def set_head_mask(self, component: str, mask: torch.Tensor | None) -> None:
        """Keep a (layers, heads) head mask of `component` ("encoder", "decoder", "cross") on the model, for every
        forward and `generate` (`None` removes it); see [`hf_headattn.head_masks`][hf_headattn.head_masks]."""
        set_head_mask(self, component, mask)

    def get_head_mask(self, component: str) -> torch.Tensor | None:
        """The (layers, heads) head mask of `component` kept on the model (0 at pruned heads), or `None`."""
        return get_head_mask(self, component)

    def prune_heads(self, heads: dict) -> dict:
        """Remove attention heads: `{module name: [original head numbers]}`, e.g.
        `{"encoder.layers.0.self_attn": [1, 5]}`; recorded in `config.pruned_heads` (see
        [`hf_headattn.pruning`][hf_headattn.pruning]). Returns the updated record."""
        record = prune_heads(self, heads)
        self.headattn_pruned_heads = self.config.pruned_heads
        return record

    def save_pretrained(self, save_directory, is_main_process=True, state_dict=None, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`; refused (a `ValueError`, nothing written) for a model whose weights
        DeepSpeed ZeRO-3 partitions, unless `state_dict` gives them whole: it would write empty tensors."""
        partitioned = zero3_partitioned(self) if state_dict is None else None
        if partitioned is not None:
            raise ValueError(
                f"save_pretrained: the model's weights are partitioned by DeepSpeed ZeRO-3 ({partitioned} holds only "
                "this process's shard), so it would save empty tensors; nothing was written. Save with "
                "trainer.save_model(output_dir), called on every process, with "
                "stage3_gather_16bit_weights_on_model_save: true in the DeepSpeed config (it gathers the weights), or "
                "pass the gathered weights: state_dict=trainer.accelerator.get_state_dict(trainer.model_wrapped), "
                "also called on every process")
        return super().save_pretrained(save_directory, is_main_process, state_dict, *args, **kwargs)

    def initialize_weights(self):
        """HF's initialisation, then the methods' parameters.

        The attention modules live in the inner HF model (e.g. a stock `MBartModel`), whose own `_init_weights`
        does not know the methods, so they are initialised here; HF's `initialization` functions skip parameters
        loaded from a checkpoint, so this initialises exactly the new (missing) ones.
        """
        super().initialize_weights()
        for module in self.modules():
            if isinstance(module, AttentionMethod):
                module.init_weights(self.config.init_std)

    def _check_settings_unchanged(self) -> None:
        """Refuse to run with method settings changed after the model was built (they would be silently ignored).

        The config re-resolves its settings whenever they are set (in-place edits are refused), so an unchanged
        config holds the very objects the model was built with."""
        pruned = self.config.pruned_heads
        if pruned is not self.headattn_pruned_heads:  # changed, or pruned through a part (of model.get_encoder())
            if (pruned or {}) != (self.headattn_pruned_heads or {}):
                held = modules_record(self)
                if (pruned or {}) != held:
                    raise ValueError(f"config.pruned_heads was changed after the model was built (to {pruned!r}, the "
                                     f"model's modules have {held!r} pruned); prune with model.prune_heads(...), which "
                                     "records them")
            self.headattn_pruned_heads = pruned
        current = self.config.headattn_settings
        if current is self.headattn_settings or current == self.headattn_settings:
            return
        name = next(spec.name for spec in registered_methods()
                    if current.get(spec.name) != self.headattn_settings.get(spec.name))
        raise ValueError(
            f"config.{name} was changed after the model was built (to {getattr(self.config, name, None)!r}); the "
            f"methods keep the settings they were built with. Build a new model with the new settings, e.g. "
            f"from_pretrained(path, {name}=...)"
        )

    def _check_lengths(self, values: dict) -> None:
        """The target's length (with the cache's) against the position embeddings; the source's is checked by the
        encoder's pre-hook (`check_encoder_inputs`), which `generate` passes too."""
        cache = cache_argument(values)
        target = values.get("decoder_input_ids")
        target = values.get("decoder_inputs_embeds") if target is None else target
        if target is not None:
            check_length(self.config, "target", target.shape[1] + (cache.get_seq_length() if cache is not None else 0))

    def _run_hf_forward(self, values: dict, target_mask, compute_losses: bool = True, base_only: bool = False) -> tuple:
        """Run the HF forward with the methods' inputs and a fresh
        [`HeadAttnContext`][hf_headattn.context.HeadAttnContext] passed down to every attention call; returns `(HF
        outputs, output fields of the methods, their weighted objective term or None,
        return_dict)`. `base_only`: run the base model (`self.model`) instead, without the LM head."""
        self._check_settings_unchanged()
        return_dict = values.pop("return_dict", None)
        self._check_lengths(values)
        flags = {flag for flag in readout_flags() if values.pop(flag, False)}
        context = HeadAttnContext(flags, _token_mask(values.get("attention_mask")), _token_mask(target_mask))
        context.compute_losses = compute_losses
        cache = cache_argument(values)
        past = 0 if cache is None else cache.get_seq_length()  # what HF's position embeddings add
        # (a static cache counts in a tensor it increments in place as the layers write: its value now, no sync)
        context.past_length = past.clone() if isinstance(past, torch.Tensor) else past
        for name in method_inputs():
            if values.get(name, ...) is None:
                del values[name]
        for argument in HEAD_MASK_ARGUMENTS:  # passed down to every attention call, checked once here
            if values.get(argument, ...) is None:
                del values[argument]
        check_forward_masks(values, self.config)
        with dict_outputs(self.config):
            outputs = (self.base_model if base_only else super().forward)(**values, headattn_context=context)
        fields, term = collect_method_outputs(context, self.headattn_settings)
        return outputs, fields, term, self.config.return_dict if return_dict is None else return_dict


class HeadAttnModelMixin(HeadAttnPreTrainedMixin):
    def _headattn_forward(self, *args, **kwargs) -> HeadAttnSeq2SeqModelOutput | tuple:
        """The HF forward (all of its arguments), plus the methods' inputs (e.g. SEA's `dependency_mask`,
        `phrase_positions`) and read-out flags (`output_head_importance`, `output_redundant_heads`).

        With `return_dict=False` (argument or config) a tuple, as from the HF model, followed by the methods'
        fields that are set.
        """
        values = self._bind(args, kwargs)
        outputs, fields, _, return_dict = self._run_hf_forward(values, values.get("decoder_attention_mask"))
        output = with_method_fields(HeadAttnSeq2SeqModelOutput(**outputs), fields)
        return output if return_dict else output.to_tuple()


class HeadAttnLMMixin(HeadAttnPreTrainedMixin):
    forward_extra = ("num_items_in_batch", "skip_logits")

    def _shift_labels(self, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _headattn_forward(self, *args, **kwargs) -> HeadAttnSeq2SeqLMOutput | tuple:
        """The HF forward (all of its arguments), plus the methods' inputs and read-out flags; `loss` is the total
        objective.

        `loss = label-smoothed NLL (config.label_smoothing) + the methods' weighted terms`, normalised by
        `num_items_in_batch` when the Trainer passes it (exact gradient accumulation and DDP, see
        [`hf_headattn.losses.total_objective`][hf_headattn.losses.total_objective]). With `return_dict=False` (argument
        or config) a tuple, as from the HF model, followed by the methods' fields and `nll_loss` that are set.

        `skip_logits` (Liger Kernel's convention): True computes the loss from the decoder's last hidden states
        and the output projection without the (B, T, V) logits
        ([`linear_label_smoothed_nll_loss`][hf_headattn.losses.linear_label_smoothed_nll_loss]; `logits` is then None;
        labels are required); False always returns the logits; None (default) skips them when training with labels and
        `config.loss_without_logits` is on.
        """
        values = self._bind(args, kwargs)
        labels, num_items_in_batch = values.pop("labels", None), values.pop("num_items_in_batch", None)
        skip_logits = self._skips_logits(values.pop("skip_logits", None), labels)
        target_mask = values.get("decoder_attention_mask")
        if labels is not None:
            values["use_cache"] = False
            if values.get("decoder_input_ids") is None and values.get("decoder_inputs_embeds") is None:
                values["decoder_input_ids"] = self._shift_labels(labels)
            if target_mask is None:
                target_mask = labels.ne(IGNORE_INDEX)
        # no loss terms in generate, nor in inference
        outputs, fields, method_term, return_dict = self._run_hf_forward(
            values, target_mask, compute_losses=labels is not None or torch.is_grad_enabled(), base_only=skip_logits
        )
        loss = nll_loss = None
        if labels is not None:
            if skip_logits:
                hidden = outputs.last_hidden_state
                weight, bias = self._output_projection()
                loss_sum, nll_sum, num_tokens = linear_label_smoothed_nll_loss(
                    hidden, weight, bias, labels.to(hidden.device), self.config.label_smoothing)
            else:
                loss_sum, nll_sum, num_tokens = label_smoothed_nll_loss(
                    outputs.logits, labels.to(outputs.logits.device), self.config.label_smoothing
                )
            nll_loss = nll_sum / num_tokens.clamp(min=1)
            loss = total_objective(loss_sum, num_tokens, method_term, num_items_in_batch)
        output = with_method_fields(HeadAttnSeq2SeqLMOutput(
            loss=loss, nll_loss=nll_loss, **{k: v for k, v in outputs.items() if k not in ("loss", "last_hidden_state")}
        ), fields)
        return output if return_dict else output.to_tuple()

    def _skips_logits(self, skip_logits: bool | None, labels: torch.Tensor | None) -> bool:
        """Whether this forward computes the loss without the logits (see `_headattn_forward`)."""
        if skip_logits is None:
            return (self.training and labels is not None and getattr(self.config, "loss_without_logits", False)
                    and self._output_projection() is not None)
        if skip_logits not in (True, False):
            raise ValueError(f"skip_logits must be True, False or None, got {skip_logits!r}")
        if skip_logits and labels is None:
            raise ValueError("skip_logits=True computes the loss without the logits and needs labels, got none; "
                             "pass labels, or skip_logits=False/None for the logits")
        if skip_logits and self._output_projection() is None:
            raise ValueError(f"skip_logits=True needs a plain nn.Linear output projection (its weight), got "
                             f"{type(self.get_output_embeddings()).__name__}; pass skip_logits=False/None")
        return skip_logits

    def _output_projection(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`(weight (V, d), bias (V,))` of `logits = lm_head(h) + final_logits_bias`, or None where the LM head
        is not a plain `nn.Linear` (e.g. wrapped by PEFT's LoRA or quantized), whose weight alone is not the
        projection: the loss then goes through the logits."""
        head = self.get_output_embeddings()
        if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
            return None
        bias = logits_bias(self).reshape(-1)
        return head.weight, bias if head.bias is None else bias + head.bias


class HeadAttnMBartModel(HeadAttnModelMixin, MBartModel):
    """`MBartModel` with the hf-headattn methods; identical to it with every method off."""

    config_class = HeadAttnMBartConfig


class HeadAttnMBartForConditionalGeneration(HeadAttnLMMixin, MBartForConditionalGeneration):
    """`MBartForConditionalGeneration` with the hf-headattn methods; identical to it with every method off.

    Loads stock mBART checkpoints: `HeadAttnMBartForConditionalGeneration.from_pretrained(
    "facebook/mbart-large-50", dhicm={"decoder_layers": [-1]})` (method settings as keyword arguments).
    """

    config_class = HeadAttnMBartConfig

    def _shift_labels(self, labels):
        """mBART's `shift_tokens_right`, except that a row without any target token (all -100, e.g. a target
        truncated away) becomes all padding instead of an IndexError (mBART indexes each row's last real token)."""
        pad = self.config.pad_token_id
        tokens = labels.masked_fill(labels == IGNORE_INDEX, pad)
        last = (tokens.ne(pad).sum(-1) - 1).clamp(min=0)  # (B,) the last real token (0 in a row without any)
        shifted = tokens.roll(1, dims=-1)  # no data-dependent branch: no host sync, no graph break
        shifted[:, 0] = tokens.gather(1, last[:, None]).squeeze(1)
        return shifted

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """What `DataCollatorForSeq2Seq` calls: the same shift as the forward's."""
        return self._shift_labels(labels)


class HeadAttnMarianModel(HeadAttnModelMixin, MarianModel):
    """`MarianModel` with the hf-headattn methods; identical to it with every method off."""

    config_class = HeadAttnMarianConfig


class HeadAttnMarianMTModel(HeadAttnLMMixin, MarianMTModel):
    """`MarianMTModel` with the hf-headattn methods; identical to it with every method off."""

    config_class = HeadAttnMarianConfig

    def _shift_labels(self, labels):
        return marian_shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


class HeadAttnStackMixin(HeadAttnPreTrainedMixin):
    """An encoder or decoder of our models on its own (what `get_encoder()`/`get_decoder()` return when it
    carries methods): built with its side's methods, so `type(encoder).from_pretrained` of a saved one keeps them."""

    headattn_side: str

    def _attach_methods(self, config) -> None:
        attach_methods(SimpleNamespace(**{self.headattn_side: self}), config, self.headattn_settings,
                       sides=(self.headattn_side,))


class HeadAttnMBartEncoder(HeadAttnStackMixin, MBartEncoder):
    config_class, headattn_side = HeadAttnMBartConfig, "encoder"


class HeadAttnMBartDecoder(HeadAttnStackMixin, MBartDecoder):
    config_class, headattn_side = HeadAttnMBartConfig, "decoder"


class HeadAttnMarianEncoder(HeadAttnStackMixin, MarianEncoder):
    config_class, headattn_side = HeadAttnMarianConfig, "encoder"


class HeadAttnMarianDecoder(HeadAttnStackMixin, MarianDecoder):
    config_class, headattn_side = HeadAttnMarianConfig, "decoder"


STACK_CLASSES = {
    MBartEncoder: HeadAttnMBartEncoder, MBartDecoder: HeadAttnMBartDecoder,
    MarianEncoder: HeadAttnMarianEncoder, MarianDecoder: HeadAttnMarianDecoder,
}
"""The stock stacks and the class each becomes when it carries methods."""
