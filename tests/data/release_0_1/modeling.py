"""HeadAttn mBART and Marian models: the HF models with the methods attached to their attention modules.

Identical to the HF parents except:
* ``__init__`` attaches the configured methods to the chosen attention modules (:mod:`hf_headattn.attention`); with
  every method off nothing is attached and the model *is* the HF model (same modules, weights, outputs);
* ``forward`` creates a :class:`~hf_headattn.attention.HeadAttnContext`, passes it (and the syntax inputs) down with
  the keyword arguments transformers already forwards to every attention call, and returns the methods' terms and
  read-outs; the LM heads compute label-smoothed cross-entropy themselves and add the methods' terms to ``loss``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import MarianModel, MarianMTModel, MBartForConditionalGeneration, MBartModel
from transformers.modeling_outputs import Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.models.marian.modeling_marian import shift_tokens_right as marian_shift_tokens_right
from transformers.models.mbart.modeling_mbart import shift_tokens_right as mbart_shift_tokens_right

from .attention import AttentionMethod, HeadAttnContext, attach_method
from .configuration import HeadAttnMarianConfig, HeadAttnMBartConfig
from .dhicm import METHOD as DHICM
from .eadra import METHOD as EADRA
from .losses import IGNORE_INDEX, label_smoothed_nll_loss, total_objective
from .sea import METHOD as SEA

#: Order matters: SEA changes the mask before the backend, EaDRA reads the probabilities, DHICM reweights the heads.
METHODS = (SEA, EADRA, DHICM)


@dataclass
class HeadAttnOutputMixin:
    """The methods' terms and read-outs (each ``None`` when its method is off or it was not asked for).

    dhicm_kl: mean KL of the head-importance distributions from uniform (DHICM Eq. 5), unweighted.
    eadra_loss: the weighted EaDRA regularizer (Eq. 9), included in ``loss``; eadra_terms: its unweighted terms.
    head_importances: {module name: (batch, tokens, heads) importance G}, with ``output_head_importance=True``.
    redundant_heads: {module name: (batch, heads) bool}, with ``output_redundant_heads=True``.
    """

    dhicm_kl: torch.FloatTensor | None = None
    eadra_loss: torch.FloatTensor | None = None
    eadra_terms: dict[str, torch.FloatTensor] | None = None
    head_importances: dict[str, torch.FloatTensor] | None = None
    redundant_heads: dict[str, torch.BoolTensor] | None = None


@dataclass
class HeadAttnSeq2SeqModelOutput(Seq2SeqModelOutput, HeadAttnOutputMixin):
    """``Seq2SeqModelOutput`` plus the methods' fields."""


@dataclass
class HeadAttnSeq2SeqLMOutput(Seq2SeqLMOutput, HeadAttnOutputMixin):
    """``Seq2SeqLMOutput`` whose ``loss`` is the total objective, plus ``nll_loss`` (mean token NLL, unsmoothed)
    and the methods' fields."""

    nll_loss: torch.FloatTensor | None = None


def attention_module(base_model: nn.Module, side: str, layer: int, kind: str) -> nn.Module:
    """The attention module of ``side`` ("encoder"/"decoder"), ``layer`` and ``kind`` ("self"/"cross")."""
    block = getattr(base_model, side).layers[layer]
    return block.encoder_attn if kind == "cross" else block.self_attn


def attach_methods(base_model: nn.Module, config) -> None:
    """Attach every configured method to its attention modules (nothing when every method is off)."""
    for method in METHODS:
        for side, layer, kind in method.placements(config):
            module = attention_module(base_model, side, layer, kind)
            module.headattn_kind, module.headattn_side = kind, side
            module.headattn_name = f"{side}.layers.{layer}.{'encoder_attn' if kind == 'cross' else 'self_attn'}"
            attach_method(module, method.name, method.build(config, module), config)


def collect_method_outputs(context: HeadAttnContext, config) -> tuple[dict, torch.Tensor | None]:
    """Reduce what the attention calls recorded into output fields and the methods' (weighted) objective term."""
    fields, objective = {}, None
    for method in METHODS:
        method_fields, term = method.collect(context, config)
        fields.update(method_fields)
        if term is not None:
            objective = term if objective is None else objective + term
    return fields, objective


class HeadAttnPreTrainedMixin:
    """What the base model and the LM model share: method attachment, weight init, context creation."""

    # Trainer then passes `num_items_in_batch`, and the loss is normalised by it (see `losses.total_objective`).
    accepts_loss_kwargs = True

    def __init__(self, config):
        super().__init__(config)
        config.check_headattn_settings()  # the config may have been changed after it was built
        attach_methods(self.base_model, config)
        self.post_init()  # initialises the new method parameters (HF skips what is already initialised)

    def initialize_weights(self):
        """HF's initialisation, then the methods' parameters.

        The attention modules live in the inner HF model (e.g. a stock ``MBartModel``), whose own ``_init_weights``
        does not know the methods, so they are initialised here; HF's ``initialization`` functions skip parameters
        loaded from a checkpoint, so this initialises exactly the new (missing) ones.
        """
        super().initialize_weights()
        for module in self.modules():
            if isinstance(module, AttentionMethod):
                module.init_weights(self.config.init_std)

    def _check_lengths(self, input_ids, inputs_embeds, decoder_input_ids, decoder_inputs_embeds, past_key_values):
        """A clear error, instead of an IndexError deep in the position embeddings, for over-long inputs."""
        limit = self.config.max_position_embeddings
        source = input_ids if input_ids is not None else inputs_embeds
        target = decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        for name, tensor, offset in (("source", source, 0), ("target", target, past)):
            if tensor is not None and tensor.shape[1] + offset > limit:
                raise ValueError(
                    f"The {name} sequence has {tensor.shape[1] + offset} positions, more than the model's "
                    f"max_position_embeddings={limit}; truncate it (e.g. tokenizer(..., truncation=True, "
                    f"max_length={limit})) or generate fewer tokens"
                )

    def _headattn_kwargs(
        self, kwargs, dependency_mask, phrase_positions, output_head_importance, output_redundant_heads,
        source_mask=None, target_mask=None,
    ):
        context = HeadAttnContext(
            bool(output_head_importance), bool(output_redundant_heads),
            None if source_mask is None else source_mask.bool(), None if target_mask is None else target_mask.bool(),
        )
        kwargs["headattn_context"] = context
        if dependency_mask is not None:
            kwargs["dependency_mask"] = dependency_mask
        if phrase_positions is not None:
            kwargs["phrase_positions"] = phrase_positions
        return context


