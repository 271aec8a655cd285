"""Configs: the HF mBART/Marian configs plus the settings of the three methods (all off by default).

Type errors are caught by the HF configs' strict dataclass validation; range and consistency errors raise
``ValueError`` naming the field, the bad value and what was expected, when the config is built (and again when a
model is built from a config that was changed afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import MarianConfig, MBartConfig
from transformers.utils import logging

from .dhicm import METHOD as DHICM
from .eadra import METHOD as EADRA
from .sea import METHOD as SEA

logger = logging.get_logger(__name__)

#: Output fields that are training read-outs, not predictions: the Trainer leaves them out of ``logits``.
READOUT_FIELDS = ["nll_loss", "dhicm_kl", "dhicm_stats", "eadra_loss", "eadra_terms", "head_importances", "redundant_heads"]


@dataclass(kw_only=True)
class HeadAttnSettings:
    """Settings of the methods, shared by the mBART and Marian configs. Every method is off by default.

    Loss:
        label_smoothing: epsilon of label-smoothed cross-entropy, computed inside the model (so a Trainer never has
            to recompute the loss from logits and drop the methods' terms).
    DHICM (Goindani & Shrivastava 2021), see :mod:`hf_headattn.dhicm`:
        dhicm_encoder_layers / dhicm_decoder_layers: layer indices (negative counts from the end) or None (off).
        dhicm_dim: d_m of Eq. 2-3 (None: d_model). dhicm_dropout: dropout after Ux (Eq. 2).
        dhicm_kl_weight: lambda of Eq. 4-5. dhicm_kl_reduction: how the KL joins the per-token NLL, "per_batch"
            (lambda * KL / target tokens, fairseq's token-summed loss; the default, chosen by the fidelity study)
            or "per_token" (lambda * KL, release 0.1), see
            :func:`hf_headattn.dhicm.kl_objective_term`. dhicm_attention: which attention of a decoder layer ("self", "cross").
        dhicm_mode: "paper" (Eq. 3) or "scaled_out_proj" (our fine-tuning variant, keeps the pretrained out_proj).
    EaDRA (Araabi, Niculae & Monz), see :mod:`hf_headattn.eadra`:
        eadra: mapping from "encoder", "decoder", "cross" to component settings, or None (off).
    SEA + RHE (Zhang et al. 2021), see :mod:`hf_headattn.sea`:
        sea_type: None, "dea" or "lpea". sea_heads: "all" or "redundant" (RHE). sea_layers: encoder layer indices.
        rhe_prune: drop the redundant heads' outputs instead. lpea_max_relative_position: k of Eq. 7.
    """

    label_smoothing: float = 0.0
    dhicm_encoder_layers: list[int] | None = None
    dhicm_decoder_layers: list[int] | None = None
    dhicm_dim: int | None = None
    dhicm_dropout: float = 0.2
    dhicm_kl_weight: float = 0.1
    dhicm_kl_reduction: str = "per_batch"
    dhicm_attention: list[str] | None = None
    dhicm_mode: str = "paper"
    eadra: dict[str, Any] | None = None
    sea_type: str | None = None
    sea_heads: str = "redundant"
    sea_layers: list[int] | None = None
    rhe_prune: bool = False
    lpea_max_relative_position: int = 6

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        """Stock checkpoints (model_type "mbart"/"marian") load as ours: the type is renamed, with one log line."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == cls.stock_model_type:
            logger.info(f"Loading the stock {cls.stock_model_type!r} config of {pretrained_model_name_or_path} as {cls.__name__}")
            config_dict["model_type"] = cls.model_type
        elif config_dict.get("model_type", cls.model_type) != cls.model_type:
            raise ValueError(
                f"{pretrained_model_name_or_path} holds a {config_dict['model_type']!r} model; {cls.__name__} loads "
                f"{cls.stock_model_type!r} and {cls.model_type!r} checkpoints"
            )
        return config_dict, kwargs

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.check_headattn_settings()

    def check_headattn_settings(self) -> None:
        """Raise ``ValueError`` for a setting out of range; normalise what has a canonical form."""
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        for method in (DHICM, EADRA, SEA):
            method.check_settings(self)


@strict
class HeadAttnMBartConfig(HeadAttnSettings, MBartConfig):
    """``MBartConfig`` plus :class:`HeadAttnSettings`; loads every stock mBART config."""

    model_type = "headattn_mbart"
    stock_model_type = MBartConfig.model_type
    keys_to_ignore_at_inference = ["past_key_values", *READOUT_FIELDS]


@strict
class HeadAttnMarianConfig(HeadAttnSettings, MarianConfig):
    """``MarianConfig`` plus :class:`HeadAttnSettings`; loads every stock Marian config."""

    model_type = "headattn_marian"
    stock_model_type = MarianConfig.model_type
    keys_to_ignore_at_inference = ["past_key_values", *READOUT_FIELDS]
