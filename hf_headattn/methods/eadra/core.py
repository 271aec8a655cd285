"""EaDRA: entropy- and distance-regularized attention (Araabi, Niculae & Monz, §3, Eq. 1-9).

Eq. 9 adds `alpha_peak R_peak + alpha_sent R_sent + alpha_dist R_dist` per component (encoder self-attention,
decoder self-attention, cross-attention) to the translation loss. The math is in `equations`; this module
holds the settings, the `EaDRA` method attached to each regularized attention module, and the reduction.

How it runs (fast by design): the backend (SDPA, eager, ...) computes the attention output as usual; `after` only
keeps the call's queries, keys and masks. When the model collects the terms, the layers of all components go through
one fused pass (`layer_regularizers`; lengths padded to the longest, see `layer_terms`):
`softmax(q_h k_h^T * scaling +
mask)` in float32 for the regularized heads only (the *first* `num_heads` heads of each regularized layer), the
three terms, and a hand-written backward straight to q and k. The support of each query: keys the model's mask lets
it see (a bool mask, or an additive one above half its dtype's minimum), for decoder self-attention also its causal
prefix (offset `key_len - query_len` with a cache; SDPA may get no mask and `is_causal`), and never padding keys
(the context's masks). Nothing happens without a context (e.g. `generate` running the encoder alone) or when no
loss is needed (`generate`, inference without labels under `no_grad`). Dropout is not applied to these
probabilities.

Reductions (the authors' fairseq code, `aliaraabi/EaDRA`, where it works; see `equations` for per-query
choices): per sentence and head, R_peak is the mean over real queries of H_N, R_sent = -H_N(query-averaged
attention), R_dist the sum over consecutive real query pairs; the settings `dist_reduction` and `peak_reduction`
rescale them per sentence and head (`rescale_terms`; by default R_dist becomes the *mean* over the pairs, the
fidelity study's choice) and `warmup_steps` scales the alphas (`_warmup`). These are **summed** over the
regularized heads and
layers of a component and over the sentences of the batch (the authors' code sums its stacked layer x batch x head
tensor), then **divided by the number of real target tokens** of the batch, because fairseq divides the summed loss,
penalties included, by `sample_size` = target tokens. So the terms sit next to the model's per-token NLL at the
scale Table 6's alphas were tuned at, and with gradient accumulation (`losses.total_objective`) the accumulated term
is the sum over sentences divided by all the batch's target tokens, as in fairseq. Without a target mask (no labels)
every decoder position counts as a target token; an encoder-only setting without one counts source tokens instead.
Unlike the authors' code, padding never counts (they normalise by the padded length), R_dist follows Eq. 8 (their
matrix product does not run) and only the chosen heads are regularized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from ...attention import AttentionCall, AttentionMethod, HeadAttnContext, HeadIndex, key_allowed
from ...hf_compat import init_zeros_
from ...placement import heads_of, layers_of
from ...registry import HeadUse, MethodSettings, MethodSpec
from ...settings_checks import allowed_values, check_choice, check_range
from ...sites import COMPONENT_SITES, COMPONENTS, component_of, component_shape
from .equations import TERMS
from .passes import check_implementation, layer_regularizers

NAME = "eadra"
ALPHA_SCALE = 0.1
"""Every alpha's factor by default (`EaDRASettings.alpha_scale`): the fidelity study's choice on Multi30k
(docs/results/fidelity-study.md), kept by the converged study (docs/results/converged-study.md: 0.1 ahead of 0.3
and 1.0)."""
DEFAULTS = {
    "encoder": {"alpha_peak": 0.0, "alpha_sent": 0.8, "alpha_dist": 0.02},
    "decoder": {"alpha_peak": 0.0, "alpha_sent": 0.8, "alpha_dist": 2.0},
    "cross": {"alpha_peak": 0.0, "alpha_sent": 8.0, "alpha_dist": 0.1},
}
"""Table 6, WMT En-De (100k) rows; alpha_peak 0 because "alpha_dist appears to render alpha_peak redundant"
(Appendix A). num_heads None = three quarters of the heads (6 of 8 from scratch, §5.3); layers "all"."""


@dataclass(frozen=True)
class ComponentSettings(MethodSettings):
    """One component's settings (a dict under `config.eadra["encoder" | "decoder" | "cross"]`; missing alphas take
    [`DEFAULTS`][hf_headattn.methods.eadra.core.DEFAULTS]). num_heads: how many heads are regularized, the first ones
    (None: three quarters, §5.3);

    - `heads`: which heads instead, "all" or head numbers (the paper does not say which heads); layers: the component's
    layers in the placement vocabulary (`hf_headattn.placement`: "all", the default, or layer numbers; the
    component's key names the attention kind, so `eadra["encoder"]["layers"]` is the vocabulary's
    `encoder_layers`)."""

    alpha_peak: float | None = None
    alpha_sent: float | None = None
    alpha_dist: float | None = None
    num_heads: int | None = None
    heads: list[int] | Literal["all"] | None = None
    layers: list[int] | Literal["all"] = "all"

    def resolved_for(self, component: str, config, where: str) -> ComponentSettings:
        """Every field resolved for `component`: alphas filled in, `num_heads` an integer, `heads` None (the
        first `num_heads`) or sorted indices, `layers` a sorted list of non-negative indices."""
        alphas = {key: default if getattr(self, key) is None else getattr(self, key)
                  for key, default in DEFAULTS[component].items()}
        for key, value in alphas.items():
            check_range(value, f"{where}[{key!r}]", 0.0)
        num_layers, heads = component_shape(config, component)
        chosen, num_heads = None, self.num_heads
        if self.heads is not None:
            chosen = heads_of(self.heads, heads, f"{where}['heads']")
            if num_heads is not None and num_heads != len(chosen):
                raise ValueError(f"{where} sets num_heads={num_heads!r} and {len(chosen)} heads {chosen}; "
                                 "expected one of them")
            num_heads, chosen = len(chosen), None if chosen == list(range(len(chosen))) else chosen
        if num_heads is None:
            num_heads = max(1, round(0.75 * heads))
        if not 1 <= num_heads <= heads:
            raise ValueError(f"{where}['num_heads'] must be an integer in [1, {heads}] (the model's heads), got "
                             f"{num_heads!r}")
        layers = layers_of(self.layers, num_layers, f"{where}['layers']")
        return dataclasses.replace(self, **alphas, num_heads=num_heads, heads=chosen, layers=layers)


@dataclass(frozen=True)
class EaDRASettings(MethodSettings):
    """EaDRA's settings (`config.eadra`): one dict per regularized component, absent or None = not regularized.

    The readings of the paper's open choices (README "The papers' open choices", docs/results/fidelity-study.md):
    `dist_reduction` and `peak_reduction` (how R_dist, Eq. 8, and R_peak, Eq. 4, are reduced per sentence and
    head, `rescale_terms`; "sum" and "sum" read the equations literally), `warmup_steps` (the alphas grow
    linearly from 0 over that many training steps, `_warmup`; 0: off) and `alpha_scale` (every alpha is
    multiplied by it: the paper tunes its alphas per component, §5.3, and Table 6's, the per-component defaults, were
    tuned for Transformer-base on 100k WMT sentences; 1.0 uses them as they are).

    `implementation` changes no value, only how the regularizer pass runs (chosen in one place,
    `passes`): "auto" (under `torch.compile` on CUDA, where the eager pass is some twenty
    memory-bound passes over float32 maps; eager on the CPU), "eager", "compiled" (`compiled`) or "triton" (tiled
    Triton kernels that write no (queries x keys) map, `tiled`: CUDA, or the CPU under `TRITON_INTERPRET=1`; no
    LPEA bias gradient; "auto" does not choose it until a GPU run shows it faster).

    Resolved, each component is a [`ComponentSettings`][hf_headattn.methods.eadra.core.ComponentSettings] with every
    field resolved ([`ComponentSettings.resolved_for`][hf_headattn.methods.eadra.core.ComponentSettings.resolved_for]).
    """

    encoder: ComponentSettings | None = None
    decoder: ComponentSettings | None = None
    cross: ComponentSettings | None = None
    dist_reduction: Literal["sum", "pair_mean", "normalized_positions"] = "pair_mean"
    peak_reduction: Literal["mean", "sum"] = "mean"
    warmup_steps: int = 0
    alpha_scale: float = ALPHA_SCALE
    implementation: Literal["auto", "eager", "compiled", "triton"] = "auto"

    @property
    def components(self) -> dict[str, ComponentSettings]:
        """The regularized components' settings, in [`COMPONENTS`][hf_headattn.sites.COMPONENTS] order."""
        return {component: getattr(self, component) for component in COMPONENTS if getattr(self, component) is not None}

    def resolved(self, config, name: str) -> EaDRASettings:
        if not self.components:
            raise ValueError(f"{name} must map some of {COMPONENTS} to settings (or be None for off), got "
                             f"{dataclasses.asdict(self)!r}")
        components = {}
        for component, values in self.components.items():
            where = f"{name}[{component!r}]"
            if not isinstance(values, ComponentSettings):
                values = ComponentSettings.from_dict(values, where, config)
            components[component] = values.resolved_for(component, config, where)
        check_range(self.alpha_scale, f"{name}.alpha_scale", 0.0)
        implementation = check_implementation(self.implementation, f"{name}.implementation")  # the one check
        if self.warmup_steps < 0:
            raise ValueError(f"{name}.warmup_steps must be an integer >= 0 (0: no warm-up), got {self.warmup_steps!r}")
        return dataclasses.replace(self, **components, implementation=implementation)


