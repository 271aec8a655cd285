"""Relative positions' kit (Shaw et al. 2018; with RHE, Zhang et al. 2021): recipe names and the presets of RHE's
Table 1 (Rel_Pos) and Table 2 (Rel_Pos + RHE).

Its input ``dependency_mask`` (for ``heads="redundant"``) has no hooks here: SEA's kit makes it from parses (its
syntax pipeline, in SEA's folder), and two kits may not declare one column or recipe flag. So the recipes and
``translate`` offer no ``--method`` name for Rel_Pos + RHE yet (a name they cannot feed); the ``rel_pos_rhe`` preset
builds the model, which then needs ``dependency_mask`` passed to it (``model(..., dependency_mask=...)``, as SEA's
collator makes it)."""

from __future__ import annotations

from hf_headattn.experiment.kit import MethodKit, Preset
from hf_headattn.experiment.presets import TRANSFORMER_BASE
from hf_headattn.methods.rel_pos.core import NAME

#: Shaw et al.'s setting as we read it: k = 16 (their clipping distance; their Table 3 varies k and finds BLEU
#: insensitive to it from k >= 2), on every self-attention of the encoder and the decoder.
SHAW = {"max_relative_position": 16, "encoder_layers": "all", "decoder_layers": "all"}

KIT = MethodKit(
    NAME,
    paper="Shaw, Uszkoreit & Vaswani 2018, self-attention with relative position representations",
    method_names={
        "rel_pos": {},  # every encoder layer, every head, key and value terms, k = 16
        "rel_pos_keys": {"values": False},  # the key term only: a score bias, SDPA's fast path
    },
    presets={
        "rel_pos_shaw": Preset(
            doc="RHE (Zhang et al. 2021) Table 1, row Rel_Pos: Shaw et al. 2018's relative positions (k = 16, key "
                "and value terms, every self-attention layer of Transformer-base, encoder and decoder).",
            flags={**TRANSFORMER_BASE, "method": "rel_pos"},
            method_overrides={NAME: SHAW},
        ),
        "rel_pos_rhe": Preset(
            doc="RHE (Zhang et al. 2021) Table 2, row Rel_Pos + RHE: the relative positions (k = 16) on the heads "
                "RHE finds redundant per sentence, in every encoder layer (our reading: RHE needs the source's "
                "dependency_mask, so the decoder keeps plain attention); the model needs dependency_mask passed "
                "to it (SEA's syntax pipeline makes it; no kit hooks yet).",
            flags={**TRANSFORMER_BASE, "method": "rel_pos"},
            method_overrides={NAME: {"max_relative_position": 16, "heads": "redundant"}},
        ),
    },
)
