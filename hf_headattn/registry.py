"""The method registry: one [`MethodSpec`][hf_headattn.registry.MethodSpec] per method names everything the model needs
from it.

A method's core defines a settings dataclass (a [`MethodSettings`][hf_headattn.registry.MethodSettings]), an
[`AttentionMethod`][hf_headattn.attention.AttentionMethod] and a `MethodSpec` (the built-in ones in
`hf_headattn/methods/<name>/core.py`, one line in `hf_headattn.methods` registering each; one outside the
package through [`hf_headattn.plugin`][hf_headattn.plugin]; how: docs/design.md, "Adding a method"). The config, the
model and the Trainer's logging read the registry; the recipes, the model card and the analyses read the method's kit
(`MethodSpec.kit`, `hf_headattn.experiment.kit`), found through it; nothing else lists the methods. (The peft
tuners are the model: one config dataclass per method, validated when it is built, and one registration call.)

Settings live on the model config under the method's name, as a read-only dict (JSON in `config.json`), e.g.
`config.dhicm = {"encoder_layers": [-1], "decoder_layers": [-1], "kl_weight": 0.1, ...}`; `None` = off. The
config resolves them once, when set, into the method's frozen settings dataclass (`config.headattn_settings`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import keyword
import math
import sys
import traceback
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .placement import layer_placements
from .settings_checks import describe_type
from .sites import component_of, component_shape


class MethodSettings:
    """Base of the methods' settings: frozen dataclasses built from a dict, type-checked, resolved against the model
    config.

    Subclasses are `@dataclass(frozen=True)` ([`register_method`][hf_headattn.registry.register_method] checks it); each
    field's annotation is checked (`int`, `float`, `bool`, `str`, `Literal[...]`, `list[...]`, `dict`, another
    `MethodSettings` class given as a dict, `X | None`), then [`resolved`][hf_headattn.registry.MethodSettings.resolved]
    checks ranges and consistency and fills in what depends on the model (e.g. EaDRA's per-component defaults). Every
    error is a `ValueError` naming `<method>.<field>`, the bad value and what was expected. The config resolves each
    method's settings once, when they (or the model shape they depend on) are set, and the model is built from the
    resolved objects.
    """

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], name: str, model_config) -> MethodSettings:
        """The settings of `values` (a dict from the config), type-checked and
        [`resolved`][hf_headattn.registry.MethodSettings.resolved]."""
        if not isinstance(values, Mapping):
            raise ValueError(f"{name} must be a dict of settings (or None for off), got {values!r}")
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{name} has unknown settings {unknown}; expected some of {sorted(known)}")
        hints = typing.get_type_hints(cls)
        for key, value in values.items():
            check_type(value, hints[key], f"{name}.{key}")
        return cls(**values).resolved(model_config, name)

    @classmethod
    def without_unknown(cls, values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """`values` without the keys that are no field of `cls`, also inside nested settings given as dicts (e.g.
        EaDRA's components), and those keys (`"cross.new_key"`): for a config written by a newer release, whose new
        settings this release does not know (`HeadAttnSettings._drop_newer_settings`)."""
        known, hints = {f.name for f in dataclasses.fields(cls) if f.init}, typing.get_type_hints(cls)
        kept, dropped = {}, []
        for key, value in values.items():
            if key not in known:
                dropped.append(key)
                continue
            nested = _nested_settings(hints[key])
            if nested is not None and isinstance(value, Mapping):
                value, inner = nested.without_unknown(value)
                dropped += [f"{key}.{name}" for name in inner]
            kept[key] = value
        return kept, dropped

    def resolved(self, model_config, name: str) -> MethodSettings:
        """These settings checked against the model config (e.g. layer indices), with what depends on it filled in
        (a new object: settings are frozen); raise `ValueError`. The default:
        [`validate`][hf_headattn.registry.MethodSettings.validate], then `self`."""
        self.validate(model_config, name)
        return self

    def validate(self, model_config, name: str) -> None:
        """Range and consistency checks that need the model config (e.g. layer indices); raise `ValueError`."""

    def switched_on(self) -> bool:
        """Whether these settings ask for anything (e.g. SEA needs a type or pruning); settings that do not are
        off, with a warning. (Settings that ask for something but place it nowhere, e.g. empty layer lists, are
        refused by the config.)"""
        return True


def _nested_settings(annotation) -> type[MethodSettings] | None:
    """The [`MethodSettings`][hf_headattn.registry.MethodSettings] class a field's annotation names (alone or in a
    union), else None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, MethodSettings):
            return candidate
    return None


