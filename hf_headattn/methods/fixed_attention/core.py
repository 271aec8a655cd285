"""Fixed attention: fixed, token-independent attention patterns on some heads (Raganato, Scherrer & Tiedemann 2020).

"Fixed encoder self-attention patterns in Transformer-based machine translation" (Findings of EMNLP 2020): in each
encoder self-attention layer of 8 heads, 7 heads attend with a fixed pattern of positions (the current token, the
previous token, the next token, the larger left-hand and right-hand contexts, and, as we read it, the first and the
last token) and 1 head stays learnable; the abstract reports translation quality close to the fully learned
encoder. The patterns, their weights (cubic by default, `weights`) and our readings of what the sources leave open
(the sentence edges, padding) are in `equations`; where each setting comes from: the folder's README.

Here each fixed head is taken over (`call.take_over`) on every backend: it computes no query-key product; its
output is the pattern's weighted sum of its values (a shift of V, V itself, cumulative sums of weighted V divided by
the weights' sum), computed without a (T, S) tensor. The head's q/k projection rows are still computed by HF's
module and unused (so they get zero gradient). On eager, whose callers expect every head's (T, S) weights
(`output_attentions`), the fixed heads return their patterns' dense weights, the ones their output was computed
with; SDPA and flex attention return no weights, as for the other heads. Other methods' score biases and hard masks
(SEA's, Localness's, a relative-position key term) never reach a fixed head: its weights are fixed.

Head masks scale a fixed head's output as any head's (the shared layer does it). Pruning a fixed head is supported:
the head and its pattern go, the other fixed heads keep theirs (renumbered), so a pruned model equals the unpruned
one with the head masked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from ...attention import AttentionCall, AttentionMethod, key_allowed
from ...placement import layer_placements, renamed
from ...registry import HeadUse, MethodSettings, MethodSpec
from .equations import (
    CAUSAL,
    PATTERNS,
    POSITION_FREE,
    Pattern,
    Weights,
    fixed_outputs,
    make_plan,
    pattern_weights,
)

NAME = "fixed_attention"


@dataclass(frozen=True)
class FixedAttentionSettings(MethodSettings):
    """Fixed attention's settings (`config.fixed_attention`).

    - `patterns`: the fixed heads' patterns, one per fixed head (`equations`; default the paper's 7 as we read
        them: current, previous, next, left, right, start, end). Fewer than the layer's heads: the other heads stay
        learnable (e.g. `["previous", "next"]`). A pattern may repeat.
    - `encoder_layers`: the encoder layers whose self-attention gets the fixed heads ("all", the default; layer numbers,
        negative counting from the end; None: none).
    - `decoder_layers`: the decoder layers whose self-attention gets them too (default None: none; only the patterns
        that respect the causal mask, `CAUSAL`).
    - `cross_layers`: the decoder layers whose cross-attention gets them too (default None: none; only the
        position-free patterns, `POSITION_FREE`: a target query has no position in the source).
    - `heads`: the head numbers that are fixed, one per pattern, in the patterns' order (negative ones count from the
        end; None: the first `len(patterns)` heads).
    - `weights`: how the spread patterns weigh their keys (`equations`): "cubic" (the default: weights that decay
        away from each pattern's anchor, the cube of the rank, as a third-party reimplementation has them; three
        one-hot heads of the seven, as EaDRA §5.1 reports) or "uniform" (release 0.3's reading: uniform contexts,
        one-hot start and end). A config.json saved before this setting existed loads with "uniform", the reading it
        was trained with (`MethodSpec.older_files_defaults`).
    """

    patterns: list[Pattern] = field(default_factory=lambda: list(PATTERNS))
    encoder_layers: list[int] | Literal["all"] | None = "all"
    decoder_layers: list[int] | Literal["all"] | None = None
    cross_layers: list[int] | Literal["all"] | None = None
    heads: list[int] | None = None
    weights: Weights = "cubic"

    def validate(self, config, name: str) -> None:
        if not self.patterns:
            raise ValueError(f"{name}.patterns must name at least one pattern of {PATTERNS}, got []")
        placed = {"cross" if kind == "cross" else side for side, _, kind in layer_placements(self, config, name)}
        for switch, allowed, why in (("decoder_layers", CAUSAL, "decoder self-attention is causal (no later token)"),
                                     ("cross_layers", POSITION_FREE, "a target query has no position in the source")):
            refused = [pattern for pattern in dict.fromkeys(self.patterns) if pattern not in allowed]
            if getattr(self, switch) and refused:
                raise ValueError(f"{name}.patterns contains {refused}, which {name}.{switch}={getattr(self, switch)!r} "
                                 f"cannot use: {why}; expected patterns among {allowed} there")
        sides = [("encoder self-attention", config.encoder_attention_heads)] if "encoder" in placed else []
        if "decoder" in placed or "cross" in placed:
            sides.append(("decoder attention", config.decoder_attention_heads))
        for where, num_heads in sides:
            if len(self.patterns) >= num_heads:
                raise ValueError(f"{name}.patterns has {len(self.patterns)} patterns, but {where} has {num_heads} "
                                 f"heads: expected fewer patterns than heads (at least one head stays learnable)")
            if self.heads is None:
                continue
            if len(self.heads) != len(self.patterns) or not all(-num_heads <= head < num_heads for head in self.heads) \
                    or len({head % num_heads for head in self.heads}) != len(self.heads):
                raise ValueError(f"{name}.heads must be {len(self.patterns)} distinct head numbers in [{-num_heads}, "
                                 f"{num_heads - 1}] ({where}; negative ones count from the end), one per pattern, got "
                                 f"{self.heads!r}")


def placements(settings: FixedAttentionSettings, config) -> list[tuple[str, int, str]]:
    return layer_placements(settings, config, NAME)


def older_spellings(values) -> tuple[dict, list]:
    """0.3's development builds' switches `decoder` / `cross` (True: every decoder layer) as `decoder_layers` /
    `cross_layers`, and their `encoder_layers=None` (every layer) as `"all"` where the dict uses none of the new
    layer fields (`MethodSpec.older_spellings`)."""
    notes = []
    older = "decoder" in values or "cross" in values
    for switch in ("decoder", "cross"):
        values = renamed(values, switch, f"{switch}_layers", lambda on: "all" if on else None, notes)
    if "encoder_layers" in values and values["encoder_layers"] is None and (
            older or not {"decoder_layers", "cross_layers"} & set(values)):
        values = renamed(values, "encoder_layers", "encoder_layers", lambda value: "all", notes)
        notes[-1] = ("encoder_layers=None (every layer)", "encoder_layers='all'")  # (the same key, a new meaning)
    return values, notes


class FixedAttention(AttentionMethod):
    """The fixed heads of one attention module: `heads[i]` attends with `patterns[i]`; the other heads are the
    module's own (learned). No parameters."""

    def __init__(self, patterns, heads, causal: bool, weights: str = "cubic"):
        super().__init__()
        self.causal, self.weights = causal, weights
        self._set(tuple(patterns), tuple(heads))

    def _set(self, patterns: tuple[str, ...], heads: tuple[int, ...]) -> None:
        """Keep the pairs, and the order they are taken over in: ascending head numbers (`taken`, with their
        patterns `taken_patterns`), so that the shared layer cuts consecutive fixed heads as one view and puts their
        outputs in place without an index (the default heads 0 .. P-1 are one such run)."""
        self.patterns, self.heads = patterns, heads
        order = sorted(range(len(heads)), key=heads.__getitem__)
        self.taken = tuple(heads[i] for i in order)
        self.taken_patterns = tuple(patterns[i] for i in order)

    def extra_repr(self) -> str:
        return (f"heads={list(self.heads)}, patterns={list(self.patterns)}, causal={self.causal}, "
                f"weights={self.weights!r}")

    def prune_heads(self, keep: torch.Tensor) -> None:
        """The module keeps the heads `keep`: a pruned fixed head's pattern goes with it, the others are
        renumbered."""
        place = {int(old): new for new, old in enumerate(keep.tolist())}
        pairs = [(pattern, place[head]) for pattern, head in zip(self.patterns, self.heads) if head in place]
        self._set(tuple(pattern for pattern, _ in pairs), tuple(head for _, head in pairs))

    def before(self, call: AttentionCall) -> None:
        """Take over the fixed heads (`attend`) on every backend, their real keys the context's mask of this
        side where it fits the call, else read from the mask `attend` gets, their queries at the call's positions
        (`call.query_positions`: right under a static cache too) in self-attention with fewer queries than keys;
        on eager they also return their dense weights (`output_attentions`)."""
        if not self.taken:
            return
        site = (call.is_decoder, call.is_cross)
        cached = not call.is_cross and call.query.shape[2] != call.key.shape[2]  # (else the queries are the keys)
        call.take_over(self.taken, self._attend_with(call.key_mask, call.context, site, call.implementation == "eager",
                                                     (lambda: call.query_positions) if cached else None))

    def _attend_with(self, real, context, site, eager: bool, positions=None):
        """`positions`: None, or a function giving the queries' positions (called only where a plan is made)."""
        def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None):
            output = self.attend(value, query.shape[2], attention_mask, real, context, site, positions)
            if not eager:
                return output, None
            keys = self.real_keys(value, attention_mask, real)
            return output, pattern_weights(self.taken_patterns, keys, query.shape[2], self.causal, query.dtype,
                                           self.weights, positions() if callable(positions) else positions)

        return attend

    def attend(self, value: torch.Tensor, length: int, attention_mask, real: torch.Tensor | None, context,
               site=None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The fixed heads' output (B, T, h, D) from their values (B, h, S, D) for T = `length` queries (heads in
        the order taken over: ascending, `taken`) at `positions` among the keys ((T,) or (B, T), or a function
        giving them; None: the last T); `site`: the plan's key in the context's cache."""
        plan = self.plan(value, attention_mask, real, context, length, site, positions)
        return fixed_outputs(value, plan).transpose(1, 2)

    def real_keys(self, value: torch.Tensor, attention_mask, real: torch.Tensor | None) -> torch.Tensor:
        """(B, S) bool: the context's key mask where given, else the keys some query may attend to by the mask, else
        every key."""
        if real is not None:
            return real
        batch, key_length = value.shape[0], value.shape[2]
        allowed = key_allowed(attention_mask, key_length)
        if allowed is None:
            return torch.ones(batch, key_length, dtype=torch.bool, device=value.device)
        return allowed.any(1).any(1).expand(batch, key_length)

    def plan(self, value, attention_mask, real, context, length: int, site=None, positions=None):
        """The `make_plan` of this call, made once per forward and site (encoder, decoder self-
        or cross-attention) for the layers whose real keys come from the context (its key holds no size: a
        forward's sizes are one per site, and a size in a dict key would be a guard of a compiled graph)."""
        key = (NAME, "plan", self.taken_patterns, self.causal, self.weights, site)  # (D, dtype: one per model)
        cache = None if context is None or real is None or site is None else context.cache
        if cache is not None and key in cache:
            return cache[key]
        made = make_plan(self.taken_patterns, self.real_keys(value, attention_mask, real), length, self.causal,
                         value.dtype, value.shape[-1], self.weights, positions() if callable(positions) else positions)
        if cache is not None:
            cache[key] = made
        return made


def fixed_heads(settings: FixedAttentionSettings, num_heads: int) -> list[int]:
    """The fixed heads' numbers in a module of `num_heads` heads, one per pattern in the patterns' order
    (`settings.heads`, negative ones counting from the end; None: the first `len(patterns)`)."""
    heads = range(len(settings.patterns)) if settings.heads is None else settings.heads
    return [head % num_heads for head in heads]


def build(settings: FixedAttentionSettings, config, module) -> FixedAttention:
    heads = fixed_heads(settings, module.num_heads)
    causal = module.headattn_side == "decoder" and module.headattn_kind == "self"
    return FixedAttention(settings.patterns, heads, causal, settings.weights)


def collect(context, settings: FixedAttentionSettings):
    """No output fields and no objective term: the fixed heads only change the attention."""
    return {}, None


def head_use(settings: FixedAttentionSettings, config, site) -> HeadUse:
    """The fixed heads are taken over, and their weights are the patterns' (no softmax of the scores)."""
    count = config.encoder_attention_heads if site[0] == "encoder" else config.decoder_attention_heads
    heads = tuple(sorted(fixed_heads(settings, count)))
    return HeadUse(takes_over=heads, fixes=heads)


METHOD = MethodSpec(NAME, FixedAttentionSettings, placements, build, collect,
                    older_files_defaults={"weights": "uniform"},  # release 0.3's reading, before the setting existed
                    older_spellings=older_spellings,
                    head_use=head_use, kit="hf_headattn.methods.fixed_attention.kit")
