"""EaDRA: entropy- and distance-regularized attention (Araabi, Niculae & Monz, §3, Eq. 1-9)."""

from __future__ import annotations

from .settings import check_range, resolve_layers

NAME = "eadra"
COMPONENTS = ("encoder", "decoder", "cross")
#: Table 6, WMT En-De (100k) rows; alpha_peak 0 because "alpha_dist appears to render alpha_peak redundant"
#: (Appendix A). num_heads None = three quarters of the heads (6 of 8 from scratch, §5.3); layers None = all.
DEFAULTS = {
    "encoder": {"alpha_peak": 0.0, "alpha_sent": 0.8, "alpha_dist": 0.02, "num_heads": None, "layers": None},
    "decoder": {"alpha_peak": 0.0, "alpha_sent": 0.8, "alpha_dist": 2.0, "num_heads": None, "layers": None},
    "cross": {"alpha_peak": 0.0, "alpha_sent": 8.0, "alpha_dist": 0.1, "num_heads": None, "layers": None},
}


def _shape(config, component: str) -> tuple[int, int]:
    if component == "encoder":
        return config.encoder_layers, config.encoder_attention_heads
    return config.decoder_layers, config.decoder_attention_heads


def component_settings(config, component: str) -> dict:
    """The settings of one component with defaults filled in, ``num_heads`` and ``layers`` resolved."""
    settings = {**DEFAULTS[component], **config.eadra[component]}
    num_layers, heads = _shape(config, component)
    if settings["num_heads"] is None:
        settings["num_heads"] = max(1, round(0.75 * heads))
    layers = range(num_layers) if settings["layers"] is None else settings["layers"]
    settings["layers"] = resolve_layers(layers, num_layers, f"eadra[{component!r}]['layers']")
    return settings


def check_settings(config) -> None:
    if config.eadra is None:
        return
    if not isinstance(config.eadra, dict) or not config.eadra:
        raise ValueError(f"eadra must map some of {COMPONENTS} to settings (or be None), got {config.eadra!r}")
    for component, settings in config.eadra.items():
        if component not in COMPONENTS:
            raise ValueError(f"eadra has unknown component {component!r}; expected some of {COMPONENTS}")
        if not isinstance(settings, dict):
            raise ValueError(f"eadra[{component!r}] must be a dict of settings, got {settings!r}")
        unknown = set(settings) - set(DEFAULTS[component])
        if unknown:
            raise ValueError(
                f"eadra[{component!r}] has unknown settings {sorted(unknown)}; expected some of {sorted(DEFAULTS[component])}"
            )
        resolved = component_settings(config, component)
        for alpha in ("alpha_peak", "alpha_sent", "alpha_dist"):
            check_range(resolved[alpha], f"eadra[{component!r}][{alpha!r}]", 0.0)
        heads = _shape(config, component)[1]
        num_heads = resolved["num_heads"]
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or not 1 <= num_heads <= heads:
            raise ValueError(
                f"eadra[{component!r}]['num_heads'] must be an integer in [1, {heads}] (the model's heads), "
                f"got {num_heads!r}"
            )


def placements(config) -> list[tuple[str, int, str]]:
    where = []
    for component in config.eadra or {}:
        side, kind = ("encoder", "self") if component == "encoder" else ("decoder", "cross" if component == "cross" else "self")
        where += [(side, layer, kind) for layer in component_settings(config, component)["layers"]]
    return where


def build(config, module):
    raise NotImplementedError(f"{NAME} is not implemented yet")


def collect(context, config):
    return {}, None
