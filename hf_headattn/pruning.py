"""Head pruning: physically remove attention heads (transformers 4's `prune_heads`, removed in 5).

`prune_heads(model, {"encoder.layers.0.self_attn": [1, 5], ...})` removes those heads: the rows of `q_proj`,
`k_proj`, `v_proj` and the columns of `out_proj` (when `out_proj` reads the concatenated heads; DHICM's
paper mode reads its d_m-dimensional mixture instead, so it keeps `out_proj`), and every per-head thing a method
keeps ([`prune_heads`][hf_headattn.attention.AttentionMethod.prune_heads]: EaDRA's regularized heads). Heads are named
by their original numbers, before any pruning, so importances and masks keep their coordinates across pruning steps.

The pruned heads are recorded in `config.pruned_heads` (`{module name: [original head numbers]}`), so
`save_pretrained`/`from_pretrained`, remote code and PEFT build the smaller modules. A pruned model equals the
unpruned one with those heads masked ([`hf_headattn.head_masks`][hf_headattn.head_masks]): logits, loss and generated
tokens.

Pruning every head of a module is refused (a `ValueError`): the papers' remaining-heads accounting (Michel et al.
2019, Voita et al. 2019) never removes a whole attention sub-layer, and the methods that mix heads need one.

A model wrapped with PEFT adapters (LoRA on the projections, the methods' modules saved with the adapter) is refused
too, before anything changes: prune first, then attach the adapters (or `merge_and_unload()`, prune, re-attach). So
is a model whose weights DeepSpeed ZeRO-3 partitions (each process holds a shard): prune the saved full weights; a
pruned checkpoint then loads under ZeRO-3 (`from_pretrained` builds the pruned projections partitioned).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from .attention import AttentionMethod, HeadIndex
from .head_masks import head_numbers, routed_modules
from .hf_compat import INPUT_PROJECTIONS, OUTPUT_PROJECTION, set_num_heads, zero3_partitioned
from .settings_checks import check_head_numbers, check_pruned_heads
from .sites import AttentionSite, component_shape


def check_prunable(model: nn.Module, modules: Iterable[nn.Module]) -> None:
    """A `ValueError` unless `model` carries no PEFT adapters, its weights are not partitioned by DeepSpeed ZeRO-3
    and `modules` (attention modules) have plain `nn.Linear` projections and hf-headattn methods: pruning cuts
    those in place, and a wrapped one (LoRA's `lora_A`/`lora_B`, a `ModulesToSaveWrapper`'s copies) would be
    left half-pruned, a partitioned one cut from this process's shard."""
    partitioned = zero3_partitioned(model)
    if partitioned is not None:
        raise ValueError(f"prune_heads: the model's weights are partitioned by DeepSpeed ZeRO-3 ({partitioned} holds "
                         "only this process's shard); nothing was pruned. Prune the full weights: save the model "
                         "(trainer.save_model with stage3_gather_16bit_weights_on_model_save: true in the DeepSpeed "
                         "config), load it with from_pretrained outside DeepSpeed, prune and save it; from_pretrained "
                         "under ZeRO-3 then builds the pruned model")
    wrapped = next((name for name, module in model.named_modules() if type(module).__module__.startswith("peft.")),
                   None)
    if wrapped is not None:
        peft_class = type(model.get_submodule(wrapped))
        raise ValueError(f"prune_heads: the model carries PEFT adapters ({wrapped or 'the model itself'} is a "
                         f"{peft_class.__module__}.{peft_class.__qualname__}); nothing was pruned. Prune first, then "
                         "attach the adapters (prune_heads, then get_peft_model), or merge them first: model = "
                         "peft_model.merge_and_unload(); model.prune_heads(...); then attach new adapters")
    for module in modules:
        parts = {name: getattr(module, name) for name in (*INPUT_PROJECTIONS, OUTPUT_PROJECTION)}
        parts.update({name: getattr(module, name) for name in module.headattn_methods})
        for name, part in parts.items():
            expected = AttentionMethod if name in module.headattn_methods else nn.Linear
            if not isinstance(part, expected):
                raise ValueError(f"prune_heads: {module.headattn_name}.{name} is a {type(part).__name__}, expected "
                                 f"a plain {expected.__name__} (prune before wrapping or replacing modules); nothing "
                                 "was pruned")
            if getattr(part, "pruning_refused", None):
                raise ValueError(f"prune_heads: {module.headattn_name}.{name}: {part.pruning_refused}; nothing was "
                                 "pruned")


