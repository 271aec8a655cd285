"""The methods' own forward inputs in the recipes and `translate`: the hooks of the switched-on methods' kits
([`MethodKit`][hf_headattn.experiment.kit.MethodKit]'s `columns`, `recipe_arguments`, `prepare_features`, `collate`;
`translate` calls `inference_inputs`) composed, so that no shared module names a method.

Several methods with inputs of their own compose: each adds its own feature columns, each `collate` adds its own
forward inputs to the one padded batch, and `translate` merges each text's columns from every method. What cannot
compose is refused naming both methods: two kits that declare one column or one recipe flag, or two collate hooks
that make one input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import datasets
from transformers import DataCollatorForSeq2Seq

from .kit import MethodKit, input_providers, kits

_HOOKS = ("check_inputs", "prepare_features", "collate", "inference_inputs")


def _owners(found: Iterable[MethodKit], names: Callable[[MethodKit], Iterable[str]], what: str) -> dict[str, str]:
    """`{name: method}` over `found`; a name two methods claim is refused, naming both."""
    owners: dict[str, str] = {}
    for kit in found:
        for name in names(kit):
            if owners.setdefault(name, kit.name) != kit.name:
                raise ValueError(f"the methods {owners[name]!r} and {kit.name!r} both declare the {what} {name!r}; "
                                 f"expected each {what} declared by one method")
    return owners


def _makes_inputs(kit: MethodKit) -> bool:
    return bool(kit.columns) or any(getattr(kit, hook) is not None for hook in _HOOKS)


def _readers(settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`{provider or lending method: {method: its settings}}`: who makes the inputs of each switched-on method that
    takes them from a shared provider or another kit (`MethodKit.inputs_from`); a name that is neither is refused."""
    every = kits()
    providers = input_providers()
    lenders = {*providers, *(kit.name for kit in every if _makes_inputs(kit))}
    readers: dict[str, dict[str, Any]] = {}
    for kit in every:
        values = settings.get(kit.name)
        lender = kit.inputs_from(values) if values is not None and kit.inputs_from is not None else None
        if lender is None:
            continue
        if lender not in lenders:
            raise ValueError(f"method {kit.name!r} takes its inputs from {lender!r}, which is neither an input "
                             f"provider nor a registered method whose kit makes inputs; expected one of "
                             f"{sorted(lenders)}")
        readers.setdefault(lender, {})[kit.name] = values
    return readers


def input_kits(settings: Mapping[str, Any]) -> list[MethodKit]:
    """The input providers and kits (providers first, then the registry's order) whose hooks make the inputs that
    `settings` (config fields, e.g. a recipe's settings or `config.to_dict()`) need: of each switched-on method
    (not None) that makes inputs of its own (columns or a hook), and each provider or method a switched-on one takes
    its inputs from (`MethodKit.inputs_from`), each once."""
    readers = _readers(settings)
    found = [provider for name, provider in input_providers().items() if name in readers]
    found += [kit for kit in kits() if kit.name in readers or (settings.get(kit.name) is not None
                                                                 and _makes_inputs(kit))]
    _owners(found, lambda kit: kit.columns, "feature column")
    return found


def input_settings(kit: MethodKit, settings: Mapping[str, Any], method_settings: Callable[[str], Any] | None = None):
    """What `kit`'s hooks are given as `settings`: a provider's, `{method: settings}` of the switched-on methods
    that read its inputs (`method_settings(name)` where given, e.g. the model's config, else `settings[name]`);
    a method's kit, its own settings dict (None where it is off and makes another's inputs)."""
    def own(name):
        value = method_settings(name) if method_settings is not None else None
        return value if value is not None else settings.get(name)

    if kit.name in input_providers():
        return {name: own(name) for name in _readers(settings).get(kit.name, {})}
    return own(kit.name)


def recipe_argument_classes() -> list[type]:
    """The input providers' and the registered kits' `recipe_arguments` dataclasses, for a recipe's
    `HfArgumentParser` (after its own); two that define one flag are refused, naming both."""
    found = [kit for kit in [*input_providers().values(), *kits()] if kit.recipe_arguments is not None]
    _owners(found, lambda kit: [f.name for f in dataclasses.fields(kit.recipe_arguments)], "recipe flag")
    return [kit.recipe_arguments for kit in found]


def method_options(parsed: Sequence) -> dict[str, Any]:
    """`{flag: value}` of parsed `recipe_arguments` objects: `prepare_method_features`'s `options`."""
    return {f.name: getattr(args, f.name) for args in parsed for f in dataclasses.fields(args)}


def input_flags(options: Mapping[str, Any]) -> dict[str, Any]:
    """`{"--<flag>": value}` of the methods' recipe flags that name paths a run reads (each `recipe_arguments`
    class lists them in its `input_flags` class variable), for `check_output_dir`'s `inputs`."""
    return {f"--{name}": options.get(name) for cls in recipe_argument_classes()
            for name in getattr(cls, "input_flags", ())}


def _arguments(kit: MethodKit, options: Mapping[str, Any]):
    """The kit's `recipe_arguments` object from the flat `options` (its defaults for flags not given)."""
    if kit.recipe_arguments is None:
        return None
    names = {f.name for f in dataclasses.fields(kit.recipe_arguments) if f.init}
    return kit.recipe_arguments(**{key: value for key, value in options.items() if key in names})


