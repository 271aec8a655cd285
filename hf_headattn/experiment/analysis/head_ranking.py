"""Head importance over a dataset by several criteria, and which heads to prune by it.

[`score_heads`][hf_headattn.experiment.analysis.head_ranking.score_heads] returns, per criterion, a (layers, heads)
tensor per component (`"encoder"`, `"decoder"`, `"cross"`, as `hf_headattn.sites`), in the original head numbering;
higher means more important. `NaN` marks heads that are pruned or that the criterion does not score (a method's
criterion scores the modules that carry the method). Padding never counts. The criteria:

* `gradient` (Michel et al. 2019, §4.1, Eq. 2): I_h = E_x |dL(x)/d xi_h|, the expected absolute gradient of the
  loss to head h's mask variable, per sentence (one mask per sentence, so one backward pass gives every sentence's
  gradient), L the summed token NLL of the sentence; then normalised per layer by its L2 norm, as their code does.
* `confidence` (Voita et al. 2019, §4.1): the mean over real query tokens of the head's largest attention weight,
  end-of-sentence queries left out (our reading of "excluding the end of sentence symbol").
* `entropy`: 1 minus the mean over real queries of the normalised attention entropy H(a) / log n (n the keys a
  query can see): the quantity EaDRA regularizes (Araabi et al., Eq. 1-2); focused heads score high.
* the methods' own criteria (their kit's `MethodKit.importance`): `dhicm`, the mean DHICM importance G over real
  tokens (Goindani & Shrivastava 2021, Eq. 1); `rhe`, 1 minus the share of sentences in which RHE marks the head
  redundant (Zhang et al. 2021, Eq. 10).
* `random`: uniform in [0, 1), seeded.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral

import torch

from ...head_masks import ARGUMENTS_BY_COMPONENT, attention_modules, head_numbers, module_rows, routed_modules
from ...hf_compat import attention_backend
from ...losses import IGNORE_INDEX
from ...methods.eadra.equations import normalized_entropy
from ...registry import readout, registered_methods
from ...sites import COMPONENTS, component_of, component_shape
from ..kit import kit_of

BUILT_IN = ("gradient", "confidence", "entropy", "random")
ATTENTION_OUTPUTS = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}
"""The attention outputs of each component, as transformers names them."""


def method_criteria() -> dict:
    """`{criterion name: method spec}` of the registered methods whose kit scores heads (`MethodKit.importance`)."""
    return {kit.importance[0]: spec for spec in registered_methods() if (kit := kit_of(spec)).importance}


def criteria() -> list[str]:
    """Every criterion [`score_heads`][hf_headattn.experiment.analysis.head_ranking.score_heads] knows."""
    return [*BUILT_IN, *method_criteria()]


class _Sums:
    """Per criterion and component, sums and counts in the original (layers, heads) numbering."""

    def __init__(self, model, names):
        self.modules = routed_modules(model)
        self.sums = {name: {component: torch.zeros(component_shape(model.config, component), dtype=torch.float64)
                            for component in COMPONENTS} for name in names}
        self.counts = {name: {component: torch.zeros_like(table) for component, table in tables.items()}
                       for name, tables in self.sums.items()}

    def add(self, name: str, module, values: torch.Tensor, count) -> None:
        """Add (heads,) `values` (current numbering) of `module` and `count` items to criterion `name`."""
        component, layer, heads = component_of(module), module.headattn_layer, head_numbers(module)
        self.sums[name][component][layer, heads] += values.detach().double().cpu()
        self.counts[name][component][layer, heads] += float(count)

    def means(self, name: str) -> dict[str, torch.Tensor]:
        sums, counts = self.sums[name], self.counts[name]
        return {component: torch.where(counts[component] > 0, sums[component] / counts[component].clamp(min=1),
                                       float("nan")).float() for component in COMPONENTS}


def score_heads(model, batches: Iterable[dict], criteria_: Iterable[str] = BUILT_IN,
                seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """`{criterion: {component: (layers, heads) importance}}` of `model`'s heads over `batches` (dicts of
    model inputs with `labels`, e.g. from `DataCollatorForSeq2Seq`; add the syntax inputs for `rhe`).

    The model runs in eval mode (no dropout) and is left as it was; `confidence` and `entropy` run it with the
    eager backend (for the attention weights), then restore the backend.
    """
    names = list(dict.fromkeys(criteria_))
    known, methods = criteria(), method_criteria()
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown head importance criteria {unknown}; expected some of {known}")
    sums = _Sums(model, [name for name in names if name != "random"])
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            batch = {k: v.to(model.device) if torch.is_tensor(v) else v for k, v in batch.items()}
            if "labels" not in batch:
                raise ValueError(f"score_heads needs batches with labels, got the keys {sorted(batch)}")
            if "gradient" in names:
                _gradient(model, batch, sums)
            if {"confidence", "entropy"} & set(names):
                with attention_backend(model, "eager"):
                    _attention_statistics(model, batch, sums, names)
            for name in names:
                if name in methods:
                    _method_criterion(model, batch, sums, name, methods[name])
    finally:
        model.train(was_training)
    results = {name: sums.means(name) for name in names if name != "random"}
    if "gradient" in results:
        results["gradient"] = {component: _per_layer_l2(table) for component, table in results["gradient"].items()}
    if "random" in names:
        generator = torch.Generator().manual_seed(seed)
        results["random"] = {component: torch.rand(component_shape(model.config, component), generator=generator)
                             for component in COMPONENTS}
        pruned = _pruned(model)
        for component, table in results["random"].items():
            table[pruned[component]] = float("nan")
    return {name: results[name] for name in names}


def _per_layer_l2(table: torch.Tensor) -> torch.Tensor:
    """Each layer's importances divided by their L2 norm (Michel et al.'s code), NaN entries left out."""
    norm = table.nan_to_num(0.0).pow(2).sum(-1, keepdim=True).sqrt()
    return table / norm.clamp(min=1e-20)


def _pruned(model) -> dict[str, torch.Tensor]:
    """(layers, heads) bool per component, True at pruned heads."""
    pruned = {component: torch.zeros(component_shape(model.config, component), dtype=torch.bool)
              for component in COMPONENTS}
    for module in routed_modules(model).values():
        pruned[component_of(module)][module.headattn_layer] = True
        pruned[component_of(module)][module.headattn_layer, head_numbers(module)] = False
    return pruned


def _gradient(model, batch: dict, sums: _Sums) -> None:
    """Michel et al.: |dL_b / d xi| per sentence b from per-sentence masks of ones, in one backward pass."""
    size = batch["labels"].shape[0]
    masks = {argument: torch.ones(size, *component_shape(model.config, component), device=model.device,
                                  requires_grad=True) for component, argument in ARGUMENTS_BY_COMPONENT.items()}
    out = model(**batch, **masks)
    tokens = batch["labels"].ne(IGNORE_INDEX).sum()
    grads = torch.autograd.grad(out.nll_loss * tokens, list(masks.values()))
    for component, grad in zip(ARGUMENTS_BY_COMPONENT, grads):
        table = grad.abs().sum(0)  # (layers, heads), original numbering (pruned heads: 0)
        for module in attention_modules(model, component):
            sums.add("gradient", module, module_rows(table, module)[0], size)


@torch.no_grad()
def _attention_statistics(model, batch: dict, sums: _Sums, names: list[str]) -> None:
    """Voita et al.'s confidence and EaDRA's normalised entropy from the eager backend's attention weights."""
    out = model(**batch, output_attentions=True)
    eos = model.config.eos_token_id
    source = batch["attention_mask"].bool() if "attention_mask" in batch else batch["input_ids"].ne(
        model.config.pad_token_id)
    target = batch["labels"].ne(IGNORE_INDEX)
    decoder_inputs = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
    queries = {"encoder": source & batch["input_ids"].ne(eos), "decoder": target & decoder_inputs.ne(eos)}
    queries["cross"] = queries["decoder"]
    keys = {"encoder": source, "decoder": target, "cross": source}
    for module in routed_modules(model).values():
        component = component_of(module)
        probs = getattr(out, ATTENTION_OUTPUTS[component])[module.headattn_layer].float()  # (B, H, T, S)
        query = queries[component][:, None, :].to(probs.dtype)  # (B, 1, T)
        count = query.sum()
        if "confidence" in names:
            sums.add("confidence", module, (probs.amax(-1) * query).sum((0, 2)), count)
        if "entropy" in names:
            support = keys[component][:, None, None, :]
            if component == "decoder":
                support = support & torch.ones(probs.shape[-2:], dtype=torch.bool, device=probs.device).tril()
            entropy = normalized_entropy(probs, support)  # (B, H, T)
            sums.add("entropy", module, ((1 - entropy) * query).sum((0, 2)), count)


