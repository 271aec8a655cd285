"""Every assumption hf-headattn makes about transformers' and torch's internals, in one place.

The rest of the package uses transformers' public API (its model, config and Trainer classes, ``AttentionInterface``)
and takes anything beyond it from here. Each assumption below is one name, and ``tests/test_hf_compat.py`` holds one
contract test per name (``test_<name>``): a release that breaks one fails that test, which says what to adapt.

Transformers' open PR #48333 (Bart-family attention through ``ALL_ATTENTION_FUNCTIONS``, hyperparameters read from
the config) would change :data:`eager_attention_forward`, :func:`attention_query_input` and :class:`ConfigStandIn`'s
reason to exist at once.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # the attention registry's instance (not exported)
from transformers.models.marian.modeling_marian import MarianDecoder, MarianEncoder
from transformers.models.marian.modeling_marian import shift_tokens_right as marian_shift_tokens_right
from transformers.models.mbart.modeling_mbart import MBartDecoder, MBartEncoder, eager_attention_forward
from transformers.trainer_pt_utils import nested_gather

__all__ = [
    "ALL_ATTENTION_FUNCTIONS", "eager_attention_forward", "MBartEncoder", "MBartDecoder", "MarianEncoder",
    "MarianDecoder", "marian_shift_tokens_right", "nested_gather", "ConfigStandIn", "attention_query_input",
    "dict_outputs", "transformers_forward", "config_fields", "softmax_backward", "assert_async",
]

# --- transformers: names it does not export at the top level --------------------------------------------------------
# ALL_ATTENTION_FUNCTIONS: the registry (``get_interface(name, default)``, ``[name]``) an attention module reads its
#   function from, by ``module.config._attn_implementation``.
# eager_attention_forward: mBART's eager attention function (Marian's is the same code), the "eager" backend.
# MBartEncoder, MBartDecoder, MarianEncoder, MarianDecoder: the stacks, subclassed so that ``get_encoder()`` of a model
#   with methods is a class that reloads them.
# marian_shift_tokens_right: Marian's label shift (mBART's is ours, ``modeling``).
# nested_gather: the Trainer's gather of a tensor over processes (the logged loss components).


class ConfigStandIn:
    """Stands in for ``config`` inside one attention module: ``_attn_implementation`` answers the subclass's class
    attribute, every other attribute reads through to the model config (so later changes of the model config are
    seen). (A class attribute, not one per object: ``torch.compile`` then guards on the class that all the layers
    share, and compiles one version for them, not one per layer.)

    The assumption: an HF attention module reads its attention function from ``self.config._attn_implementation``
    at each call, and nothing else of it needs the real config object."""

    _attn_implementation: str

    def __init__(self, model_config):
        self.model_config = model_config

    def __getattr__(self, name: str):
        if name == "model_config":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.model_config, name)


def attention_query_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The query-side input of an HF attention module's call: its first parameter, ``hidden_states``, passed by
    position or by name. (The module passes its own ``**kwargs`` on to the attention function, which is how our
    inputs, e.g. the per-forward context, reach it from the model's forward.)"""
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


@contextmanager
def dict_outputs(config):
    """Let an HF forward return output objects even when ``config.return_dict`` is False: HF's bodies (and its
    encoders/decoders) read ``config.return_dict`` at the call; with False, MBart returns tuples we cannot add fields
    to and Marian crashes. The flag is set for the call and restored; nothing changes when it is True."""
    if config.return_dict:
        yield
        return
    config.return_dict = True
    try:
        yield
    finally:
        config.return_dict = False


def transformers_forward(cls: type):
    """The ``forward`` of the first class in ``cls.__mro__`` that transformers defines (whose signature ours
    extends)."""
    return next(base for base in cls.__mro__ if base.__module__.startswith("transformers.")).forward


def config_fields(config_class: type) -> set[str]:
    """The fields a transformers 5 config class declares (they are dataclasses; ``__post_init__(**kwargs)`` receives
    the keyword arguments that are no field)."""
    return set(config_class.__dataclass_fields__)


# --- torch: operators outside the documented API --------------------------------------------------------------------


def softmax_backward(grad: torch.Tensor, probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The gradient through ``probs = softmax(x, dim)`` of ``grad`` (one fused operator)."""
    return torch.ops.aten._softmax_backward_data(grad, probs, dim, probs.dtype)


def assert_async(condition: torch.Tensor, message: str) -> None:
    """Fail on the device when ``condition`` is False, without synchronising the host."""
    torch._assert_async(condition, message)

