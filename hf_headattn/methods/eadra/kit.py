"""EaDRA's kit (Araabi, Niculae & Monz): recipe names, Table 6's presets (from scratch) and §5.4's (mBART
fine-tuning); `analysis` is the encoder-entropy read-out of its Table 2 and Figure 1."""

from __future__ import annotations

from hf_headattn.methods.eadra.core import DEFAULTS, NAME
from hf_headattn.plugin import TRANSFORMER_BASE, MethodKit, Preset

COMPONENTS = {"enc": "encoder", "dec": "decoder", "x": "cross"}
"""The paper's component names (enc, dec: self-attention; x: cross-attention) -> ours."""

TABLE_6 = {
    "wmt_en_de_100k": {short: (DEFAULTS[COMPONENTS[short]]["alpha_dist"], DEFAULTS[COMPONENTS[short]]["alpha_sent"])
                       for short in ("enc", "x", "dec")},
    "be_en": {"enc": (0.02, 1.2), "x": (0.1, 8.0), "dec": (1.0, 0.9)},
    "gl_en": {"enc": (0.02, 0.8), "x": (0.15, 5.0), "dec": (1.0, 0.8)},
    "sk_en": {"enc": (0.02, 0.8), "x": (0.1, 8.0), "dec": (2.0, 0.8)},
    "ko_en": {"enc": (0.01, 0.4), "x": (0.05, 8.0), "dec": (0.5, 0.8)},
    "vi_en": {"enc": (0.02, 0.6), "x": (0.2, 8.0), "dec": (4.0, 1.0)},
    "tr_en": {"enc": (0.04, 1.2), "x": (0.1, 10.0), "dec": (3.0, 1.5)},
    "ja_en": {"enc": (0.02, 0.8), "x": (0.1, 10.0), "dec": (2.0, 0.8)},
}
"""Appendix A, Table 6: (alpha_dist, alpha_sent) per data set and component; alpha_peak 0 ("alpha_dist appears to
render alpha_peak redundant"). The WMT En-De (100k) row is EaDRA's defaults, read from
[`hf_headattn.methods.eadra.core.DEFAULTS`][hf_headattn.methods.eadra.core.DEFAULTS]."""

PAPER_READING = {"dist_reduction": "sum", "alpha_scale": 1.0}
"""The paper presets read Eq. 8 as written (summed over query pairs) and use Table 6's alphas unscaled."""

def table_6_presets() -> dict[str, Preset]:
    """`eadra_<component>_<data set>` (Table 6, Transformer-base from scratch) and `eadra_mbart_<component>`
    (§5.4, fine-tuning mBART on two heads)."""
    presets = {}
    for data_set, components in TABLE_6.items():
        for short, (alpha_dist, alpha_sent) in components.items():
            alphas = {"alpha_peak": 0.0, "alpha_dist": alpha_dist, "alpha_sent": alpha_sent}
            presets[f"eadra_{short}_{data_set}"] = Preset(
                doc=f"EaDRA (Araabi, Niculae & Monz) Appendix A Table 6, EaDRA_{short} on {data_set}: alpha_dist "
                    f"{alpha_dist}, alpha_sent {alpha_sent}; Transformer-base (§4.2). Combine components with '+' "
                    f"(e.g. eadra_enc_{data_set}+eadra_dec_{data_set}: Table 6's values, as in the paper).",
                flags=dict(TRANSFORMER_BASE), config={NAME: {COMPONENTS[short]: alphas, **PAPER_READING}},
            )
    for short in ("enc", "dec"):
        alpha_dist, alpha_sent = TABLE_6["wmt_en_de_100k"][short]
        presets[f"eadra_mbart_{short}"] = Preset(
            doc=f"EaDRA §5.4 (Table 5, mBART fine-tuning): EaDRA_{short} with Table 6's WMT En-De (100k) alphas "
                "on two heads. Fine-tuning: no architecture or training flags.",
            config={NAME: {COMPONENTS[short]: {"alpha_peak": 0.0, "alpha_dist": alpha_dist, "alpha_sent": alpha_sent,
                                               "num_heads": 2}, **PAPER_READING}},
        )
    return presets


KIT = MethodKit(
    NAME,
    paper="Araabi, Niculae & Monz, entropy- and distance-regularized attention (EaDRA)",
    method_names={
        # encoder and decoder self-attention with Table 6's WMT En-De (100k) alphas
        "eadra": {"encoder": {}, "decoder": {}},
        "eadra_all": {"encoder": {}, "decoder": {}, "cross": {}},
        # the same as "eadra" with Eq. 4 and Eq. 8 read literally (sums over queries and query pairs), no warm-up
        "eadra_paper_literal": {"encoder": {}, "decoder": {}, "dist_reduction": "sum", "peak_reduction": "sum",
                                "warmup_steps": 0, "alpha_scale": 1.0},
    },
    presets=table_6_presets(),
    model_test_names=("eadra_all",),
)
