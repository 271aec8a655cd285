"""DHICM: dynamic head importance computation (Goindani & Shrivastava 2021, §3.1, Eq. 1-5)."""

from __future__ import annotations

from .settings import check_choice, check_range, resolve_layers

NAME = "dhicm"
ATTENTIONS = ("self", "cross")
MODES = ("paper", "scaled_out_proj")


def check_settings(config) -> None:
    resolve_layers(config.dhicm_encoder_layers, config.encoder_layers, "dhicm_encoder_layers")
    resolve_layers(config.dhicm_decoder_layers, config.decoder_layers, "dhicm_decoder_layers")
    if config.dhicm_dim is not None and config.dhicm_dim <= 0:
        raise ValueError(f"dhicm_dim must be a positive integer (or None for d_model), got {config.dhicm_dim!r}")
    check_range(config.dhicm_dropout, "dhicm_dropout", 0.0, 1.0, high_open=True)
    check_range(config.dhicm_kl_weight, "dhicm_kl_weight", 0.0)
    for kind in config.dhicm_attention or ():
        check_choice(kind, "dhicm_attention entries", ATTENTIONS)
    if config.dhicm_attention is not None and not config.dhicm_attention:
        raise ValueError(f"dhicm_attention must name at least one of {ATTENTIONS} (or be None for both), got []")
    check_choice(config.dhicm_mode, "dhicm_mode", MODES)


def placements(config) -> list[tuple[str, int, str]]:
    kinds = config.dhicm_attention or ATTENTIONS
    where = [("encoder", i, "self") for i in resolve_layers(config.dhicm_encoder_layers, config.encoder_layers, "")]
    for i in resolve_layers(config.dhicm_decoder_layers, config.decoder_layers, ""):
        where += [("decoder", i, kind) for kind in kinds]
    return where


def build(config, module):
    raise NotImplementedError("DHICM is not implemented yet")


def collect(context, config):
    return {}, None
