"""Named method settings, model shapes and the papers' presets for the recipes: small diffs over one default.

A preset (:data:`PRESETS`; ``--preset NAME`` in the recipes, several joined with "+", later ones winning) holds

* ``flags``: values of recipe flags (``--model_shape``, ``--method``, ``--dropout``, ``--attention_dropout``,
  ``--label_smoothing``, ``--num_beams``, ``--early_stopping_patience``) and of ``Seq2SeqTrainingArguments``
  (``--learning_rate``, ``--lr_scheduler_type``, ...);
* ``config``: config fields without a flag (attention heads, feed-forward size, activation and DHICM dropout, EaDRA
  alphas, LPEA's k).

Precedence in the recipes, later wins:

1. the recipe's defaults;
2. what early stopping needs, when ``--early_stopping_patience`` is given (by you or a preset): evaluate and save each
   epoch, keep the best checkpoint by validation loss (:data:`EARLY_STOPPING_FLAGS`);
3. the preset's ``flags``;
4. the flags you pass.

``HfArgumentParser`` cannot tell a default from a value you typed, so :func:`expand_argv` puts 2 and 3 *before* your
flags on the command line, where argparse lets the last occurrence of a flag win. For config fields without a flag:
the method's fields < the preset's ``config`` < ``--method_settings``. Architecture fields (heads, feed-forward size)
apply to models trained from scratch, over ``--model_shape``; with a pretrained checkpoint they are refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transformers import EarlyStoppingCallback

from ..dhicm import METHOD as DHICM
from ..eadra import DEFAULTS as EADRA_DEFAULTS
from ..eadra import METHOD as EADRA
from ..registry import registered_methods, uses_syntax  # noqa: F401  (uses_syntax: re-exported for the recipes)
from ..sea import METHOD as SEA


def method_names() -> dict[str, dict]:
    """Recipe method names -> config fields, from the registered methods' presets (plus "baseline")."""
    names = {"baseline": {}}
    for spec in registered_methods():
        names.update({name: {spec.name: settings} for name, settings in spec.presets.items()})
    return names


#: Model shapes for training from scratch (Marian-style, shared embeddings).
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


def method_settings(spec: str) -> dict:
    """Config fields for a method name (``MethodSpec.presets`` of the registered methods, or "baseline") or a
    "+"-joined combination of names; names that set the same field to different values (e.g. ``dea_rhe+lpea_rhe``:
    ``sea``) are refused.

    >>> method_settings("dhicm+dea_rhe")["sea"]["type"]
    'dea'
    """
    names, settings, setters = method_names(), {}, {}
    for name in (part.strip() for part in spec.split("+")):
        if name not in names:
            raise ValueError(f"unknown method {name!r} in {spec!r}; expected names from {sorted(names)} joined by '+'")
        for key, value in names[name].items():
            if key in settings and settings[key] != value:
                raise ValueError(
                    f"methods {setters[key]!r} and {name!r} in {spec!r} conflict: they set {key} to {settings[key]!r} "
                    f"and {value!r}; expected one of them"
                )
            settings[key], setters[key] = value, name
    return settings


def check_setting_keys(settings: Mapping, config_class: type | None = None) -> None:
    """Raise ``ValueError`` for keys of ``settings`` that are neither a field of ``config_class`` (default
    :class:`~hf_headattn.HeadAttnMarianConfig`; the pretrained model's config class for a checkpoint), nor one of
    its ``attribute_map`` aliases, nor a registered method's settings field. A misspelled key would otherwise be
    stored on the config and ignored; release 0.1's flat fields are pointed to their method's dict.

    >>> check_setting_keys({"dhicm_dropot": 0.1})
    Traceback (most recent call last):
    ...
    ValueError: unknown settings ['dhicm_dropot'] (did you mean {"dhicm": {"dropout": ...}}?): expected fields of HeadAttnMarianConfig
    """
    if config_class is None:
        from ..configuration import HeadAttnMarianConfig as config_class
    valid = {f.name for f in dataclasses.fields(config_class)} | set(getattr(config_class, "attribute_map", {}))
    valid |= {spec.name for spec in registered_methods()}
    flat = {old: f'{{"{spec.name}": {{"{key}": ...}}}}' for spec in registered_methods()
            for old, key in spec.legacy_fields.items()}
    unknown = sorted(set(settings) - valid)
    if unknown:
        hints = [flat.get(match, match) for key in unknown for match in difflib.get_close_matches(key, [*valid, *flat], n=1)]
        hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
        raise ValueError(f"unknown settings {unknown}{hint}: expected fields of {config_class.__name__}")


