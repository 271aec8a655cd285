"""The fixed attention patterns of Raganato, Scherrer & Tiedemann 2020 as pure functions of the real keys.

"Fixed encoder self-attention patterns in Transformer-based machine translation" (Findings of EMNLP 2020): each
fixed head attends with a pattern that depends only on the positions, never on the tokens. The paper's method section
is not reachable here (`/work/shared/papers/fixed-attention-raganato.md` says what each reading rests on); the
pattern names come from a secondary description, the weights from a third-party reimplementation and EaDRA's §5.1
entropy remark, and the rest is our choice, said so below (the folder's README tabulates the sources).

The patterns, for a query at position p over the real (non-padding) keys R of its sentence:

* `current`: the token itself, p;
* `previous`: the previous token, the nearest real key j < p;
* `next`: the next token, the nearest real key j > p;
* `left`: the larger left-hand context, the real keys j < p;
* `right`: the larger right-hand context, the real keys j > p;
* `start`: the sentence from its first real token (anchor: min R);
* `end`: the sentence up to its last real token (anchor: max R: `</s>`, or mBART's language code).

Weights (`weights`, `WEIGHTS`):

* `"cubic"` (the default): a spread pattern (`left`, `right`, `start`, `end`) weighs its keys by the cube of
  their rank counted from the end of its span farthest from the anchor, m = 1, 2, ..., n (m = n at the anchor: the
  query for the contexts, the first or last token for `start`/`end`): w = m^3 / (n (n + 1) / 2)^2 (the sum of
  the cubes). So the left context rises towards the query, the right context falls away from it, `start` falls
  from the first token and `end` rises to the last. This follows the third-party reimplementation's cubic
  weights (n + 1)^3 as the summary describes them, and EaDRA §5.1's remark that exactly three fixed heads (current,
  previous, next) have zero entropy, the others low entropy: not the paper's text, which is not reachable. Ranks
  count real tokens only, so padding changes nothing.
* `"uniform"` (release 0.3's reading): each pattern weighs its keys alike, 1 / n: the contexts uniform over all
  their tokens, `start` and `end` one-hot on the first and last token (five zero-entropy heads).

Readings and choices (ours):

* **Sentence edges**: a query whose pattern has no key (no previous token at the first token, no right context at
  the last one, ...) attends to the token itself (our choice).
* **Padding never receives weight**: the patterns are over R. A padding query (whose output no real token reads)
  attends to the real token nearest to it (ties: the one on the left) where its pattern has no key; a sentence with
  no real token at all attends to the position itself.
* **Causal attention** (decoder self-attention): only keys j <= p exist, so only `current`, `previous`, `left`
  and `start` are defined there (`CAUSAL`); `start` is one-hot on the first real token there whatever
  `weights` (its cubic ranks count from the sentence's far end, which a causal query does not see), and falls
  back to the token itself while the first real token is still to come. With a cache the queries' positions are
  the attention call's ([`query_positions`][hf_headattn.attention_call.AttentionCall.query_positions]: p = past + t,
  under a dynamic cache the last T of the S keys, under a static one not: its S keys are the cache's slots, those after
  the queries empty and masked, so not real keys); without them, the last T of the S keys.
* **Cross-attention** has no query position in the source, so only `start` and `end` are defined there
  (`POSITION_FREE`).
* **Other methods' score changes** (a bias, SEA's hard mask) never reach a fixed head: its weights are fixed, so an
  anchor that such a mask would remove stays (`FixedAttention` takes the heads over on every backend).
* No attention dropout on the fixed heads: there are no learned probabilities to drop (our choice).

Shapes: B sentences, P patterns, T queries, S keys, D head dimension; `real` (B, S) bool, True at real keys;
`positions` the queries' positions among the keys, LongTensor (T,) or (B, T), None: `query_positions` (the
functions take the T = S queries to be the keys themselves, 0 .. S-1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

Pattern = Literal["current", "previous", "next", "left", "right", "start", "end"]
"""A pattern's name."""
PATTERNS: tuple[str, ...] = get_args(Pattern)
"""Every pattern, in the order of the paper's 7-fixed-heads configuration as we read it (the default)."""
Weights = Literal["cubic", "uniform"]
"""How a spread pattern weighs its keys (the default first)."""
WEIGHTS: tuple[str, ...] = get_args(Weights)
POINT = ("current", "previous", "next", "start", "end")
"""The patterns that put all the weight on one key (computed as a gather of the values)."""
CONTEXT = ("left", "right")
"""The larger contexts (a cumulative sum of the weighted values over the real keys, divided by the weights' sum)."""
CAUSAL = ("current", "previous", "left", "start")
"""The patterns defined under a causal mask (decoder self-attention): none looks at later tokens."""
POSITION_FREE = ("start", "end")
"""The patterns defined without the query's position (cross-attention)."""


