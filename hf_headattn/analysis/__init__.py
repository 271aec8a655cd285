"""Read-outs of trained models over datasets, as JSON-able dicts and PNG plots (like the papers' figures)."""

from .head_importance import mean_head_importance, plot_head_importance, sentence_head_importance
