"""Relative positions' kit (Shaw et al. 2018; with RHE, Zhang et al. 2021): recipe names and the presets of RHE's
Table 1 (Rel_Pos) and Table 2 (Rel_Pos + RHE).

With `head_selection="redundant"` it reads RHE's `dependency_mask` (Eq. 5), made from the sources' dependency
parses by the shared input provider (`hf_headattn.syntax_inputs`: `--spacy_model`, `--syntax_parses_dir`):
`inputs_from` names it, so the recipes and `translate` run its hooks for `--method
rel_pos_rhe` as they do for `dea_rhe`."""

from __future__ import annotations

from hf_headattn.methods.rel_pos.core import NAME, RelPosSettings
from hf_headattn.plugin import TRANSFORMER_BASE, MethodKit, Preset, syntax_for_redundant_heads

SHAW = {"max_relative_position": 16, "tables": "head", "encoder_layers": "all", "decoder_layers": "all",
        "absolute_positions": False}
"""Shaw et al.'s base model (§4.1): k = 16, a table per layer and per head, key and value terms, on every
self-attention of the encoder and the decoder, without absolute position encodings (§4.2). (Their Table 2 varies
k and finds BLEU insensitive to it from k >= 2.)"""
SHAW_BIG = {**SHAW, "max_relative_position": 8, "tables": "layer"}
"""Their big model's reading (§4.1): k = 8, one table per layer shared by its heads."""

KIT = MethodKit(
    NAME,
    paper="Shaw, Uszkoreit & Vaswani 2018, self-attention with relative position representations",
    method_names={
        # every encoder layer, a table per layer and head (the paper's base model), key and value terms, k = 16
        "rel_pos": {},
        "rel_pos_keys": {"values": False},  # the key term only: a score bias, SDPA's fast path
        "rel_pos_rhe": {"head_selection": "redundant"},  # on the heads RHE finds redundant per sentence (needs parses)
    },
    presets={
        "rel_pos_shaw": Preset(
            doc="RHE (Zhang et al. 2021) Table 1, row Rel_Pos: Shaw et al. 2018's base model (§4.1-4.2): relative "
                "positions with k = 16 and a table per layer and per head, key and value terms, on every "
                "self-attention layer of Transformer-base, encoder and decoder, without absolute positions.",
            flags={**TRANSFORMER_BASE, "method": "rel_pos"},
            method_overrides={NAME: SHAW},
        ),
        "rel_pos_shaw_big": Preset(
            doc="Shaw et al. 2018's big-model reading (§4.1; their Table 1's big rows) on Transformer-base: k = 8, "
                "one table per layer shared by its heads, encoder and decoder self-attention, without absolute "
                "positions.",
            flags={**TRANSFORMER_BASE, "method": "rel_pos"},
            method_overrides={NAME: SHAW_BIG},
        ),
        "rel_pos_shaw_rhe": Preset(
            doc="RHE (Zhang et al. 2021) Table 2, row Rel_Pos + RHE: the relative positions (k = 16, a table per "
                "layer and head) on the heads RHE finds redundant per sentence, in every encoder layer (our reading: "
                "RHE needs the source's dependency_mask, so the decoder keeps plain attention, and the absolute "
                "positions stay); the sources are parsed as for LPEA+RHE.",
            flags={**TRANSFORMER_BASE, "method": "rel_pos_rhe"},
            method_overrides={NAME: {"max_relative_position": 16, "tables": "head", "head_selection": "redundant"}},
        ),
    },
    inputs_from=syntax_for_redundant_heads(RelPosSettings),
)
