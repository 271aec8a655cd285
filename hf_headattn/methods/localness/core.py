"""Localness (Yang, Tu, Wong, Meng, Chao & Zhang 2018, "Modeling Localness for Self-Attention Networks", EMNLP 2018):
a learned Gaussian bias G_ij = -(j - P_i)^2 / (2 sigma_i^2) on the scores of the lower encoder self-attention layers,
centred at a predicted position P_i with a predicted (or fixed) window D_i = 2 sigma_i; on every head, on the heads
`heads` names (the authors' code's `local_heads=n`: `heads=[0, ..., n - 1]`), or with
`head_selection="redundant"` only on the heads RHE (Zhang et al. 2021, Eq. 3, 9, 10) finds redundant per sentence
(RHE's Table 2, Localness+RHE).

Settings (`config.localness`): `encoder_layers` (default "lower_half": `range(ceil(L / 2))`, layers 0-2 of 6),
`window` ("predicted": the query-specific window; an integer D >= 1: the fixed-window strategy, P_i still
predicted), `heads` ("all" or head numbers), `head_selection` ("all" or "redundant"; the latter needs the forward
input `dependency_mask` (B, S, S) bool, SEA's), `predictor` ("query": the authors' code, the default; "head": the
per-head reading of release 0.3's development builds). The math is in `hf_headattn.methods.localness.equations`;
where each reading comes from: the folder's README.

* `predictor="query"` (the authors' public code): P and D are predicted from the whole query (d_model wide, every
  head's query before the split) through one hidden layer tanh(W_p q + b_p) of n d_h units shared by P, D and the
  heads, then per-head output weights with biases; P = (I - 1) sigmoid, D = I sigmoid + 0.1 (fixed window: D as
  given). About 0.27M parameters a layer at Transformer-base (RHE's Table 1, WMT14 column: +0.80M over 3 layers).
* `predictor="head"`: each head predicts its own P_i and D_i from its own query Q_i^h (d_h wide); W_p (d_h, d_h),
  v_p and v_d (d_h,) are shared by the heads of a layer, no biases; P = I sigmoid, D = I sigmoid (floored at 1e-3).
  12,672 parameters over 3 layers at Transformer-base, close to RHE's Table 1 WMT16 columns (+0.02M).

In both, I, the sentence length, and the positions j count the real tokens only: a padded sentence gets the bias it
gets alone; padding keys stay masked by the call's mask; the bias is added to the scaled scores (q k^T * scaling + G),
before the softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ...attention import AttentionCall, AttentionMethod, key_allowed
from ...hf_compat import init_normal_, init_zeros_
from ...placement import heads_of, layers_of, renamed
from ...redundancy import checked_dependency_mask, neutral_dependency_mask, real_tokens, redundant_heads_of
from ...registry import MethodSettings, MethodSpec
from .equations import BIAS_FLOOR, centre_and_window, gaussian_bias, query_centre_and_window, sentence_positions

NAME = "localness"


@dataclass(frozen=True)
class LocalnessSettings(MethodSettings):
    """Localness's settings (`config.localness`).

    - `encoder_layers`: "lower_half" (the default: `range(ceil(L / 2))`, the abstract's lower layers), "all", layer
    numbers (negative count from the end) or None (none).
    - `window`: "predicted" (the query-specific window) or an integer D >= 1 (a fixed window of D tokens, sigma = D / 2;
    the centre P_i is still predicted). heads: "all" or the head numbers with the bias (the authors' code's
    `local_heads=n`: `[0, ..., n - 1]`). head_selection: "all" or "redundant" (RHE, needs `dependency_mask`;
    with `heads="all"`). predictor: "query" (the authors' code: the whole
    query, a hidden layer shared by the heads, per-head outputs with biases) or "head" (each head's own query, weights
    shared by the heads: the reading that matches RHE's WMT16 parameter columns). A saved config.json that has
    no `predictor` and records no default for it was written before it existed and reads "head"
    (`METHOD.older_files_defaults`).
    """

    encoder_layers: list[int] | Literal["all", "lower_half"] | None = "lower_half"
    window: int | Literal["predicted"] = "predicted"
    heads: list[int] | Literal["all"] = "all"
    head_selection: Literal["all", "redundant"] = "all"
    predictor: Literal["query", "head"] = "query"

    def validate(self, config, name: str) -> None:
        layers(self, config, name)
        if self.window != "predicted" and self.window < 1:
            raise ValueError(f"{name}.window must be 'predicted' or an integer >= 1 (a fixed window of D tokens), got "
                             f"{self.window!r}")
        heads_of(self.heads, config.encoder_attention_heads, f"{name}.heads")
        if self.head_selection == "redundant" and self.heads != "all":
            raise ValueError(f"{name}.head_selection='redundant' chooses among every head, got {name}.heads="
                             f"{self.heads!r}; expected heads='all' (or head_selection='all')")


LAYOUTS = {"lower_half": lambda count: range((count + 1) // 2)}
"""Localness's own layout ([`hf_headattn.placement.layers_of`][hf_headattn.placement.layers_of]): the lower half,
`range(ceil(L / 2))`."""


def layers(settings: LocalnessSettings, config, name: str = NAME) -> list[int]:
    """The encoder layers with the bias: `settings.encoder_layers`, by default the lower half (the abstract: lower
    layers)."""
    return layers_of(settings.encoder_layers, config.encoder_layers, f"{name}.encoder_layers", LAYOUTS)


def older_spellings(values) -> tuple[dict, list]:
    """0.3's development builds' `layers` (None: the lower half) as `encoder_layers`, and `heads` as a count n
    (the first n heads: `heads=[0, ..., n - 1]`) or a head mode (`"redundant"`: `head_selection`)
    (`MethodSpec.older_spellings`)."""
    notes = []
    values = renamed(values, "layers", "encoder_layers", lambda value: "lower_half" if value is None else value,
                     notes)
    heads = values.get("heads")
    if heads == "redundant":
        values = renamed(values, "heads", "head_selection", notes=notes)
    elif isinstance(heads, int) and not isinstance(heads, bool):
        values = renamed(values, "heads", "heads", lambda count: list(range(count)), notes)
        notes[-1] = (f"heads={heads} (a count)", f"heads={values['heads']} (head numbers)")
    return values, notes


def placements(settings: LocalnessSettings, config) -> list[tuple[str, int, str]]:
    return [("encoder", layer, "self") for layer in layers(settings, config)]


class Localness(AttentionMethod):
    """The Gaussian bias of one encoder self-attention module, on all heads, the heads named or the redundant ones.

    `predictor="query"` (n the heads with the bias, H for "all" and "redundant"; m = n d_h): `hidden_weight` W_p
    (m, d_model) ~ N(0, std), `hidden_bias` b_p (m,) = 0, `output_weight` (k n, m) ~ N(0, std), rows u_1 .. u_n
    for P (then v_1 .. v_n for D with the predicted window: k = 2, else k = 1), `output_bias` (k n,) = 0. At
    initialisation P_i ~ (I - 1) / 2 and D_i ~ I / 2 + 0.1. Pruning heads is refused: the predictor reads every head's
    query, which a pruned head no longer has.

    `predictor="head"` (shared by the module's heads, d_h its head dimension): `weight` W_p (d_h, d_h),
    `centre_vector` v_p (d_h,), with the predicted window `window_vector` v_d (d_h,), all ~ N(0, std); P_i ~ I / 2
    and D_i ~ I / 2 at initialisation.

    The bias is computed in float32 (outside autocast) and added in the query's dtype through `call.add_score_bias`
    (a float additive mask on SDPA/eager, so SDPA keeps its fused kernels; a `score_mod` on flex attention); its
    gradient reaches the predictor and the query. RHE's selection is a hard decision, without gradient.
    """

    def __init__(self, settings: LocalnessSettings, head_dim: int, num_heads: int, model_dim: int):
        super().__init__()
        self.settings = settings
        self.fixed_window = None if settings.window == "predicted" else float(settings.window)
        chosen = None if settings.heads == "all" else tuple(heads_of(settings.heads, num_heads, "heads"))
        count = num_heads if chosen is None else len(chosen)
        self.local_heads = chosen
        """the heads with the bias (current numbers; None: every head, or RHE's selection)"""
        if settings.predictor == "query":
            outputs = count * (1 if self.fixed_window is not None else 2)
            self.hidden_weight = nn.Parameter(torch.empty(count * head_dim, model_dim))
            self.hidden_bias = nn.Parameter(torch.empty(count * head_dim))
            self.output_weight = nn.Parameter(torch.empty(outputs, count * head_dim))
            self.output_bias = nn.Parameter(torch.empty(outputs))
            return
        self.weight = nn.Parameter(torch.empty(head_dim, head_dim))
        self.centre_vector = nn.Parameter(torch.empty(head_dim))
        if self.fixed_window is None:
            self.window_vector = nn.Parameter(torch.empty(head_dim))

    def init_weights(self, std: float) -> None:
        if self.settings.predictor == "query":
            init_normal_(self.hidden_weight, std=std)
            init_zeros_(self.hidden_bias)
            init_normal_(self.output_weight, std=std)
            init_zeros_(self.output_bias)
            return
        init_normal_(self.weight, std=std)
        init_normal_(self.centre_vector, std=std)
        if self.fixed_window is None:
            init_normal_(self.window_vector, std=std)

    @property
    def pruning_refused(self) -> str | None:
        if self.settings.predictor == "query":
            return ("localness with predictor='query' reads every head's query, which pruning removes; expected no "
                    "pruned heads on its layers (or predictor='head')")
        return None

    def prune_heads(self, keep: torch.Tensor) -> None:
        if self.pruning_refused:  # (a config that records pruned heads on its layers)
            raise ValueError(self.pruning_refused)
        if self.local_heads is not None:
            self.local_heads = tuple(i for i, number in enumerate(keep.tolist()) if number in self.local_heads)

    def sentence_tokens(self, call: AttentionCall) -> torch.Tensor | None:
        """(B, S) bool, True at the sentence's real tokens: the context's source mask, else (`generate` runs the
        encoder without the model's context) the keys the call's mask allows; None: every token is real."""
        if call.key_mask is not None:
            return call.key_mask
        allowed = key_allowed(call.mask_tensor, call.key.shape[2])
        return None if allowed is None else real_tokens(allowed, call.key.shape[0], call.key.shape[2], call.key.device)

    def bias(self, query: torch.Tensor, real: torch.Tensor | None, allowed: torch.Tensor | None = None
             ) -> torch.Tensor:
        """G (B, n, T, S) for the queries (B, H, T, d_h) of sentences whose real tokens are `real` (B, S), n the
        heads with the bias, in float32 (floored at `BIAS_FLOOR` for a float16 query); with `allowed` (the
        call's mask, bool (B, 1, T, S)) G is `finfo.min` of the query's dtype where it masks (one write)."""
        if real is None:
            real = torch.ones(query.shape[0], query.shape[2], dtype=torch.bool, device=query.device)
        positions, lengths = sentence_positions(real)
        dtype = query.dtype
        with torch.autocast(query.device.type, enabled=False):
            if self.settings.predictor == "query":
                whole = query.transpose(1, 2).flatten(2)  # (B, T, H d_h): the query before the head split
                centre, width = query_centre_and_window(
                    whole.float(), self.hidden_weight.float(), self.hidden_bias.float(), self.output_weight.float(),
                    self.output_bias.float(), lengths, self.fixed_window)
            else:
                if self.local_heads is not None:
                    query = query[:, list(self.local_heads)]
                window_vector = None if self.fixed_window is not None else self.window_vector.float()
                centre, width = centre_and_window(query.float(), self.weight.float(), self.centre_vector.float(),
                                                  window_vector, lengths, self.fixed_window)
            base = None
            if allowed is not None:  # 0 or the query dtype's minimum (float32 holds bfloat16's too)
                base = torch.where(allowed, 0.0, torch.full((), torch.finfo(dtype).min, device=query.device))
            return gaussian_bias(centre, width, positions, BIAS_FLOOR if dtype == torch.float16 else None, base)

    def before(self, call: AttentionCall) -> None:
        selected = self.local_heads
        if selected == ():
            return  # its heads were pruned
        if self.settings.head_selection == "redundant":
            dependency_mask = checked_dependency_mask(NAME, call.kwargs.get("dependency_mask"), call.query)
            selected = redundant_heads_of(call, dependency_mask)  # (B, H) bool, True = redundant
        allowed = None
        if call.implementation == "sdpa" and call.query.dtype in (torch.float32, torch.bfloat16) and selected is None \
                and torch.is_grad_enabled():  # SDPA's path of one trainable bias: the mask in the bias's write
            allowed = call.explicit_mask
            allowed = allowed if allowed is not None and allowed.dtype == torch.bool else None
        bias = self.bias(call.query, self.sentence_tokens(call), allowed)
        call.add_score_bias(bias.to(call.query.dtype), heads=selected, masked=allowed is not None)


def build(settings: LocalnessSettings, config, module) -> Localness:
    return Localness(settings, module.head_dim, module.num_heads, module.num_heads * module.head_dim)


def collect(context, settings: LocalnessSettings) -> tuple[dict, None]:
    """Localness adds no output field and no objective term."""
    return {}, None


METHOD = MethodSpec(
    NAME, LocalnessSettings, placements, build, collect,
    inputs=("dependency_mask",),  # read only with head_selection="redundant" (RHE's Eq. 9); SEA reads it too
    neutral_inputs=neutral_dependency_mask,
    older_files_defaults={"predictor": "head"},  # saved before the authors' layout became the default
    older_spellings=older_spellings,
    kit="hf_headattn.methods.localness.kit",
)
