"""What a method sees of one attention call, and the hooks it changes the call's attention with
([`AttentionCall`][hf_headattn.attention_call.AttentionCall]).

A method's `before` adds score biases, flex `score_mod`s, head mixing or heads it computes itself; the attention
function (`hf_headattn.attention`) then runs the backend with them (`hf_headattn.scores` makes the biases
into each backend's mask or `score_mod`). Two methods' changes compose; what cannot is refused naming both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .context import HeadAttnContext
from .flex import FLEX, dense_mask, is_block_mask
from .hf_compat import additive_mask_allowed
from .positions import query_positions, relative_positions
from .scores import ScoreBias, ScoreMod, biased_mask, biased_score_mod, compose_score_mods, head_numbers, score_bias

Attend = Callable[..., tuple]
"""What a method that takes over heads computes for them
([`AttentionCall.take_over`][hf_headattn.attention_call.AttentionCall.take_over]), called as transformers calls an
attention function: `attend(module, query, key, value, attention_mask, dropout=, scaling=)` ->
`(output (B, T, h, D), weights (B, h, T, S) or None)`."""


@dataclass
class AttentionCall:
    """What a method sees of one attention call (shapes as transformers passes them), and the hooks it changes the
    call's attention with.

    - `query`: (B, H, T, D); key, value: (B, H, S, D) (H: the module's heads, fewer once pruned; head numbers below are
    places in this dimension); attention_mask: what transformers passes: None, bool (True = attend) or additive float
    (`finfo.min` where masked), broadcastable to (B, H, T, >= S), or on flex attention a `BlockMask`
    ([`mask_tensor`][hf_headattn.attention_call.AttentionCall.mask_tensor] gives it as a tensor; with SDPA, None may
    stand for a causal mask, `is_causal`);
    - `hidden_states`: (B, T, d_model), the module's query-side input; `implementation`: the model's backend ("sdpa",
    "eager", "flex_attention"; None where a test made the call).

    A method's `before` changes the attention through the hooks, which compose (two methods' changes both apply, in
    the order the methods run; a combination that cannot compose is refused naming both methods):

    * [`add_score_bias`][hf_headattn.attention_call.AttentionCall.add_score_bias]: a bias (and/or a hard mask) on the
    scores of some heads, per sentence if need be (SEA;
      a Gaussian locality bias; a relative-position bias); on SDPA/eager it reaches the backend inside the mask, on
      flex attention as a `score_mod` (`hf_headattn.scores`);
    * [`add_score_mod`][hf_headattn.attention_call.AttentionCall.add_score_mod]: on flex attention only, any `score_mod`
    (composed with the others);
    * [`take_over`][hf_headattn.attention_call.AttentionCall.take_over]: the method computes the attention of some heads
    itself (a value term needs the
      probabilities, which SDPA does not return); the backend runs on the other heads only;
    * [`mix_scores`][hf_headattn.attention_call.AttentionCall.mix_scores] /
    [`mix_weights`][hf_headattn.attention_call.AttentionCall.mix_weights]: mix the heads' scores before the softmax and
    their weights after it
      (talking-heads attention); the call then computes every head's probabilities itself
      (`mixed_attention`), with the other methods' score biases and the mask applied to the
      mixed scores.

    [`query_positions`][hf_headattn.attention_call.AttentionCall.query_positions],
    [`key_positions`][hf_headattn.attention_call.AttentionCall.key_positions] and
    [`relative_positions`][hf_headattn.attention_call.AttentionCall.relative_positions] give where the queries and keys
    sit in their sequences, right under a key/value cache, static or dynamic (`hf_headattn.positions`).

    Replacing `attention_mask` (or q/k/v) in `before` still works: the hooks apply to the mask as the backend then
    gets it.
    """

    module: nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attention_mask: torch.Tensor | None
    scaling: float
    hidden_states: torch.Tensor
    context: HeadAttnContext | None
    kwargs: dict[str, Any]
    head_mask: torch.Tensor | None = None  # (1 or B, H), already applied to the per-head output ``after`` gets
    state: dict[str, Any] = field(default_factory=dict)  # what a method's ``before`` leaves for its ``after``
    implementation: str | None = None
    _scores: list = field(default_factory=list, repr=False)
    """the score changes (ScoreBias, or (owner, score_mod) on flex) and the heads taken over ((owner, numbers,
    attend)), in the order added; the method whose hook runs (errors name it); the mask made for the backend"""
    _taken: list = field(default_factory=list, repr=False)
    _method: str | None = field(default=None, repr=False)
    _made_mask: tuple | None = field(default=None, repr=False)
    _mixes: list = field(default_factory=list, repr=False)
    """the head mixings ((kind "scores"/"weights", owner, matrix (H, H))), in the order added"""

    @property
    def is_cross(self) -> bool:
        return self.module.headattn_kind == "cross"

    @property
    def is_decoder(self) -> bool:
        return self.module.headattn_side == "decoder"

    @property
    def is_flex(self) -> bool:
        """Whether flex attention runs the call (transformers then passes a `BlockMask`)."""
        return self.implementation == FLEX or is_block_mask(self.attention_mask)

    @property
    def query_mask(self) -> torch.Tensor | None:
        """(B, T) bool, True at real query tokens (`None`: all real, or no context)."""
        if self.context is None:
            return None
        mask = self.context.target_mask if self.is_decoder else self.context.source_mask
        return None if mask is None or mask.shape[1] != self.query.shape[2] else mask

    @property
    def key_mask(self) -> torch.Tensor | None:
        """(B, S) bool, True at real key tokens (`None`: all real, or no context); causality is not included."""
        if self.context is None:
            return None
        mask = self.context.target_mask if self.is_decoder and not self.is_cross else self.context.source_mask
        return None if mask is None or mask.shape[1] != self.key.shape[2] else mask

    @property
    def mask_tensor(self) -> torch.Tensor | None:
        """The mask as a tensor, as the backend applies it: on SDPA/eager `attention_mask` with the score biases
        added so far in it (`biased_mask`; `attention_mask` itself while there is none), on flex
        attention the BlockMask as the bool mask (B, 1, T, S) SDPA would get (made once per forward and block mask,
        `dense_mask`), with the score biases added so far in it as SDPA would get them (so a method
        reading it sees the same on every backend); refused once a method added a raw `score_mod`
        ([`add_score_mod`][hf_headattn.attention_call.AttentionCall.add_score_mod]), which has no tensor form."""
        if self.is_flex:
            if self._scores and all(isinstance(change, ScoreBias) for change in self._scores):
                return self._biased_mask(boolean=True)
            if self._scores:
                raise ValueError(
                    f"{self.module.headattn_name}: a method's flex score_mod (from {self._owners(self._scores)}) "
                    f"changed this call's mask, which {self._method or 'a method'!r} reads as a tensor; expected "
                    "attn_implementation 'sdpa' or 'eager' for this combination"
                )
            return self._base_mask()
        return self._backend_mask()

    @property
    def explicit_mask(self) -> torch.Tensor | None:
        """The call's own mask as a tensor, without any method's changes: `attention_mask` cut to the keys, bool
        or additive float, with causality explicit (SDPA's None on a causal module is the causal mask it stands for; a
        BlockMask the bool mask SDPA would get); None: every key allowed."""
        return self._explicit_mask()

    @property
    def score_mod(self):
        raise AttributeError("AttentionCall.score_mod is gone: a method adds a score_mod with call.add_score_mod(...) "
                             "(flex attention) or a bias with call.add_score_bias(...), which compose")

    @score_mod.setter
    def score_mod(self, value) -> None:
        raise ValueError(f"{self._method or 'a method'}: setting call.score_mod would overwrite another method's; "
                         "expected call.add_score_mod(score_mod) (flex attention) or call.add_score_bias(bias, "
                         "allowed=, heads=), which compose")

    def add_score_bias(self, bias: torch.Tensor | None = None, *, allowed: torch.Tensor | None = None,
                       heads: torch.Tensor | Sequence[int] | None = None, masked: bool = False) -> None:
        """Add `bias` to the attention scores (q k^T * scaling) of `heads` and mask them where not `allowed`;
        on every backend, summed with the other methods' biases.

        Parameters
        ----------
        bias : None or float tensor broadcastable to (B, h, T, S), finite
            Added to the scores (trainable: its gradient flows through every backend; on flex attention only where
            torch differentiates a `score_mod`'s captured tensors, a GPU).
        allowed : None or bool tensor broadcastable to (B, h, T, S)
            A hard mask: False = the key is masked (-inf) for that query. A query row where it allows no key that
            the call's mask allows (e.g. a padding row) keeps the call's mask alone on these heads, `bias` left out.
        heads : None (every head: h = H), a bool tensor (H,) or (B, H) (the heads it applies to, per sentence
            where (B, H): h = H), or a sequence of head numbers (h of them: the bias's head dimension follows their
            order)
        masked : whether `bias` already holds `finfo.min` of the query's dtype wherever the call's mask (the
            mask as the backend gets it, causality explicit) masks: on SDPA, one trainable bias on every head is then
            the mask SDPA gets as it is, not masked again (one (B, H, T, S) write less; `_trainable_bias`)

        Notes
        -----
        The backend then gets (`hf_headattn.scores`): SDPA a bool mask where the call's one bias is a hard
        mask and the call's mask is bool or None, else an additive float mask (`finfo.min` where masked), eager
        always that; either (B, H, T, S) only where a bias applies to some heads or differs between heads; flex
        attention a `score_mod` reading the tensors by index (no (B, H, T, S) tensor), the padding staying in the
        block mask. A `ValueError` names the method and the bad argument.
        """
        batch, num_heads, length, _ = self.query.shape
        shape = (batch, num_heads, length, self.key.shape[2])
        self._scores.append(score_bias(self._method or "a method", bias, allowed, heads, shape, masked))

    def add_score_mod(self, score_mod: ScoreMod) -> None:
        """Flex attention only: apply `score_mod(score, batch, head, query, key) -> score` (torch's flex
        signature, the indices over the call's (B, H, T, S)) after the score changes added before it. On SDPA or
        eager a `ValueError` asks for [`add_score_bias`][hf_headattn.attention_call.AttentionCall.add_score_bias] (which
        a mask carries there)."""
        if not self.is_flex:
            raise ValueError(
                f"{self._method or 'a method'}: add_score_mod needs attn_implementation 'flex_attention', got "
                f"{self.implementation!r}; expected call.add_score_bias(bias, allowed=, heads=) on SDPA or eager"
            )
        self._scores.append((self._method or "a method", score_mod))

    def mix_scores(self, matrix: torch.Tensor) -> None:
        """Mix the heads' scores before the softmax: head i's scores become `sum_j matrix[i, j] * scores_j`
        (`scores = q k^T * scaling`; the logits projection of talking-heads attention, Shazeer et al. 2020).

        `matrix`: a float tensor (H, H) over the call's heads (fewer once pruned), trainable (its gradient flows);
        the identity changes nothing. Two mixings compose (applied in the order added). The score biases of every
        method and the call's mask then apply to the mixed scores, head by head, so a bias on head i is on the scores
        head i takes the softmax of. The call then runs every head on the mixing path
        (`mixed_attention`: eager's computation, on every backend, weights returned), not on
        the backend; heads taken over by a method ([`take_over`][hf_headattn.attention_call.AttentionCall.take_over]) or
        a raw flex `score_mod` beside it are refused, naming both methods."""
        self._mixes.append(("scores", self._method or "a method", self._mix_matrix("mix_scores", matrix)))

    def mix_weights(self, matrix: torch.Tensor) -> None:
        """Mix the heads' attention weights after the softmax: head i's weights become `sum_j matrix[i, j] *
        weights_j` (the weights projection of talking-heads attention), before dropout and the product with V.
        `matrix` and the rest as [`mix_scores`][hf_headattn.attention_call.AttentionCall.mix_scores]."""
        self._mixes.append(("weights", self._method or "a method", self._mix_matrix("mix_weights", matrix)))

    def _mix_matrix(self, hook: str, matrix) -> torch.Tensor:
        num_heads = self.query.shape[1]
        if not isinstance(matrix, torch.Tensor) or not matrix.is_floating_point() or matrix.shape != (num_heads,
                                                                                                       num_heads):
            got = (f"{matrix.dtype} of shape {tuple(matrix.shape)}" if isinstance(matrix, torch.Tensor)
                   else type(matrix).__name__)
            raise ValueError(f"{self._method or 'a method'}: {hook} needs a float matrix of shape (heads, heads) = "
                             f"({num_heads}, {num_heads}) on {self.module.headattn_name}, got {got}")
        return matrix

    def head_mix(self, kind: str) -> torch.Tensor | None:
        """The mixings of `kind` ("scores" or "weights") as one (H, H) matrix (the later ones times the earlier
        ones), or None where none was added."""
        matrices = [matrix for added, _, matrix in self._mixes if added == kind]
        if not matrices:
            return None
        combined = matrices[0]
        for matrix in matrices[1:]:
            combined = matrix.to(combined.dtype) @ combined
        return combined

    @property
    def query_positions(self) -> torch.Tensor:
        """The queries' positions in their sequence: LongTensor (T,), or (B, T) where read from a mask (an attention
        call made outside the model's forward with fewer queries than keys); `hf_headattn.positions`."""
        length, key_length, device = self.query.shape[2], self.key.shape[2], self.query.device
        offset = None if self.context is None else self.context.past_length
        if not self.is_decoder:
            return torch.arange(length, device=device)
        if self.is_cross:  # the target's positions (offset + arange(T))
            offset = 0 if offset is None else offset
            return query_positions(length, length if isinstance(offset, torch.Tensor) else offset + length, device,
                                   offset=offset)
        allowed = None
        if offset is None and length < key_length:
            allowed = key_allowed(self._explicit_mask(), key_length)
        return query_positions(length, key_length, device, offset=offset, allowed=allowed)

    @property
    def key_positions(self) -> torch.Tensor:
        """The keys' positions in their sequence (key j at j; a static cache's slots not yet filled are masked):
        LongTensor (S,)."""
        return torch.arange(self.key.shape[2], device=self.key.device)

    @property
    def relative_positions(self) -> torch.Tensor:
        """j - i, key position minus query position, for every (query, key) pair: LongTensor (T, S), or (B, T, S)
        where the query positions are per sentence
        ([`query_positions`][hf_headattn.attention_call.AttentionCall.query_positions])."""
        return relative_positions(self.query_positions, self.key_positions)

    def take_over(self, heads: Sequence[int], attend: Attend) -> None:
        """Compute the attention of `heads` (head numbers) with `attend` instead of the backend, which then runs
        on the other heads only (all of them taken: it does not run).

        `attend` is called as transformers calls an attention function, on those heads:
        `attend(module, query, key, value, attention_mask, dropout=, scaling=)` with query (B, h, T, D), key and
        value (B, h, S, D) of the heads in the order given, `attention_mask` a tensor for them: None (every key),
        bool (True = attend) or additive float (`finfo.min` where masked), broadcastable to (B, h, T, S), with
        causality explicit and the other methods' score biases on these heads in it (on flex attention too);
        `dropout` the attention dropout probability (0 in eval). It returns `(output (B, T, h, D), weights)`,
        weights (B, h, T, S) or None; the call returns weights only where every part has them as (B, ., T, S).
        Heads taken over by two methods, or a flex `score_mod`
        ([`add_score_mod`][hf_headattn.attention_call.AttentionCall.add_score_mod]) beside taken-over heads (it has no
        tensor form), are refused naming both methods."""
        owner = self._method or "a method"
        numbers = head_numbers(owner, heads, self.query.shape[1])
        for other, taken, _ in self._taken:
            if set(numbers) & set(taken):
                raise ValueError(f"{self.module.headattn_name}: {owner!r} takes over heads {list(numbers)} and "
                                 f"{other!r} heads {list(taken)}; expected each head taken over by one method")
        if not callable(attend):
            raise ValueError(f"{owner}: take_over needs a function attend(module, query, key, value, "
                             f"attention_mask, dropout=, scaling=), got {type(attend).__name__}")
        self._taken.append((owner, numbers, attend))

    @staticmethod
    def _owners(changes) -> str:
        names = dict.fromkeys(change.owner if isinstance(change, ScoreBias) else change[0] for change in changes)
        return ", ".join(repr(name) for name in names)

    def _base_mask(self) -> torch.Tensor | None:
        """`attention_mask` as a tensor, as transformers gave it (a BlockMask as bool (B, 1, T, S))."""
        cache = None if self.context is None else self.context.cache
        return dense_mask(self.attention_mask, self.query.shape[2], self.key.shape[2], cache)

    def _explicit_mask(self) -> torch.Tensor | None:
        """The call's mask as a tensor cut to the keys, with causality explicit: SDPA's None on a causal module is
        the causal mask its `is_causal` stands for (as transformers' `sdpa_attention_forward` decides it)."""
        mask, length, key_length = self._base_mask(), self.query.shape[2], self.key.shape[2]
        if mask is not None:
            return mask if mask.shape[-1] == key_length else mask[..., :key_length]
        causal = self.kwargs.get("is_causal")
        causal = getattr(self.module, "is_causal", True) if causal is None else causal
        if self.implementation != "sdpa" or length == 1 or not causal:
            return None
        device = self.query.device
        return (torch.arange(length, device=device)[:, None] >= torch.arange(key_length, device=device))[None, None]

    def _biased_mask(self, boolean: bool) -> torch.Tensor | None:
        """`_explicit_mask` with the score biases in it (the mask itself without any)."""
        biases = [change for change in self._scores if isinstance(change, ScoreBias)]
        if len(biases) < len(self._scores):
            raise ValueError(f"{self.module.headattn_name}: a flex score_mod from {self._owners(self._scores)} has no "
                             f"tensor form, which the heads {self._owners_of_taken()} take over need; expected "
                             "call.add_score_bias(...) for such a combination")
        mask = self._explicit_mask()
        return mask if not biases else biased_mask(mask, biases, self.query.dtype, boolean)

    def _owners_of_taken(self) -> str:
        return ", ".join(repr(owner) for owner, _, _ in self._taken)

    def _backend_mask(self) -> torch.Tensor | None:
        """What SDPA or eager receives: `attention_mask` unchanged without score biases, else
        `_biased_mask` (made once per call and mask)."""
        if not self._scores:
            return self.attention_mask
        made = self._made_mask
        if made is None or made[0] is not self.attention_mask or made[1] != len(self._scores):
            made = (self.attention_mask, len(self._scores), self._biased_mask(self.implementation == "sdpa"))
            self._made_mask = made
        return made[2]

    def _trainable_bias(self, dropout: float) -> tuple[torch.Tensor, torch.Tensor | None, bool] | None:
        """(bias, allowed, masked) where SDPA runs the call with `biased_sdpa`: on the CPU
        (CUDA's SDPA has a kernel for a mask's gradient), without dropout, as many key/value heads as query heads,
        where the scores' changes need a gradient: one score bias on every head without a hard mask, in the query's
        dtype, the call's mask bool or None, as it is; else (hard masks, some heads: LPEA with RHE's selection)
        `_backend_mask` where it needs one, which holds the mask (`masked`); else None (the backend gets
        `_backend_mask`)."""
        if self.implementation != "sdpa" or dropout or not self._scores or not torch.is_grad_enabled() or \
                self.query.device.type != "cpu" or self.key.shape[1] != self.query.shape[1]:
            return None
        term = self._scores[0]
        if len(self._scores) == 1 and isinstance(term, ScoreBias) and term.bias is not None and term.allowed is None \
                and term.selection is None and term.bias.requires_grad and term.bias.dtype == self.query.dtype:
            mask = self._explicit_mask()
            if mask is None or mask.dtype == torch.bool:
                return term.bias, mask, term.masked
        mask = self._backend_mask()
        if mask is None or not mask.requires_grad or mask.dtype != self.query.dtype:
            return None
        return mask, None, True

    def _flex_score_mod(self) -> ScoreMod | None:
        """The score changes as one flex `score_mod` (None: none), in the order added."""
        if not self._scores:
            return None
        needs_mask = any(isinstance(change, ScoreBias) and change.allowed is not None for change in self._scores)
        allowed = key_allowed(self._base_mask(), self.key.shape[2]) if needs_mask else None
        score_mods, biases = [], []
        for change in [*self._scores, None]:  # consecutive biases make one score_mod
            if isinstance(change, ScoreBias):
                biases.append(change)
                continue
            if biases:
                score_mods.append(biased_score_mod(biases, allowed))
                biases = []
            if change is not None:
                score_mods.append(change[1])
        return compose_score_mods(score_mods)


def key_allowed(attention_mask: torch.Tensor | None, key_length: int) -> torch.Tensor | None:
    """The keys a query may attend to by the mask transformers passes to the attention function, as bool.

    Parameters
    ----------
    attention_mask : None, BoolTensor (True = attend) or additive float tensor, shape (B, 1 or H, T, >= S)
        SDPA gets bool; eager gets `finfo.min` where masked (`additive_mask_allowed`).
    key_length : int
        S; longer masks are cut to it, as the HF backends do.

    Returns
    -------
    :
        None (every key allowed) or BoolTensor, shape (B, 1 or H, T, S)
    """
    if attention_mask is None:
        return None
    attention_mask = attention_mask[..., :key_length]
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return additive_mask_allowed(attention_mask)