PEFT_PREFIX = "base_model.model."
"""The prefix PEFT puts before the wrapped model's module names (`PeftModel.base_model.model`)."""


def module_aliases(model: nn.Module) -> dict[str, str]:
    """`{name: base-model name}` of every name [`prune_heads`][hf_headattn.pruning.prune_heads] accepts for `model`'s
    attention modules: the base-model name itself (`encoder.layers.0.self_attn`), every path under which `model` holds
    the module (`model.encoder.layers.0.self_attn`; all of them, where a module is shared), and each of those with or
    without PEFT's [`PEFT_PREFIX`][hf_headattn.pruning.PEFT_PREFIX] (the names a `PeftModel` gives the same module)."""
    aliases = {module.headattn_name: module.headattn_name for module in routed_modules(model).values()}
    aliases.update({path: module.headattn_name for path, module in model.named_modules(remove_duplicate=False)
                    if hasattr(module, "headattn_layer")})
    for path, name in list(aliases.items()):
        aliases.setdefault(path.removeprefix(PEFT_PREFIX) if path.startswith(PEFT_PREFIX) else PEFT_PREFIX + path, name)
    return aliases


def requested_heads(model: nn.Module, heads: Mapping) -> dict[str, tuple[list[int], str]]:
    """`heads` merged per module: `{base-model name: (sorted distinct head numbers, where)}`, each key resolved to
    its module first ([`module_aliases`][hf_headattn.pruning.module_aliases]), so that two names of one module add up;
    `where` names the keys, for messages. A `ValueError` for an unknown key, a bad number or a merged list that leaves
    the module no head."""
    aliases, merged = module_aliases(model), {}
    for path, numbers in heads.items():
        name = aliases.get(path) if isinstance(path, str) else None
        if name is None:
            raise ValueError(f"prune_heads: {path!r} is no attention module of this model; expected names such as "
                             f"{sorted(set(aliases.values()))[:3]} or the model's own paths to them")
        total = component_shape(model.config, AttentionSite.parse(name).component)[1]
        numbers, where = check_head_numbers(numbers, total, f"prune_heads[{path!r}]"), f"prune_heads[{path!r}]"
        if name in merged:  # another name of the same module
            where = f"{merged[name][1]} and {where} (both {name!r})"
            numbers = check_head_numbers([*merged[name][0], *numbers], total, where)
        merged[name] = numbers, where
    return merged


def pruned_numbers(module: nn.Module, total: int) -> list[int]:
    """The original numbers of the heads `module` (one of `total` heads before pruning) no longer has."""
    return sorted(set(range(total)) - set(head_numbers(module)))


def modules_record(model: nn.Module) -> dict[str, list[int]]:
    """`{module name: [original head numbers]}` of the heads `model`'s attention modules no longer have (modules
    that have all theirs left out): what `config.pruned_heads` holds while it agrees with the modules."""
    record = {}
    for name, module in routed_modules(model).items():
        numbers = pruned_numbers(module, component_shape(model.config, AttentionSite.parse(name).component)[1])
        if numbers:
            record[name] = numbers
    return record


