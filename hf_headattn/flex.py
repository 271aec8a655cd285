"""The methods on `attn_implementation="flex_attention"`: what they read of a call that flex attention runs.

On flex attention, transformers hands the attention function a `BlockMask`
(the padding and causal masks as a `mask_mod`) instead of a mask tensor, and HF's flex function returns the
per-head output as SDPA does; off the CPU its second output is the log-sum-exp of the scores (B, H, T), where
the other backends return weights or None (a head mask leaves it unchanged:
[`scale_weights`][hf_headattn.head_masks.scale_weights]). DHICM reads only the output and the query-side input; EaDRA
reads the queries, keys and the mask as the bool tensor (B, 1, T, S) that SDPA would have received, which `dense_mask`
rebuilds from the block mask's `mask_mod`, so its terms are the SDPA path's. The methods' score biases (SEA's, which
change the mask per sentence and head) run there as a `score_mod` over the sentence's positions and the heads they apply
to (`biased_score_mod`), the padding staying in the block mask.

On the CPU flex attention runs forward only (torch 2.13 raises for its backward there); `tests/test_flex.py`
compares it with SDPA without gradients, and training on flex needs a GPU.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, create_mask

from .hf_compat import flex_attention_function

FLEX = "flex_attention"
"""The backend name transformers gives flex attention."""


def is_block_mask(attention_mask) -> bool:
    """Whether transformers gave the attention function a flex BlockMask (the model runs flex attention)."""
    return isinstance(attention_mask, BlockMask)


def dense_mask(attention_mask, query_length: int, key_length: int, cache: dict | None = None):
    """`attention_mask` as a tensor: a BlockMask as the bool mask (B, 1, T, S) it stands for (True = attend), any
    other mask (None, bool or additive float tensor) unchanged.

    `cache`: a per-forward dict (`HeadAttnContext.cache`) that keeps the mask made from one BlockMask, so the
    layers that share a block mask share one tensor (as they share SDPA's mask); not used under torch.compile.
    """
    if not isinstance(attention_mask, BlockMask):
        return attention_mask
    key = ("flex_dense_mask", id(attention_mask), query_length, key_length)
    if cache is not None and not torch.compiler.is_compiling() and key in cache:
        return cache[key][1]
    batch = attention_mask.kv_num_blocks.shape[0]
    mask = create_mask(attention_mask.mask_mod, batch, 1, query_length, key_length,
                       attention_mask.kv_num_blocks.device)  # (B, 1, T, S) bool
    if cache is not None and not torch.compiler.is_compiling():
        cache[key] = (attention_mask, mask)  # the block mask kept alive: its id is not reused within the forward
    return mask


def flex_attention_with(module, query, key, value, block_mask, score_mod, scaling: float, dropout: float = 0.0):
    """Flex attention (compiled as transformers compiles it) with a method's `score_mod` and transformers' block
    mask: `(attn_output (B, T, H, D), None)`, what transformers' flex function returns on the CPU."""
    if dropout > 0:
        raise ValueError(f"flex_attention takes no attention dropout, got {dropout}; set attention_dropout=0.0 or "
                         "train on attn_implementation 'sdpa' or 'eager'")
    output = flex_attention_function()(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling,
                                       training=module.training)  # (B, H, T, D)
    return output.transpose(1, 2).contiguous(), None