def check_type(value, annotation, name: str) -> None:
    """Raise `ValueError` unless `value` matches `annotation` (bools are not numbers; ints are floats)."""
    if not _matches(value, annotation):
        raise ValueError(f"{name} must be {describe_type(annotation)}, got {value!r}")


def _matches(value, annotation) -> bool:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return True
    if annotation is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if origin is Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is str:
        return isinstance(value, str)
    if origin is list:
        return isinstance(value, (list, tuple)) and all(_matches(item, args[0]) for item in value)
    if annotation is dict or origin is dict:
        return isinstance(value, Mapping)
    if isinstance(annotation, type) and issubclass(annotation, MethodSettings):
        return isinstance(value, (Mapping, annotation))  # nested settings, resolved by the enclosing settings
    raise TypeError(f"unsupported settings annotation {annotation!r}")


@dataclass(frozen=True)
class MethodSpec:
    """What a method contributes to the model (its core; what the recipes know of it is its kit, `kit`).

    - `name`: the config field holding its settings, the attribute of its module on an attention module, and the prefix
        of its parameters (`...self_attn.<name>.*`).
    - `settings`: its [`MethodSettings`][hf_headattn.registry.MethodSettings] dataclass.
    - `placements`: `placements(settings, model_config) -> [(side, layer, kind), ...]` with side "encoder"/"decoder",
        kind "self"/"cross"; an empty list means the settings place the method nowhere (refused: it would be off).
        Default (None): [`layer_placements`][hf_headattn.placement.layer_placements], from the settings' fields
        `encoder_layers`, `decoder_layers`, `cross_layers` (the placement vocabulary, `hf_headattn.placement`: "all",
        layer numbers, None: not placed).
    - `build`: `build(settings, model_config, attention_module, *, num_heads, head_dim) -> AttentionMethod`, called once
        per placement ([`make`][hf_headattn.registry.MethodSpec.make]); the keywords are optional: `num_heads` (the
        module's heads as the config gives them: methods are built before [`pruning`][hf_headattn.pruning] prunes, which
        then calls the method's `prune_heads`) and `head_dim` (the size of one head) are passed only if `build` names
        them (or takes `**kwargs`), so a `build(settings, config, module)` of an earlier release works as before.
    - `collect`: `collect(context, settings) -> (output fields, weighted objective term or None)` after each forward.
        Default (None): `no_outputs` (none, and no objective term). Only `name`, `settings` and `build`
        are required: `MethodSpec(NAME, Settings, build=build)`.
    - `runs_after` / `runs_before`: names of methods whose hooks must run before / after this method's on an attention
        module that carries both (a method not registered is ignored). Each attention call runs every `before`
        hook, then the backend, then every `after` hook, the methods in
        [`registered_methods`][hf_headattn.registry.registered_methods] order: the registration order, moved as these
        constraints ask; a cycle is refused when the method is registered. (How the built-in methods interact on one
        module: docs/design.md.)
    - `inputs`: forward arguments (batch columns) it reads, `None` when not given; the model's `forward` names them
        (so that `generate` and the Trainer pass them on) and hands them to every attention call.
    - `flags`: boolean forward arguments (default False) that ask for read-outs, e.g. `output_head_importance`; the
        methods see the ones set in `HeadAttnContext.flags`.
    - `neutral_inputs`: `neutral_inputs(batch_size, source_length) -> {input: tensor}`, values of `inputs` that change
        nothing (`translate` gives them to sentences it cannot prepare the inputs for, e.g. unparsable ones).
    - `outputs`: output field -> description; fields that are training read-outs, never predictions (the Trainer keeps
        them out of `logits`).
    - `logged`: the output fields logged as loss components (dict fields flattened as `<field>/<key>`); the other
        output fields are the read-outs that `flags` ask for ([`readout`][hf_headattn.registry.readout]).
    - `legacy_fields`: flat config fields of release 0.1 -> settings field, so old saved configs still load.
    - `legacy_defaults`: settings whose default changed since release 0.1, with release 0.1's value: a checkpoint saved
        by release 0.1 keeps the behaviour it was trained with.
    - `older_files_defaults`: settings added, with a new default, after configs with the method had been saved, each
        with what a saved dict that lacks it was trained with (e.g. Localness's `{"predictor": "head"}`): `to_dict`
        records the defaults a dict relies on (`headattn_defaults` in config.json), so a saved dict that lacks one
        and a file that records none predate the setting, and load with this value.
    - `older_spellings`: `older_spellings(values) -> (values, [(old, new), ...])`: a settings dict with the spellings
        the method used before the shared placement vocabulary (`hf_headattn.placement`) given in today's
        ([`renamed`][hf_headattn.placement.renamed]), and what it renamed; the config warns about those (removed in 0.4,
        `hf_headattn.legacy.translate_older_spellings`) and keeps the new dict. None: nothing renamed.
    - `prepare_stack`: `prepare_stack(settings, model_config, side, stack)`, called once when a model (or a stack on its
        own) is built, for each side ("encoder", "decoder") the method is placed on, with that side's HF stack
        (`MBartEncoder`, ...), after the methods are attached and before any weight is loaded: a change to the
        model outside attention (e.g. Rel_Pos's `absolute_positions=False` mutes the position embeddings with
        [`hf_headattn.model_hooks.mute_module`][hf_headattn.model_hooks.mute_module]). It must keep the stack's
        parameters (checkpoints load as before) and be idempotent. None: the method changes attention only.
    - `head_use`: `head_use(settings, model_config, site) -> HeadUse`: what the method does to the heads of the
        attention module `site` ((side, layer, kind), one of its placements), for the check of two methods on one
        module (`meeting_conflict`, when the config is built); None: it only biases scores or reads or
        changes outputs, which composes with every method.
    - `kit`: the import path of the method's kit module (`KIT = MethodKit(...)`: recipe names, presets, model card
        line, head-importance criterion; `hf_headattn.experiment.kit`), or `None`: the module that defines
        the settings class, if it has a `KIT` (a method kept in one module). Only the experiment kit
        imports it: the model, and the code `save_pretrained` ships, never do.
    """

    name: str
    settings: type[MethodSettings]
    placements: Callable | None = None
    build: Callable | None = None
    collect: Callable | None = None
    runs_after: tuple[str, ...] = ()
    runs_before: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    neutral_inputs: Callable | None = None
    outputs: Mapping[str, str] = field(default_factory=dict)
    logged: tuple[str, ...] = ()
    legacy_fields: Mapping[str, str] = field(default_factory=dict)
    legacy_defaults: Mapping[str, Any] = field(default_factory=dict)
    older_files_defaults: Mapping[str, Any] = field(default_factory=dict)
    older_spellings: Callable | None = None
    head_use: Callable | None = None
    prepare_stack: Callable | None = None
    kit: str | None = None

    def __post_init__(self):
        if self.build is None:
            raise ValueError(f"method {self.name!r}: MethodSpec needs build=build(settings, config, module, *, "
                             "num_heads, head_dim) -> AttentionMethod, the method on one attention module")
        if self.placements is None or (isinstance(self.placements, LayerPlacements)
                                       and self.placements.name != self.name):
            object.__setattr__(self, "placements", LayerPlacements(self.name))
        if self.collect is None:
            object.__setattr__(self, "collect", no_outputs)

    def make(self, settings: MethodSettings, model_config, module) -> Any:
        """[`build`][hf_headattn.registry.MethodSpec.build] on the attention `module`, with the `num_heads` and
        `head_dim` keywords it names."""
        offered = {"num_heads": component_shape(model_config, component_of(module))[1], "head_dim": module.head_dim}
        wanted = _keywords(self.build)
        return self.build(settings, model_config, module, **{key: value for key, value in offered.items()
                                                             if wanted is None or key in wanted})