def spread_patterns(weights: str, causal: bool) -> tuple[str, ...]:
    """The patterns that spread their weight over several keys with `weights` (the others are one-hot): the
    contexts, and with cubic weights `start` and `end` too (`start` not under a causal mask)."""
    if weights == "uniform":
        return CONTEXT
    if weights != "cubic":
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    return ("left", "right", "end") if causal else ("left", "right", "start", "end")


def query_positions(length: int, key_length: int, device) -> torch.Tensor:
    """(T,) the default positions of the queries among the keys: the last T of the S keys (p = S - T + t; S = T
    without a cache; right under a dynamic cache, not a static one), kept in [0, S) (cross-attention, whose queries
    have no position in the source, uses none of them but the fallback's)."""
    if length == key_length:
        return torch.arange(length, device=device)
    return (torch.arange(length, device=device) + (key_length - length)).clamp(0, key_length - 1)


def at_positions(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, T): the entries of `keys` (B, S) at the queries' `positions` (T,) or (B, T)."""
    return keys[:, positions] if positions.dim() == 1 else keys.gather(1, positions)


def _positions(positions, length: int, key_length: int, device) -> torch.Tensor | None:
    """The queries' positions, or None where the T = S queries are the keys (no gather)."""
    if length == key_length:  # (without a cache, or a static cache's first forward over all its slots: p = t)
        return None
    return query_positions(length, key_length, device) if positions is None else positions


