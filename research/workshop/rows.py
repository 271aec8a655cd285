"""The studies' rows: a method's settings with every field a study varies, or a later default change could move,
written out, so that a row trains the same model whatever the running release's defaults are. Each method's
constants come from its kit (``hf_headattn/methods/<name>/``) and its core module."""

from __future__ import annotations

from hf_headattn.methods.dhicm.core import NAME as DHICM
from hf_headattn.methods.dhicm.kit import LAYERS as DHICM_LAYERS
from hf_headattn.methods.eadra.core import DEFAULTS as EADRA_ALPHAS
from hf_headattn.methods.eadra.core import NAME as EADRA
from hf_headattn.methods.sea.core import NAME as SEA

#: The components the EaDRA rows regularize (the ``eadra`` recipe name's): encoder and decoder self-attention.
EADRA_COMPONENTS = ("encoder", "decoder")


def dhicm_row(reduction: str, weight: float, mode: str = "paper") -> dict:
    """DHICM on the last encoder and the last decoder layer (§4.3), the KL joined by ``reduction`` with weight
    ``weight``, in ``mode``."""
    return {DHICM: {**DHICM_LAYERS, "kl_reduction": reduction, "kl_weight": weight, "mode": mode}}


def eadra_row(dist: str, *, warmup: int = 0, scale: float = 1.0, alpha_scale: float = 1.0) -> dict:
    """EaDRA on encoder and decoder self-attention with Table 6's WMT En-De (100k) alphas (``eadra.DEFAULTS``;
    alpha_peak 0) times ``scale``, written out, and the ``alpha_scale`` option (every alpha's factor in the model)
    explicit."""
    components = {name: {"alpha_peak": 0.0, "alpha_sent": EADRA_ALPHAS[name]["alpha_sent"] * scale,
                         "alpha_dist": EADRA_ALPHAS[name]["alpha_dist"] * scale} for name in EADRA_COMPONENTS}
    return {EADRA: {**components, "dist_reduction": dist, "peak_reduction": "mean", "warmup_steps": warmup,
                    "alpha_scale": alpha_scale}}


def sea_row(kind: str, heads: str = "redundant") -> dict:
    """DEA (``kind="dea"``) or LPEA (``"lpea"``) on the redundant heads (RHE) of the first encoder layer (the recipe
    names ``dea_rhe``/``lpea_rhe``), with k = 6 and our reading of Rule 2 written out."""
    return {SEA: {"type": kind, "head_selection": heads, "encoder_layers": [0], "max_relative_position": 6,
                  "rule2": "symmetric"}}
