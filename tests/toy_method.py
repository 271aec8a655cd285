"""A toy fourth method's core, written as docs/design.md ("Adding a method") says a new method is: one core
module, one kit folder (here ``tests/toy_kit``: its recipe name, preset, head-importance criterion, analysis and the
hooks that make its input in the recipes and ``translate``) and one registration line (here the tests register it, as
a user's script does before running a recipe; a built-in one gets its line in ``hf_headattn/methods/__init__.py``).

"Head scaling": each head's output is multiplied by a learned scale (times the optional forward input ``toy_gate``,
one number per sentence); the objective adds ``weight * mean(scale^2)``; ``output_toy_scales=True`` reads the scales
out (``toy_scales``: {module name: (heads,)}). Its own input and read-out flag are declared on its spec only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hf_headattn.plugin import AttentionMethod, MethodSettings, MethodSpec, check_range, init_ones_, resolve_layers


@dataclass(frozen=True)
class ToySettings(MethodSettings):
    encoder_layers: list[int] | None = None
    weight: float = 0.5

    def validate(self, config, name: str) -> None:
        resolve_layers(self.encoder_layers, config.encoder_layers, f"{name}.encoder_layers")
        check_range(self.weight, f"{name}.weight", 0.0)


class HeadScale(AttentionMethod):
    def __init__(self, num_heads: int):
        super().__init__()
        self.scale = nn.Parameter(torch.empty(num_heads))

    def init_weights(self, std: float) -> None:
        init_ones_(self.scale)

    def after(self, call, attn_output):
        scale = self.scale[None, None, :, None]  # (B, T, H, D)
        gate = call.kwargs.get("toy_gate")
        if gate is not None:
            scale = scale * gate[:, None, None, None]
        if call.context is not None:
            call.context.record("toy", self.scale.pow(2).mean())
            if "output_toy_scales" in call.context.flags:
                call.context.record("toy_scales", (call.module.headattn_name, self.scale.detach()))
        return attn_output * scale


def placements(settings, config):
    return [("encoder", i, "self") for i in resolve_layers(settings.encoder_layers, config.encoder_layers, "")]


def build(settings, config, module):
    return HeadScale(module.num_heads)


def collect(context, settings):
    records = context.records.get("toy")
    if not records:
        return {}, None
    penalty = torch.stack(records).mean()
    fields = {"toy_penalty": penalty}
    if context.records.get("toy_scales"):
        fields["toy_scales"] = dict(context.records["toy_scales"])
    return fields, settings.weight * penalty


METHOD = MethodSpec(
    "toy", ToySettings, placements, build, collect,
    runs_before=("dhicm",),  # scales per-head outputs, which DHICM's paper mode mixes into one (B, T, d_m) output
    inputs=("toy_gate",), flags=("output_toy_scales",),
    outputs={"toy_penalty": "mean squared head scale", "toy_scales": "{module name: (heads,)} with output_toy_scales"},
    logged=("toy_penalty",),
    kit="toy_kit",
)