@torch.no_grad()
def _method_criterion(model, batch: dict, sums: _Sums, name: str, spec) -> None:
    """A method's criterion from its read-out (`MethodKit.importance`)."""
    flag, field = readout(spec)
    found = False
    values_of = kit_of(spec).importance[1]
    for module_name, (values, count) in values_of(getattr(model(**batch, **{flag: True}), field) or {}).items():
        sums.add(name, sums.modules[module_name], values, count)
        found = True
    if not found:
        raise ValueError(f"the criterion {name!r} needs {spec.name} switched on (config.{spec.name}), with its "
                         "inputs in the batches")


def common_heads(importances: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The heads that every criterion of `importances` (`{criterion: {component: (layers, heads)}}`, as
    [`score_heads`][hf_headattn.experiment.analysis.head_ranking.score_heads] returns) scores, as
    `{component: bool (layers, heads)}`: to compare a method's criterion with the others on the heads it ranks (`dhicm`
    scores only DHICM's modules, `rhe` only the first encoder layer's)."""
    tables = list(importances.values())
    return {component: torch.stack([table[component].isfinite() for table in tables]).all(0)
            for component in tables[0]}


def heads_to_prune(model, importance: dict[str, torch.Tensor], count: int,
                   among: dict[str, torch.Tensor] | None = None) -> dict[str, list[int]]:
    """The `count` least important heads by `importance` (`{component: (layers, heads)}`; NaN entries and
    heads already pruned are no candidates, so an importance computed before pruning can be used again), as
    `{module name: [original head numbers]}` for [`hf_headattn.pruning.prune_heads`][hf_headattn.pruning.prune_heads];
    the last head of a module is never chosen. `among` (`{component: bool (layers, heads)}`, e.g.
    [`common_heads`][hf_headattn.experiment.analysis.head_ranking.common_heads]) limits the candidates further. Fewer
    are returned when fewer are candidates. `count` must be a non-negative integer (a `ValueError` otherwise)."""
    value = count.item() if getattr(count, "ndim", None) == 0 and hasattr(count, "item") else count  # numpy, 0-d
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"heads_to_prune: count must be a non-negative integer (the number of heads to prune), got "
                         f"{count!r}")
    count = int(value)
    if among is not None:
        importance = {component: table.masked_fill(~among[component], float("nan"))
                      for component, table in importance.items()}
    modules = {(component_of(module), module.headattn_layer): module for module in routed_modules(model).values()}
    candidates = sorted(
        (float(value), component, layer, head) for component, table in importance.items()
        for (layer, head), value in zip(torch.cartesian_prod(torch.arange(table.shape[0]),
                                                             torch.arange(table.shape[1])).tolist(),
                                        table.flatten().tolist())
        if value == value  # not NaN
    )
    chosen: dict[str, list[int]] = {}
    for _, component, layer, head in candidates:
        if sum(map(len, chosen.values())) == count:
            break
        module = modules[(component, layer)]
        taken = chosen.setdefault(module.headattn_name, [])
        if head in head_numbers(module) and module.num_heads - len(taken) > 1:
            taken.append(head)
    return {name: sorted(heads) for name, heads in chosen.items() if heads}