def older_spellings(values) -> tuple[dict, list]:
    """A component's `layers=None` (every layer, release 0.2) as `"all"` (`MethodSpec.older_spellings`)."""
    values, notes = dict(values), []
    for component in COMPONENTS:
        given = values.get(component)
        if isinstance(given, Mapping) and "layers" in given and given["layers"] is None:
            values[component] = {**given, "layers": "all"}
            notes.append((f"{component}.layers=None (every layer)", f"{component}.layers='all'"))
    return values, notes


PEAK_REDUCTIONS = allowed_values(EaDRASettings, "peak_reduction")
"""The readings the settings allow (from their `Literal`s), for the pure functions' own checks."""
DIST_REDUCTIONS = allowed_values(EaDRASettings, "dist_reduction")


def placements(settings: EaDRASettings, config) -> list[tuple[str, int, str]]:
    where = []
    for component, resolved in settings.components.items():
        side, kind = COMPONENT_SITES[component]
        where += [(side, layer, kind) for layer in resolved.layers]
    return where


class _Call(NamedTuple):
    """What EaDRA keeps of one attention call until the model collects the terms (no reference to the context)."""

    component: str
    num_heads: int
    query: torch.Tensor  # (B, H, T, D)
    key: torch.Tensor  # (B, H, S, D)
    attention_mask: torch.Tensor | None
    scaling: float
    causal: bool
    key_mask: torch.Tensor | None
    query_mask: torch.Tensor | None
    head_weights: torch.Tensor | None = None  # (1 or B, h): the regularized heads' head mask (None: all 1)

    @classmethod
    def of(cls, call: AttentionCall, component: str, num_heads: int, heads: HeadIndex | None = None) -> "_Call":
        """`heads`: the regularized head indices (None: the first `num_heads`), gathered here."""
        query, key, mask, weights = call.query, call.key, call.mask_tensor, call.head_mask
        if heads is not None:
            heads = heads.on(query.device)
            query, key = query.index_select(1, heads), key.index_select(1, heads)
            if mask is not None and mask.dim() == 4 and mask.shape[1] > 1:
                mask = mask.index_select(1, heads)
            weights = None if weights is None else weights.index_select(1, heads)
        elif weights is not None:
            weights = weights[:, :num_heads]
        return cls(component, num_heads, query, key, mask, call.scaling, call.is_decoder and not call.is_cross,
                   call.key_mask, call.query_mask, weights)

    def same_masks(self, other: "_Call") -> bool:
        """Whether the support and the regularized heads are the same (the layers of one component share their
        masks; pruning may leave two layers the same heads but different numbers of regularized ones)."""
        return (self.component == other.component and self.attention_mask is other.attention_mask
                and self.num_heads == other.num_heads
                and self.query.shape == other.query.shape and self.key.shape == other.key.shape)