def prune_heads(model: nn.Module, heads: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
    """Remove `heads` (`{module name: [original head numbers]}`) from `model` in place and record them in
    `model.config.pruned_heads`; returns the updated record.

    Module names are relative to the base model (`"encoder.layers.0.self_attn"`), the model's own paths
    (`"model.encoder.layers.0.self_attn"`) or PEFT's (`"base_model.model.model.encoder..."`), see
    [`module_aliases`][hf_headattn.pruning.module_aliases]. Every key is resolved to its module first and the heads
    given for one module under several names are merged. A head already pruned, a number out of range, the last head of
    a module (in the merged list, with the heads pruned before) and a `config.pruned_heads` that disagrees with the
    modules are refused with a `ValueError`, before anything changes. The record is then read back from the pruned
    modules, so the record, the config and the modules agree and `save_pretrained` writes what `from_pretrained` can
    build. Prune before wrapping the model with PEFT adapters (which wrap the projections): a PEFT model is refused (see
    [`check_prunable`][hf_headattn.pruning.check_prunable]).
    """
    if not isinstance(heads, Mapping):
        raise ValueError(f"prune_heads expects a dict {{module name: [head numbers]}}, e.g. "
                         f"{{'encoder.layers.0.self_attn': [1, 5]}}, got a {type(heads).__name__}: {heads!r}")
    modules = routed_modules(model)
    record = check_pruned_heads(model.config.pruned_heads, model.config)
    totals = {name: component_shape(model.config, AttentionSite.parse(name).component)[1] for name in modules}
    for name, module in modules.items():
        if record.get(name, []) != pruned_numbers(module, totals[name]):
            raise ValueError(f"config.pruned_heads was changed after the model was built: it records "
                             f"{record.get(name, [])} for {name!r}, whose module has pruned "
                             f"{pruned_numbers(module, totals[name])}; nothing was pruned. Prune with "
                             "model.prune_heads(...) only, which records the heads")
    requested = requested_heads(model, heads)
    for name, (numbers, where) in requested.items():
        again = sorted(set(numbers) & set(record.get(name, ())))
        if again:
            raise ValueError(f"{where}: heads {again} are already pruned (heads keep their original numbers; pruned "
                             f"so far: {record[name]})")
        check_head_numbers([*record.get(name, ()), *numbers], totals[name], f"{where} with the heads pruned before")
    check_prunable(model, [modules[name] for name in requested])
    for name, (numbers, _) in requested.items():
        if numbers:  # (an empty list asks for nothing)
            prune_module(modules[name], numbers)
            record[name] = pruned_numbers(modules[name], totals[name])  # what the module now holds
    model.config.pruned_heads = {name: record[name] for name in sorted(record) if record[name]}
    for module in model.modules():  # the models (and stacks) check at each forward that they have what is recorded
        if hasattr(module, "headattn_pruned_heads") and module.config is model.config:
            module.headattn_pruned_heads = model.config.pruned_heads
    return model.config.pruned_heads


def apply_pruned_heads(model: nn.Module, record: Mapping[str, list[int]]) -> None:
    """Prune a freshly built model as `record` (`config.pruned_heads`) says, before its weights are loaded (with
    DeepSpeed ZeRO-3, `from_pretrained` builds it partitioned: the projections are then built anew at their pruned
    shapes, see `_select`)."""
    modules = routed_modules(model)
    for name, numbers in record.items():
        if name in modules:  # a stack built alone holds one side
            prune_module(modules[name], numbers)


def prune_module(module: nn.Module, numbers: list[int]) -> None:
    """Remove the heads with original numbers `numbers` (present in the module) from one attention module."""
    original = head_numbers(module)
    cpu = torch.device("cpu")  # (explicitly: from_pretrained builds under a meta device context)
    keep = torch.tensor([i for i, number in enumerate(original) if number not in numbers], device=cpu)
    rows = (keep[:, None] * module.head_dim + torch.arange(module.head_dim, device=cpu)).flatten()
    for name in INPUT_PROJECTIONS:
        _select(module, name, rows, dim=0)
    methods = [getattr(module, name) for name in module.headattn_methods]
    if all(method.out_proj_per_head for method in methods):
        _select(module, OUTPUT_PROJECTION, rows, dim=1)
    for method in methods:
        method.prune_heads(keep)
    set_num_heads(module, len(keep))
    module.headattn_heads = HeadIndex(original[i] for i in keep.tolist())
    if module.headattn_head_mask is not None:
        module.headattn_head_mask = module.headattn_head_mask[:, keep.to(module.headattn_head_mask.device)]


def _select(module: nn.Module, name: str, index: torch.Tensor, dim: int) -> None:
    """Keep the output rows (`dim` 0, and the bias) or input columns (`dim` 1) `index` of the `nn.Linear`
    `module.<name>`.

    A projection DeepSpeed ZeRO-3 holds partitioned is one `from_pretrained` builds under `deepspeed.zero.Init`
    ([`prune_heads`][hf_headattn.pruning.prune_heads] refuses a partitioned model): it holds no weights yet, only this
    process's share of a placeholder, so it is built anew at its pruned shape, which `deepspeed.zero.Init` partitions,
    and the checkpoint's weights are loaded into it."""
    linear = getattr(module, name)
    if zero3_partitioned(linear) is not None:
        shape = (len(index), linear.in_features) if dim == 0 else (linear.out_features, len(index))
        setattr(module, name, nn.Linear(shape[1], shape[0], bias=linear.bias is not None))
        return
    weight = linear.weight
    index = index.to(weight.device)
    linear.weight = nn.Parameter(weight.detach().index_select(dim, index).clone(), requires_grad=weight.requires_grad)
    if dim == 0:
        linear.out_features = len(index)
        if linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias.detach().index_select(0, index).clone(),
                                       requires_grad=linear.bias.requires_grad)
    else:
        linear.in_features = len(index)