class LayerPlacements:
    """The default `MethodSpec.placements`: [`layer_placements`][hf_headattn.placement.layer_placements] of the
    settings' layer fields (`encoder_layers`, `decoder_layers`, `cross_layers`; "all", layer numbers, None: not placed),
    errors naming the method."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, settings: MethodSettings, model_config) -> list[tuple[str, int, str]]:
        return layer_placements(settings, model_config, self.name)

    def __repr__(self) -> str:
        return f"LayerPlacements({self.name!r})"


def no_outputs(context, settings: MethodSettings) -> tuple[dict, None]:
    """The default `MethodSpec.collect`: no output fields, no objective term."""
    return {}, None


def _keywords(function: Callable) -> set[str] | None:
    """The names `function` takes as keywords, or None where it takes any (`**kwargs`)."""
    parameters = inspect.signature(function).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None
    return {parameter.name for parameter in parameters
            if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}


@dataclass(frozen=True)
class HeadUse:
    """What a method does to some heads of one attention module (`MethodSpec.head_use`); head numbers, sorted.

    - `takes_over`: the heads it computes itself (`call.take_over`): no other method may take them over too.
    - `fixes`: the heads whose weights are its own, no softmax of the scores (fixed patterns): other methods' score
        biases do not reach them, and their probabilities cannot be recomputed from q and k.
    - `reads_scores`: the heads whose probabilities it recomputes from q, k and the mask (EaDRA's regularizer).
    - `mixes`: the heads it mixes (`call.mix_scores` / `mix_weights`; talking-heads attention: all of them): every
        head then runs on the mixing path, so no other method may take a head over, and the mixed heads'
        probabilities are no softmax of their own q and k.
    """

    takes_over: tuple[int, ...] = ()
    fixes: tuple[int, ...] = ()
    reads_scores: tuple[int, ...] = ()
    mixes: tuple[int, ...] = ()


def meeting_conflict(first: str, first_use: HeadUse, second: str, second_use: HeadUse, where: str) -> str | None:
    """Why the methods `first` and `second` cannot run on the attention module `where` with those head uses
    (a sentence naming both, the module and the heads), or None: they compose there."""
    both = sorted(set(first_use.takes_over) & set(second_use.takes_over))
    if both:
        return (f"{first} and {second} both take over heads {both} of {where} (each computes those heads itself); "
                f"expected each head taken over by one method: place them on different layers or heads")
    for mixer, mixing, other, use in ((first, first_use, second, second_use), (second, second_use, first, first_use)):
        if mixing.mixes and use.takes_over:
            return (f"{mixer} mixes heads {list(mixing.mixes)} of {where}, which needs every head's scores, and "
                    f"{other} takes over heads {list(use.takes_over)}; expected the two on different layers")
        both = sorted(set(mixing.mixes) & set(use.reads_scores))
        if both:
            return (f"{other} reads the attention probabilities of heads {both} of {where}, which {mixer} mixes "
                    f"(they are no softmax of their own q and k); expected the two on different layers")
    for reader, read, fixer, fixed in ((first, first_use, second, second_use), (second, second_use, first, first_use)):
        both = sorted(set(read.reads_scores) & set(fixed.fixes))
        if both:
            return (f"{reader} reads the attention probabilities of heads {both} of {where}, which {fixer} fixes "
                    f"(their weights are no softmax of the scores); expected {reader} on heads {fixer} leaves "
                    "learnable, or the two on different layers")
    return None


def check_meetings(resolved: Mapping[str, MethodSettings], model_config) -> None:
    """Refuse two switched-on methods (`resolved`: name -> settings, in registry order) that cannot compose on an
    attention module both are placed on (`meeting_conflict`): a `ValueError` naming both methods and the
    module, when the config is built, whatever the backend."""
    from .sites import AttentionSite  # (sites imports transformers' model classes: not at registry import)

    uses = {}
    for spec in registered_methods():
        if spec.name in resolved and spec.head_use is not None:
            settings = resolved[spec.name]
            uses[spec.name] = {site: spec.head_use(settings, model_config, site)
                               for site in spec.placements(settings, model_config)}
    names = list(uses)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            for site in [site for site in uses[first] if site in uses[second]]:  # (the first such module)
                reason = meeting_conflict(first, uses[first][site], second, uses[second][site],
                                          AttentionSite(*site).name)
                if reason:
                    raise ValueError(reason)


_REGISTRY: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Register `spec` (re-registering a name replaces it). Returns it, so a module can end with
    `METHOD = register_method(MethodSpec(...))`."""
    if not dataclasses.is_dataclass(spec.settings) or not spec.settings.__dataclass_params__.frozen:
        raise ValueError(f"method {spec.name!r}: its settings class {spec.settings.__name__} must be a "
                         "@dataclass(frozen=True) (the model keeps the object it was built with)")
    previous = _REGISTRY.get(spec.name)
    _REGISTRY[spec.name] = spec
    try:
        registered_methods()
    except ValueError:
        _REGISTRY.pop(spec.name) if previous is None else _REGISTRY.update({spec.name: previous})
        raise
    return spec


def unregister_method(name: str) -> None:
    _REGISTRY.pop(name, None)


def import_method_modules(names: Iterable[str]) -> dict[str, list[str]]:
    """Import the modules `names` that bring methods kept outside the package, so that they are registered: what
    the recipes' `--method_modules` does before it parses their flags. Each is a dotted module name
    (`my_pkg.my_method`, installed or on PYTHONPATH) or the path of a `.py` file (`my_method.py`,
    `plugins/my_method.py`), imported as the module its file name gives (`my_method`: `module_of_file`).
    Returns `{name as given: [names of the methods it brought]}`.

    A module brings the methods it registers when imported (`register_method(METHOD)` at its end, docs/design.md,
    "Adding a method") and the registered specs it holds; one that registers none but defines `METHOD` (a
    [`MethodSpec`][hf_headattn.registry.MethodSpec], the name a method's core module gives its spec) has that
    registered, so a core module is named the same way whether or not it registers itself. A module that brings no
    method is refused, not warned about: naming it has no other purpose, so it is a mistake (a kit module, a misspelt
    submodule) that would otherwise surface later as an unknown `--method` or a checkpoint that does not load. Every
    error is a `ValueError` naming the module and why (an import that fails: its exception, and where it was raised).
    """
    brought: dict[str, list[str]] = {}
    for name in names:
        before = dict(_REGISTRY)
        module_name = module_of_file(name) if name.endswith(".py") else name
        expected = ("a .py file whose code runs and registers a method" if module_name != name else
                    "an importable module (installed, or on PYTHONPATH) that registers a method")
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # any failure of the module's own code is the user's to see, named
            raise ValueError(f"method module {name!r} does not import: {type(error).__name__}: {error}"
                             f"{_raised_at(error, module_name)}; expected {expected}") from error
        new = [key for key, spec in _REGISTRY.items() if before.get(key) is not spec]
        held = [value.name for value in vars(module).values()
                if isinstance(value, MethodSpec) and _REGISTRY.get(value.name) is value]
        found = list(dict.fromkeys([*new, *held]))
        spec = getattr(module, "METHOD", None)
        if not found and isinstance(spec, MethodSpec):
            found = [register_method(spec).name]
        if not found:
            raise ValueError(f"method module {name!r} imports but brings no method: it registers none and defines no "
                             "METHOD = MethodSpec(...); expected the module of a method's core, which ends with "
                             "register_method(METHOD) or defines METHOD (docs/design.md, \"Adding a method\")")
        brought[name] = found
    return brought


def module_of_file(path: str) -> str:
    """The module name a method's `.py` file is imported as: its file name without `.py` (`plugins/my_method.py`
    -> `my_method`), with its folder added to the end of `sys.path`, as `python plugins/my_method.py` would
    (so its own imports of modules beside it work, and processes the data loader starts import it too). A
    checkpoint records that name (`headattn_method_modules`), not the path, which would not hold on another
    machine: it loads again with the file's path or, its folder on PYTHONPATH, the name. `ValueError` for a path
    that is no file, a file name that is no module name, or a name another module has taken."""
    file = Path(path).expanduser().resolve()
    name = file.stem
    if not file.is_file():
        raise ValueError(f"method module {path!r} is no file; expected the path of a .py file, or a module name "
                         "without .py (my_pkg.my_method)")
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"method module {path!r}: its file name {file.name!r} gives no module name; expected a file "
                         "named as a Python module (letters, digits and _, e.g. my_method.py)")
    if name in sys.modules:  # imported already: from this file, or the name is another module's
        origin = getattr(sys.modules[name], "__file__", None)
    else:
        found = importlib.util.find_spec(name)
        origin = file if found is None else found.origin
    if origin is None or Path(origin).resolve() != file:
        raise ValueError(f"method module {path!r} would be imported as {name!r}, but that name is another module's "
                         f"({origin or 'a folder or a built-in module'}); expected a file named after no other module "
                         "(rename it)")
    if str(file.parent) not in sys.path:
        sys.path.append(str(file.parent))
    return name


