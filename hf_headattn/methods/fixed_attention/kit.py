"""Fixed attention's kit (Raganato, Scherrer & Tiedemann 2020): recipe names and presets.

EaDRA's paper (Araabi, Niculae & Monz, Tables 3-5) compares against "Fixed-attention", Raganato et al.'s encoder with
7 fixed heads and 1 learnable head per layer, and §5's ablation fixes only the previous- and next-token heads; the
presets are those two configurations (Transformer-base, 8 heads, as in those tables).
"""

from __future__ import annotations

from hf_headattn.experiment.kit import MethodKit, Preset
from hf_headattn.experiment.presets import TRANSFORMER_BASE
from hf_headattn.methods.fixed_attention.core import NAME
from hf_headattn.methods.fixed_attention.equations import PATTERNS

#: Raganato et al. §3 (as we read it, hf_headattn/methods/fixed_attention/equations.py): 7 fixed + 1 learnable head in
#: every encoder self-attention layer of 8 heads.
RAGANATO = {"patterns": list(PATTERNS)}
#: Only the previous- and next-token heads fixed (the other heads learnable).
PREV_NEXT = {"patterns": ["previous", "next"]}

KIT = MethodKit(
    NAME,
    paper="Raganato, Scherrer & Tiedemann 2020, fixed encoder self-attention patterns (fixed attention)",
    method_names={
        # first: the one the registry-wide tests run on the tiny models (4 heads)
        "fixed_attention_prev_next": dict(PREV_NEXT),
        # the paper's configuration: needs 8 heads or more
        "fixed_attention": dict(RAGANATO),
    },
    presets={
        "fixed_attention_raganato": Preset(
            doc="Fixed attention (Raganato, Scherrer & Tiedemann 2020, §3), as EaDRA's Tables 3-5 compare against it "
                "(Fixed-attention): 7 fixed + 1 learnable head in every encoder self-attention layer; "
                "Transformer-base.",
            flags=dict(TRANSFORMER_BASE), config={NAME: dict(RAGANATO)},
        ),
        "fixed_attention_prev_next": Preset(
            doc="Fixed attention with only the previous- and next-token heads fixed in every encoder self-attention "
                "layer (the other 6 learnable); Transformer-base.",
            flags=dict(TRANSFORMER_BASE), config={NAME: dict(PREV_NEXT)},
        ),
    },
    model_test_names=("fixed_attention_prev_next",),
)
