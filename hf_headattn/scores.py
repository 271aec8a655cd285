"""Score biases on chosen heads, made into what each backend takes (the shared layer under `AttentionCall`).

A method's `before` hook adds a bias to the attention scores of some heads
([`add_score_bias`][hf_headattn.attention_call.AttentionCall.add_score_bias]: SEA's DEA/LPEA masks, a Gaussian locality
bias, a relative-position term); the attention function turns every bias of the call into what its backend takes, so
that two methods' biases add up and no method imports another's math:

* SDPA and eager: one mask tensor (`biased_mask`), the call's mask with the biases in it, of H heads only where
  a bias differs between heads (else (B, 1, T, S)); bool (True = attend) where the backend takes bool (SDPA) and the
  one bias is a hard mask, else additive float with `finfo.min` where masked (what eager needs, and SDPA with a
  float bias);
* flex attention: a `score_mod` over (sentence, head, query, key) that reads each bias tensor by index
  (`biased_score_mod`), so a compact bias ((B, 1, T, S), or only the chosen heads') never becomes (B, H, T, S);
  the padding and causality stay in transformers' block mask.

One bias (a `ScoreBias`) is `score + bias` where `allowed` and `-inf` elsewhere, on its heads. A query
row whose allowed keys are all masked by the call's own mask (e.g. a padding row) keeps the call's mask alone on that
bias's heads, the bias left out: a hard mask never leaves a row with nothing to attend to (SEA's rule for padding rows,
which the paper does not cover). Two hard masks that together leave a row empty give that row the call's mask back on
SDPA/eager (so a real query never attends to padding); on flex attention, whose `score_mod` applies them one by
one, such a row gets -inf everywhere (no weight on padding either; no built-in pair gives one).

Shapes: B batch, H the call's heads (after pruning, the heads of `query`), T queries, S keys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

ScoreMod = Callable[..., torch.Tensor]
"""A flex attention `score_mod`: (score, batch, head, query, key) -> score."""


@dataclass(frozen=True, eq=False)
class ScoreBias:
    """One method's change to the scores of some heads, checked and in a fixed layout (made by
    `score_bias`).

    owner : the method's name (errors name it)
    bias : None or float (B or 1, h or 1, T or 1, S or 1), added to the scores (finite)
    allowed : None or bool, the same layout: where False the score becomes -inf (a hard mask)
    selection : None (every head), or bool (B or 1, H): the heads the bias applies to, per sentence
    slot : None, or long (H,): with heads given by number, the place of head h in the bias's head dimension (0 for the
        heads it does not apply to; `selection` leaves them out)
    masked : whether `bias` already holds `finfo.min` of the query's dtype (or less) wherever the call's mask
        masks (the SDPA path of one trainable bias then uses it as the mask as it is:
        `_trainable_bias`)
    """

    owner: str
    bias: torch.Tensor | None
    allowed: torch.Tensor | None
    selection: torch.Tensor | None = None
    slot: torch.Tensor | None = None
    masked: bool = False


def score_bias(owner: str, bias: torch.Tensor | None, allowed: torch.Tensor | None, heads, shape: tuple,
               masked: bool = False) -> ScoreBias:
    """A `ScoreBias` from what a method passes to `add_score_bias`, checked against the call's `shape` =
    (B, H, T, S); a `ValueError` names the method, the bad value and what was expected.

    `heads`: None (every head), a bool tensor (H,) or (B, H) (a selection, per sentence where (B, H)), or a sequence
    of head numbers (h of them, distinct, in [0, H)). `bias`/`allowed` broadcast to (B, h, T, S), h = H for None or
    a selection, the number of heads given otherwise (sizes 1 broadcast; fewer than 4 dimensions are aligned right).
    """
    batch, num_heads, length, key_length = shape
    if bias is None and allowed is None:
        raise ValueError(f"{owner}: add_score_bias got neither bias nor allowed; expected a float bias, a bool "
                         "allowed mask, or both")
    selection, slot, width = _heads(owner, heads, batch, num_heads, _device(bias, allowed))
    expected = (batch, width, length, key_length)
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
            raise ValueError(f"{owner}: the score bias must be a float tensor, got "
                             f"{getattr(bias, 'dtype', type(bias).__name__)}; a hard mask goes in allowed= (bool)")
        bias = _laid_out(owner, "bias", bias, expected)
    if allowed is not None:
        if not isinstance(allowed, torch.Tensor) or allowed.dtype != torch.bool:
            raise ValueError(f"{owner}: allowed must be a bool tensor (True = attend), got "
                             f"{getattr(allowed, 'dtype', type(allowed).__name__)}")
        allowed = _laid_out(owner, "allowed", allowed, expected)
    return ScoreBias(owner, bias, allowed, selection, slot, masked)


def _device(*tensors) -> torch.device:
    return next(tensor.device for tensor in tensors if isinstance(tensor, torch.Tensor))


def _laid_out(owner: str, name: str, tensor: torch.Tensor, expected: tuple) -> torch.Tensor:
    """`tensor` with 4 dimensions (1s added on the left), each 1 or the expected size."""
    shape = tuple(tensor.shape)
    if tensor.dim() > 4 or any(size not in (1, want) for size, want in zip(shape[::-1], expected[::-1])):
        raise ValueError(f"{owner}: {name} of shape {shape} does not broadcast to (batch, heads, query, key) = "
                         f"{expected}; expected each size 1 or that size")
    return tensor if tensor.dim() == 4 else tensor.reshape((1,) * (4 - tensor.dim()) + shape)


def _heads(owner: str, heads, batch: int, num_heads: int, device) -> tuple:
    """(selection (B or 1, H) bool or None, slot (H,) long or None, the bias's number of heads)."""
    if heads is None:
        return None, None, num_heads
    if isinstance(heads, torch.Tensor):
        if heads.dtype != torch.bool or heads.shape not in ((num_heads,), (1, num_heads), (batch, num_heads)):
            raise ValueError(f"{owner}: heads as a tensor must be a bool selection of shape (heads,) or (batch, "
                             f"heads) = ({num_heads},) or ({batch}, {num_heads}), got {heads.dtype} of shape "
                             f"{tuple(heads.shape)}; or pass head numbers as a sequence of ints")
        return (heads if heads.dim() == 2 else heads[None]), None, num_heads
    numbers = head_numbers(owner, heads, num_heads)
    if numbers == tuple(range(num_heads)):
        return None, None, num_heads
    place = {head: index for index, head in enumerate(numbers)}
    selection = torch.tensor([[head in place for head in range(num_heads)]], device=device)
    slot = torch.tensor([place.get(head, 0) for head in range(num_heads)], device=device)
    return selection, slot, len(numbers)


def head_numbers(owner: str, heads: Sequence[int], num_heads: int) -> tuple[int, ...]:
    """`heads` as a tuple of distinct head numbers in [0, num_heads), or a `ValueError` naming `owner`."""
    try:
        numbers = tuple(int(head) for head in heads)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: heads must be head numbers (a sequence of ints), got {heads!r}") from None
    if not numbers or len(set(numbers)) != len(numbers) or not all(0 <= head < num_heads for head in numbers):
        raise ValueError(f"{owner}: heads {list(numbers)} must be distinct head numbers in [0, {num_heads}), at "
                         "least one")
    return numbers


# --- SDPA and eager: one mask tensor ------------------------------------------------------------------------------


def biased_mask(mask: torch.Tensor | None, biases: Sequence[ScoreBias], dtype: torch.dtype,
                boolean: bool = False) -> torch.Tensor:
    """The call's mask with every bias in it, what SDPA or eager receives.

    Parameters
    ----------
    mask : None, bool (True = attend) or additive float (finfo.min where masked), (B or 1, 1 or H, T, S)
        The call's mask cut to the keys, causality explicit (None: every key allowed).
    biases
        the call's `ScoreBias` es, at least one, in the order added (they add up)
    dtype
        of an additive result (the query's)
    boolean : whether a bool result is taken (SDPA); it is returned when the mask is None or bool and the one bias is
        a hard mask (`allowed` only), else the result is additive float (two hard masks may leave a row empty,
        which a bool mask would make NaN in SDPA)

    Returns
    -------
    :
        (B or 1, 1 or H, T, S): (B, H, ...) only where a bias applies to some heads or differs between them. Biases that
        all name the same heads (one method's, usually) are combined at their own size and spread over the heads once.
    """
    allowed = _allowed(mask)
    added = None if mask is None or mask.dtype == torch.bool else mask.to(dtype)
    boolean = boolean and added is None and len(biases) == 1 and biases[0].bias is None
    shared = all(term.selection is biases[0].selection for term in biases)
    now_allowed, now_added = allowed, added
    for term in biases:
        if shared:  # the biases' own size: (B, 1 or h, T, S)
            keeps = None
            if term.allowed is not None:
                hard = term.allowed if now_allowed is None else term.allowed & now_allowed
                keeps = (hard if now_allowed is allowed else _both(allowed, term.allowed)).any(-1, keepdim=True)
                now_allowed = hard | ~keeps if now_allowed is None else torch.where(keeps, hard, now_allowed)
            now_added = _plus(now_added, _kept_bias(term, keeps, dtype))
            continue
        keeps = _keeps(term.allowed, allowed)
        if term.allowed is not None:
            factor = term.allowed if keeps is None else term.allowed | ~keeps
            now_allowed = _both(now_allowed, _spread(factor, term, True))
        if term.bias is not None:
            now_added = _plus(now_added, _spread(_kept_bias(term, keeps, dtype), term, 0.0))
    if now_allowed is not None and sum(term.allowed is not None for term in biases) > 1:
        # two hard masks that together leave a row no key: the row keeps the call's mask (never padding, never NaN)
        empty = ~now_allowed.any(-1, keepdim=True)
        now_allowed = now_allowed | (empty if allowed is None else empty & allowed)
    result = _finished(now_allowed, now_added, dtype, boolean)
    if shared and biases[0].selection is not None:  # the other heads keep the call's mask as it is
        result = _spread(result, biases[0], added if added is not None else _finished(allowed, None, dtype, boolean))
    return result


def _allowed(mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def _keeps(term_allowed: torch.Tensor | None, allowed: torch.Tensor | None) -> torch.Tensor | None:
    """(B, 1 or h, T, 1) bool: the rows where the hard mask `term_allowed` leaves a key that `allowed` (the call's
    mask) allows; elsewhere the bias is left out. None: no hard mask (the bias applies to every row)."""
    if term_allowed is None:
        return None
    hard = term_allowed if allowed is None else term_allowed & allowed
    return hard.any(-1, keepdim=True)


def _kept_bias(term: ScoreBias, keeps: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The bias in `dtype`, 0 on the rows its hard mask leaves to the call's mask (a finite bias times 0 or 1: one
    operator, its gradient the same)."""
    if term.bias is None:
        return None
    bias = term.bias.to(dtype)
    return bias if keeps is None else bias * keeps


def _both(first, second):
    return second if first is None else first & second


def _plus(first, second):
    if second is None:
        return first
    return second if first is None else first + second


def _finished(allowed, added, dtype: torch.dtype, boolean: bool) -> torch.Tensor | None:
    """The mask from what is allowed and what is added: `allowed` itself (bool), or additive `finfo.min` where
    not allowed (set by `masked_fill`/`where`, never added: adding to `finfo.min` could overflow to -inf)."""
    if boolean or (allowed is None and added is None):
        return allowed
    low = torch.finfo(dtype).min
    if allowed is None:
        return added
    if added is None:
        return torch.full(allowed.shape, low, dtype=dtype, device=allowed.device).masked_fill(allowed, 0.0)
    return torch.where(allowed, added, low)


def _spread(values: torch.Tensor, term: ScoreBias, neutral) -> torch.Tensor:
    """`values` (of the bias's heads) on the call's heads: the bias's heads get theirs, the others `neutral`
    (a tensor, or the value that changes nothing: True for a hard mask, 0 for a bias)."""
    if term.selection is None:
        return values
    if term.slot is not None and values.shape[1] > 1:
        values = values.index_select(1, term.slot)  # (., H, T, S), each head reading its place
    if neutral is None:
        neutral = True if values.dtype == torch.bool else 0.0
    return torch.where(term.selection[:, :, None, None], values, neutral)


# --- flex attention: a score_mod -----------------------------------------------------------------------------------


def biased_score_mod(biases: Sequence[ScoreBias], allowed: torch.Tensor | None) -> ScoreMod:
    """The biases as one flex `score_mod`, each read by index (no (B, H, T, S) tensor): what `biased_mask`
    adds to the scores, the call's own mask staying in the block mask.

    `allowed`: the call's mask as bool (B, 1, T, S) (the block mask's `dense_mask`) or None, read only
    for the rows a hard mask leaves to it (computed here, (B, 1 or h, T)).
    """
    return compose_score_mods([_score_mod(term, allowed) for term in biases])


def _score_mod(term: ScoreBias, allowed: torch.Tensor | None) -> ScoreMod:
    keeps = _keeps(term.allowed, allowed)
    keeps = None if keeps is None else keeps[..., 0]  # (B or 1, 1 or h, T)
    bias, hard, selection, slot = term.bias, term.allowed, term.selection, term.slot

    def score_mod(score, batch, head, query, key):
        place = head if slot is None else slot[head]
        changed = score if bias is None else score + _at(bias, batch, place, query, key)
        if hard is not None:
            changed = torch.where(_at(hard, batch, place, query, key), changed, -float("inf"))
        on = None if keeps is None else _at(keeps, batch, place, query)
        if selection is not None:
            chosen = selection[batch if selection.shape[0] > 1 else 0, head]
            on = chosen if on is None else on & chosen
        return changed if on is None else torch.where(on, changed, score)

    return score_mod


def _at(tensor: torch.Tensor, *index):
    """`tensor[index]`, with index 0 along the dimensions of size 1 (they broadcast)."""
    return tensor[tuple(position if size > 1 else 0 for position, size in zip(index, tensor.shape))]


def compose_score_mods(score_mods: Sequence[ScoreMod]) -> ScoreMod:
    """One `score_mod` that applies `score_mods` in order (each to the score the one before returned)."""
    if len(score_mods) == 1:
        return score_mods[0]

    def composed(score, batch, head, query, key):
        for score_mod in score_mods:  # (a few methods' functions, traced once by flex; no loop over heads or tokens)
            score = score_mod(score, batch, head, query, key)
        return score

    return composed


def on_heads(score_mod: ScoreMod, heads: torch.Tensor) -> ScoreMod:
    """`score_mod` (over the call's heads) for a flex call on the heads `heads` (long (h,)) only: head h of that
    call is head `heads[h]` of the call."""

    def renumbered(score, batch, head, query, key):
        return score_mod(score, batch, heads[head], query, key)

    return renumbered
