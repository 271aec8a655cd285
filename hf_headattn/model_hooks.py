"""Changes a method makes to the model outside attention (`MethodSpec.prepare_stack`), kept loadable.

A method's `prepare_stack(settings, model_config, side, stack)` runs once when the model (or a stack on its own) is
built, for each side the method is placed on; what it changes must keep the stack's parameters, so that a checkpoint
saved with the method, or a stock one, loads as before. [`mute_module`][hf_headattn.model_hooks.mute_module] is the one
change the built-in methods make: Shaw et al.'s relative positions without absolute ones mute the stack's
`embed_positions`.
"""

from __future__ import annotations

import torch
from torch import nn


def _zero_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(output)


def mute_module(module: nn.Module) -> None:
    """Make `module` contribute nothing: its forward's output (a tensor) is replaced by zeros of its shape, dtype and
    device (a forward hook). Its parameters stay (saved and loaded as before, without gradient from the model's
    loss). Idempotent; [`is_muted`][hf_headattn.model_hooks.is_muted] tells."""
    if not is_muted(module):
        module.register_forward_hook(_zero_output)
        module.headattn_muted = True


def is_muted(module: nn.Module) -> bool:
    """Whether [`mute_module`][hf_headattn.model_hooks.mute_module] muted `module`."""
    return getattr(module, "headattn_muted", False)


def mute_position_embeddings(stack: nn.Module, owner: str) -> None:
    """Mute the absolute position embeddings of an HF encoder or decoder (`stack.embed_positions`: mBART's learned
    ones, Marian's sinusoidal ones); a `ValueError` naming `owner` where the stack has none."""
    embeddings = getattr(stack, "embed_positions", None)
    if not isinstance(embeddings, nn.Module):
        raise ValueError(f"{owner}: {type(stack).__name__} has no embed_positions module to mute; expected an mBART or "
                         "Marian encoder/decoder")
    mute_module(embeddings)
