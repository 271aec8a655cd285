"""DHICM's kit (Goindani & Shrivastava 2021): recipe names, Table 2's presets and its head-importance criterion;
`analysis` reads the importances out over a dataset (the paper's Figure 3)."""

from __future__ import annotations

import torch

from hf_headattn.methods.dhicm.core import NAME
from hf_headattn.plugin import MethodKit, Preset

TRAINING = {
    "model_shape": "base", "method": "dhicm", "learning_rate": 5e-4, "adam_beta1": 0.9, "adam_beta2": 0.98,
    "adam_epsilon": 1e-6, "lr_scheduler_type": "inverse_sqrt", "warmup_steps": 4000, "num_beams": 5,
    "early_stopping_patience": 10,
}
"""§4.3: 6+6 layers, d 512; Adam (0.9, 0.98, eps 1e-6), lr 5e-4, inverse square root after 4000 warm-up steps,
beam 5, a checkpoint each epoch, the best by validation loss, early stopping after 10 epochs without improvement.
(8000 tokens per batch has no flag here.)"""

TABLE_2 = {
    "default": (2048, 8, 0.1, 0.0, 0.0, None, 0.1),
    "de_en": (2048, 4, 0.5, 0.1, 0.3, 0.5, 0.1),
    "hi_en": (1024, 4, 0.3, 0.0, 0.0, 0.2, 0.1),
    "be_en": (128, 2, 0.1, 0.0, 0.0, 0.2, 0.4),
}
"""Table 2, one column each: feed-forward dim, attention heads, dropout, attention dropout, activation dropout,
DHICM dropout (§3.1; N/A in the default column: the config's default stays), label smoothing."""

LAYERS = {"encoder_layers": [-1], "decoder_layers": [-1]}
"""The layers the presets and the studies put DHICM on: the last encoder and the last decoder layer (§4.3)."""


def table_2_presets() -> dict[str, Preset]:
    """`dhicm_<column>`: Table 2's column with §4.3's training (`--method baseline` gives its T-base/T-optimal)."""
    presets = {}
    for column, (ffn, heads, dropout, attention_dropout, activation_dropout, dhicm_dropout, smoothing) in (
            TABLE_2.items()):
        config = {"encoder_ffn_dim": ffn, "decoder_ffn_dim": ffn, "encoder_attention_heads": heads,
                  "decoder_attention_heads": heads, "activation_dropout": activation_dropout}
        overrides = {} if dhicm_dropout is None else {NAME: {"dropout": dhicm_dropout}}
        label = "default column (Transformer-base)" if column == "default" else f"optimal {column} column"
        presets[f"dhicm_{column}"] = Preset(
            doc=f"DHICM (Goindani & Shrivastava 2021) Table 2, {label}; training of §4.3. --method baseline gives "
                f"the paper's {'T-base' if column == 'default' else 'T-optimal'}.",
            flags={**TRAINING, "dropout": dropout, "attention_dropout": attention_dropout,
                   "label_smoothing": smoothing},
            config=config, method_overrides=overrides,
        )
    return presets


def importance_sums(importances: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The `dhicm` head-importance criterion: per module, G summed over the real tokens of the batch (G is zero at
    padding) and their number, from the `head_importances` read-out."""
    return {name: (G.sum((0, 1)), (G.sum(-1) > 0).sum()) for name, G in importances.items()}


KIT = MethodKit(
    NAME,
    paper="Goindani & Shrivastava 2021, dynamic head importance computation (DHICM)",
    method_names={
        # self- and cross-attention of the last encoder and decoder layer (§4.3), lambda 0.1, the KL reduced as the
        # fidelity study chose (docs/results/fidelity-study.md)
        "dhicm": dict(LAYERS),
        # the same with the per-token reading of Eq. 5 released in 0.1 (lambda 0.1 against the per-token NLL)
        "dhicm_paper_literal": {**LAYERS, "kl_reduction": "per_token", "kl_weight": 0.1},
    },
    presets=table_2_presets(),
    importance=(NAME, importance_sums),
)
