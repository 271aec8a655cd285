"""A method's kit: what the recipes, studies and analyses know of a method beyond the model.

The model needs a method's core spec ([`hf_headattn.registry.MethodSpec`][hf_headattn.registry.MethodSpec]: settings,
placements, hooks, inputs, outputs). Everything else about it (its recipe names, the papers' presets, the model card's
line, its head-importance criterion, how the recipes and `translate` make its own forward inputs) is its kit:
`KIT = MethodKit(...)` in the module that `MethodSpec.kit` names, next to the method's analyses (the built-in ones:
`hf_headattn/methods/<name>/`). The core names its kit by import path only, so the model (and the
code `save_pretrained` ships to the Hub) never loads it; `kit_of` does, when a recipe asks. How the hooks of
several kits compose: `method_inputs`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..registry import MethodSpec, registered_methods


def merge_settings(base: dict, update: dict) -> dict:
    """`base` updated with `update`; nested dicts (`eadra`'s components) are merged, not replaced."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            value = merge_settings(dict(merged[key]), dict(value))
        merged[key] = value
    return merged


@dataclass(frozen=True)
class Preset:
    """A paper's setting (`--preset NAME`). `doc` names its source table; `flags`: values of recipe flags and
    of `Seq2SeqTrainingArguments`; `config`: config fields without a flag; `method_overrides`: {method name:
    settings} merged into a method's settings only when the chosen methods switch it on (e.g. DHICM Table 2's DHICM
    dropout, which means nothing for the T-base/T-optimal baselines). (`presets`.)"""

    doc: str
    flags: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    method_overrides: dict[str, dict] = field(default_factory=dict)

    def apply(self, settings: dict) -> dict:
        """`settings` (config fields) with this preset's `config` and `method_overrides` merged in."""
        merged = merge_settings(settings, self.config)
        for method, overrides in self.method_overrides.items():
            if merged.get(method) is not None:
                merged[method] = merge_settings(merged[method], overrides)
        return merged


@dataclass(frozen=True)
class MethodKit:
    """What the recipes know of one method.

    - `name`: the method's name (its `MethodSpec.name`).
    - `paper`: one line for the model card (default: the name).
    - `method_names`: recipe method names (`--method NAME`) -> this method's settings dict.
    - `presets`: the papers' presets (`--preset NAME`) -> [`Preset`][hf_headattn.experiment.kit.Preset].
    - `importance`: `(criterion name, function)`: the method's head-importance criterion for
        [`hf_headattn.experiment.analysis.head_ranking.score_heads`][hf_headattn.experiment.analysis.head_ranking.score_heads];
        the function maps one batch's read-out (the value of its read-out field,
        [`hf_headattn.registry.readout`][hf_headattn.registry.readout]) to
        `{module name: (per-head sums (heads,), number of items)}`, higher = more important.
    - `model_test_names`: the recipe method names (keys of `method_names`) whose settings HF's common model tests run
        the method with (`tests/test_hf_common.py`); default: the first one.

    A method whose forward inputs (`MethodSpec.inputs`) come from the data has hooks, all optional, which the
    recipes and `translate` call only while the method is switched on (`method_inputs` composes several):

    - `columns`: the feature columns `prepare_features` adds; the collator takes them out of each feature before
        padding the rest, and the Trainer keeps them (`remove_unused_columns=False`).
    - `recipe_arguments`: a dataclass of its recipe flags (`HfArgumentParser` fields, e.g. SEA's `--spacy_model`);
        the recipes add it to their parser, and hand its parsed object to `prepare_features`. Its class variable
        `input_flags` (a `ClassVar` tuple) names the flags that are paths the run reads (never its output folder).
    - `check_inputs`: `check_inputs(raw, job)`: raise `ValueError` / `FileNotFoundError` naming what is wrong with
        its inputs for the data `raw` (e.g. SEA: parse files that do not match the splits), before a recipe writes
        anything; `job` as for `prepare_features`, its `tokenizer` and `config` None.
    - `prepare_features`: `prepare_features(raw, features, job) -> features`: `raw` and `features` are
        `datasets.DatasetDict` s of the same splits and rows (the `translation` pairs; their tokenization),
        `job` a `FeatureJob`; returns `features` with its `columns` added, every other
        column kept. It may record on `job.config` what `inference_inputs` needs to make the same inputs (SEA:
        the parser).
    - `collate`: `collate(features, batch, *, tokenizer, settings, return_tensors) -> {forward input: tensor}`: a
        batch's forward inputs from its `features` (the dicts given to the collator, its columns included) and the
        `batch` the seq2seq collator padded; `settings` is its settings dict (the model's, else the recipe's),
        None where its method is off and its hooks make another method's inputs (`inputs_from`, below); an input
        provider's: `{method: settings}` of the methods that read its inputs.
    - `inference_inputs`: `inference_inputs(model, tokenizer, *, max_source_length, **input_options) -> make`, called
        once per `translate` (load a parser here, so that a missing one fails before any translating):
        `make(texts) -> [{column: value}, ...]`, one dict per text holding its `columns`, as `prepare_features`
        makes them; a text it cannot handle raises [`MethodInputError`][hf_headattn.experiment.kit.MethodInputError]
        naming its index in `texts`.
    - `example_inputs`: `example_inputs(batch_size, source_length) -> {forward input: tensor}`: random, valid values of
        its forward inputs, for HF's common model tests and the registry-wide tests.

    A method whose forward inputs a shared input provider makes (`INPUT_PROVIDERS`), or another method's kit,
    declares it instead of repeating the hooks:

    - `inputs_from`: `inputs_from(settings) -> provider or method name, or None`: given its settings dict, the provider
        (or the method whose kit's hooks) that makes the inputs these settings need (None: they need none). E.g. SEA,
        and Rel_Pos and Localness with `head_selection="redundant"` (RHE's `dependency_mask`) return
        `"syntax_inputs"`, and the recipes and `translate` then run that provider's hooks once however many
        methods ask for them (`method_inputs.input_kits`), its settings `{method: settings}` of the methods
        that asked.
    """

    name: str
    paper: str = ""
    method_names: Mapping[str, dict] = field(default_factory=dict)
    presets: Mapping[str, Preset] = field(default_factory=dict)
    importance: tuple[str, Callable] | None = None
    model_test_names: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    recipe_arguments: type | None = None
    check_inputs: Callable | None = None
    prepare_features: Callable | None = None
    collate: Callable | None = None
    inference_inputs: Callable | None = None
    example_inputs: Callable | None = None
    inputs_from: Callable[[Mapping[str, Any]], str | None] | None = None


INPUT_PROVIDERS: dict[str, str] = {"syntax_inputs": "hf_headattn.syntax_inputs.provider"}
"""The shared input providers, outside every method's folder: name -> the module whose `PROVIDER` (a
[`MethodKit`][hf_headattn.experiment.kit.MethodKit] of that name: `columns` and the input hooks) makes inputs that
several methods read. A method's kit names one from `inputs_from`; no method folder then imports another's."""


def input_providers() -> dict[str, MethodKit]:
    """`{name: PROVIDER}` of `INPUT_PROVIDERS` (each module imported now)."""
    found = {}
    for name, module in INPUT_PROVIDERS.items():
        provider = getattr(importlib.import_module(module), "PROVIDER", None)
        if not isinstance(provider, MethodKit) or provider.name != name:
            raise ValueError(f"input provider {name!r}: its module {module!r} must define PROVIDER = MethodKit("
                             f"{name!r}, ...), got {provider!r}")
        found[name] = provider
    return found


def kit_of(spec: MethodSpec) -> MethodKit:
    """The kit `spec.kit` names (`KIT` of that module); without `spec.kit`, the `KIT` of the module that
    defines the method's settings, if it has one (a method kept in one module needs not name itself), else an empty
    one (`MethodKit(spec.name)`)."""
    module = spec.kit or spec.settings.__module__
    kit = getattr(importlib.import_module(module), "KIT", None)
    if spec.kit is None and kit is None:
        return MethodKit(spec.name, paper=spec.name)
    if not isinstance(kit, MethodKit) or kit.name != spec.name:
        raise ValueError(f"method {spec.name!r}: its kit module {module!r} must define KIT = MethodKit("
                         f"{spec.name!r}, ...), got {kit!r}")
    return kit


def kits() -> list[MethodKit]:
    """The kits of the registered methods, in their order; two kits that claim one recipe method or preset name are
    refused."""
    found = [kit_of(spec) for spec in registered_methods()]
    owners: dict[str, str] = {}
    for kit in found:
        for name in [*kit.method_names, *kit.presets]:
            if owners.setdefault(name, kit.name) != kit.name:
                raise ValueError(f"the methods {owners[name]!r} and {kit.name!r} both define the recipe name "
                                 f"{name!r}; expected names unique over all methods")
    return found


class MissingDependencyError(ImportError):
    """A package that a method's inputs need (e.g. SEA's parser) is not installed; the message says what to install.
    The recipes turn it into a usage error (exit 2)."""


class MethodInputError(ValueError):
    """A text (or example) for which a method cannot make its inputs (e.g. SEA's parser refuses it): `index` is
    its position in the texts or dataset given. Subclasses keep the `(index, message)` signature."""

    def __init__(self, index: int, message: str):
        super().__init__(index, message)  # both in args, so the error pickles back from datasets' worker processes
        self.index, self.message = index, message

    def __str__(self) -> str:
        return f"example {self.index}: {self.message}"

    def renumbered(self, index: int) -> MethodInputError:
        """The same error for the same text at position `index` of a larger list."""
        return type(self)(index, self.message)
