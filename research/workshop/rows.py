"""The studies' rows: a method's settings with every field a study varies, or a later default change could move,
written out, so that a row trains the same model whatever the running release's defaults are. Each method's
constants come from its kit (``hf_headattn/methods/<name>/``) and its core module."""

from __future__ import annotations

from hf_headattn.methods.dhicm.core import NAME as DHICM
from hf_headattn.methods.dhicm.kit import LAYERS as DHICM_LAYERS
from hf_headattn.methods.eadra.core import DEFAULTS as EADRA_ALPHAS
from hf_headattn.methods.eadra.core import NAME as EADRA
from hf_headattn.methods.fixed_attention.core import NAME as FIXED
from hf_headattn.methods.fixed_attention.equations import PATTERNS
from hf_headattn.methods.fixed_attention.kit import RAGANATO
from hf_headattn.methods.localness.core import NAME as LOCALNESS
from hf_headattn.methods.rel_pos.core import NAME as REL_POS
from hf_headattn.methods.rel_pos.kit import SHAW
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


def rel_pos_row(heads: str = "all") -> dict:
    """Rel_Pos (Shaw et al. 2018), RHE's Table 1 row (``heads="all"``: the base model's layout, ``SHAW``: k = 16, a
    table per layer and head, key and value terms, every encoder and decoder self-attention, no absolute positions)
    or its Table 2 row Rel_Pos + RHE (``"redundant"``: the ``rel_pos_shaw_rhe`` preset's, every encoder layer, on the
    heads RHE finds redundant per sentence, absolute positions kept), written out."""
    if heads == "all":
        return {REL_POS: {**SHAW, "values": True, "head_selection": "all"}}
    return {REL_POS: {"encoder_layers": "all", "decoder_layers": None, "max_relative_position": 16, "values": True,
                      "tables": "head", "head_selection": "redundant", "absolute_positions": True}}


def localness_row(heads: str = "all") -> dict:
    """Localness (Yang et al. 2018), RHE's Table 1 row (``heads="all"``) or Table 2 row Localness + RHE
    (``"redundant"``), as the ``localness_yang`` presets: the query-specific window predicted from the whole query,
    on the lower half of the encoder layers (0-2 of Transformer-base's 6; 0-1 of the ``small`` shape's 4)."""
    return {LOCALNESS: {"encoder_layers": "lower_half", "window": "predicted", "heads": "all",
                        "head_selection": heads, "predictor": "query"}}


def fixed_attention_row(heads: int) -> dict:
    """Fixed attention (Raganato et al. 2020), EaDRA's Tables 3-4 row, on a model of ``heads`` encoder heads: all
    heads of every encoder self-attention layer but one fixed (the abstract's layout, 7 + 1 on Transformer-base),
    with the first ``heads - 1`` patterns in the order of ``fixed_attention_raganato``'s 7 (on the ``small``
    shape's 4 heads: current, previous, next; our reading: the paper does not say which patterns a smaller layer
    keeps), cubic weights."""
    if not 2 <= heads <= len(PATTERNS) + 1:
        raise ValueError(f"heads={heads}: expected 2 to {len(PATTERNS) + 1} encoder heads (all but one fixed, "
                         f"{len(PATTERNS)} patterns)")
    return {FIXED: {"patterns": list(PATTERNS[:heads - 1]), "weights": RAGANATO["weights"],
                    "encoder_layers": "all", "decoder_layers": None, "cross_layers": None}}
