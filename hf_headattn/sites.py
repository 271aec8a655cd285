"""Where an attention module sits: one description for routing, head masks, pruning and the methods.

An attention module of an encoder-decoder is a `AttentionSite`: `side` ("encoder" / "decoder"), `layer`
and `kind` ("self" / "cross"). Its `component` is what head masks and EaDRA tell apart: encoder self-attention
("encoder"), decoder self-attention ("decoder") and cross-attention ("cross"); its `name` is its path in the base
model (`decoder.layers.1.encoder_attn`), the key of `config.pruned_heads` and of the read-outs.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from torch import nn

from .hf_compat import BLOCK_ATTENTION, STACK_LAYERS

SIDES = ("encoder", "decoder")

KINDS = ("self", "cross")
COMPONENT_SITES = {"encoder": ("encoder", "self"), "decoder": ("decoder", "self"), "cross": ("decoder", "cross")}
"""Each component's (side, kind): encoder self-, decoder self- and cross-attention."""
COMPONENTS = tuple(COMPONENT_SITES)
_KIND_OF = {attribute: kind for kind, attribute in BLOCK_ATTENTION.items()}  # "self_attn": "self", ...
_NAME = re.compile(rf"(?:.*\.)?((encoder|decoder)\.{STACK_LAYERS}\.(\d+)\.({'|'.join(_KIND_OF)}))")


class AttentionSite(NamedTuple):
    side: str
    layer: int
    kind: str

    @property
    def component(self) -> str:
        return "cross" if self.kind == "cross" else self.side

    @property
    def name(self) -> str:
        return f"{self.side}.{STACK_LAYERS}.{self.layer}.{BLOCK_ATTENTION[self.kind]}"

    @classmethod
    def parse(cls, name) -> AttentionSite | None:
        """The site of a module path (relative to the base model, or ending in one, e.g. `model.encoder...`), or
        None for anything else."""
        match = _NAME.fullmatch(name) if isinstance(name, str) else None
        if match is None:
            return None
        _, side, layer, attribute = match.groups()
        return cls(side, int(layer), _KIND_OF[attribute])

    @classmethod
    def in_model(cls, base_model: nn.Module, sides=SIDES) -> list[AttentionSite]:
        """The sites of every attention module of `base_model`'s stacks `sides`, layer by layer (self-attention,
        then a decoder's cross-attention)."""
        return [cls(side, layer, kind) for side in sides
                for layer in range(len(getattr(getattr(base_model, side), STACK_LAYERS)))
                for kind in (KINDS if side == "decoder" else ("self",))]

    @classmethod
    def of(cls, module: nn.Module) -> AttentionSite:
        """The site of an attention module tagged by `hf_headattn.attention.route`."""
        return cls(module.headattn_side, module.headattn_layer, module.headattn_kind)

    def module(self, base_model: nn.Module) -> nn.Module:
        """This site's attention module in `base_model` (one with `encoder` and `decoder` stacks)."""
        block = getattr(getattr(base_model, self.side), STACK_LAYERS)[self.layer]
        return getattr(block, BLOCK_ATTENTION[self.kind])


def component_of(module: nn.Module) -> str:
    """"encoder", "decoder" or "cross" for an attention module tagged by `hf_headattn.attention.route`. (It
    reads the side and kind alone: a compiled layer that read the layer number too would be compiled once per layer.)"""
    return "cross" if module.headattn_kind == "cross" else module.headattn_side


def component_shape(config, component: str) -> tuple[int, int]:
    """(layers, heads) of a component in the model config (heads in the original numbering: before pruning)."""
    side = COMPONENT_SITES[component][0]
    return getattr(config, f"{side}_layers"), getattr(config, f"{side}_attention_heads")
