"""Read-outs of trained models over datasets, as JSON-able dicts and PNG plots (like the papers' figures)."""

from .entropy import encoder_attention_entropy, plot_encoder_entropy, write_entropy_report
from .head_importance import mean_head_importance, plot_head_importance, sentence_head_importance
from .redundancy import count_redundant_heads, plot_redundancy, redundancy_report
