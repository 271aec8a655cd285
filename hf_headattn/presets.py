"""Named method settings and model shapes for the recipes: experiment settings as small diffs over one default."""

from __future__ import annotations

#: Method names -> config fields. Combine with "+", e.g. "dhicm+eadra".
METHODS: dict[str, dict] = {
    "baseline": {},
    # DHICM on the last encoder and last decoder layer, self- and cross-attention (§4.3), lambda 0.1.
    "dhicm": {"dhicm_encoder_layers": [-1], "dhicm_decoder_layers": [-1]},
    # EaDRA on encoder and decoder self-attention with Table 6's WMT En-De (100k) alphas.
    "eadra": {"eadra": {"encoder": {}, "decoder": {}}},
    "eadra_all": {"eadra": {"encoder": {}, "decoder": {}, "cross": {}}},
    # SEA on the first encoder layer (Appendix A.2): on every head, or on the redundant ones (RHE).
    "dea": {"sea_type": "dea", "sea_heads": "all"},
    "lpea": {"sea_type": "lpea", "sea_heads": "all"},
    "dea_rhe": {"sea_type": "dea", "sea_heads": "redundant"},
    "lpea_rhe": {"sea_type": "lpea", "sea_heads": "redundant"},
    "rhe_prune": {"rhe_prune": True},
}

#: Model shapes for training from scratch (Marian-style, shared embeddings).
MODEL_SHAPES: dict[str, dict] = {
    # CPU-sized: trains on Multi30k in minutes.
    "tiny": dict(d_model=128, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512),
    # Multi30k-sized on a GPU.
    "small": dict(d_model=256, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024),
    # Transformer-base, the papers' size (Vaswani et al. 2017): 512, 6+6 layers, 8 heads, 2048.
    "base": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048),
}


def method_settings(spec: str) -> dict:
    """Config fields for a method name or a "+"-joined combination of names (later names win on conflicts).

    >>> method_settings("dhicm+dea_rhe")["sea_type"]
    'dea'
    """
    settings = {}
    for name in (part.strip() for part in spec.split("+")):
        if name not in METHODS:
            raise ValueError(f"unknown method {name!r} in {spec!r}; expected names from {sorted(METHODS)} joined by '+'")
        settings.update(METHODS[name])
    return settings


def model_shape(name: str) -> dict:
    if name not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {name!r}; expected one of {sorted(MODEL_SHAPES)}")
    return dict(MODEL_SHAPES[name])


def uses_syntax(settings: dict) -> bool:
    """Whether the settings need the syntax inputs (SEA or RHE pruning)."""
    return settings.get("sea_type") is not None or bool(settings.get("rhe_prune"))
