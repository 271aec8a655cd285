"""SEA + RHE: syntax-enhanced attention on redundant heads (Zhang et al. 2021, §3.0.2, §4, Eq. 3-10)."""

from __future__ import annotations

from .settings import check_choice, resolve_layers

NAME = "sea"
SEA_TYPES = (None, "dea", "lpea")
SEA_HEADS = ("all", "redundant")


def layers(config) -> list[int]:
    """The enhanced encoder layers: ``sea_layers``, by default the first (Appendix A.2)."""
    return resolve_layers([0] if config.sea_layers is None else config.sea_layers, config.encoder_layers, "sea_layers")


def check_settings(config) -> None:
    check_choice(config.sea_type, "sea_type", SEA_TYPES)
    check_choice(config.sea_heads, "sea_heads", SEA_HEADS)
    layers(config)
    if config.rhe_prune and config.sea_type is not None:
        raise ValueError(
            f"rhe_prune=True drops the redundant heads, so it cannot also enhance them with sea_type="
            f"{config.sea_type!r}; set sea_type=None for RHE pruning"
        )
    k = config.lpea_max_relative_position
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"lpea_max_relative_position must be a positive integer, got {k!r}")


def enabled(config) -> bool:
    return config.sea_type is not None or config.rhe_prune


def placements(config) -> list[tuple[str, int, str]]:
    return [("encoder", layer, "self") for layer in layers(config)] if enabled(config) else []


def build(config, module):
    raise NotImplementedError(f"{NAME} is not implemented yet")


def collect(context, config):
    return {}, None
