"""Relative positions' kit (Shaw et al. 2018; with RHE, Zhang et al. 2021): recipe names and the presets of RHE's
Table 1 (Rel_Pos) and Table 2 (Rel_Pos + RHE).

With ``heads="redundant"`` it reads RHE's ``dependency_mask`` (Eq. 5), made from the sources' dependency parses by
SEA's kit (its syntax pipeline: ``--spacy_model``, ``--syntax_parses_dir``): ``inputs_from`` names SEA, so the
recipes and ``translate`` run SEA's input hooks for ``--method rel_pos_rhe`` as they do for ``dea_rhe``."""

from __future__ import annotations

from hf_headattn.experiment.kit import MethodKit, Preset
from hf_headattn.experiment.presets import TRANSFORMER_BASE
from hf_headattn.methods.rel_pos.core import NAME, RelPosSettings
from hf_headattn.methods.sea.inputs import rhe_inputs_from  # SEA's kit makes RHE's dependency_mask from parses

#: Shaw et al.'s setting as we read it: k = 16 (their clipping distance; their Table 3 varies k and finds BLEU
#: insensitive to it from k >= 2), on every self-attention of the encoder and the decoder.
SHAW = {"max_relative_position": 16, "encoder_layers": "all", "decoder_layers": "all"}

KIT = MethodKit(
    NAME,
    paper="Shaw, Uszkoreit & Vaswani 2018, self-attention with relative position representations",
    method_names={
        "rel_pos": {},  # every encoder layer, every head, key and value terms, k = 16
        "rel_pos_keys": {"values": False},  # the key term only: a score bias, SDPA's fast path
        "rel_pos_rhe": {"heads": "redundant"},  # on the heads RHE finds redundant per sentence (needs parses)
    },
    presets={
        "rel_pos_shaw": Preset(
            doc="RHE (Zhang et al. 2021) Table 1, row Rel_Pos: Shaw et al. 2018's relative positions (k = 16, key "
                "and value terms, every self-attention layer of Transformer-base, encoder and decoder).",
            flags={**TRANSFORMER_BASE, "method": "rel_pos"},
            method_overrides={NAME: SHAW},
        ),
        "rel_pos_shaw_rhe": Preset(
            doc="RHE (Zhang et al. 2021) Table 2, row Rel_Pos + RHE: the relative positions (k = 16) on the heads "
                "RHE finds redundant per sentence, in every encoder layer (our reading: RHE needs the source's "
                "dependency_mask, so the decoder keeps plain attention); the sources are parsed as for LPEA+RHE.",
            flags={**TRANSFORMER_BASE, "method": "rel_pos_rhe"},
            method_overrides={NAME: {"max_relative_position": 16, "heads": "redundant"}},
        ),
    },
    inputs_from=rhe_inputs_from(RelPosSettings),
)
