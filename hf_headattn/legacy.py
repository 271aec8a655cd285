"""Release 0.1's config fields, read into today's: the flat fields (`dhicm_encoder_layers`, `sea_type`,
`rhe_prune`, ...; each method's `MethodSpec.legacy_fields`) move into the methods' dicts, with a
`HeadAttnDeprecationWarning` naming the release that removes them
(`FLAT_FIELDS_REMOVED_IN`), wherever a config gets them: built (`translate_kwargs`), loaded
(`translate_flat_fields` on the file, `translate_pretrained_kwargs` on `from_pretrained`'s keyword
arguments) or assigned (`assign_flat_field`). A file written by release 0.1 keeps release 0.1's readings of
the settings whose default has changed since (`MethodSpec.legacy_defaults`): `written_by_release_0_1`
tells, by the release a file records (`headattn_version`, `recorded_release`) or, where it records none
(releases 0.1 and 0.2 wrote none), by its fields. [`hf_headattn.configuration`][hf_headattn.configuration] calls these;
nothing else does.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Mapping
from dataclasses import MISSING, fields
from pathlib import Path

from packaging.version import InvalidVersion, Version
from transformers import MarianConfig, MBartConfig
from transformers.utils import logging

from .deprecation import NEXT_RELEASE, warn_deprecated
from .hf_compat import config_fields
from .registry import registered_methods

logger = logging.get_logger(__name__)

FIRST_RELEASE_WITH_DICTS = (0, 2)
"""The first release that saves the methods' dicts: files recorded by an earlier one are release 0.1's."""
FLAT_FIELDS_REMOVED_IN = "0.5"
"""The release that stops reading the flat fields (saved files live long on the Hub: two releases of warnings)."""
DEFAULTS_RECORD = "headattn_defaults"
"""What a saved config.json records of the defaults its method dicts rely on (`MethodSpec.older_files_defaults`):
`{method: {setting: value}}`, written by `to_dict` (a file without it predates those settings)."""


def flat_fields() -> dict[str, tuple]:
    """Release 0.1's flat config fields: `{flat name: (method spec, settings key)}`."""
    return {flat: (spec, key) for spec in registered_methods() for flat, key in spec.legacy_fields.items()}


def recorded_release(version, where: str) -> tuple[int, ...]:
    """The release numbers of a recorded `headattn_version` (e.g. `"0.2.1"` -> `(0, 2, 1)`; pre-releases of 0.2
    count as 0.2); a `ValueError` naming `where` unless it is a version string."""
    try:
        if not isinstance(version, str):
            raise InvalidVersion
        return Version(version).release
    except InvalidVersion:
        raise ValueError(f"{where} must be the version string of the hf-headattn release that wrote the config, "
                         f"such as '0.3.0' (or None: not recorded), got {version!r}") from None


def written_by_release_0_1(values: Mapping, where: str = "config.json") -> bool:
    """Whether saved config fields `values` were written by release 0.1: by their `headattn_version` when they
    record one (< 0.2), else by their fields: release 0.1's flat fields and no dict field of a method that has flat
    fields (later releases save those, `null` when off)."""
    version = values.get("headattn_version")
    if version is not None:
        return recorded_release(version, f"{where}: headattn_version") < FIRST_RELEASE_WITH_DICTS
    known = flat_fields()
    return (any(key in known for key in values)
            and not any(spec.name in values for spec in registered_methods() if spec.legacy_fields))


