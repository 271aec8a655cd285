"""EaDRA: entropy- and distance-regularized attention (Araabi, Niculae & Monz, §3, Eq. 1-9).

Eq. 9 adds ``alpha_peak R_peak + alpha_sent R_sent + alpha_dist R_dist`` per component (encoder self-attention,
decoder self-attention, cross-attention) to the translation loss. The math is in :mod:`.eadra_math`; this module
holds the settings, the :class:`EaDRA` method attached to each regularized attention module, and the reduction.

How it runs (fast by design): the backend (SDPA, eager, ...) computes the attention output as usual; ``after``
recomputes ``softmax(q_h k_h^T * scaling + mask)`` in float32 for the regularized heads only (the *first*
``num_heads`` heads of each regularized layer), and the regularizers' gradient flows through q and k. The support of
each query: keys the model's mask lets it see (a bool mask, or an additive one above half its dtype's minimum), for
decoder self-attention also its causal prefix (offset ``key_len - query_len`` with a cache; SDPA may get no mask and
``is_causal``), and never padding keys (the context's masks). Nothing happens without a context (e.g. ``generate``
running the encoder alone). Dropout is not applied to these probabilities.

Reductions (the authors' fairseq code, ``aliaraabi/EaDRA``, where it works; see :mod:`.eadra_math` for per-query
choices): per sentence and head, R_peak is the mean over real queries of H_N, R_sent = -H_N(query-averaged
attention), R_dist the sum over consecutive real query pairs; the options ``dist_reduction``, ``peak_reduction``
(:func:`rescale_terms`; by default R_dist becomes the *mean* over the pairs, the fidelity study's choice) and
``warmup_steps`` (:func:`_warmup`) are top-level keys of the ``eadra`` dict. These are **summed** over the regularized heads and
layers of a component and over the sentences of the batch (the authors' code sums its stacked layer x batch x head
tensor), then **divided by the number of real target tokens** of the batch, because fairseq divides the summed loss,
penalties included, by ``sample_size`` = target tokens. So the terms sit next to the model's per-token NLL at the
scale Table 6's alphas were tuned at, and with gradient accumulation (``losses.total_objective``) the accumulated term
is the sum over sentences divided by all the batch's target tokens, as in fairseq. Without a target mask (no labels)
every decoder position counts as a target token; an encoder-only setting without one counts source tokens instead.
Unlike the authors' code, padding never counts (they normalise by the padded length), R_dist follows Eq. 8 (their
matrix product does not run) and only the chosen heads are regularized.
"""

from __future__ import annotations

import torch
from transformers import initialization as init

from .attention import AttentionCall, AttentionMethod, HeadAttnContext, MethodSpec, key_allowed
from .eadra_math import TERMS, eadra_regularizers
from .settings_checks import check_choice, check_range, resolve_layers

NAME = "eadra"
COMPONENTS = ("encoder", "decoder", "cross")
#: Table 6, WMT En-De (100k) rows; alpha_peak 0 because "alpha_dist appears to render alpha_peak redundant"
#: (Appendix A). num_heads None = three quarters of the heads (6 of 8 from scratch, §5.3); layers None = all.
#: heads: an explicit list of head indices instead (then num_heads is its length).
DEFAULTS = {
    "encoder": {"alpha_peak": 0.0, "alpha_sent": 0.8, "alpha_dist": 0.02, "num_heads": None, "heads": None,
                "layers": None},
    "decoder": {"alpha_peak": 0.0, "alpha_sent": 0.8, "alpha_dist": 2.0, "num_heads": None, "heads": None,
                "layers": None},
    "cross": {"alpha_peak": 0.0, "alpha_sent": 8.0, "alpha_dist": 0.1, "num_heads": None, "heads": None,
              "layers": None},
}
#: The readings of the paper's open choices: top-level keys of the ``eadra`` dict, beside the components.
#: dist_reduction: how R_dist (Eq. 8) is reduced per (sentence, head), see :func:`rescale_terms`; peak_reduction: the
#: same for R_peak (Eq. 4); warmup_steps: the alphas grow linearly from 0 over this many training steps (0: off).
#: The defaults are the fidelity study's choice (README "The papers' open choices"); release 0.1 used "sum".
OPTION_DEFAULTS = {"dist_reduction": "pair_mean", "peak_reduction": "mean", "warmup_steps": 0}
DIST_REDUCTIONS = ("sum", "pair_mean", "normalized_positions")
PEAK_REDUCTIONS = ("mean", "sum")


def _shape(config, component: str) -> tuple[int, int]:
    if component == "encoder":
        return config.encoder_layers, config.encoder_attention_heads
    return config.decoder_layers, config.decoder_attention_heads