#: The config fields a model shape fixes; a search or a preset may override them (models trained from scratch only).
ARCHITECTURE_FIELDS = tuple(MODEL_SHAPES["base"])


def model_shape(name: str | Mapping) -> dict:
    """The config fields of a named shape, or of ``{"shape": NAME, **overrides}`` (of ``ARCHITECTURE_FIELDS``).

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
    """``(shape for model_shape, settings without architecture fields)``: the architecture fields move into the shape.

    >>> split_architecture("tiny", {"encoder_ffn_dim": 64, "dropout": 0.3})
    ({'shape': 'tiny', 'encoder_ffn_dim': 64}, {'dropout': 0.3})
    """
    architecture = {key: value for key, value in settings.items() if key in ARCHITECTURE_FIELDS}
    rest = {key: value for key, value in settings.items() if key not in ARCHITECTURE_FIELDS}
    return ({"shape": shape, **architecture} if architecture else shape), rest


def refuse_architecture(settings: dict, model_name_or_path: str) -> None:
    """Raise ``ValueError`` if ``settings`` change the architecture of a pretrained checkpoint."""
    fields = sorted(key for key in settings if key in ARCHITECTURE_FIELDS)
    if fields:
        raise ValueError(
            f"{fields} change the architecture, which only a model trained from scratch can do; {model_name_or_path} "
            "brings its own. Drop them (or the preset that sets them) or train from scratch with --model_shape"
        )


# --- the papers' presets ----------------------------------------------------------------------------------------
# The papers' tables, as data named after their paper and keyed by preset names (``--preset``: training flags and
# architectures, which a method's spec does not hold); the config fields they set are named by the specs.


@dataclass(frozen=True)
class Preset:
    """A paper's setting. ``doc`` names its source table; ``flags`` and ``config`` as in the module docstring;
    ``method_overrides``: {method name: settings} merged into a method's settings only when the chosen methods switch
    it on (e.g. DHICM Table 2's DHICM dropout, which means nothing for the T-base/T-optimal baselines)."""

    doc: str
    flags: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    method_overrides: dict[str, dict] = field(default_factory=dict)

    def apply(self, settings: dict) -> dict:
        """``settings`` (config fields) with this preset's ``config`` and ``method_overrides`` merged in."""
        merged = merge_settings(settings, self.config)
        for method, overrides in self.method_overrides.items():
            if merged.get(method) is not None:
                merged[method] = merge_settings(merged[method], overrides)
        return merged


#: Transformer-base training (Vaswani et al. 2017, §5.3-5.4), which EaDRA (§4.2) and RHE (Appendix A.1) follow:
#: Adam (0.9, 0.98, 1e-9), inverse-square-root decay after 4000 warm-up steps with the peak of their schedule,
#: d_model^-0.5 * 4000^-0.5 = 7e-4; dropout 0.1, label smoothing 0.1. Their ~25k-token batches have no flag here.
TRANSFORMER_BASE = {
    "model_shape": "base", "dropout": 0.1, "attention_dropout": 0.0, "label_smoothing": 0.1, "learning_rate": 7e-4,
    "adam_beta1": 0.9, "adam_beta2": 0.98, "adam_epsilon": 1e-9, "lr_scheduler_type": "inverse_sqrt",
    "warmup_steps": 4000,
}

#: DHICM §4.3: 6+6 layers, d 512; Adam (0.9, 0.98, eps 1e-6), lr 5e-4, inverse square root after 4000 warm-up steps,
#: beam 5, a checkpoint each epoch, the best by validation loss, early stopping after 10 epochs without improvement.
#: (8000 tokens per batch has no flag here.)
DHICM_TRAINING = {
    "model_shape": "base", "method": "dhicm", "learning_rate": 5e-4, "adam_beta1": 0.9, "adam_beta2": 0.98,
    "adam_epsilon": 1e-6, "lr_scheduler_type": "inverse_sqrt", "warmup_steps": 4000, "num_beams": 5,
    "early_stopping_patience": 10,
}

#: DHICM Table 2, one column each: feed-forward dim, attention heads, dropout, attention dropout, activation dropout,
#: DHICM dropout (§3.1; N/A in the default column: the config's default stays), label smoothing.
DHICM_TABLE_2 = {
    "default": (2048, 8, 0.1, 0.0, 0.0, None, 0.1),
    "de_en": (2048, 4, 0.5, 0.1, 0.3, 0.5, 0.1),
    "hi_en": (1024, 4, 0.3, 0.0, 0.0, 0.2, 0.1),
    "be_en": (128, 2, 0.1, 0.0, 0.0, 0.2, 0.4),
}

EADRA_COMPONENTS = {"enc": "encoder", "dec": "decoder", "x": "cross"}
#: EaDRA Appendix A, Table 6: (alpha_dist, alpha_sent) per data set and component; alpha_peak 0 ("alpha_dist
#: appears to render alpha_peak redundant"). Names follow the paper: enc, dec (self-attention), x (cross-attention).
#: The WMT En-De (100k) row is EaDRA's defaults, read from :data:`hf_headattn.eadra.DEFAULTS`.
EADRA_TABLE_6 = {
    "wmt_en_de_100k": {short: (EADRA_DEFAULTS[EADRA_COMPONENTS[short]]["alpha_dist"],
                               EADRA_DEFAULTS[EADRA_COMPONENTS[short]]["alpha_sent"]) for short in ("enc", "x", "dec")},
    "be_en": {"enc": (0.02, 1.2), "x": (0.1, 8.0), "dec": (1.0, 0.9)},
    "gl_en": {"enc": (0.02, 0.8), "x": (0.15, 5.0), "dec": (1.0, 0.8)},
    "sk_en": {"enc": (0.02, 0.8), "x": (0.1, 8.0), "dec": (2.0, 0.8)},
    "ko_en": {"enc": (0.01, 0.4), "x": (0.05, 8.0), "dec": (0.5, 0.8)},
    "vi_en": {"enc": (0.02, 0.6), "x": (0.2, 8.0), "dec": (4.0, 1.0)},
    "tr_en": {"enc": (0.04, 1.2), "x": (0.1, 10.0), "dec": (3.0, 1.5)},
    "ja_en": {"enc": (0.02, 0.8), "x": (0.1, 10.0), "dec": (2.0, 0.8)},
}


def _dhicm_presets() -> dict[str, Preset]:
    presets = {}
    for column, (ffn, heads, dropout, attention_dropout, activation_dropout, dhicm_dropout, smoothing) in (
            DHICM_TABLE_2.items()):
        config = {"encoder_ffn_dim": ffn, "decoder_ffn_dim": ffn, "encoder_attention_heads": heads,
                  "decoder_attention_heads": heads, "activation_dropout": activation_dropout}
        overrides = {} if dhicm_dropout is None else {DHICM.name: {"dropout": dhicm_dropout}}
        label = "default column (Transformer-base)" if column == "default" else f"optimal {column} column"
        presets[f"dhicm_{column}"] = Preset(
            doc=f"DHICM (Goindani & Shrivastava 2021) Table 2, {label}; training of §4.3. --method baseline gives "
                f"the paper's {'T-base' if column == 'default' else 'T-optimal'}.",
            flags={**DHICM_TRAINING, "dropout": dropout, "attention_dropout": attention_dropout,
                   "label_smoothing": smoothing},
            config=config, method_overrides=overrides,
        )
    return presets


#: The paper presets read Eq. 8 as written (summed over query pairs) and use Table 6's alphas unscaled.
PAPER_READING = {"dist_reduction": "sum", "alpha_scale": 1.0}


def _eadra_presets() -> dict[str, Preset]:
    presets = {}
    for data_set, components in EADRA_TABLE_6.items():
        for short, (alpha_dist, alpha_sent) in components.items():
            alphas = {"alpha_peak": 0.0, "alpha_dist": alpha_dist, "alpha_sent": alpha_sent}
            presets[f"eadra_{short}_{data_set}"] = Preset(
                doc=f"EaDRA (Araabi, Niculae & Monz) Appendix A Table 6, EaDRA_{short} on {data_set}: alpha_dist "
                    f"{alpha_dist}, alpha_sent {alpha_sent}; Transformer-base (§4.2). Combine components with '+' "
                    f"(e.g. eadra_enc_{data_set}+eadra_dec_{data_set}: Table 6's values, as in the paper).",
                flags=dict(TRANSFORMER_BASE), config={EADRA.name: {EADRA_COMPONENTS[short]: alphas, **PAPER_READING}},
            )
    wmt = EADRA_TABLE_6["wmt_en_de_100k"]
    for short in ("enc", "dec"):
        alpha_dist, alpha_sent = wmt[short]
        presets[f"eadra_mbart_{short}"] = Preset(
            doc=f"EaDRA §5.4 (Table 5, mBART fine-tuning): EaDRA_{short} with Table 6's WMT En-De (100k) alphas "
                "on two heads. Fine-tuning: no architecture or training flags.",
            config={EADRA.name: {EADRA_COMPONENTS[short]: {"alpha_peak": 0.0, "alpha_dist": alpha_dist,
                                                           "alpha_sent": alpha_sent, "num_heads": 2}, **PAPER_READING}},
        )
    return presets


#: Presets by name; see each one's ``doc`` for its source table.
PRESETS: dict[str, Preset] = {
    **_dhicm_presets(),
    **_eadra_presets(),
    "rhe_base": Preset(
        doc="RHE (Zhang et al.) Appendix A.1 (Transformer-base: hidden 512, filter 2048, 8 heads; the paper averages "
            "the last 10 checkpoints: recipes/average_checkpoints.py --last 10), Table 3 (k = 6), LPEA+RHE on the "
            "first encoder layer (Appendix A.2).",
        flags={**TRANSFORMER_BASE, "method": "lpea_rhe"},
        method_overrides={SEA.name: {"max_relative_position": 6, "layers": [0]}},
    ),
}


def merge_settings(base: dict, update: dict) -> dict:
    """``base`` updated with ``update``; nested dicts (``eadra``'s components) are merged, not replaced."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            value = merge_settings(dict(merged[key]), dict(value))
        merged[key] = value
    return merged


def preset(spec: str) -> Preset:
    """The preset of a name or of a "+"-joined combination (later names win; nested config dicts merge).

    >>> sorted(preset("eadra_enc_vi_en+eadra_dec_vi_en").config["eadra"])
    ['decoder', 'encoder']
    """
    docs, flags, config, overrides = [], {}, {}, {}
    for name in (part.strip() for part in spec.split("+")):
        if name not in PRESETS:
            raise ValueError(
                f"unknown preset {name!r} in {spec!r}; expected names from {sorted(PRESETS)} joined by '+'"
            )
        docs.append(f"{name}: {PRESETS[name].doc}")
        flags.update(PRESETS[name].flags)
        config = merge_settings(config, PRESETS[name].config)
        overrides = merge_settings(overrides, PRESETS[name].method_overrides)
    return Preset(doc="\n".join(docs), flags=flags, config=config, method_overrides=overrides)


# --- how presets and early stopping reach a recipe's command line ----------------------------------------------------

#: What early stopping needs (DHICM §4.3): evaluate and save each epoch, keep the best checkpoint by validation loss.
EARLY_STOPPING_FLAGS = ["--eval_strategy", "epoch", "--save_strategy", "epoch", "--load_best_model_at_end", "true",
                        "--metric_for_best_model", "loss"]


def flag_values(argv: list[str], name: str) -> list[str]:
    """The values given to ``--name`` in ``argv`` (``--name VALUE`` or ``--name=VALUE``; ``-`` for ``_`` too)."""
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
    """``argv`` (default ``sys.argv[1:]``) after early stopping's flags and the ``--preset``'s, so that yours win.

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
    """``[EarlyStoppingCallback(patience)]`` (``[]`` for None or 0), after checking that ``args`` evaluate and keep the
    best checkpoint. (Its counter restarts with each ``hyperparameter_search`` trial: a new training has no best
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