def key_landmarks(real: torch.Tensor, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(last, first), each (B, S) long: the last real key <= j (-1: none) and the first real key >= j (S: none).
    `positions`: `arange(S)`, where already made."""
    key_length = real.shape[-1]
    positions = torch.arange(key_length, device=real.device) if positions is None else positions
    last = torch.where(real, positions, -1).cummax(-1).values
    first = torch.where(real, positions, key_length).flip(-1).cummin(-1).values.flip(-1)
    return last, first


def nearest_real(real: torch.Tensor, length: int, causal: bool, landmarks=None, positions=None) -> torch.Tensor:
    """(B, T) long: the fallback key of each query, the real key nearest to its position p (p itself where real;
    ties: the left one; causal: the nearest j <= p), p where there is none. `landmarks`: `key_landmarks`
    of `real`, where already made; `positions`: the queries' (module docstring)."""
    key_length = real.shape[-1]
    at = _positions(positions, length, key_length, real.device)
    keys = torch.arange(key_length, device=real.device) if at is None or landmarks is None else None
    last, first = key_landmarks(real, keys) if landmarks is None else landmarks
    positions = keys if at is None else at
    if at is not None:
        last, first = at_positions(last, at), at_positions(first, at)
    if causal:
        return torch.where(last >= 0, last, positions)
    take_left = (last >= 0) & ((first >= key_length) | (positions - last <= first - positions))
    return torch.where(take_left, last, torch.where(first < key_length, first, positions))


def point_indices(patterns, real: torch.Tensor, length: int, causal: bool, positions=None) -> torch.Tensor:
    """(B, P, T) long: the one key each query of each point pattern (`POINT`) attends to, with the fallback of
    `nearest_real` where the pattern has none; for a spread pattern (`spread_patterns`), that fallback,
    the key it attends to where its span is empty (`fixed_outputs` gathers both at once). `positions`: the
    queries' (module docstring)."""
    key_length = real.shape[-1]
    at = _positions(positions, length, key_length, real.device)
    keys = torch.arange(key_length, device=real.device)
    last, first = landmarks = key_landmarks(real, keys)
    nearest = nearest_real(real, length, causal, landmarks, at)
    positions = keys if at is None else at
    batch = real.shape[0]

    def at_queries(keys: torch.Tensor) -> torch.Tensor:  # (B, S) -> (B, T)
        return keys if at is None else at_positions(keys, at)

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


def span_counts(patterns, real: torch.Tensor, length: int, spread=CONTEXT, positions=None) -> torch.Tensor:
    """(B, C, T) long: the number n of real keys in each query's span for the spread patterns among `spread`:
    j < p (`left`), j > p (`right`), the whole sentence (`start`, `end`); 0 for another pattern between
    them, which `fixed_outputs` then gives its key's value, as a spread head where its span is empty.
    `positions`: the queries' (module docstring)."""
    at = _positions(positions, length, real.shape[-1], real.device)

    def at_queries(keys: torch.Tensor) -> torch.Tensor:  # (B, S) -> (B, T)
        return keys if at is None else at_positions(keys, at)

    ones = real.long()
    inclusive = ones.cumsum(-1)  # real keys j <= p
    counts = []
    for pattern in patterns:
        if pattern not in PATTERNS:
            raise ValueError(f"{pattern!r} is no pattern; expected one of {PATTERNS}")
        if pattern not in spread:
            counts.append(at_queries(torch.zeros_like(inclusive)))
        elif pattern == "left":
            counts.append(at_queries(inclusive - ones))
        elif pattern == "right":
            counts.append(at_queries(inclusive[:, -1:] - inclusive))
        else:  # start, end: the sentence
            counts.append(at_queries(inclusive[:, -1:].expand_as(inclusive)))
    return torch.stack(counts, 1)


def key_ranks(pattern: str, real: torch.Tensor) -> torch.Tensor:
    """(B, S) long: each real key's rank m for `pattern`'s cubic weights, counted from the span's end farthest from
    the anchor (1 there): 1, 2, ... from the first real token (`left`, `end`) or from the last one (`right`,
    `start`); 0 at padding."""
    inclusive = real.long().cumsum(-1)
    ranks = inclusive if pattern in ("left", "end") else inclusive[:, -1:] - inclusive + 1
    return ranks * real


def weight_sums(counts: torch.Tensor, weights: str) -> torch.Tensor:
    """The sum of the weights of n keys of a span, for `counts` n (any shape, long): n (uniform), or the sum of
    the cubes 1^3 + ... + n^3 = (n (n + 1) / 2)^2 (cubic)."""
    if weights == "uniform":
        return counts
    return (counts * (counts + 1) // 2) ** 2


def pattern_weights(patterns, real: torch.Tensor, length: int, causal: bool = False,
                    dtype: torch.dtype = torch.float32, weights: str = "cubic", positions=None) -> torch.Tensor:
    """(B, P, T, S): the weights of each pattern, dense (for `output_attentions` and the tests); each row sums to 1
    and is 0 at padding keys (but in a sentence with no real token). `positions`: the queries' (module
    docstring)."""
    key_length = real.shape[-1]
    at = _positions(positions, length, key_length, real.device)
    keys = torch.arange(key_length, device=real.device)
    rows_at = (keys if at is None else at)[..., None]  # (T, 1) or (B, T, 1)
    spread = spread_patterns(weights, causal)
    nearest = torch.nn.functional.one_hot(nearest_real(real, length, causal, positions=at), key_length).to(dtype)
    rows = []
    for pattern in patterns:
        if pattern not in spread:
            index = point_indices((pattern,), real, length, causal, at)[:, 0]
            rows.append(torch.nn.functional.one_hot(index, key_length).to(dtype))
            continue
        if pattern == "left":
            side = keys < rows_at
        elif pattern == "right":
            side = keys > rows_at
        else:
            side = torch.ones(length, key_length, dtype=torch.bool, device=real.device)
        chosen = (side if side.dim() == 3 else side[None]) & real[:, None, :]  # (B, T, S)
        factor = 1.0 if weights == "uniform" else key_ranks(pattern, real).to(dtype)[:, None, :] ** 3
        unnormalised = chosen.to(dtype) * factor
        total = unnormalised.sum(-1, keepdim=True)
        rows.append(torch.where(total > 0, unnormalised / total.clamp(min=torch.finfo(dtype).tiny), nearest))
    return torch.stack(rows, 1)


@dataclass
class Plan:
    """What `fixed_outputs` needs of one forward's real keys, made once per forward (`make_plan`) and
    shared by the layers of a side.

    - `index`: (B, h, T, D) long (expanded), the key each head gathers: a point pattern's (`point_indices`), a
    spread pattern's fallback (`nearest_real`, where its span is empty);
    - `span`: None without spread patterns, else (start, stop), the heads from the first spread head to the last (a
    point head between them counts as an empty span: its own key's value);
    - `factor`: (B, c, S, 1), each key's weight before normalising (1 or 0 at padding, uniform; m^3, cubic), or None
    without spread patterns;
    - `sides`: which keys the heads of the span sum, as runs of consecutive heads alike: ((side, first head of the run
    in the span, its length), ...), side "before" (j < p), "after" (j > p) or "all" (a point head between spread
    heads joins the run before it);
    - `scale`: (B, c, T, 1), 1 / the weights' sum (0 where the span is empty); empty: (B, c, T, 1), 1 where empty;
    - `rows`: the key rows of the queries, their positions (T,) or (B, T), or None where the queries are the keys.
    """

    index: torch.Tensor
    span: tuple[int, int] | None
    factor: torch.Tensor | None
    sides: tuple[tuple[str, int, int], ...] | None
    scale: torch.Tensor | None
    empty: torch.Tensor | None
    rows: torch.Tensor | None


SIDES = {"left": "before", "right": "after", "start": "all", "end": "all"}
"""Which keys a spread pattern sums: before the query, after it, or the whole sentence."""


def make_plan(patterns, real: torch.Tensor, length: int, causal: bool, dtype: torch.dtype, depth: int = 1,
              weights: str = "cubic", positions=None) -> Plan:
    """The `Plan` of the heads with `patterns` (in that order) for the real keys `real` (B, S), T =
    `length` queries at `positions` (module docstring) and values of `depth` (D) dimensions."""
    positions = _positions(positions, length, real.shape[-1], real.device)
    index = point_indices(patterns, real, length, causal, positions).unsqueeze(-1).expand(-1, -1, -1, depth)
    plan = Plan(index, None, None, None, None, None, positions)
    spread = spread_patterns(weights, causal)
    heads = [i for i, pattern in enumerate(patterns) if pattern in spread]
    if heads:
        start, stop = heads[0], heads[-1] + 1
        span = tuple(patterns[start:stop])
        counts = span_counts(span, real, length, spread, positions).unsqueeze(-1)  # (B, c, T, 1)
        accumulate = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        if weights == "uniform":
            plan.factor = real[:, None, :, None].to(accumulate)
        else:  # (a point head between spread heads: any factor, its span is empty)
            plan.factor = torch.stack([key_ranks(pattern if pattern in spread else "left", real) for pattern in span],
                                      1).to(accumulate)[..., None] ** 3
        runs = []
        for i, pattern in enumerate(span):
            side = SIDES[pattern] if pattern in spread else runs[-1][0]  # (the span starts with a spread head)
            if runs and runs[-1][0] == side:
                runs[-1][2] += 1
            else:
                runs.append([side, i, 1])
        plan.span = (start, stop)
        plan.sides = tuple(tuple(run) for run in runs)
        plan.scale = (1.0 / weight_sums(counts, weights).clamp(min=1).to(accumulate)) * (counts > 0)
        plan.empty = (counts == 0).to(dtype)
    return plan


def fixed_outputs(value: torch.Tensor, plan: Plan) -> torch.Tensor:
    """(B, h, T, D): the fixed heads' outputs, sum_j w_pj v_j, from their values (B, h, S, D) (heads in the order of
    the patterns `make_plan` was given) without any (T, S) tensor: one gather takes each point head's key's
    value and each spread head's fallback; a spread head sums its keys' weighted values with a cumulative sum (in
    float32 at least; forward for the keys before the query, backward for those after it, so that the query's own
    term, the largest, is what is taken off) and divides by the weights' sum, the fallback where its span is
    empty."""
    gathered = value.gather(2, plan.index)
    if plan.span is None:
        return gathered
    start, stop = plan.span
    heads = value.shape[1]
    sizes = [size for size in (start, stop - start, heads - stop) if size]
    parts = list(gathered.split(sizes, 1)) if len(sizes) > 1 else [gathered]
    here = 1 if start else 0  # the span's part
    span = value if len(sizes) == 1 else value.narrow(1, start, stop - start)
    accumulate = span if span.dtype in (torch.float32, torch.float64) else span.float()
    weighted = accumulate * plan.factor  # (B, c, S, D)
    pieces = []
    for side, first, count in plan.sides:  # (runs of heads alike: one operator each, a few per layer)
        run = weighted if count == weighted.shape[1] else weighted.narrow(1, first, count)
        if side == "before":  # j < p: the sum up to p, less p's own term (the largest: no cancellation)
            pieces.append(run.cumsum(2) - run)
        elif side == "after":  # j > p: the sum from p backwards, less p's own term
            pieces.append(run.flip(2).cumsum(2).flip(2) - run)
        else:  # the whole sentence, the same for every query
            pieces.append(run.sum(2, keepdim=True).expand_as(run))
    sums = pieces[0] if len(pieces) == 1 else torch.cat(pieces, 1)
    if plan.rows is not None:  # the queries' rows (B, c, T, D): a static cache's are not the last T
        if plan.rows.dim() == 1:
            sums = sums.index_select(2, plan.rows)
        else:
            sums = sums.gather(2, plan.rows[:, None, :, None].expand(-1, sums.shape[1], -1, sums.shape[3]))
    parts[here] = (sums * plan.scale).to(value.dtype) + parts[here] * plan.empty
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)