def components(config) -> list[str]:
    """The regularized components named in ``config.eadra`` (its other keys are :data:`OPTION_DEFAULTS`'s)."""
    return [key for key in config.eadra or {} if key in COMPONENTS]


def options(config) -> dict:
    """``dist_reduction``, ``peak_reduction`` and ``warmup_steps`` of ``config.eadra``, defaults filled in."""
    return {key: (config.eadra or {}).get(key, default) for key, default in OPTION_DEFAULTS.items()}


def component_settings(config, component: str) -> dict:
    """The settings of one component with defaults filled in; ``heads`` (sorted head indices), ``num_heads`` (their
    number) and ``layers`` resolved. Without ``heads`` the regularized heads are the first ``num_heads``."""
    settings = {**DEFAULTS[component], **config.eadra[component]}
    num_layers, heads = _shape(config, component)
    name = f"eadra[{component!r}]"
    if settings["heads"] is not None:
        chosen = settings["heads"]
        if not isinstance(chosen, (list, tuple)) or not chosen or any(
                isinstance(h, bool) or not isinstance(h, int) or not -heads <= h < heads for h in chosen):
            raise ValueError(f"{name}['heads'] must be a non-empty list of head indices in [{-heads}, {heads - 1}] "
                             f"(or None for the first num_heads), got {chosen!r}")
        chosen = sorted({h % heads for h in chosen})
        if settings["num_heads"] is not None and settings["num_heads"] != len(chosen):
            raise ValueError(f"{name} sets num_heads={settings['num_heads']!r} and {len(chosen)} heads {chosen}; "
                             "expected one of them (or num_heads equal to the number of heads)")
        settings["heads"], settings["num_heads"] = chosen, len(chosen)
    elif settings["num_heads"] is None:
        settings["num_heads"] = max(1, round(0.75 * heads))
    layers = range(num_layers) if settings["layers"] is None else settings["layers"]
    settings["layers"] = resolve_layers(layers, num_layers, f"{name}['layers']")
    return settings


def check_settings(config) -> None:
    if config.eadra is None:
        return
    if not isinstance(config.eadra, dict) or not config.eadra:
        raise ValueError(f"eadra must map some of {COMPONENTS} to settings (or be None), got {config.eadra!r}")
    unknown = [key for key in config.eadra if key not in COMPONENTS and key not in OPTION_DEFAULTS]
    if unknown:
        raise ValueError(f"eadra has unknown component {unknown[0]!r}; expected some of {COMPONENTS} (and the "
                         f"options {tuple(OPTION_DEFAULTS)})")
    if not components(config):
        raise ValueError(f"eadra must name at least one of {COMPONENTS}, got {config.eadra!r}")
    chosen = options(config)
    check_choice(chosen["dist_reduction"], "eadra['dist_reduction']", DIST_REDUCTIONS)
    check_choice(chosen["peak_reduction"], "eadra['peak_reduction']", PEAK_REDUCTIONS)
    warmup = chosen["warmup_steps"]
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"eadra['warmup_steps'] must be an integer >= 0 (0: no warm-up), got {warmup!r}")
    for component, settings in config.eadra.items():
        if component in OPTION_DEFAULTS:
            continue
        if not isinstance(settings, dict):
            raise ValueError(f"eadra[{component!r}] must be a dict of settings, got {settings!r}")
        unknown = set(settings) - set(DEFAULTS[component])
        if unknown:
            raise ValueError(
                f"eadra[{component!r}] has unknown settings {sorted(unknown)}; expected some of {sorted(DEFAULTS[component])}"
            )
        resolved = component_settings(config, component)
        for alpha in ("alpha_peak", "alpha_sent", "alpha_dist"):
            check_range(resolved[alpha], f"eadra[{component!r}][{alpha!r}]", 0.0)
        heads = _shape(config, component)[1]
        num_heads = resolved["num_heads"]
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or not 1 <= num_heads <= heads:
            raise ValueError(
                f"eadra[{component!r}]['num_heads'] must be an integer in [1, {heads}] (the model's heads), "
                f"got {num_heads!r}"
            )


def placements(config) -> list[tuple[str, int, str]]:
    where = []
    for component in components(config):
        side, kind = ("encoder", "self") if component == "encoder" else ("decoder", "cross" if component == "cross" else "self")
        where += [(side, layer, kind) for layer in component_settings(config, component)["layers"]]
    return where


def component_of(module) -> str:
    """"encoder", "decoder" or "cross" for an attention module tagged by ``modeling.attach_methods``."""
    return "cross" if module.headattn_kind == "cross" else module.headattn_side


