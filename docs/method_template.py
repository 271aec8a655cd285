"""A method kept outside the package, complete: copy this file, rename the method, change the math.

Head gates (a simple relaxation of Voita et al. 2019's head pruning): each head's output on the chosen encoder
self-attention layers is multiplied by a learned gate 2 * sigmoid(g_h) (1 at the start), and the objective adds
``weight`` times the mean gate (each head weighted by its head-mask value), which pushes unneeded heads towards 0.

Everything comes from one import path, :mod:`hf_headattn.plugin`. Use it with the recipes (the file's path, or its
module name with ``docs/`` on PYTHONPATH or the file copied into your own package)::

    hf-headattn train --method_modules docs/method_template.py --method head_gates ...

or in a script: ``import method_template`` (or ``import_method_modules(["docs/method_template.py"])`` from
:mod:`hf_headattn.plugin`) before building ``HeadAttnMBartConfig(..., head_gates={})`` (every encoder layer, weight
0.01). Checkpoints record the module (``config.json``'s ``headattn_method_modules``: ``method_template``); loading one
needs hf_headattn installed and the module imported first (``--method_modules`` again): ``trust_remote_code``
alone cannot load it.
``tests/test_plugin.py`` runs this file as a user does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from hf_headattn.plugin import (
    AttentionMethod,
    MethodKit,
    MethodSettings,
    MethodSpec,
    check_range,
    init_zeros_,
    layers_of,
    register_method,
)

NAME = "head_gates"  # the config field, the parameters' prefix (...self_attn.head_gates.logits) and the --method name


@dataclass(frozen=True)
class HeadGateSettings(MethodSettings):
    """encoder_layers: the encoder layers whose self-attention is gated, in the shared placement vocabulary ("all",
    the default; layer numbers, negative counting from the end; None: none); weight: the penalty's weight in the
    objective (>= 0)."""

    encoder_layers: list[int] | Literal["all"] | None = "all"
    weight: float = 0.01

    def validate(self, config, name: str) -> None:
        layers_of(self.encoder_layers, config.encoder_layers, f"{name}.encoder_layers")
        check_range(self.weight, f"{name}.weight", 0.0)


class HeadGates(AttentionMethod):
    """The gates of one attention module's heads."""

    records_loss_terms = True  # (its penalty needs gradients: refused under reentrant checkpointing)

    def __init__(self, num_heads: int):
        super().__init__()
        self.logits = nn.Parameter(torch.empty(num_heads))

    def init_weights(self, std: float) -> None:
        init_zeros_(self.logits)  # gate 1: the model starts as the stock one (skipped for loaded weights)

    def prune_heads(self, keep: torch.Tensor) -> None:
        self.logits = nn.Parameter(self.logits.data[keep])

    def after(self, call, attn_output: torch.Tensor) -> torch.Tensor:
        gates = 2 * torch.sigmoid(self.logits)  # (H,)
        if call.context is not None and call.context.compute_losses:
            call.context.record(NAME, mean_over_heads(gates, call.head_mask))
        return attn_output * gates[None, None, :, None]  # attn_output: (B, T, H, D)


def mean_over_heads(values: torch.Tensor, head_mask: torch.Tensor | None) -> torch.Tensor:
    """The mean of per-head ``values`` (H,), each head weighted by its head-mask value (``head_mask``: (1 or B, H) or
    None), averaged over the sentences: a head masked with 0 counts as a pruned one (the head-mask rules,
    :mod:`hf_headattn.plugin`)."""
    if head_mask is None:
        return values.mean()
    return ((head_mask * values).sum(-1) / head_mask.sum(-1).clamp_min(1e-9)).mean()


def build(settings: HeadGateSettings, config, module, *, num_heads: int, head_dim: int) -> HeadGates:
    """The method on one of its attention modules (``num_heads``, ``head_dim``: the module's, before pruning)."""
    return HeadGates(num_heads)


def collect(context, settings: HeadGateSettings):
    """The output fields and the objective's term of one forward, from what the modules recorded."""
    recorded = context.recorded(NAME)
    if not recorded:
        return {}, None
    penalty = torch.stack(recorded).mean()
    return {"head_gates_penalty": penalty}, settings.weight * penalty


# Where it is attached: MethodSpec's default placements read the settings' encoder_layers (and decoder_layers,
# cross_layers where a settings class has them): "all" is every layer, layer numbers those layers, None none.
METHOD = MethodSpec(
    NAME, HeadGateSettings, build=build, collect=collect,
    outputs={"head_gates_penalty": "the mean gate over the gated heads"},
    logged=("head_gates_penalty",),  # the Trainer logs it beside the loss
)
# What the recipes know of it (found in this module: no MethodSpec(kit=...) needed).
KIT = MethodKit(NAME, paper="Head gates (docs/method_template.py)", method_names={NAME: {"weight": 0.01}})

register_method(METHOD)
