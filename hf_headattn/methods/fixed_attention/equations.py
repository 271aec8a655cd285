"""The fixed attention patterns of Raganato, Scherrer & Tiedemann 2020 as pure functions of the real keys.

"Fixed encoder self-attention patterns in Transformer-based machine translation" (Findings of EMNLP 2020), §3: each
fixed head attends with a pattern that depends only on the positions, never on the tokens. Written from our reading
of the paper (its text is not in this repository, and its section numbers here, §3 for the method, are from memory:
check them); where the paper leaves a point open, or we are not sure of it, the choice is ours and said so.

The patterns, for a query at position p over the real (non-padding) keys R of its sentence (§3, Figure 1):

* ``current``: the token itself, p;
* ``previous``: the previous token, the nearest real key j < p;
* ``next``: the next token, the nearest real key j > p;
* ``left``: the larger left-hand context, all real keys j < p;
* ``right``: the larger right-hand context, all real keys j > p;
* ``start``: the first real token of the sentence (min R);
* ``end``: the last real token of the sentence (max R: ``</s>``, or mBART's language code).

Readings and choices (ours):

* **Larger contexts** weigh their keys uniformly, 1 / |{j in R: j < p}| (our choice, not checked against the paper,
  which may weigh nearer tokens more: the uniform reading needs no further constant, and it is a cumulative sum of
  the values divided by a count, no (T, S) product). A decaying weight would be another pattern name.
* **Start and end** as the sixth and seventh pattern of the paper's 7-fixed-heads configuration are our
  reconstruction, less certain than the five above (the current, previous and next token and the two larger
  contexts); a user who reads the paper otherwise lists the patterns (``patterns=[...]``).
* **Sentence edges**: a query whose pattern has no key (no previous token at the first token, no right context at
  the last one, ...) attends to the token itself (our choice).
* **Padding never receives weight**: the patterns are over R. A padding query (whose output no real token reads)
  attends to the real token nearest to it (ties: the one on the left) where its pattern has no key; a sentence with
  no real token at all attends to the position itself.
* **Causal attention** (decoder self-attention): only keys j <= p exist, so only ``current``, ``previous``, ``left``
  and ``start`` are defined there (:data:`CAUSAL`); ``start`` falls back to the token itself while the first real
  token is still to come. With a cache the queries are the last T of the S keys: p = S - T + t.
* **Cross-attention** has no query position in the source, so only ``start`` and ``end`` are defined there
  (:data:`POSITION_FREE`).
* No attention dropout on the fixed heads where they are taken over (SDPA, flex attention): there are no learned
  probabilities to drop (our choice). Eager runs them in its own product and drops them as every head's
  (:meth:`~.core.FixedAttention.on_eager`): train with ``attention_dropout=0`` for one behaviour everywhere.

Shapes: B sentences, P patterns, T queries, S keys, D head dimension; ``real`` (B, S) bool, True at real keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from ...attention import constant

#: A pattern's name.
Pattern = Literal["current", "previous", "next", "left", "right", "start", "end"]
#: Every pattern, in the order of the paper's 7-fixed-heads configuration as we read it (the default).
PATTERNS: tuple[str, ...] = get_args(Pattern)
#: The patterns that put all the weight on one key (computed as a gather of the values).
POINT = ("current", "previous", "next", "start", "end")
#: The larger contexts (a cumulative sum of the values over the real keys, divided by their count).
CONTEXT = ("left", "right")
#: The patterns defined under a causal mask (decoder self-attention): none looks at later tokens.
CAUSAL = ("current", "previous", "left", "start")
#: The patterns defined without the query's position (cross-attention).
POSITION_FREE = ("start", "end")


def query_positions(length: int, key_length: int, device) -> torch.Tensor:
    """(T,) the queries' positions among the keys: the last T of the S keys (p = S - T + t; S = T without a cache),
    kept in [0, S) (cross-attention, whose queries have no position in the source, uses none of them but the
    fallback's)."""
    if length == key_length:
        return torch.arange(length, device=device)
    return (torch.arange(length, device=device) + (key_length - length)).clamp(0, key_length - 1)


def key_landmarks(real: torch.Tensor, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(last, first), each (B, S) long: the last real key <= j (-1: none) and the first real key >= j (S: none).
    ``positions``: ``arange(S)``, where already made."""
    key_length = real.shape[-1]
    positions = torch.arange(key_length, device=real.device) if positions is None else positions
    last = torch.where(real, positions, -1).cummax(-1).values
    first = torch.where(real, positions, key_length).flip(-1).cummin(-1).values.flip(-1)
    return last, first


def nearest_real(real: torch.Tensor, length: int, causal: bool, landmarks=None, positions=None) -> torch.Tensor:
    """(B, T) long: the fallback key of each query, the real key nearest to its position p (p itself where real;
    ties: the left one; causal: the nearest j <= p), p where there is none. ``landmarks``: :func:`key_landmarks`
    of ``real``, and ``positions``: :func:`query_positions`, where already made."""
    key_length = real.shape[-1]
    positions = query_positions(length, key_length, real.device) if positions is None else positions
    last, first = key_landmarks(real, positions if length == key_length else None) if landmarks is None else landmarks
    if length != key_length:  # (self-attention without a cache: the queries are the keys)
        last, first = last[:, positions], first[:, positions]
    if causal:
        return torch.where(last >= 0, last, positions)
    take_left = (last >= 0) & ((first >= key_length) | (positions - last <= first - positions))
    return torch.where(take_left, last, torch.where(first < key_length, first, positions))


def point_indices(patterns, real: torch.Tensor, length: int, causal: bool) -> torch.Tensor:
    """(B, P, T) long: the one key each query of each point pattern (:data:`POINT`) attends to, with the fallback of
    :func:`nearest_real` where the pattern has none; for a context pattern (:data:`CONTEXT`), that fallback, the key
    it attends to where its context is empty (:func:`fixed_outputs` gathers both at once)."""
    key_length = real.shape[-1]
    positions = query_positions(length, key_length, real.device)
    last, first = landmarks = key_landmarks(real, positions if length == key_length else None)
    nearest = nearest_real(real, length, causal, landmarks, positions)
    batch = real.shape[0]

    def at_queries(keys: torch.Tensor) -> torch.Tensor:  # (B, S) -> (B, T)
        return keys if length == key_length else keys[:, positions]

    indices = []
    for pattern in patterns:
        if pattern == "current" or pattern in CONTEXT:
            index = nearest
        elif pattern == "previous":  # the last real key <= p - 1
            index = at_queries(torch.nn.functional.pad(last[:, :-1], (1, 0), value=-1))
            index = torch.where(index >= 0, index, nearest)
        elif pattern == "next":  # the first real key >= p + 1
            # (a fill of S by torch.full, not pad's value=: a Python number would make S a constant when compiled)
            index = at_queries(torch.cat([first[:, 1:], torch.full_like(first[:, :1], key_length)], 1))
            index = torch.where(index < key_length, index, nearest)
        elif pattern == "start":
            index = first[:, :1].expand(batch, length)
            ok = index < key_length
            index = torch.where(ok & (index <= positions) if causal else ok, index, nearest)
        elif pattern == "end":
            index = last[:, -1:].expand(batch, length)
            index = torch.where(index >= 0, index, nearest)
        else:
            raise ValueError(f"{pattern!r} is no pattern; expected one of {PATTERNS}")
        indices.append(index)
    return torch.stack(indices, 1)


def context_counts(patterns, real: torch.Tensor, length: int) -> torch.Tensor:
    """(B, C, T) long: the number of real keys of each query's larger context (:data:`CONTEXT`): j < p (left) or
    j > p (right); 0 for a point pattern (:data:`POINT`) between context patterns, which :func:`fixed_outputs` then
    gives its key's value, as a context head where its context is empty."""
    key_length = real.shape[-1]
    positions = None if length == key_length else query_positions(length, key_length, real.device)

    def at_queries(keys: torch.Tensor) -> torch.Tensor:  # (B, S) -> (B, T)
        return keys if positions is None else keys[:, positions]

    ones = real.long()
    inclusive = ones.cumsum(-1)  # real keys j <= p
    counts = []
    for pattern in patterns:
        if pattern == "left":
            counts.append(at_queries(inclusive - ones))
        elif pattern == "right":
            counts.append(at_queries(inclusive[:, -1:] - inclusive))
        elif pattern in POINT:
            counts.append(at_queries(torch.zeros_like(inclusive)))
        else:
            raise ValueError(f"{pattern!r} is no pattern; expected one of {PATTERNS}")
    return torch.stack(counts, 1)


def pattern_weights(patterns, real: torch.Tensor, length: int, causal: bool = False,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, P, T, S): the weights of each pattern, dense (for ``output_attentions`` and the tests); each row sums to 1
    and is 0 at padding keys (but in a sentence with no real token)."""
    key_length = real.shape[-1]
    positions = query_positions(length, key_length, real.device)
    keys = torch.arange(key_length, device=real.device)
    nearest = torch.nn.functional.one_hot(nearest_real(real, length, causal), key_length).to(dtype)  # (B, T, S)
    rows = []
    for pattern in patterns:
        if pattern in POINT:
            index = point_indices((pattern,), real, length, causal)[:, 0]
            rows.append(torch.nn.functional.one_hot(index, key_length).to(dtype))
            continue
        side = keys[None, :] < positions[:, None] if pattern == "left" else keys[None, :] > positions[:, None]
        chosen = (side[None] & real[:, None, :]).to(dtype)  # (B, T, S)
        count = chosen.sum(-1, keepdim=True)
        rows.append(torch.where(count > 0, chosen / count.clamp(min=1), nearest))
    return torch.stack(rows, 1)


@dataclass
class Plan:
    """What :func:`fixed_outputs` needs of one forward's real keys, made once per forward (:func:`make_plan`) and
    shared by the layers of a side.

    index: (B, h, T, D) long (expanded), the key each head gathers: a point pattern's (:func:`point_indices`), a
    context pattern's fallback (:func:`nearest_real`, where its context is empty);
    span: None without context patterns, else (start, stop), the heads from the first context head to the last (a
    point head between them counts as an empty context: its own key's value);
    real: (B, 1, S, 1), 1 at real keys (in the values' dtype), or None without context patterns;
    left: which heads of the span are left-hand contexts (else right-hand): True or False where all are alike, else
    (1, c, 1, 1) bool (:func:`left_heads`);
    scale: (B, c, T, 1), 1 / the context's count (0 where empty); empty: (B, c, T, 1), 1 where empty;
    offset: S - T, the first key row of the queries.
    """

    index: torch.Tensor
    span: tuple[int, int] | None
    real: torch.Tensor | None
    left: bool | torch.Tensor | None
    scale: torch.Tensor | None
    empty: torch.Tensor | None
    offset: int


def left_heads(patterns, device) -> torch.Tensor:
    """(1, c, 1, 1) bool: True at the left-hand contexts among ``patterns`` (made once per device:
    :func:`~hf_headattn.attention.constant`)."""
    return constant(tuple(pattern == "left" for pattern in patterns), torch.bool, device)[None, :, None, None]


def make_plan(patterns, real: torch.Tensor, length: int, causal: bool, dtype: torch.dtype, depth: int = 1) -> Plan:
    """The :class:`Plan` of the heads with ``patterns`` (in that order) for the real keys ``real`` (B, S), T =
    ``length`` queries and values of ``depth`` (D) dimensions."""
    key_length = real.shape[-1]
    index = point_indices(patterns, real, length, causal).unsqueeze(-1).expand(-1, -1, -1, depth)
    plan = Plan(index, None, None, None, None, None, key_length - length)
    contexts = [i for i, pattern in enumerate(patterns) if pattern in CONTEXT]
    if contexts:
        start, stop = contexts[0], contexts[-1] + 1
        span = tuple(patterns[start:stop])
        counts = context_counts(span, real, length).unsqueeze(-1)  # (B, c, T, 1)
        sides = {pattern == "left" for pattern in span if pattern in CONTEXT}
        plan.span = (start, stop)
        plan.real = real[:, None, :, None].to(dtype)
        plan.left = sides.pop() if len(sides) == 1 else left_heads(span, real.device)
        plan.scale = (1.0 / counts.clamp(min=1).to(dtype)) * (counts > 0)
        plan.empty = (counts == 0).to(dtype)
    return plan


def fixed_outputs(value: torch.Tensor, plan: Plan) -> torch.Tensor:
    """(B, h, T, D): the fixed heads' outputs, sum_j w_pj v_j, from their values (B, h, S, D) (heads in the order of
    the patterns :func:`make_plan` was given) without any (T, S) tensor: one gather takes each point head's key's
    value and each context head's fallback; a context head takes a cumulative sum of the real keys' values (in
    float32 at least) and divides by the count, the fallback where its context is empty."""
    gathered = value.gather(2, plan.index)
    if plan.span is None:
        return gathered
    start, stop = plan.span
    heads = value.shape[1]
    sizes = [size for size in (start, stop - start, heads - stop) if size]
    parts = list(gathered.split(sizes, 1)) if len(sizes) > 1 else [gathered]
    here = 1 if start else 0  # the span's part
    context = value if len(sizes) == 1 else value.narrow(1, start, stop - start)
    accumulate = context if context.dtype in (torch.float32, torch.float64) else context.float()
    masked = accumulate * plan.real
    running = masked.cumsum(2)  # real keys j <= p
    if plan.left is True:  # j < p
        sums = running - masked
    elif plan.left is False:  # j > p
        sums = running[:, :, -1:] - running
    else:
        sums = torch.where(plan.left, running - masked, running[:, :, -1:] - running)
    if plan.offset:
        sums = sums[:, :, plan.offset:]
    parts[here] = (sums * plan.scale).to(value.dtype) + parts[here] * plan.empty
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)
