"""Two methods written outside the package with ``hf_headattn.plugin`` only (``tests/test_plugin_surface.py`` runs
them; neither registers itself on import):

* ``distance_bias``: a bias that is a non-linear function of the relative position j - i, per head (right in
  ``generate`` only with the true query positions: the queries of a static cache are not its last keys);
* ``talking_heads``: talking-heads attention (Shazeer et al. 2020): the heads' scores mixed by one (H, H) matrix before
  the softmax, their weights by another after it, both started at the identity (the stock model's outputs).

Each spec names only its name, settings and ``build``: placements and collect are the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from hf_headattn.plugin import AttentionMethod, HeadUse, MethodSettings, MethodSpec, init_identity_, init_values_


def distance_function(distance: torch.Tensor) -> torch.Tensor:
    """f(j - i), non-linear: sin(0.9 d) + 0.3 sqrt(|d|)."""
    return torch.sin(0.9 * distance) + 0.3 * distance.abs().sqrt()


@dataclass(frozen=True)
class DistanceBiasSettings(MethodSettings):
    """encoder_layers, decoder_layers: "all" (the default), layer numbers or None (none)."""

    encoder_layers: list[int] | Literal["all"] | None = "all"
    decoder_layers: list[int] | Literal["all"] | None = "all"


class DistanceBias(AttentionMethod):
    """scale_h * f(j - i) on head h's scores."""

    def __init__(self, num_heads: int):
        super().__init__()
        self.scales = nn.Parameter(torch.empty(num_heads))

    def init_weights(self, std: float) -> None:
        init_values_(self.scales, torch.linspace(0.5, 2.0, self.scales.shape[0]))

    def before(self, call) -> None:
        distance = call.relative_positions.to(call.query.dtype)  # (T, S) or (B, T, S)
        bias = distance_function(distance)
        bias = bias if bias.dim() == 2 else bias[:, None]  # (T, S) or (B, 1, T, S)
        call.add_score_bias(bias * self.scales.to(bias.dtype)[:, None, None])  # (H, T, S) or (B, H, T, S)


def build_distance_bias(settings, config, module, *, num_heads: int) -> DistanceBias:
    return DistanceBias(num_heads)


DISTANCE_BIAS = MethodSpec("distance_bias", DistanceBiasSettings, build=build_distance_bias)


@dataclass(frozen=True)
class TalkingHeadsSettings(MethodSettings):
    """encoder_layers (default "all"), decoder_layers (default None: none)."""

    encoder_layers: list[int] | Literal["all"] | None = "all"
    decoder_layers: list[int] | Literal["all"] | None = None


class TalkingHeads(AttentionMethod):
    """``score_mix`` (H, H) mixes the scores before the softmax, ``weight_mix`` (H, H) the weights after it."""

    def __init__(self, num_heads: int):
        super().__init__()
        self.score_mix = nn.Parameter(torch.empty(num_heads, num_heads))
        self.weight_mix = nn.Parameter(torch.empty(num_heads, num_heads))

    def init_weights(self, std: float) -> None:
        init_identity_(self.score_mix)
        init_identity_(self.weight_mix)

    def prune_heads(self, keep: torch.Tensor) -> None:
        self.score_mix = nn.Parameter(self.score_mix.data[keep][:, keep])
        self.weight_mix = nn.Parameter(self.weight_mix.data[keep][:, keep])

    def before(self, call) -> None:
        call.mix_scores(self.score_mix)
        call.mix_weights(self.weight_mix)


def build_talking_heads(settings, config, module, *, num_heads: int) -> TalkingHeads:
    return TalkingHeads(num_heads)


def talking_heads_use(settings, config, site) -> HeadUse:
    """It mixes every head (so the config refuses a method that takes heads over on its layers)."""
    return HeadUse(mixes=tuple(range(getattr(config, f"{site[0]}_attention_heads"))))


TALKING_HEADS = MethodSpec("talking_heads", TalkingHeadsSettings, build=build_talking_heads,
                           head_use=talking_heads_use)