class HeadAttnModelMixin(HeadAttnPreTrainedMixin):
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        past_key_values=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        use_cache=None,
        dependency_mask=None,
        phrase_positions=None,
        output_head_importance=False,
        output_redundant_heads=False,
        **kwargs,
    ) -> HeadAttnSeq2SeqModelOutput:
        """The HF forward, plus ``dependency_mask``/``phrase_positions`` (SEA inputs) and the read-out flags."""
        kwargs.pop("return_dict", None)
        self._check_lengths(input_ids, inputs_embeds, decoder_input_ids, decoder_inputs_embeds, past_key_values)
        context = self._headattn_kwargs(
            kwargs, dependency_mask, phrase_positions, output_head_importance, output_redundant_heads,
            attention_mask, decoder_attention_mask,
        )
        outputs = super().forward(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
            past_key_values=past_key_values, inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache, **kwargs,
        )
        fields, _ = collect_method_outputs(context, self.config)
        return HeadAttnSeq2SeqModelOutput(**outputs, **fields)


class HeadAttnLMMixin(HeadAttnPreTrainedMixin):
    def _shift_labels(self, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        past_key_values=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        labels=None,
        use_cache=None,
        dependency_mask=None,
        phrase_positions=None,
        output_head_importance=False,
        output_redundant_heads=False,
        num_items_in_batch=None,
        **kwargs,
    ) -> HeadAttnSeq2SeqLMOutput:
        """The HF forward, plus the SEA inputs and read-out flags; ``loss`` is the total objective.

        ``loss = label-smoothed NLL (config.label_smoothing) + the methods' weighted terms``, normalised by
        ``num_items_in_batch`` when the Trainer passes it (exact gradient accumulation and DDP, see
        :func:`hf_headattn.losses.total_objective`).
        """
        return_dict = kwargs.pop("return_dict", None)
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self._shift_labels(labels)
        self._check_lengths(input_ids, inputs_embeds, decoder_input_ids, decoder_inputs_embeds, past_key_values)
        if decoder_attention_mask is None and labels is not None:
            target_mask = labels.ne(IGNORE_INDEX)
        else:
            target_mask = decoder_attention_mask
        context = self._headattn_kwargs(
            kwargs, dependency_mask, phrase_positions, output_head_importance, output_redundant_heads,
            attention_mask, target_mask,
        )
        outputs = super().forward(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
            past_key_values=past_key_values, inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache, **kwargs,
        )
        fields, method_term = collect_method_outputs(context, self.config)
        loss = nll_loss = None
        if labels is not None:
            loss_sum, nll_sum, num_tokens = label_smoothed_nll_loss(
                outputs.logits, labels.to(outputs.logits.device), self.config.label_smoothing
            )
            nll_loss = nll_sum / num_tokens.clamp(min=1)
            loss = total_objective(loss_sum, num_tokens, method_term, num_items_in_batch)
        output = HeadAttnSeq2SeqLMOutput(
            loss=loss, nll_loss=nll_loss, **{k: v for k, v in outputs.items() if k != "loss"}, **fields
        )
        return output.to_tuple() if return_dict is False else output


class HeadAttnMBartModel(HeadAttnModelMixin, MBartModel):
    """``MBartModel`` with the hf-headattn methods; identical to it with every method off."""

    config_class = HeadAttnMBartConfig


class HeadAttnMBartForConditionalGeneration(HeadAttnLMMixin, MBartForConditionalGeneration):
    """``MBartForConditionalGeneration`` with the hf-headattn methods; identical to it with every method off.

    Loads stock mBART checkpoints: ``HeadAttnMBartForConditionalGeneration.from_pretrained(
    "facebook/mbart-large-50", dhicm_decoder_layers=[-1])`` (method settings as keyword arguments).
    """

    config_class = HeadAttnMBartConfig

    def _shift_labels(self, labels):
        return mbart_shift_tokens_right(labels, self.config.pad_token_id)


class HeadAttnMarianModel(HeadAttnModelMixin, MarianModel):
    """``MarianModel`` with the hf-headattn methods; identical to it with every method off."""

    config_class = HeadAttnMarianConfig


class HeadAttnMarianMTModel(HeadAttnLMMixin, MarianMTModel):
    """``MarianMTModel`` with the hf-headattn methods; identical to it with every method off."""

    config_class = HeadAttnMarianConfig

    def _shift_labels(self, labels):
        return marian_shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
