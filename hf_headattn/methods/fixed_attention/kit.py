"""Fixed attention's kit (Raganato, Scherrer & Tiedemann 2020): recipe names and presets.

EaDRA's paper (Araabi, Niculae & Monz, Tables 3-5) compares against "Fixed-attention", Raganato et al.'s encoder with
7 fixed heads and 1 learnable head per layer; it also tried fixing only the previous- and next-token heads (§5.4, on
mBART). The presets are those two configurations (Transformer-base, 8 heads), and the same two
on top of mBART fine-tuning (Table 5). The patterns' weights are the method's default, "cubic" (the folder's README
says where each setting comes from).
"""

from __future__ import annotations

from hf_headattn.methods.fixed_attention.core import NAME
from hf_headattn.methods.fixed_attention.equations import PATTERNS
from hf_headattn.plugin import TRANSFORMER_BASE, MethodKit, Preset

RAGANATO = {"patterns": list(PATTERNS), "weights": "cubic"}
"""Raganato et al.'s 7 patterns as a secondary description names them (fixed_attention/equations.py): 7 fixed + 1
learnable head in every encoder self-attention layer of 8 heads (the abstract: all heads but one)."""
PREV_NEXT = {"patterns": ["previous", "next"]}
"""Only the previous- and next-token heads fixed (the other heads learnable)."""
HEADS = {"encoder_attention_heads": 8, "decoder_attention_heads": 8}
"""The 8 heads of Transformer-base that those tables' models have, kept under another --model_shape."""

KIT = MethodKit(
    NAME,
    paper="Raganato, Scherrer & Tiedemann 2020, fixed encoder self-attention patterns (fixed attention)",
    method_names={
        # the previous- and next-token heads of every encoder layer: valid at every model shape (the recipes' tiny
        # models have 4 heads); the paper's 7 fixed + 1 learnable heads need 8 heads: --preset
        # fixed_attention_raganato, which sets them
        "fixed_attention": dict(PREV_NEXT),
    },
    presets={
        "fixed_attention_raganato": Preset(
            doc="Fixed attention (Raganato, Scherrer & Tiedemann 2020), the Fixed-attention row of EaDRA's "
                "(Araabi, Niculae & Monz) Tables 3-4: 7 fixed + 1 learnable head in every encoder self-attention "
                "layer; Transformer-base (8 heads).",
            flags=dict(TRANSFORMER_BASE), config={**HEADS, NAME: dict(RAGANATO)},
        ),
        "fixed_attention_prev_next": Preset(
            doc="Fixed attention with only the previous- and next-token heads fixed in every encoder self-attention "
                "layer (the other 6 learnable), a variant of the Fixed-attention row of EaDRA's Tables 3-4; "
                "Transformer-base (8 heads).",
            flags=dict(TRANSFORMER_BASE), config={**HEADS, NAME: dict(PREV_NEXT)},
        ),
        # Table 5 (fine-tuning mBART): the patterns on a pretrained model's heads, no architecture or training flags
        "fixed_attention_mbart": Preset(
            doc="EaDRA (Araabi, Niculae & Monz) Table 5, row mBART-FT Fixed-attn: fine-tuning a pretrained mBART with "
                "Raganato et al.'s 7 patterns fixed on the first 7 heads of every encoder self-attention layer, the "
                "others (9 of mBART-large's 16) learnable (our reading: the paper gives no head count for mBART). "
                "Fine-tuning: no architecture or training flags (hf-headattn train --model_name_or_path "
                "facebook/mbart-large-50 --preset fixed_attention_mbart ...).",
            config={NAME: dict(RAGANATO)},
        ),
        "fixed_attention_mbart_prev_next": Preset(
            doc="EaDRA (Araabi, Niculae & Monz) Table 5's text: fine-tuning mBART with only the previous- and "
                "next-token heads fixed in every encoder self-attention layer (\"the two most important fixed "
                "patterns\"), the others learnable.",
            config={NAME: dict(PREV_NEXT)},
        ),
    },
)
