"""RHE, redundant head identification (Zhang et al. 2021, Eq. 3, 5, 9, 10), shared: SEA applies its masks to the heads
it finds redundant, and so may any method that adds a bias to the scores (`head_selection="redundant"`, e.g. relative
positions, Localness; RHE's Table 2). One implementation, in the shared layer, so that no method imports another's
math.

Per sentence and head of one self-attention call: the head's confidence (Eq. 3, the mean over real queries of its
largest plain attention weight) and its syntactic attention (Eq. 9, the mean attention mass on dependency-related
tokens, Eq. 5's pairs: head-dependent either way, and i = j); a head is redundant when its syntactic attention is at
most sigmoid(confidence) (Eq. 10). The attention is the plain one (Eq. 2: softmax(q k^T * scaling) with the padding
mask, in float32), never the one a method changed. A hard decision: no gradient.

Shapes: B batch, H heads, T = S source length (encoder self-attention).
"""

from __future__ import annotations

import torch

from .attention import AttentionCall, key_allowed
from .probabilities import attention_probabilities


def real_tokens(allowed: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
    """(B, S) bool, True at real tokens: the keys some query may attend to (bidirectional padding masks).

    In encoder self-attention queries and keys are the same tokens, so this is also the query mask. It is read from
    the mask itself so that `generate()`, which runs the encoder without the model's context, sees the same tokens.
    """
    if allowed is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    return allowed.any(dim=-2).all(dim=1)  # (B, 1|H, T, S) -> (B, 1|H, S) -> (B, S)


def _token_mean(values: torch.Tensor, query_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of (B, H, T) values over the real query tokens -> (B, H)."""
    if query_mask is None:
        return values.mean(dim=-1)
    weights = query_mask[:, None, :].to(values.dtype)  # (B, 1, T)
    return (values * weights).sum(-1) / weights.sum(-1).clamp(min=1)


def head_confidence(probs: torch.Tensor, query_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 3: h_conf = 1/n sum_i max_j Att(Q_i, K_j), per sentence and head.

    Parameters
    ----------
    probs : FloatTensor, shape (B, H, T, S)
        Attention probabilities (rows sum to 1).
    query_mask : BoolTensor, shape (B, T), optional
        True at real query tokens; n is their number (padding rows are left out).

    Returns
    -------
    FloatTensor, shape (B, H)
    """
    return _token_mean(probs.amax(dim=-1), query_mask)


def syntactic_attention(probs: torch.Tensor, dependency_mask: torch.Tensor,
                        query_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 9: Syn_attn = 1/n sum_i sum_j Dep_mask(Att(Q_i, K_j)), the mean attention mass on related tokens.

    Parameters
    ----------
    probs : FloatTensor, shape (B, H, T, S)
    dependency_mask : BoolTensor, shape (B, T, S)
        True for a head-dependent pair (either direction); the diagonal counts as related (Eq. 5: i = j).
    query_mask : BoolTensor, shape (B, T), optional

    Returns
    -------
    FloatTensor, shape (B, H)
    """
    related = dependency_allowed(dependency_mask).to(probs.dtype)  # (B, T, S)
    mass = torch.einsum("bhts,bts->bht", probs, related)  # (B, H, T)
    return _token_mean(mass, query_mask)


def head_statistics(probs: torch.Tensor, dependency_mask: torch.Tensor,
                    query_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 3 and Eq. 9 at once, as `head_confidence` and `syntactic_attention` give them, in 15 operators
    against their 30 (issue 63: each one a kernel launch): both are means over the real queries, so the query weights
    1/n (0 at padding) are made once, and Eq. 9's mean is one batched product over the (T, S) pairs with the weights
    folded into the related pairs (no (B, H, T, S) product is formed). In float32 or wider,
    outside autocast (a batched product under autocast would run in bf16).

    Parameters
    ----------
    probs : FloatTensor, shape (B, H, T, S)
    dependency_mask : BoolTensor, shape (B, T, S)
    query_mask : BoolTensor, shape (B, T), optional

    Returns
    -------
    :
        (h_conf, syn_attn), FloatTensors of shape (B, H)
    """
    batch, heads, length, keys = probs.shape
    with torch.autocast(probs.device.type, enabled=False):
        if query_mask is None:
            weights = probs.new_full((batch, length), 1 / length)
        else:  # (B, T): 1/n at the real queries
            weights = (query_mask / query_mask.sum(-1, keepdim=True).clamp(min=1)).to(probs.dtype)
        # Eq. 3 elementwise with a sum (compiled, one kernel with the max; a batched product would be a library call)
        h_conf = (probs.amax(dim=-1) * weights[:, None]).sum(-1)
        related = dependency_allowed(dependency_mask) * weights[..., None]  # (B, T, S): 1/n where related (Eq. 5)
        syn_attn = torch.bmm(probs.reshape(batch, heads, length * keys), related.view(batch, length * keys, 1))
    return h_conf, syn_attn.view(batch, heads)


def redundant_heads(h_conf: torch.Tensor, syn_attn: torch.Tensor) -> torch.Tensor:
    """Eq. 10: a head is redundant (h_label = 0) when Syn_attn <= Syn_gate = sigmoid(h_conf).

    A hard, non-differentiable decision: the result is a bool tensor with no gradient.

    Parameters
    ----------
    h_conf, syn_attn : FloatTensor, shape (B, H)

    Returns
    -------
    :
        BoolTensor, shape (B, H), True = redundant
    """
    return syn_attn <= torch.sigmoid(h_conf)


def dependency_allowed(dependency_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 5 as a bool mask: D_ij = 0 (allowed) for a dependency pair or i = j, -inf (not allowed) elsewhere.

    Parameters
    ----------
    dependency_mask : BoolTensor, shape (B, T, S)

    Returns
    -------
    :
        BoolTensor, shape (B, T, S): `dependency_mask` with the diagonal set.
    """
    eye = torch.eye(*dependency_mask.shape[-2:], dtype=torch.bool, device=dependency_mask.device)
    return dependency_mask | eye


@torch.no_grad()
def redundant_heads_of(call: AttentionCall, dependency_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 3, 9, 10 on the plain attention of one encoder self-attention call: (B, H) bool, True = redundant.
    `dependency_mask` (B, T, S) bool, the sentence's head-dependent pairs (SEA's input `dependency_mask`).

    Computed once per call: two methods on one module (SEA and Localness+RHE) get the same selection, from the plain
    attention, whichever runs first (the second would otherwise read a mask the first changed)."""
    cached = call.state.get(_SELECTION)
    if cached is not None and cached[0] is dependency_mask:
        return cached[1]
    selection = _redundant_heads_of(call, dependency_mask)
    call.state[_SELECTION] = (dependency_mask, selection)
    return selection


_SELECTION = "rhe_redundant"
"""`call.state` key of the call's RHE selection: (the dependency mask it was computed for, (B, H) bool)."""


def _redundant_heads_of(call: AttentionCall, dependency_mask: torch.Tensor) -> torch.Tensor:
    length = call.key.shape[2]
    allowed = key_allowed(call.mask_tensor, length)  # None or (B, 1, T, S)
    real = real_tokens(allowed, call.key.shape[0], length, call.key.device)  # (B, S) = (B, T)
    probs = attention_probabilities(call.query, call.key, call.scaling, allowed, dtype=torch.float32)  # (B, H, T, S)
    redundant = redundant_heads(*head_statistics(probs, dependency_mask, real))
    call.state["redundant_heads_of"] = (dependency_mask, redundant)
    return redundant


def neutral_dependency_mask(batch_size: int, length: int) -> dict[str, torch.Tensor]:
    """A `dependency_mask` that changes nothing: every pair related, so RHE finds no head redundant (Eq. 10). The
    `MethodSpec.neutral_inputs` of a bias method with `head_selection="redundant"`."""
    return {"dependency_mask": torch.ones(batch_size, length, length, dtype=torch.bool)}


def checked_dependency_mask(owner: str, tensor, query: torch.Tensor) -> torch.Tensor:
    """`tensor` if it is a valid `dependency_mask` for RHE in this call ((B, S, S) bool on the query's device),
    else a `ValueError` naming `owner` (the method with `head_selection="redundant"`), what it got and what was
    expected."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(
            f"{owner} with head_selection='redundant' needs the forward argument dependency_mask (batch, src_len, "
            f"src_len) bool (RHE's Eq. 9; SEA's input, e.g. from "
            f"hf_headattn.syntax_inputs.DataCollatorForSyntaxSeq2Seq), "
            f"got {type(tensor).__name__}; pass model(..., dependency_mask=...) or model.generate(..., "
            "dependency_mask=...)"
        )
    expected = (query.shape[0], query.shape[2], query.shape[2])
    if tuple(tensor.shape) != expected or tensor.dtype != torch.bool or tensor.device != query.device:
        raise ValueError(
            f"{owner}: dependency_mask must be a bool tensor of shape (batch, src_len, src_len) = {expected}, got "
            f"{tensor.dtype}: dependency_mask has shape {tuple(tensor.shape)} on {tensor.device}; expected (batch, "
            f"src_len, src_len) = {expected} on {query.device}"
        )
    return tensor
