"""Named method settings, model shapes and the papers' presets for the recipes: small diffs over one default.

A preset (`paper_presets`, from the methods' kits; `--preset NAME` in the recipes, several joined with "+",
later ones winning) holds

* `flags`: values of recipe flags (`--model_shape`, `--method`, `--dropout`, `--attention_dropout`,
  `--label_smoothing`, `--num_beams`, `--early_stopping_patience`) and of `Seq2SeqTrainingArguments`
  (`--learning_rate`, `--lr_scheduler_type`, ...);
* `config`: config fields without a flag (attention heads, feed-forward size, activation and DHICM dropout, EaDRA
  alphas, LPEA's k).

Precedence in the recipes, later wins:

1. the recipe's defaults;
2. what early stopping needs, when `--early_stopping_patience` is given (by you or a preset): evaluate and save each
   epoch, keep the best checkpoint by validation loss (`EARLY_STOPPING_FLAGS`);
3. the preset's `flags`;
4. the flags you pass.

`HfArgumentParser` cannot tell a default from a value you typed, so `expand_argv` puts 2 and 3 *before* your
flags on the command line, where argparse lets the last occurrence of a flag win. For config fields without a flag:
the method's fields < the preset's `config` < `--method_settings`. Architecture fields (heads, feed-forward size)
apply to models trained from scratch, over `--model_shape`; with a pretrained checkpoint they are refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from collections.abc import Mapping

from transformers import EarlyStoppingCallback

from ..deprecation import NEXT_RELEASE, warn_deprecated
from ..registry import registered_methods
from .kit import Preset, kits, merge_settings


def method_names() -> dict[str, dict]:
    """Recipe method names -> config fields, from the registered methods' kits (`MethodKit.method_names`; plus
    "baseline")."""
    names = {"baseline": {}}
    for kit in kits():
        names.update({name: {kit.name: settings} for name, settings in kit.method_names.items()})
    return names


MODEL_SHAPES: dict[str, dict] = {
    # CPU-sized: trains on Multi30k in minutes.
    "tiny": dict(d_model=128, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512),
    # Multi30k-sized on a GPU.
    "small": dict(d_model=256, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024),
    # Transformer-base, the papers' size (Vaswani et al. 2017): 512, 6+6 layers, 8 heads, 2048.
    "base": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048),
}
"""Model shapes for training from scratch (Marian-style, shared embeddings)."""


def method_settings(spec: str) -> dict:
    """Config fields for a method name (`MethodKit.method_names` of the registered methods, or "baseline") or a
    "+"-joined combination of names; names that set the same field to different values (e.g. `dea_rhe+lpea_rhe`:
    `sea`) are refused.

    >>> method_settings("dhicm+dea_rhe")["sea"]["type"]
    'dea'
    """
    names, settings, setters = method_names(), {}, {}
    for name in (part.strip() for part in spec.split("+")):
        if name not in names:
            raise ValueError(f"unknown method {name!r} in {spec!r}{_did_you_mean(name, names)}; expected names from "
                             f"{sorted(names)} joined by '+'")
        for key, value in names[name].items():
            if key in settings and settings[key] != value:
                raise ValueError(
                    f"methods {setters[key]!r} and {name!r} in {spec!r} conflict: they set {key} to {settings[key]!r} "
                    f"and {value!r}; expected one of them"
                )
            settings[key], setters[key] = value, name
    return settings


def _did_you_mean(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_setting_keys(settings: Mapping, config_class: type | None = None) -> None:
    """Raise `ValueError` for keys of `settings` that are neither a field of `config_class` (default
    [`HeadAttnMarianConfig`][hf_headattn.configuration.HeadAttnMarianConfig]; the pretrained model's config class for a
    checkpoint), nor one of its `attribute_map` aliases, nor a registered method's settings field. A misspelled key
    would otherwise be stored on the config and ignored; release 0.1's flat fields are pointed to their method's dict.

    >>> check_setting_keys({"dhicm_dropot": 0.1})  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    ValueError: unknown settings ['dhicm_dropot'] (did you mean {"dhicm": {"dropout": ...}}?): expected fields of
    HeadAttnMarianConfig
    """
    if config_class is None:
        from ..configuration import HeadAttnMarianConfig as config_class
    valid = {f.name for f in dataclasses.fields(config_class)} | set(getattr(config_class, "attribute_map", {}))
    valid |= {spec.name for spec in registered_methods()}
    flat = {old: f'{{"{spec.name}": {{"{key}": ...}}}}' for spec in registered_methods()
            for old, key in spec.legacy_fields.items()}
    unknown = sorted(set(settings) - valid)
    if unknown:
        hints = [flat.get(match, match) for key in unknown
                 for match in difflib.get_close_matches(key, [*valid, *flat], n=1)]
        hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
        raise ValueError(f"unknown settings {unknown}{hint}: expected fields of {config_class.__name__}")


ARCHITECTURE_FIELDS = tuple(MODEL_SHAPES["base"])
"""The config fields a model shape fixes; a search or a preset may override them (models trained from scratch only)."""


def model_shape(name: str | Mapping) -> dict:
    """The config fields of a named shape, or of `{"shape": NAME, **overrides}` (of `ARCHITECTURE_FIELDS`).

    >>> model_shape({"shape": "tiny", "encoder_attention_heads": 2})["encoder_attention_heads"]
    2
    """
    overrides = {}
    if isinstance(name, Mapping):
        overrides = dict(name)
        name = overrides.pop("shape", None)
        unknown = sorted(set(overrides) - set(ARCHITECTURE_FIELDS))
        if unknown:
            raise ValueError(
                f"shape overrides {unknown} are not architecture fields; expected some of {ARCHITECTURE_FIELDS}"
            )
    if name not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {name!r}; expected one of {sorted(MODEL_SHAPES)}")
    return {**MODEL_SHAPES[name], **overrides}


def split_architecture(shape: str, settings: dict) -> tuple[str | dict, dict]:
    """`(shape for model_shape, settings without architecture fields)`: the architecture fields move into the shape.

    >>> split_architecture("tiny", {"encoder_ffn_dim": 64, "dropout": 0.3})
    ({'shape': 'tiny', 'encoder_ffn_dim': 64}, {'dropout': 0.3})
    """
    architecture = {key: value for key, value in settings.items() if key in ARCHITECTURE_FIELDS}
    rest = {key: value for key, value in settings.items() if key not in ARCHITECTURE_FIELDS}
    return ({"shape": shape, **architecture} if architecture else shape), rest


def refuse_architecture(settings: dict, model_name_or_path: str) -> None:
    """Raise `ValueError` if `settings` change the architecture of a pretrained checkpoint."""
    fields = sorted(key for key in settings if key in ARCHITECTURE_FIELDS)
    if fields:
        raise ValueError(
            f"{fields} change the architecture, which only a model trained from scratch can do; {model_name_or_path} "
            "brings its own. Drop them (or the preset that sets them) or train from scratch with --model_shape"
        )


# --- the papers' presets ----------------------------------------------------------------------------------------
# The papers' tables live in their method's kit (``MethodKit.presets``, hf_headattn/methods/<name>/);
# the training flags they share are here.

TRANSFORMER_BASE = {
    "model_shape": "base", "dropout": 0.1, "attention_dropout": 0.0, "label_smoothing": 0.1, "learning_rate": 7e-4,
    "adam_beta1": 0.9, "adam_beta2": 0.98, "adam_epsilon": 1e-9, "lr_scheduler_type": "inverse_sqrt",
    "warmup_steps": 4000,
}
"""Transformer-base training (Vaswani et al. 2017, §5.3-5.4), which EaDRA (§4.2) and RHE (Appendix A.1) follow:
Adam (0.9, 0.98, 1e-9), inverse-square-root decay after 4000 warm-up steps with the peak of their schedule,
d_model^-0.5 * 4000^-0.5 = 7e-4; dropout 0.1, label smoothing 0.1. Their ~25k-token batches have no flag here."""


def paper_presets() -> dict[str, Preset]:
    """Every preset by name (the registered methods' `MethodKit.presets`); see each one's `doc` for its source
    table."""
    return {name: value for kit in kits() for name, value in kit.presets.items()}


def __getattr__(name):
    """`PRESETS`, release 0.2's dict of the presets: deprecated, `paper_presets` (the methods registered
    now)."""
    if name == "PRESETS":
        warn_deprecated(f"{__name__}.PRESETS", f"{__name__}.paper_presets()", removed_in=NEXT_RELEASE)
        return paper_presets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def preset(spec: str) -> Preset:
    """The preset of a name or of a "+"-joined combination (later names win; nested config dicts merge).

    >>> sorted(preset("eadra_enc_vi_en+eadra_dec_vi_en").config["eadra"])  # both components, merged
    ['alpha_scale', 'decoder', 'dist_reduction', 'encoder']
    """
    docs, flags, config, overrides, known = [], {}, {}, {}, paper_presets()
    for name in (part.strip() for part in spec.split("+")):
        if name not in known:
            raise ValueError(f"unknown preset {name!r} in {spec!r}{_did_you_mean(name, known)}; expected names from "
                             f"{sorted(known)} joined by '+'")
        docs.append(f"{name}: {known[name].doc}")
        flags.update(known[name].flags)
        config = merge_settings(config, known[name].config)
        overrides = merge_settings(overrides, known[name].method_overrides)
    return Preset(doc="\n".join(docs), flags=flags, config=config, method_overrides=overrides)


# --- how presets and early stopping reach a recipe's command line ----------------------------------------------------

EARLY_STOPPING_FLAGS = ["--eval_strategy", "epoch", "--save_strategy", "epoch", "--load_best_model_at_end", "true",
                        "--metric_for_best_model", "loss"]
"""What early stopping needs (DHICM §4.3): evaluate and save each epoch, keep the best checkpoint by validation loss."""


def flag_values(argv: list[str], name: str) -> list[str]:
    """The values given to `--name` in `argv` (`--name VALUE` or `--name=VALUE`; `-` for `_` too)."""
    values, spellings = [], {f"--{name}", f"--{name.replace('_', '-')}"}
    for i, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        if flag in spellings:
            if equals:
                values.append(value)
            elif i + 1 < len(argv):
                values.append(argv[i + 1])
    return values


def _flag_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def preset_argv(spec: str) -> list[str]:
    """The preset's flags as command-line arguments."""
    return [item for key, value in preset(spec).flags.items() for item in (f"--{key}", _flag_text(value))]