def _raised_at(error: BaseException, name: str) -> str:
    """` (at file:line)`: where `error` was raised (its innermost frame outside the import machinery); nothing
    for the named module (or its package) not found, whose message says all."""
    if isinstance(error, ModuleNotFoundError) and error.name and f"{name}.".startswith(f"{error.name}."):
        return ""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith("<")]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def registered_methods() -> list[MethodSpec]:
    """The registered methods in the order their hooks run: registration order, each method after those its
    `runs_after` names and before those its `runs_before` names (a stable topological order)."""
    specs = list(_REGISTRY.values())
    earlier = {spec.name: set() for spec in specs}  # name -> the methods that must run before it
    for spec in specs:
        earlier[spec.name] |= {name for name in spec.runs_after if name in earlier}
        for name in spec.runs_before:
            if name in earlier:
                earlier[name].add(spec.name)
    ordered: list[MethodSpec] = []
    while len(ordered) < len(specs):
        placed = {spec.name for spec in ordered}
        ready = next((spec for spec in specs if spec.name not in placed and earlier[spec.name] <= placed), None)
        if ready is None:
            stuck = sorted(name for name in earlier if name not in placed)
            raise ValueError(f"the methods {stuck} declare a cycle in runs_after/runs_before; expected an order "
                             "in which each runs after the methods it names")
        ordered.append(ready)
    return ordered


