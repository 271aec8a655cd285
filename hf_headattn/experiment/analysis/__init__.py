"""Read-outs of trained models over datasets, as JSON-able dicts and PNG plots (like the papers' figures).

[`head_ranking`][hf_headattn.experiment.analysis.head_ranking] scores heads by several criteria and chooses which to
prune; [`head_pruning`][hf_headattn.experiment.analysis.head_pruning] prunes them step by step as Michel et al. (2019)
do. Each method's own analysis lives in its kit (`hf_headattn/methods/<name>/analysis.py`); the ones below are
re-exported here for one import, the public spelling. (Releases 0.1 and 0.2 spelt this package `hf_headattn.analysis`,
which still imports it, with a warning, until 0.4: it moved into the experiment kit, which it imports.)
"""

from ...methods.dhicm.analysis import mean_head_importance, plot_head_importance, sentence_head_importance
from ...methods.eadra.analysis import encoder_attention_entropy, plot_encoder_entropy, write_entropy_report
from ...methods.sea.analysis import count_redundant_heads, plot_redundancy, redundancy_report

__all__ = [
    "mean_head_importance", "plot_head_importance", "sentence_head_importance",
    "encoder_attention_entropy", "plot_encoder_entropy", "write_entropy_report",
    "count_redundant_heads", "plot_redundancy", "redundancy_report",
]