def expand_argv(argv: list[str] | None = None) -> list[str]:
    """`argv` (default `sys.argv[1:]`) after early stopping's flags and the `--preset`'s, so that yours win.

    >>> expand_argv(["--preset", "dhicm_be_en", "--dropout", "0.3"])[-4:]
    ['--preset', 'dhicm_be_en', '--dropout', '0.3']
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    names = flag_values(argv, "preset")
    front = preset_argv(names[-1]) if names and names[-1] else []
    patience = flag_values(front + argv, "early_stopping_patience")
    if patience and patience[-1].lstrip("-").isdigit() and int(patience[-1]) > 0:
        front = EARLY_STOPPING_FLAGS + front
    return front + argv


def early_stopping_callbacks(patience: int | None, args) -> list:
    """`[EarlyStoppingCallback(patience)]` (`[]` for None or 0), after checking that `args` evaluate and keep the
    best checkpoint. (Its counter restarts with each `hyperparameter_search` trial: a new training has no best
    yet.)"""
    if not patience:
        return []
    if patience < 0:
        raise ValueError(f"early_stopping_patience must be a positive number of evaluations, got {patience}")
    if args.eval_strategy == "no":
        raise ValueError(
            f"early_stopping_patience={patience} needs evaluations during training, got eval_strategy='no'; expected "
            "'epoch' (the papers; the default with early stopping) or 'steps'"
        )
    if not args.load_best_model_at_end:
        raise ValueError(
            f"early_stopping_patience={patience} keeps the best checkpoint: expected load_best_model_at_end=True (the "
            "default with early stopping), got False"
        )
    return [EarlyStoppingCallback(early_stopping_patience=patience)]
