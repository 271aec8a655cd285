"""Localness (Yang, Tu, Wong, Meng, Chao & Zhang 2018, "Modeling Localness for Self-Attention Networks", EMNLP 2018):
a learned Gaussian bias G_ij = -(j - P_i)^2 / (2 sigma_i^2) on the scores of the lower encoder self-attention layers,
centred at a predicted position P_i with a predicted (or fixed) window D_i = 2 sigma_i; with ``heads="redundant"``
only on the heads RHE (Zhang et al. 2021, Eq. 3, 9, 10) finds redundant per sentence (RHE's Table 2, Localness+RHE).

Settings (``config.localness``): ``layers`` (encoder layers; None: the lower half, ``range(ceil(L / 2))``, layers
0-2 of 6 as in the paper's best configuration), ``window`` ("predicted": the query-specific window, Eq. 8; an
integer D >= 1: the fixed-window strategy, P_i still predicted), ``heads`` ("all" or "redundant"; the latter needs
the forward input ``dependency_mask`` (B, S, S) bool, SEA's). The math is in
:mod:`hf_headattn.methods.localness.equations`.

Readings of the paper (docs: the folder's README):

* multi-head: each head predicts its own P_i and D_i from its own query Q_i^h (d_h wide); W_p (d_h, d_h), v_p and
  v_d (d_h,) are shared by the heads of a layer, so that heads differ through their queries (and pruning a head
  drops nothing of the method);
* I, the sentence length, and the positions j count the real tokens only: a padded sentence gets the bias it gets
  alone; padding keys stay masked by the call's mask;
* the bias is added to the scaled scores (q k^T * scaling + G), before the softmax (Eq. 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ...attention import AttentionCall, AttentionMethod, key_allowed
from ...hf_compat import init_normal_
from ...redundancy import checked_dependency_mask, neutral_dependency_mask, real_tokens, redundant_heads_of
from ...registry import MethodSettings, MethodSpec
from ...settings_checks import resolve_layers
from .equations import BIAS_FLOOR, centre_and_window, gaussian_bias, sentence_positions

NAME = "localness"


@dataclass(frozen=True)
class LocalnessSettings(MethodSettings):
    """Localness's settings (``config.localness``).

    layers: encoder layer indices (None: the lower half, ``range(ceil(L / 2))``; negative count from the end).
    window: "predicted" (the query-specific window, Eq. 8) or an integer D >= 1 (a fixed window of D tokens,
    sigma = D / 2; the centre P_i is still predicted). heads: "all" or "redundant" (RHE, needs ``dependency_mask``).
    """

    layers: list[int] | None = None
    window: int | Literal["predicted"] = "predicted"
    heads: Literal["all", "redundant"] = "all"

    def validate(self, config, name: str) -> None:
        layers(self, config, name)
        if self.window != "predicted" and self.window < 1:
            raise ValueError(f"{name}.window must be 'predicted' or an integer >= 1 (a fixed window of D tokens), got "
                             f"{self.window!r}")


def layers(settings: LocalnessSettings, config, name: str = NAME) -> list[int]:
    """The encoder layers with the bias: ``settings.layers``, by default the lower half (the paper: layers 1-3 of 6)."""
    chosen = list(range((config.encoder_layers + 1) // 2)) if settings.layers is None else settings.layers
    return resolve_layers(chosen, config.encoder_layers, f"{name}.layers")


def placements(settings: LocalnessSettings, config) -> list[tuple[str, int, str]]:
    return [("encoder", layer, "self") for layer in layers(settings, config)]


class Localness(AttentionMethod):
    """The Gaussian bias of one encoder self-attention module (Eq. 4-9), on all heads or the redundant ones.

    Parameters (shared by the module's heads, d_h its head dimension): ``weight`` W_p (d_h, d_h) ~ N(0, std),
    ``centre_vector`` v_p (d_h,) ~ N(0, std), and with the predicted window ``window_vector`` v_d (d_h,) ~ N(0, std).
    At initialisation P_i ~ I / 2 and D_i ~ I / 2 (the logits are near 0). The bias is computed in float32 (outside
    autocast) and added in the query's dtype through ``call.add_score_bias`` (a float additive mask on SDPA/eager,
    so SDPA keeps its fused kernels; a ``score_mod`` on flex attention); its gradient reaches W_p, v_p, v_d and the
    query. RHE's selection is a hard decision, without gradient.
    """

    def __init__(self, settings: LocalnessSettings, head_dim: int):
        super().__init__()
        self.settings = settings
        self.fixed_window = None if settings.window == "predicted" else float(settings.window)
        self.weight = nn.Parameter(torch.empty(head_dim, head_dim))
        self.centre_vector = nn.Parameter(torch.empty(head_dim))
        if self.fixed_window is None:
            self.window_vector = nn.Parameter(torch.empty(head_dim))

    def init_weights(self, std: float) -> None:
        init_normal_(self.weight, std=std)
        init_normal_(self.centre_vector, std=std)
        if self.fixed_window is None:
            init_normal_(self.window_vector, std=std)

    def sentence_tokens(self, call: AttentionCall) -> torch.Tensor | None:
        """(B, S) bool, True at the sentence's real tokens: the context's source mask, else (``generate`` runs the
        encoder without the model's context) the keys the call's mask allows; None: every token is real."""
        if call.key_mask is not None:
            return call.key_mask
        allowed = key_allowed(call.mask_tensor, call.key.shape[2])
        return None if allowed is None else real_tokens(allowed, call.key.shape[0], call.key.shape[2], call.key.device)

    def bias(self, query: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
        """G (B, H, T, S) for the queries (B, H, T, d_h) of sentences whose real tokens are ``real`` (B, S), in
        float32 (floored at ``BIAS_FLOOR`` for a float16 query)."""
        if real is None:
            real = torch.ones(query.shape[0], query.shape[2], dtype=torch.bool, device=query.device)
        positions, lengths = sentence_positions(real)
        window_vector = None if self.fixed_window is not None else self.window_vector.float()
        with torch.autocast(query.device.type, enabled=False):
            centre, width = centre_and_window(query.float(), self.weight.float(), self.centre_vector.float(),
                                              window_vector, lengths, self.fixed_window)
            return gaussian_bias(centre, width, positions, BIAS_FLOOR if query.dtype == torch.float16 else None)

    def before(self, call: AttentionCall) -> None:
        selected = None
        if self.settings.heads == "redundant":
            dependency_mask = checked_dependency_mask(NAME, call.kwargs.get("dependency_mask"), call.query)
            selected = redundant_heads_of(call, dependency_mask)  # (B, H) bool, True = redundant
        bias = self.bias(call.query, self.sentence_tokens(call))
        call.add_score_bias(bias.to(call.query.dtype), heads=selected)


def build(settings: LocalnessSettings, config, module) -> Localness:
    return Localness(settings, module.head_dim)


def collect(context, settings: LocalnessSettings) -> tuple[dict, None]:
    """Localness adds no output field and no objective term."""
    return {}, None


METHOD = MethodSpec(
    NAME, LocalnessSettings, placements, build, collect,
    inputs=("dependency_mask",),  # read only with heads="redundant" (RHE's Eq. 9); SEA reads it too (listed once)
    neutral_inputs=neutral_dependency_mask,
    kit="hf_headattn.methods.localness.kit",
)
