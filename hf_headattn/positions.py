"""The positions of an attention call's queries and keys
([`query_positions`][hf_headattn.attention_call.AttentionCall.query_positions],
[`key_positions`][hf_headattn.attention_call.AttentionCall.key_positions]), right with or without a key/value cache.

Positions count the tokens of a sequence from 0, as the model's learned position embeddings do (padding included:
HF's mBART/Marian number the positions `past length + arange(T)`). Key j of an attention call is at position j: a
dynamic cache appends the new keys after the cached ones, a static cache writes them at their positions into slots
0 .. S-1, of which those not yet filled are masked. The queries are where the call's queries sit among those:

* without a cache (and in the encoder) the queries are the keys: 0 .. T-1;
* in the decoder's self-attention with a cache, at `offset + arange(T)`, `offset` the number of positions cached
  before this forward (`cache.get_seq_length()`, what HF's position embeddings add; the model records it in the
  [`HeadAttnContext`][hf_headattn.context.HeadAttnContext]), so under a static cache (S the cache's size, T + offset <=
  S) too;
* without that offset (an attention call made outside the model's forward) and fewer queries than keys: each
  query's position is the last key its mask allows (itself, under a causal mask), or, without a mask, the last T
  of the S positions (a dynamic cache).

Cross-attention's queries (target tokens) and keys (source tokens) are numbered each in their own sequence.

Shapes: B batch, T queries, S keys.
"""

from __future__ import annotations

import torch


def last_allowed_key(allowed: torch.Tensor) -> torch.Tensor:
    """The positions of the queries from a causal mask: the last key each query may attend to (0 where none).

    Parameters
    ----------
    allowed
        BoolTensor (B, 1 or H, T, S), True = attend (the first head's rows are read)

    Returns
    -------
    LongTensor (B, T)
    """
    keys = torch.arange(allowed.shape[-1], device=allowed.device)
    return torch.where(allowed[:, 0], keys, 0).amax(-1)


def query_positions(length: int, key_length: int, device, *, offset: int | None = None,
                    allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The positions of T = `length` queries among S = `key_length` keys (module docstring).

    Parameters
    ----------
    length, key_length : T and S
    offset
        the positions cached before this forward (an int, a 0-d tensor, or None: not known)
    allowed
        None, or BoolTensor (B, 1 or H, T, S), the call's mask (read only where T < S and `offset` is None)

    Returns
    -------
    :
        LongTensor (T,), or (B, T) where read from `allowed`
    """
    if isinstance(offset, torch.Tensor):  # (a static cache's count, a 0-d tensor: added on the device, no sync)
        return offset.to(device=device, dtype=torch.long) + torch.arange(length, device=device)
    if offset is not None and offset + length <= key_length:
        return torch.arange(offset, offset + length, device=device)
    if length < key_length and allowed is not None:
        return last_allowed_key(allowed)
    start = max(key_length - length, 0)
    return torch.arange(start, start + length, device=device)


def relative_positions(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """j - i for every (query i, key j): (T, S) from positions (T,) and (S,), or (B, T, S) from (B, T)."""
    return key[..., None, :] - query[..., :, None]
