"""SEA + RHE's kit (Zhang et al. 2021): recipe names, Appendix A's preset, the `rhe` head-importance criterion; its
inputs come from the shared syntax input provider (`hf_headattn.syntax_inputs`: recipe flags, features,
collation, inference), which `inputs_from` names; `analysis` counts redundant heads."""

from __future__ import annotations

import torch

from hf_headattn.methods.sea.core import NAME
from hf_headattn.plugin import TRANSFORMER_BASE, MethodKit, Preset, needs_syntax, syntax_example_inputs


def importance_sums(redundant: dict) -> dict[str, tuple[torch.Tensor, int]]:
    """The `rhe` head-importance criterion: per module, the number of sentences in which RHE (Eq. 10) does *not*
    mark the head redundant, and the number of sentences, from the `redundant_heads` read-out."""
    return {name: ((~heads).sum(0), heads.shape[0]) for name, heads in redundant.items()}


KIT = MethodKit(
    NAME,
    paper="Zhang et al. 2021, syntax-enhanced attention on redundant heads (SEA + RHE)",
    method_names={
        # SEA on the first encoder layer (Appendix A.2): on every head, or on the redundant ones (RHE)
        "dea": {"type": "dea", "head_selection": "all"},
        "lpea": {"type": "lpea", "head_selection": "all"},
        "dea_rhe": {"type": "dea", "head_selection": "redundant"},
        "lpea_rhe": {"type": "lpea", "head_selection": "redundant"},
        "rhe_prune": {"prune": True},
    },
    presets={
        "rhe_base": Preset(
            doc="RHE (Zhang et al.) Appendix A.1 (Transformer-base: hidden 512, filter 2048, 8 heads; the paper "
                "averages the last 10 checkpoints: hf-headattn average --last 10), Table 3 (k = 6), "
                "LPEA+RHE on the first encoder layer (Appendix A.2).",
            flags={**TRANSFORMER_BASE, "method": "lpea_rhe"},
            method_overrides={NAME: {"max_relative_position": 6, "encoder_layers": [0]}},
        ),
    },
    importance=("rhe", importance_sums),
    model_test_names=("dea_rhe", "lpea_rhe"),
    inputs_from=needs_syntax,
    example_inputs=syntax_example_inputs,
)