def head_support(call: _Call) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Additive bias, support and real queries of the first `num_heads` heads of an attention call.

    Returns
    -------
    bias :
        None or (B, 1 or h, T, S) float, the additive mask (eager's, or SEA's per-head one), added to the scores.
    support :
        (B or 1, 1 or h, T, S) bool, the keys each query can see that are not padding.
    queries :
        (B or 1, 1, T) bool, real queries with a non-empty support.
    """
    length, key_length = call.query.shape[2], call.key.shape[2]
    support = bias = None
    mask = call.attention_mask
    if mask is not None:
        mask = mask[:, : call.num_heads] if mask.dim() == 4 and mask.shape[1] > 1 else mask
        support = key_allowed(mask, key_length)
        if mask.dtype != torch.bool:
            bias = mask[..., :key_length]
    if call.causal:  # the causal prefix, also when SDPA ran with is_causal and no mask
        causal = torch.ones(1, 1, length, key_length, dtype=torch.bool, device=call.query.device)
        causal = causal.tril_(key_length - length)
        support = causal if support is None else support & causal
    if call.key_mask is not None:
        support = call.key_mask[:, None, None, :] if support is None else support & call.key_mask[:, None, None, :]
    if support is None:
        support = torch.ones(1, 1, length, key_length, dtype=torch.bool, device=call.query.device)
    queries = support.any(-1)  # (B or 1, 1 or h, T)
    queries = queries.all(1, keepdim=True) if queries.shape[1] > 1 else queries
    if call.query_mask is not None:
        queries = queries & call.query_mask[:, None, :]
    return bias, support, queries


def rescale_terms(terms: tuple[torch.Tensor, ...], support: torch.Tensor, queries: torch.Tensor,
                  dist_reduction: str = "sum", peak_reduction: str = "mean") -> tuple[torch.Tensor, ...]:
    """The readings of Eq. 4 and Eq. 8 as per-(sentence, head) rescalings of the terms that
    `layer_regularizers` returns (the model's path).

    `terms` = (R_peak, R_sent, R_dist), each (..., B, h): R_peak the mean over real queries of H_N, R_dist the sum
    over consecutive real query pairs (`equations`); `support` (B or 1, 1 or h, T, S) and `queries`
    (B or 1, 1, T) as `head_support` returns them.

    * `peak_reduction="mean"` keeps R_peak; `"sum"` (Eq. 4 literally: a sum over queries) multiplies it by the
      number of real queries n_q.
    * `dist_reduction="sum"` (Eq. 8 literally) keeps R_dist; `"pair_mean"` divides it by the number of pairs of
      consecutive real queries (the mean expected distance of a pair, in positions); `"normalized_positions"`
      divides it by n_k - 1, n_k the real keys any real query sees, i.e. positions s / (n_k - 1) in [0, 1] in D of
      Eq. 7 (D is linear in the positions), still summed over pairs.
    """
    peak, sent, dist = terms
    check_choice(peak_reduction, f"{NAME}.peak_reduction", PEAK_REDUCTIONS)
    check_choice(dist_reduction, f"{NAME}.dist_reduction", DIST_REDUCTIONS)
    if peak_reduction == "sum":
        peak = peak * queries.sum(-1)
    if dist_reduction == "pair_mean":
        dist = dist / (queries[..., :-1] & queries[..., 1:]).sum(-1).clamp(min=1)
    elif dist_reduction == "normalized_positions":
        keys = (support & queries.unsqueeze(-1)).any(-2).sum(-1)  # (B or 1, 1 or h)
        dist = dist / (keys - 1).clamp(min=1)
    return peak, sent, dist


MAX_PADDING = 0.5
"""Groups of layers with different lengths (encoder self-, decoder self-, cross-attention) share one fused pass while
padding them to a common length adds at most this share of score entries (more entries cost more than the
operations saved); see `layer_terms`. Eager only: a compiled model runs one pass per group (`_fusions`)."""


def layer_terms(calls: list[_Call], dist_reduction: str = "sum", peak_reduction: str = "mean",
                implementation: str = "auto") -> dict[str, list[torch.Tensor]]:
    """Per component, [R_peak, R_sent, R_dist] (after `rescale_terms`) summed over its regularized heads,
    layers and sentences.

    The layers of a component that share their masks (all of them, unless SEA changed one layer's mask) form a group;
    groups with the same number of regularized heads go through `layer_regularizers` together,
    zero-padded to the longest query and key lengths (the padding is in no support and no query, so it counts
    nowhere), unless that padding would add more than `MAX_PADDING` of the score entries: one pass for all the
    components in the usual case. In a compiled model, one pass per group (`_fusions`).
    """
    groups: list[list[_Call]] = []
    for call in calls:
        group = next((g for g in groups if g[0].same_masks(call)), None)
        if group is None:
            groups.append([call])
        else:
            group.append(call)
    totals = {}
    for fused in _fusions(groups):
        first, members = fused[0][0], [call for group in fused for call in group]
        supports = [head_support(group[0]) for group in fused]
        bias, support, queries = supports[0] if len(fused) == 1 else _padded_supports(fused, supports)
        heads = ([c.query for c in members], [c.key for c in members], first.num_heads, first.scaling, support,
                 queries, bias)
        terms = layer_regularizers(*heads, implementation=implementation)  # (L, B, h), by passes.choose_pass's pass
        terms = rescale_terms(terms, support, queries, dist_reduction, peak_reduction)
        weights = _head_weights(members)
        if weights is not None:  # a head masked with 0 counts nowhere, as if pruned
            terms = [term * weights for term in terms]
        start = 0
        for group in fused:
            end = start + len(group)
            sums = [(term if len(fused) == 1 else term[start:end]).sum() for term in terms]
            component, start = group[0].component, end
            totals[component] = [a + b for a, b in zip(totals[component], sums)] if component in totals else sums
    return totals


def _head_weights(calls: list[_Call]) -> torch.Tensor | None:
    """(L, 1 or B, h): the calls' head masks on their regularized heads (1 where a call has none), or None when no
    call has one; the calls share their number h of regularized heads (`_Call.same_masks`). Each term of a
    head is multiplied by its mask (the rule of [`hf_headattn.head_masks`][hf_headattn.head_masks]: a head masked with 0
    drops out, as after pruning)."""
    if all(call.head_weights is None for call in calls):
        return None
    first = next(call.head_weights for call in calls if call.head_weights is not None)
    ones = torch.ones(1, calls[0].num_heads, dtype=torch.float32, device=first.device)
    weights = [ones if call.head_weights is None else call.head_weights.float() for call in calls]
    batch = max(weight.shape[0] for weight in weights)
    return torch.stack([weight.expand(batch, -1) for weight in weights])


def _fusions(groups: list[list[_Call]]) -> list[list[list[_Call]]]:
    """The groups, partitioned into those that share a fused pass: same heads (all and regularized), head size,
    scaling, dtype and kind of mask (additive or not), and padding within `MAX_PADDING`.

    Under `torch.compile` each group has its own pass, whatever the lengths: a choice made from them is a guard of
    the compiled graph, and a batch whose source/target ratio crossed the threshold compiled the model again (4
    graphs in 5 batches of a tiny model, `tests/test_compile.py`). The values are eager's but for float32
    rounding (padding counts nowhere; `tests/methods/eadra/test_eadra_model.py`: equal the two). Eager keeps its fewer
    operations (for a GPU's launches; on the CPU the step took the same time either way)."""
    if torch.compiler.is_compiling():
        return [[group] for group in groups]

    def area(fused):
        real = sum(len(g) * g[0].query.shape[2] * g[0].key.shape[2] for g in fused)
        padded = sum(len(g) for g in fused) * max(g[0].query.shape[2] for g in fused) * max(
            g[0].key.shape[2] for g in fused)
        return padded <= (1 + MAX_PADDING) * real

    def kind(call: _Call):
        additive = call.attention_mask is not None and call.attention_mask.dtype != torch.bool
        shape = call.query.shape  # (B, H, T, D)
        return call.num_heads, shape[0], shape[1], shape[3], call.scaling, call.query.dtype, call.query.device, additive

    fusions: list[list[list[_Call]]] = []
    for group in groups:
        fused = next((f for f in fusions if kind(f[0][0]) == kind(group[0]) and area([*f, group])), None)
        if fused is None:
            fusions.append([group])
        else:
            fused.append(group)
    return fusions


def _padded_supports(fused: list[list[_Call]], supports) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The groups' `head_support` results padded to the longest lengths (T, S) and stacked over their layers:
    bias (L, B, 1 or h, T, S) or None, support (L, B, 1 or h, T, S), queries (L, B, 1, T)."""
    length = max(g[0].query.shape[2] for g in fused)
    key_length = max(g[0].key.shape[2] for g in fused)
    batch = fused[0][0].query.shape[0]
    heads = max(support.shape[1] for _, support, _ in supports)

    def pad(tensor, padding, value=0.0):  # (F.pad copies even when it adds nothing; never compiled: _fusions)
        return torch.nn.functional.pad(tensor, padding, value=value) if any(padding) else tensor

    biases, masks, rows = [], [], []
    for group, (bias, support, queries) in zip(fused, supports):
        t, s = group[0].query.shape[2], group[0].key.shape[2]  # (a support may broadcast over the queries)
        support = support.expand(*support.shape[:2], t, s)
        masks.append(pad(support, (0, key_length - s, 0, length - t), value=False).expand(
            len(group), batch, heads, length, key_length))
        rows.append(pad(queries.expand(*queries.shape[:2], t), (0, length - t), value=False).expand(
            len(group), batch, 1, length))
        if bias is not None:
            biases.append(pad(bias.expand(*bias.shape[:2], t, s), (0, key_length - s, 0, length - t)).expand(
                len(group), batch, heads, length, key_length))
    return (torch.cat(biases) if biases else None), torch.cat(masks), torch.cat(rows)


class EaDRA(AttentionMethod):
    """Computes R_peak, R_sent and R_dist of the first `num_heads` heads of its attention module; no parameters.

    `after` only keeps the call's queries, keys and masks; the model's `collect` computes the terms of all
    layers at once, and nothing at all when no loss is needed (`generate`, inference without labels).

    Head masks follow [`hf_headattn.head_masks`][hf_headattn.head_masks]' rule: the terms of head h, summed over the
    heads (Eq. 9), are weighted by its mask m_h (its attention probabilities do not depend on m_h), so a head masked
    with 0 counts nowhere, as if pruned.
    """

    records_loss_terms = True

    def __init__(self, component: str, num_heads: int, heads: list[int] | None = None, warmup_steps: int = 0):
        super().__init__()
        self.component, self.num_heads = component, num_heads
        self.heads = None if heads is None else HeadIndex(heads)  # not a buffer: see HeadIndex
        if warmup_steps:  # training forward passes so far, saved with the weights (see _warmup)
            self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def init_weights(self, std: float) -> None:
        if hasattr(self, "step"):
            init_zeros_(self.step)

    def extra_repr(self) -> str:
        heads = self.num_heads if self.heads is None else list(self.heads.numbers)
        return f"component={self.component!r}, heads={heads}"

    def prune_heads(self, keep: torch.Tensor) -> None:
        """Keep regularizing the regularized heads that remain (renumbered); none left: the module adds nothing."""
        regularized = set(range(self.num_heads) if self.heads is None else self.heads.numbers)
        remaining = [i for i, head in enumerate(keep.tolist()) if head in regularized]
        self.num_heads = len(remaining)
        self.heads = None if remaining == list(range(len(remaining))) else HeadIndex(remaining)

    def after(self, call: AttentionCall, attn_output: torch.Tensor) -> torch.Tensor:
        if not self.num_heads:
            return attn_output
        if call.context is not None and call.context.compute_losses:
            call.context.record(NAME, _Call.of(call, self.component, self.num_heads, self.heads))
            if hasattr(self, "step"):
                call.context.record("eadra_modules", self)
        return attn_output


def build(settings: EaDRASettings, config, module) -> EaDRA:
    component = component_of(module)
    resolved = settings.components[component]
    return EaDRA(component, resolved.num_heads, resolved.heads, settings.warmup_steps)


def _target_tokens(context: HeadAttnContext, records: list[_Call]) -> torch.Tensor | int:
    """The batch's real target tokens (see the module docstring for the cases without a target mask)."""
    if context.target_mask is not None:
        return context.target_tokens()
    first = next((call for call in records if call.component != "encoder"), records[0])
    return first.query_mask.sum() if first.query_mask is not None else first.query.shape[0] * first.query.shape[2]


def warmup_scale(step: torch.Tensor, warmup_steps: int) -> torch.Tensor | float:
    """min(1, step / warmup_steps), the alphas' factor during the warm-up (1.0 without one)."""
    if not warmup_steps:
        return 1.0
    return (step.float() / warmup_steps).clamp(max=1.0)


def _warmup(context: HeadAttnContext, warmup_steps: int) -> torch.Tensor | float:
    """The alphas' warm-up factor for this forward, min(1, step / warmup_steps), where step is the number of earlier
    training forward passes (modules in training mode, with a loss) of the model. The count is kept in each EaDRA
    module's `step` buffer and advanced here, once per forward (so not again when gradient checkpointing recomputes
    a layer); it is saved with the weights, so a resumed run continues where it stopped. With gradient accumulation a
    step is a micro-batch: set `warmup_steps` = optimizer steps x accumulation steps."""
    modules = {id(module): module for module in context.recorded("eadra_modules")}
    if not warmup_steps or not modules:
        return 1.0
    first = next(iter(modules.values()))
    scale = warmup_scale(first.step, warmup_steps)
    if first.training:
        with torch.no_grad():
            for module in modules.values():
                module.step.add_(1)
    return scale


def collect(context: HeadAttnContext, settings: EaDRASettings) -> tuple[dict, torch.Tensor | None]:
    """`eadra_loss` (Eq. 9's weighted sum, also returned as the objective term) and `eadra_terms`.

    `eadra_terms["<component>/<term>"]` (term in peak, sent, dist) are the unweighted, detached terms: summed over
    the component's regularized heads, layers and sentences (after `rescale_terms`), divided by the batch's
    target tokens. The alphas are multiplied by `alpha_scale`, and with `warmup_steps` by `_warmup`'s factor
    (logged as
    `eadra_terms["warmup"]`).
    """
    records = context.recorded(NAME)
    if not records:
        return {}, None
    tokens = _target_tokens(context, records)
    tokens = tokens.clamp(min=1) if torch.is_tensor(tokens) else max(tokens, 1)
    totals = layer_terms(records, settings.dist_reduction, settings.peak_reduction, settings.implementation)
    loss, names, values = None, [], []
    for component, sums in totals.items():
        resolved = settings.components[component]
        for name, total in zip(TERMS, sums):
            names.append(f"{component}/{name}")
            values.append(total)
            alpha = getattr(resolved, f"alpha_{name}") * settings.alpha_scale
            if alpha:  # a zero-weighted term stays out of the graph: its backward is skipped
                loss = alpha * total if loss is None else loss.add(total, alpha=alpha)
    terms = dict(zip(names, (torch.stack(values).detach() / tokens).unbind()))
    loss = values[0].new_zeros(()) if loss is None else loss / tokens
    if settings.warmup_steps:
        scale = _warmup(context, settings.warmup_steps)
        loss = loss * scale
        terms["warmup"] = torch.as_tensor(scale, dtype=loss.dtype, device=loss.device)
    return {"eadra_loss": loss, "eadra_terms": terms}, loss


def head_use(settings: EaDRASettings, config, site) -> HeadUse:
    """EaDRA recomputes its heads' probabilities from q, k and the mask (the regularized heads)."""
    component = settings.components["cross" if site[2] == "cross" else site[0]]
    heads = component.heads if component.heads is not None else range(component.num_heads)
    return HeadUse(reads_scores=tuple(heads))


METHOD = MethodSpec(
    NAME, EaDRASettings, placements, build, collect, head_use=head_use,
    outputs={
        "eadra_loss": "the weighted EaDRA regularizer (Eq. 9), included in loss",
        "eadra_terms": "{'<component>/<term>': unweighted term}, term in peak, sent, dist",
    },
    logged=("eadra_loss", "eadra_terms"),
    legacy_defaults={"dist_reduction": "sum", "alpha_scale": 1.0},
    older_spellings=older_spellings,
    kit="hf_headattn.methods.eadra.kit",
)
