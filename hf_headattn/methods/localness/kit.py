"""Localness's kit (Yang et al. 2018): recipe names and the presets of RHE's paper (Zhang et al. 2021), whose Table 1
(row Localness) and Table 2 (row Localness + RHE) compare it on Transformer-base.

Localness+RHE (`head_selection="redundant"`, `--method localness_rhe`) reads RHE's `dependency_mask` (Eq. 5),
made from the sources' dependency parses by the shared input provider (`hf_headattn.syntax_inputs`):
`inputs_from` names it, so the recipes and `translate` run its hooks (`--spacy_model`, `--syntax_parses_dir`)
for it."""

from __future__ import annotations

import torch

from hf_headattn.methods.localness.core import NAME, LocalnessSettings
from hf_headattn.plugin import TRANSFORMER_BASE, MethodKit, Preset, syntax_for_redundant_heads


def example_inputs(batch_size: int, source_length: int) -> dict[str, torch.Tensor]:
    """A random, valid `dependency_mask` (each token related to a random few others; RHE adds i = j), for the
    registry-wide tests and a model with `head_selection="redundant"`."""
    related = torch.rand(batch_size, source_length, source_length) < 0.3
    return {"dependency_mask": related | related.transpose(1, 2)}


KIT = MethodKit(
    NAME,
    paper="Yang et al. 2018, modeling localness for self-attention networks (Localness)",
    method_names={
        # the lower half of the encoder layers (0-2 of 6: the abstract's "lower layers"), query-specific window
        "localness": {},
        "localness_fixed": {"window": 10},  # the fixed-window strategy (P_i predicted, D = 10: the authors' code)
        "localness_rhe": {"head_selection": "redundant"},  # on the heads RHE finds redundant per sentence (parses)
    },
    presets={
        "localness_yang": Preset(
            doc="RHE (Zhang et al. 2021) Table 1, row Localness (Yang et al. 2018): Transformer-base (hidden 512, "
                "filter 2048, 8 heads; Appendix A.1), the Gaussian bias with the query-specific window on encoder "
                "layers 0-2 of 6 (the lower layers), on every head, predicted from the whole query as the authors' "
                "code does (+0.81M parameters: RHE's WMT14 column, +0.80M).",
            flags={**TRANSFORMER_BASE, "method": "localness"},
            method_overrides={NAME: {"encoder_layers": [0, 1, 2], "window": "predicted", "heads": "all",
                                     "predictor": "query"}},
        ),
        "localness_yang_rhe": Preset(
            doc="RHE (Zhang et al. 2021) Table 2, row Localness + RHE: as localness_yang, the bias only on the heads "
                "RHE (Eq. 10) finds redundant per sentence; the sources are parsed as for LPEA+RHE.",
            flags={**TRANSFORMER_BASE, "method": "localness_rhe"},
            method_overrides={NAME: {"encoder_layers": [0, 1, 2], "window": "predicted", "head_selection": "redundant",
                                     "predictor": "query"}},
        ),
    },
    # HF's common model tests (the fixed window differs only in the math: tests/methods/localness)
    model_test_names=("localness",),
    example_inputs=example_inputs,
    inputs_from=syntax_for_redundant_heads(LocalnessSettings),
)