@dataclass(frozen=True)
class FeatureJob:
    """What a kit's `prepare_features` is given besides the data.

    tokenizer, source, target, max_source_length, max_target_length, num_proc: as the features were tokenized
        (`tokenize_parallel`; `source`/`target` are keys of the `translation` pairs).

    - `settings`: the method's settings dict (the recipe's); None where the method is off and its kit makes the inputs
        of another that takes them from it (`MethodKit.inputs_from`); an input provider's: `{method: settings}`
        of the switched-on methods that read its inputs.
    - `args`: its `recipe_arguments` object (defaults for the flags not given), or None.
    - `config`: the model's config, on which the kit records what inference needs to make the same inputs; None (e.g.
        features for an analysis): nothing is recorded.
    """

    tokenizer: Any
    source: str
    target: str
    max_source_length: int
    max_target_length: int
    settings: Mapping[str, Any] | None
    args: Any = None
    num_proc: int | None = None
    config: Any = None


def _known_options(options: Mapping[str, Any]) -> None:
    known = {f.name for cls in recipe_argument_classes() for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown method options {unknown}; expected recipe flags of the registered methods' kits: "
                         f"{sorted(known)}")


def check_method_inputs(raw: datasets.DatasetDict, settings: Mapping[str, Any], source: str,
                        options: Mapping[str, Any]) -> None:
    """Run the `check_inputs` hooks of the kits that `settings` need (`input_kits`) on the data `raw`, so
    that a recipe refuses inputs that do not fit it (e.g. too few parses) before it writes anything."""
    _known_options(options)
    for kit in input_kits(settings):
        if kit.check_inputs is not None:
            kit.check_inputs(raw, FeatureJob(tokenizer=None, source=source, target="", max_source_length=0,
                                             max_target_length=0, settings=input_settings(kit, settings),
                                             args=_arguments(kit, options)))


def prepare_method_features(raw: datasets.DatasetDict, features: datasets.DatasetDict, settings: Mapping[str, Any],
                            job: Mapping[str, Any], options: Mapping[str, Any]) -> datasets.DatasetDict:
    """`features` with the columns of every method that `settings` switch on (their kits' `prepare_features`,
    in registry order). `job`: `FeatureJob`'s fields but `settings` and `args`; `options`: the kits'
    recipe flags by name (unknown names are refused)."""
    _known_options(options)
    for kit in input_kits(settings):
        if kit.prepare_features is None:
            continue
        features = kit.prepare_features(raw, features, FeatureJob(
            **job, settings=input_settings(kit, settings), args=_arguments(kit, options)))
        for split, dataset in features.items():
            missing = [column for column in kit.columns if column not in dataset.column_names]
            if missing:
                raise ValueError(f"method {kit.name!r}: its prepare_features left out the columns {missing} of the "
                                 f"{split!r} split; expected every column of its kit's columns {list(kit.columns)}")
    return features


@dataclass
class MethodInputsCollator(DataCollatorForSeq2Seq):
    """`DataCollatorForSeq2Seq` plus the switched-on methods' own forward inputs.

    Identical to the parent except: the `columns` of `kits` are taken out of every feature before the parent pads
    the rest, then each kit's `collate` hook adds its forward inputs to the padded batch, given the features (its
    columns included) and its settings (`method_settings[name]`, default `{}`; None: the method is off and its
    kit makes another's inputs, `MethodKit.inputs_from`). An input made twice is refused, naming who made it
    first.
    """

    kits: Sequence[MethodKit] = ()
    method_settings: Mapping[str, Mapping] = field(default_factory=dict)

    def __call__(self, features, return_tensors=None):
        return_tensors = return_tensors or self.return_tensors
        own = {column for kit in self.kits for column in kit.columns}
        batch = super().__call__([{k: v for k, v in f.items() if k not in own} for f in features],
                                 return_tensors=return_tensors)
        made = dict.fromkeys(batch, "the seq2seq collator")
        for kit in self.kits:
            if kit.collate is None:
                continue
            inputs = kit.collate(features, batch, tokenizer=self.tokenizer,
                                 settings=self.method_settings.get(kit.name, {}), return_tensors=return_tensors)
            for key in inputs:
                if key in made:
                    raise ValueError(f"method {kit.name!r} makes the batch input {key!r}, which {made[key]} made "
                                     "already; expected each input made once")
                made[key] = f"method {kit.name!r}"
            batch.update(inputs)
        return batch


def method_collator(tokenizer, model, settings: Mapping[str, Any], **kwargs) -> DataCollatorForSeq2Seq:
    """The batch collator for `settings` (config fields): `DataCollatorForSeq2Seq` (`kwargs` passed on), or
    `MethodInputsCollator` where a method that makes inputs is on; each method's collate hook gets its
    settings from the model's config (so that inference reads them as training did), else from `settings` (None
    where its method is off and it makes another's inputs)."""
    found = input_kits(settings)
    if not found:
        return DataCollatorForSeq2Seq(tokenizer, model=model, **kwargs)
    config = getattr(model, "config", None)
    chosen = {kit.name: input_settings(kit, settings, lambda name: getattr(config, name, None)) for kit in found}
    return MethodInputsCollator(tokenizer, model=model, kits=tuple(found), method_settings=chosen, **kwargs)