def head_scores(call: AttentionCall, heads: int | list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 scores, support and real queries of some heads of one attention call: the first ``heads`` for an
    int, else the listed head indices (in their order).

    Returns
    -------
    scores : (B, h, T, S) ``q k^T * scaling`` plus the additive mask, if any.
    support : (B or 1, 1 or h, T, S) bool, the keys each query can see that are not padding.
    queries : (B or 1, 1, T) bool, real queries with a non-empty support.
    """
    if isinstance(heads, int):
        pick = slice(0, heads)  # a view, no copy
    else:
        pick = torch.tensor(heads, device=call.query.device)
    query, key = call.query[:, pick], call.key[:, pick]  # (B, h, T, D), (B, h, S, D)
    length, key_length = query.shape[2], key.shape[2]
    with torch.autocast(query.device.type, enabled=False):
        scores = torch.matmul(query.float() * call.scaling, key.float().transpose(-1, -2))  # (B, h, T, S)
    support = torch.ones(1, 1, length, key_length, dtype=torch.bool, device=query.device)
    mask = call.attention_mask
    if mask is not None:
        mask = mask[:, pick] if mask.dim() == 4 and mask.shape[1] > 1 else mask
        support = support & key_allowed(mask, key_length)
        if mask.dtype != torch.bool:
            scores.add_(mask[..., :key_length])  # scores is a fresh float32 tensor
    if call.is_decoder and not call.is_cross:  # the causal prefix, also when SDPA ran with is_causal and no mask
        support = support & torch.ones_like(support[0, 0]).tril(key_length - length)
    if call.key_mask is not None:
        support = support & call.key_mask[:, None, None, :]
    queries = support.any(-1)  # (B or 1, 1 or h, T)
    queries = queries.all(1, keepdim=True) if queries.shape[1] > 1 else queries
    if call.query_mask is not None:
        queries = queries & call.query_mask[:, None, :]
    return scores, support, queries


def rescale_terms(terms: tuple[torch.Tensor, ...], support: torch.Tensor, queries: torch.Tensor,
                  dist_reduction: str = "sum", peak_reduction: str = "mean") -> tuple[torch.Tensor, ...]:
    """The readings of Eq. 4 and Eq. 8 as per-(sentence, head) rescalings of ``eadra_regularizers``' values.

    ``terms`` = (R_peak, R_sent, R_dist), each (B, h): R_peak the mean over real queries of H_N, R_dist the sum over
    consecutive real query pairs (:mod:`.eadra_math`); ``support`` (B or 1, 1 or h, T, S) and ``queries``
    (B or 1, 1, T) as :func:`head_scores` returns them.

    * ``peak_reduction="mean"`` keeps R_peak; ``"sum"`` (Eq. 4 literally: a sum over queries) multiplies it by the
      number of real queries n_q.
    * ``dist_reduction="sum"`` (Eq. 8 literally) keeps R_dist; ``"pair_mean"`` divides it by the number of pairs of
      consecutive real queries (the mean expected distance of a pair, in positions); ``"normalized_positions"``
      divides it by n_k - 1, n_k the real keys any real query sees, i.e. positions s / (n_k - 1) in [0, 1] in D of
      Eq. 7 (D is linear in the positions), still summed over pairs.
    """
    peak, sent, dist = terms
    if peak_reduction == "sum":
        peak = peak * queries.sum(-1)
    elif peak_reduction != "mean":
        raise ValueError(f"peak_reduction must be one of {PEAK_REDUCTIONS}, got {peak_reduction!r}")
    if dist_reduction == "pair_mean":
        dist = dist / (queries[..., :-1] & queries[..., 1:]).sum(-1).clamp(min=1)
    elif dist_reduction == "normalized_positions":
        keys = (support & queries.unsqueeze(-1)).any(-2).sum(-1)  # (B or 1, 1 or h)
        dist = dist / (keys - 1).clamp(min=1)
    elif dist_reduction != "sum":
        raise ValueError(f"dist_reduction must be one of {DIST_REDUCTIONS}, got {dist_reduction!r}")
    return peak, sent, dist


def warmup_scale(step: torch.Tensor, warmup_steps: int) -> torch.Tensor | float:
    """min(1, step / warmup_steps), the alphas' factor during the warm-up (1.0 without one)."""
    if not warmup_steps:
        return 1.0
    return (step.float() / warmup_steps).clamp(max=1.0)


class EaDRA(AttentionMethod):
    """Computes R_peak, R_sent and R_dist of the regularized heads of its attention module; no parameters.

    ``heads``: the number of first heads, or a list of head indices. With a warm-up, ``step`` (a buffer, so saved
    with the weights and restored on resume) counts the training forward passes: see :func:`collect`.
    """

    def __init__(self, component: str, heads: int | list[int], dist_reduction: str = "sum",
                 peak_reduction: str = "mean", warmup_steps: int = 0):
        super().__init__()
        self.component, self.heads = component, heads
        self.dist_reduction, self.peak_reduction = dist_reduction, peak_reduction
        if warmup_steps:
            self.register_buffer("step", torch.zeros((), dtype=torch.long))

    @property
    def num_heads(self) -> int:
        return self.heads if isinstance(self.heads, int) else len(self.heads)

    def init_weights(self, std: float) -> None:
        if hasattr(self, "step"):
            init.zeros_(self.step)

    def extra_repr(self) -> str:
        return (f"component={self.component!r}, heads={self.heads}, dist_reduction={self.dist_reduction!r}, "
                f"peak_reduction={self.peak_reduction!r}")

    def after(self, call: AttentionCall, attn_output: torch.Tensor) -> torch.Tensor:
        if call.context is None:
            return attn_output
        scores, support, queries = head_scores(call, self.heads)
        terms = rescale_terms(eadra_regularizers(scores, support, queries), support, queries,
                              self.dist_reduction, self.peak_reduction)
        sums = [term.sum() for term in terms]  # each term (B, h) -> ()
        tokens = call.query_mask.sum() if call.query_mask is not None else call.query.shape[0] * call.query.shape[2]
        call.context.record(NAME, (self.component, sums, tokens))
        if hasattr(self, "step"):
            call.context.record("eadra_modules", self)
        return attn_output


def build(config, module) -> EaDRA:
    component = component_of(module)
    settings, chosen = component_settings(config, component), options(config)
    heads = settings["heads"] if settings["heads"] is not None else settings["num_heads"]
    return EaDRA(component, heads, chosen["dist_reduction"], chosen["peak_reduction"], chosen["warmup_steps"])


def _target_tokens(context: HeadAttnContext, records: list) -> torch.Tensor | int:
    """The batch's real target tokens (see the module docstring for the cases without a target mask)."""
    if context.target_mask is not None:
        return context.target_mask.sum()
    decoder_side = [tokens for component, _, tokens in records if component != "encoder"]
    return decoder_side[0] if decoder_side else records[0][2]


def _warmup(context: HeadAttnContext, warmup_steps: int) -> torch.Tensor | float:
    """The alphas' warm-up factor for this forward, min(1, step / warmup_steps), where step is the number of earlier
    training forward passes (modules in training mode, with a loss context) of the model. The count is kept in each
    EaDRA module's ``step`` buffer and advanced here, once per forward (so not again when gradient checkpointing
    recomputes a layer); it is saved with the weights, so a resumed run continues where it stopped. With gradient
    accumulation a step is a micro-batch: set ``warmup_steps`` = optimizer steps x accumulation steps."""
    modules = {id(module): module for module in context.records.get("eadra_modules", [])}
    if not warmup_steps or not modules:
        return 1.0
    first = next(iter(modules.values()))
    scale = warmup_scale(first.step, warmup_steps)
    if first.training:
        with torch.no_grad():
            for module in modules.values():
                module.step.add_(1)
    return scale


def collect(context: HeadAttnContext, config) -> tuple[dict, torch.Tensor | None]:
    """``eadra_loss`` (Eq. 9's weighted sum, also returned as the objective term) and ``eadra_terms``.

    ``eadra_terms["<component>/<term>"]`` (term in peak, sent, dist) are the unweighted, detached terms: summed over
    the component's regularized heads, layers and sentences (after :func:`rescale_terms`), divided by the batch's
    target tokens. With ``warmup_steps`` the alphas are multiplied by :func:`_warmup`'s factor (also logged as
    ``eadra_terms["warmup"]``).
    """
    records = context.records.get(NAME)
    if not records:
        return {}, None
    tokens = _target_tokens(context, records)
    tokens = tokens.clamp(min=1) if torch.is_tensor(tokens) else max(tokens, 1)
    totals = {}  # component -> [R_peak, R_sent, R_dist] summed over its layers
    for component, sums, _ in records:
        totals[component] = [a + b for a, b in zip(totals[component], sums)] if component in totals else sums
    scale = _warmup(context, options(config)["warmup_steps"])
    loss, terms = None, {}
    for component, sums in totals.items():
        settings = component_settings(config, component)
        for name, total in zip(TERMS, sums):
            value = total / tokens
            terms[f"{component}/{name}"] = value.detach()
            alpha = settings[f"alpha_{name}"]
            if alpha:  # a zero-weighted term stays out of the graph: its backward is skipped
                loss = alpha * value if loss is None else loss + alpha * value
    if loss is None:
        loss = value.new_zeros(())
    elif torch.is_tensor(scale):
        loss = loss * scale
        terms["warmup"] = scale.detach()
    return {"eadra_loss": loss, "eadra_terms": terms}, loss


METHOD = MethodSpec(NAME, check_settings, placements, build, collect)
