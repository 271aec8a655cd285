"""The state of one forward pass that every attention call of an hf-headattn model shares
([`HeadAttnContext`][hf_headattn.context.HeadAttnContext]).

The model's `forward` makes one and passes it as the `headattn_context` keyword, which transformers forwards from
the model to every attention call (`hf_headattn.attention`).
"""

from __future__ import annotations

from typing import Any

import torch


class HeadAttnContext:
    """State of one forward pass, shared by all attention modules that carry a method.

    `flags`: the read-out flags (`MethodSpec.flags`) set in this forward, e.g. `"output_head_importance"`.

    `record(key, value)` collects, per key, one entry per module call (e.g. `"dhicm_kl"`: `(name, tensor)` pairs);
    the model reduces them into output fields after the forward. `source_mask` (B, S) and `target_mask` (B, T)
    are True at real (non-padding) tokens; `None` means every token is real. `grad_enabled`: whether the forward
    that created the context records gradients (see `check_loss_terms_get_gradients`). `compute_losses`: False
    when no loss is needed (`generate`, inference without labels): the regularizers then do no work.
    `past_length`: the number of target positions the key/value cache held before this forward (0 without a
    cache; None where no model forward made the context), which
    [`query_positions`][hf_headattn.attention_call.AttentionCall.query_positions] reads.

    Deliberately not a dataclass: FSDP2 (`fully_shard`) rebuilds the dataclasses, dicts and lists among a sharded
    layer's arguments that hold tensors needing gradients, so a later layer would record into a copy (and a
    `defaultdict` cannot even be rebuilt); a plain object is passed through as it is.
    """

    def __init__(self, flags=frozenset(), source_mask: torch.Tensor | None = None,
                 target_mask: torch.Tensor | None = None):
        self.flags = frozenset(flags)
        self.source_mask, self.target_mask = source_mask, target_mask
        self._chains: dict[str, tuple] = {}  # key -> (last value, (the one before, (...))): see record()
        self.cache: dict[Any, Any] = {}  # what the model computes once per forward (e.g. the target tokens)
        self.grad_enabled = torch.is_grad_enabled()
        self.compute_losses = True
        self.past_length: int | None = None  # the target positions cached before this forward (None: not known)

    def record(self, key: str, value: Any) -> None:
        """Add `value` to the records of `key` (read back in order with
        [`records`][hf_headattn.context.HeadAttnContext.records]).

        Kept as a chain of pairs (value, the chain before), not as a list: torch.compile guards on the length of a
        list that a compiled frame appends to, so under regional compilation (one code object for every layer)
        each layer would compile a version of its own and exhaust dynamo's recompile limit; a new pair needs no
        guard on the values before it."""
        self._chains[key] = (value, self._chains.get(key))

    def has(self, key: str) -> bool:
        """Whether anything was recorded under `key` in this forward."""
        return key in self._chains

    def recorded(self, key: str) -> list:
        """The values recorded under `key`, in the order recorded (`[]`: none), what a `collect` reads."""
        values, chain = [], self._chains.get(key)
        while chain is not None:
            value, chain = chain
            values.append(value)
        return values[::-1]

    @property
    def records(self) -> dict[str, list]:
        """`{key: [values in the order recorded]}` for every key
        ([`recorded`][hf_headattn.context.HeadAttnContext.recorded] reads one)."""
        return {key: self.recorded(key) for key in self._chains}

    def target_tokens(self) -> torch.Tensor | None:
        """The batch's real target tokens, `target_mask.sum()` (None without a target mask), counted once per
        forward for every method that normalises by it."""
        if self.target_mask is None:
            return None
        if "target_tokens" not in self.cache:
            self.cache["target_tokens"] = self.target_mask.sum()
        return self.cache["target_tokens"]