def translate_flat_fields(values: dict, where: str, saved_file: bool = False, stacklevel: int = 4) -> None:
    """Move release 0.1's flat fields in `values` (config fields: a loaded `config.json` or keyword arguments)
    into their methods' dicts, in place, with one deprecation warning naming them (`stacklevel` as
    `warnings.warn`'s, from this function).

    * A flat field at its default leaves an off method off (release 0.1 saved every field, defaults included).
    * A method given both ways (its dict and its flat fields) is refused: a `ValueError` naming both.
    * A config file saved by release 0.1 (`saved_file` and `written_by_release_0_1`: its recorded
      `headattn_version` is < 0.2, or it records none and has release 0.1's fields) keeps release 0.1's values of
      the settings whose default has changed since (`MethodSpec.legacy_defaults`), for the methods it switches on.
      No other config does: not a file recorded by 0.2 or later, whatever its fields, nor keyword arguments.
    * A saved file's method dict that lacks a setting of `MethodSpec.older_files_defaults` gets the value it was
      trained with: the default the file records (`DEFAULTS_RECORD`, which `to_dict` writes) where it
      differs from today's, and the spec's older value where the file records none (it predates the setting).
    """
    known = flat_fields()
    found = sorted(key for key in values if key in known)
    release_0_1 = saved_file and written_by_release_0_1(values, where)
    for spec in registered_methods():
        flat = {key: values.pop(key) for key in list(values) if key in spec.legacy_fields}
        given = values.get(spec.name)
        if flat and given is not None:
            raise ValueError(f"{where} gives {spec.name}={dict(given)!r} and release 0.1's flat fields {flat!r}; "
                             f"expected one convention: the {spec.name} dict alone")
        newer, _ = newer_spellings(spec, {spec.legacy_fields[key]: value for key, value in flat.items()}, where)
        settings = {key: value for key, value in newer.items() if not _is_default(spec, key, value)}
        if settings and not (release_0_1 and not spec.settings(**settings).switched_on()):
            values[spec.name] = given = settings
        if release_0_1 and spec.legacy_defaults and isinstance(given, Mapping):
            values[spec.name] = given = {**spec.legacy_defaults, **given}
        if saved_file and spec.older_files_defaults and isinstance(given, Mapping):
            missing = older_file_settings(spec, given, values.get(DEFAULTS_RECORD))
            if missing:
                values[spec.name] = {**missing, **given}
    if found:
        spec, key = known[found[0]]
        warn_deprecated(f"{where}: release 0.1's flat settings {found}",
                        f"the methods' dicts ({found[0]} is read as {spec.name}[{key!r}]; save_pretrained writes the "
                        "dicts)", FLAT_FIELDS_REMOVED_IN, plural=True, stacklevel=stacklevel)


def newer_spellings(spec, values: Mapping, where: str) -> tuple[dict, list[tuple[str, str]]]:
    """`values` (a method's settings dict) in today's spellings (`MethodSpec.older_spellings`: the placement
    vocabulary's, `hf_headattn.placement`) and the `(old, new)` spellings renamed; a `ValueError` naming
    `where` for a dict that gives both spellings."""
    if spec.older_spellings is None or not isinstance(values, Mapping):
        return values, []
    try:
        return spec.older_spellings(values)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def translate_older_spellings(spec, values, where: str):
    """`newer_spellings` of `values`, with one deprecation warning naming the older spellings and their
    replacements (removed in `NEXT_RELEASE`), pointed at the first caller outside hf-headattn,
    transformers and the dataclass machinery that set it."""
    newer, renamed = newer_spellings(spec, values, where)
    if renamed:
        old = ", ".join(dict.fromkeys(f"{where}.{old}" for old, _ in renamed))
        new = ", ".join(dict.fromkeys(f"{where}.{new}" for _, new in renamed))
        warn_deprecated(f"the older spellings {old}", f"{new} (the shared placement vocabulary, docs/design.md)",
                        NEXT_RELEASE, plural=True, stacklevel=_outside_caller())
    return newer


def _outside_caller() -> int:
    """`warn_deprecated`'s `stacklevel` (from its caller) of the first frame outside hf-headattn's package,
    transformers, huggingface_hub and the standard library's dataclasses."""
    inside = (str(Path(__file__).parent), f"{os.sep}transformers{os.sep}", f"{os.sep}huggingface_hub{os.sep}",
              f"{os.sep}dataclasses.py", "<string>")
    frame, level = inspect.currentframe().f_back.f_back, 2  # (the caller of translate_older_spellings)
    while frame is not None and any(part in frame.f_code.co_filename for part in inside):
        frame, level = frame.f_back, level + 1
    return level


def older_file_settings(spec, given: Mapping, record) -> dict:
    """The settings of `spec.older_files_defaults` that a saved dict `given` lacks and that must be set to keep
    the behaviour it was trained with: the value `record` (the file's `DEFAULTS_RECORD`) gives for the
    method, else the spec's older value; those equal to today's default are left out (the dict then saves as it
    was loaded)."""
    recorded = record.get(spec.name, {}) if isinstance(record, Mapping) else {}
    today = {setting.name: _default(setting) for setting in fields(spec.settings)}
    missing = {key: recorded.get(key, older) for key, older in spec.older_files_defaults.items() if key not in given}
    return {key: value for key, value in missing.items() if value != today[key]}


