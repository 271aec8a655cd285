"""Relative positions' kit (Shaw et al. 2018; with RHE, Zhang et al. 2021): recipe names and the presets of RHE's
Table 1 (Rel_Pos) and Table 2 (Rel_Pos + RHE).

Its input ``dependency_mask`` (for ``heads="redundant"``) has no hooks here: SEA's kit makes it from parses, and two
kits may not declare one column or recipe flag; with ``rel_pos_rhe`` alone, pass ``dependency_mask`` to the model
yourself (``model(..., dependency_mask=...)``)."""

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
        "rel_pos_rhe": {"heads": "redundant"},  # the encoder's redundant heads only (RHE)
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
                "dependency_mask, so the decoder keeps plain attention); pass dependency_mask (SEA's syntax "
                "pipeline makes it).",
            flags={**TRANSFORMER_BASE, "method": "rel_pos_rhe"},
            method_overrides={NAME: {"max_relative_position": 16, "heads": "redundant"}},
        ),
    },
)