def active_methods(model_config) -> list[MethodSpec]:
    """The registered methods switched on in `model_config` (an hf-headattn config; none on a stock one)."""
    on = getattr(model_config, "headattn_settings", {})
    return [spec for spec in registered_methods() if spec.name in on]


def readout_fields() -> list[str]:
    """Every method output field (training read-outs, kept out of `logits` at evaluation)."""
    return [name for spec in registered_methods() for name in spec.outputs]


def logged_fields() -> list[str]:
    return [name for spec in registered_methods() for name in spec.logged]


def method_inputs() -> list[str]:
    """Every method's forward inputs (`MethodSpec.inputs`), e.g. SEA's `dependency_mask`, each once: methods may
    read the same input (RHE's `dependency_mask`, for SEA and for a bias method with
    `head_selection="redundant"`)."""
    return list(dict.fromkeys(name for spec in registered_methods() for name in spec.inputs))


def readout_flags() -> list[str]:
    """Every method's read-out flags (`MethodSpec.flags`), e.g. `output_head_importance`."""
    return [name for spec in registered_methods() for name in spec.flags]


def readout(spec: MethodSpec) -> tuple[str, str]:
    """`(flag, output field)` of a method with one read-out: its one flag and its one output field that is no loss
    component (not `logged`), e.g. `("output_head_importance", "head_importances")`; what an analysis of that
    read-out asks for and reads."""
    fields = [name for name in spec.outputs if name not in spec.logged]
    if len(spec.flags) != 1 or len(fields) != 1:
        raise ValueError(f"method {spec.name!r} has read-out flags {list(spec.flags)} and read-out fields {fields}; "
                         "expected one of each")
    return spec.flags[0], fields[0]