def relied_on_defaults(specs_and_settings, values: Mapping) -> dict:
    """`{method: {setting: value}}`: the settings of `MethodSpec.older_files_defaults` that the saved dicts in
    `values` leave to their defaults, with the values the resolved settings hold (what `to_dict` records as
    `DEFAULTS_RECORD`)."""
    record = {}
    for spec, settings in specs_and_settings:
        given = values.get(spec.name)
        if isinstance(given, Mapping):
            relied = {key: getattr(settings, key) for key in spec.older_files_defaults if key not in given}
            if relied:
                record[spec.name] = relied
    return record


def translate_pretrained_kwargs(config_dict: dict, kwargs: dict, where: str) -> None:
    """`from_pretrained(path, sea_type="dea")`: release 0.1's flat fields among `kwargs` (taken out) each update
    their method's dict as saved in `config_dict`, given back in `kwargs` as that dict's keyword argument."""
    flat = {key: kwargs.pop(key) for key in kwargs.keys() & flat_fields()}
    if not flat:
        return
    given = {spec.name: kwargs[spec.name] for spec in registered_methods() if spec.name in kwargs}
    translated = {**given, **flat}
    translate_flat_fields(translated, where, stacklevel=5)  # (+ get_config_dict, from_pretrained)
    for name, values in translated.items():
        if name not in given:
            kwargs[name] = {**(config_dict.get(name) or {}), **values}


def translate_kwargs(config, kwargs: dict) -> None:
    """`Config(..., dhicm_kl_weight=0.3)`: release 0.1's flat fields among the keyword arguments `kwargs` (taken
    out) set their methods' dicts on `config`; a key named like a flat field that is none is named in a warning."""
    where = f"{type(config).__name__}(...)"
    legacy = {key: kwargs.pop(key) for key in kwargs.keys() & flat_fields()}
    if legacy:
        values = {**{spec.name: getattr(config, spec.name, None) for spec in registered_methods()}, **legacy}
        translate_flat_fields(values, where, stacklevel=6)  # (+ __post_init__, __init__, strict's validating __init__)
        for name, value in values.items():
            setattr(config, name, value)
    _warn_unknown_flat_fields(kwargs, where)


def assign_flat_field(config, key: str, value) -> None:
    """`config.dhicm_kl_weight = 0.5` (release 0.1's spelling): `config.dhicm = {**config.dhicm,
    "kl_weight": 0.5}`, with the deprecation warning; validated, and refused by a model built before, as such an
    assignment is. At its default it leaves an off method off (as in `translate_flat_fields`)."""
    spec, setting = flat_fields()[key]
    translated = {key: value}
    # (+ the config's __setattr__ and strict's)
    translate_flat_fields(translated, f"config.{key} = {value!r}", stacklevel=5)
    current = getattr(config, spec.name, None)
    if current is not None or spec.name in translated:
        # (a flat field of an older spelling, e.g. sea_layers: today's, warned once, by the flat warning above)
        setattr(config, spec.name, newer_spellings(spec, {**(current or {}), setting: value}, f"config.{key}")[0])


def _is_default(spec, key: str, value) -> bool:
    default = next(_default(setting) for setting in fields(spec.settings) if setting.name == key)
    return default == value and type(default) is type(value)


def _default(setting):
    """A settings field's default (its factory's value where it has one)."""
    return setting.default if setting.default_factory is MISSING else setting.default_factory()


def _warn_unknown_flat_fields(values: Mapping, where: str) -> None:
    """Warn about keys named like a method's flat field (`dhicm_*`, `sea_*`, ...) that are none: misspelt, they
    would be kept on the config and do nothing."""
    known = flat_fields()
    prefixes = tuple({f"{flat.split('_')[0]}_" for flat in known} | {f"{spec.name}_" for spec in registered_methods()})
    declared = config_fields(MBartConfig) | config_fields(MarianConfig)
    for key in values:
        if key.startswith(prefixes) and key not in known and key not in declared:
            hint = difflib.get_close_matches(key, known, n=1)
            logger.warning(f"{where}: {key!r} is no setting of hf-headattn and is ignored"
                           + (f" (did you mean {hint[0]!r}, which release 0.1 spelled so?)" if hint else ""))
