"""Grid search in stages with ``Trainer.hyperparameter_search`` and optuna's ``GridSampler`` (DHICM §4.2).

DHICM (Goindani & Shrivastava 2021, §4.2) first grid-searches the architecture hyperparameters (attention heads,
feed-forward size) with the regularization ones at their defaults, then the regularization hyperparameters (dropout,
attention dropout, activation dropout, DHICM dropout, label smoothing) with the architecture fixed at the best of the
first stage; "the optimal hyperparameters chosen are the ones that correspond to the minimum loss on the validation
set". A grid (a JSON file, see ``research/grids/``) lists the stages in order; each stage's best values stay fixed in
the later ones:

    {"stages": [{"name": "architecture", "grid": {"attention_heads": [2, 4, 8], "ffn_dim": [512, 1024, 2048]}},
                {"name": "regularization", "grid": {"dropout": [0.1, 0.3], "label_smoothing": [0.1, 0.4]}}]}

A trial's objective is its lowest ``eval_loss`` over the evaluations during its training (with early stopping and
``load_best_model_at_end``, the kept checkpoint's). Each stage writes ``search_<stage>.json`` listing every trial.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
from transformers import TrainerCallback

from hf_headattn.experiment.presets import ARCHITECTURE_FIELDS, merge_settings
from hf_headattn.registry import registered_methods

#: Grid keys that set architecture config fields; the two aliases set the encoder's and the decoder's together.
ARCHITECTURE = {
    "attention_heads": ("encoder_attention_heads", "decoder_attention_heads"),
    "ffn_dim": ("encoder_ffn_dim", "decoder_ffn_dim"),
    **{name: (name,) for name in ARCHITECTURE_FIELDS},
}
#: Grid keys that are regularization config fields (DHICM §4.2 and Table 2); ``<method>.dropout`` is the ``dropout``
#: setting of a registered method's dict (``dhicm.dropout``: ``config.dhicm["dropout"]``).
METHOD_DROPOUTS = tuple(f"{spec.name}.dropout" for spec in registered_methods()
                        if "dropout" in {f.name for f in fields(spec.settings)})
REGULARIZATION = ("dropout", "attention_dropout", "activation_dropout", *METHOD_DROPOUTS, "label_smoothing")
#: Grid keys that are ``TrainingArguments`` fields (``hyperparameter_search`` sets them on the trial's arguments).
TRAINING = ("learning_rate", "warmup_steps", "weight_decay")
KNOWN_HYPERPARAMETERS = (*ARCHITECTURE, *REGULARIZATION, *TRAINING)


@dataclass(frozen=True)
class Stage:
    """One grid of a staged search: ``grid`` maps a hyperparameter to the values tried."""

    name: str
    grid: dict[str, list]

    @property
    def size(self) -> int:
        return math.prod(len(values) for values in self.grid.values())

    def combinations(self) -> list[dict]:
        return [dict(zip(self.grid, values)) for values in itertools.product(*self.grid.values())]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_values(stage: str, key: str, values) -> None:
    where = f"grid {key!r} of stage {stage!r}"
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where} must be a non-empty list of values, got {values!r}")
    if len(set(map(repr, values))) != len(values):
        raise ValueError(f"{where} repeats a value: {values!r}")
    for value in values:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key == "warmup_steps":
            ok, expected = _is_int(value) and value >= 0, "integers >= 0"
        elif key in ARCHITECTURE:
            ok, expected = _is_int(value) and value >= 1, "positive integers"
        elif key in REGULARIZATION:
            ok, expected = number and 0 <= value < 1, "numbers in [0, 1)"
        elif key == "learning_rate":
            ok, expected = number and value > 0, "positive numbers"
        else:
            ok, expected = number and value >= 0, "numbers >= 0"
        if not ok:
            raise ValueError(f"{where} has {value!r}; expected {expected}")


def config_fields(params: Mapping) -> dict:
    """The config fields of a trial's hyperparameters: aliases expanded, ``<method>.<setting>`` keys gathered into
    the method's dict (to be merged over the base settings, :func:`~.presets.merge_settings`), ``TRAINING`` keys left
    out.

    >>> config_fields({"attention_heads": 4, "dhicm.dropout": 0.5, "learning_rate": 0.1})
    {'encoder_attention_heads': 4, 'decoder_attention_heads': 4, 'dhicm': {'dropout': 0.5}}
    """
    fields = {}
    for key, value in params.items():
        if key in TRAINING:
            continue
        if "." in key:
            method, setting = key.split(".", 1)
            fields[method] = {**fields.get(method, {}), setting: value}
        for name in () if "." in key else ARCHITECTURE.get(key, (key,)):
            fields[name] = value
    return fields


def training_fields(params: Mapping) -> dict:
    return {key: value for key, value in params.items() if key in TRAINING}


def load_grid(source: str | Path | Mapping) -> list[Stage]:
    """The stages of a grid (a JSON file or its parsed dict), checked: raises ``ValueError`` naming the bad entry."""
    spec = json.loads(Path(source).read_text(encoding="utf-8")) if isinstance(source, (str, Path)) else source
    stages = spec.get("stages") if isinstance(spec, Mapping) else None
    if not isinstance(stages, list) or not stages:
        raise ValueError(f"a grid needs a non-empty list 'stages' of {{'name': ..., 'grid': {{...}}}}; got {spec!r}")
    result, searched = [], {}
    for index, stage in enumerate(stages):
        name = stage.get("name", f"stage{index + 1}") if isinstance(stage, Mapping) else None
        grid = stage.get("grid") if isinstance(stage, Mapping) else None
        if not isinstance(grid, Mapping) or not grid:
            raise ValueError(f"stage {name or index!r} has an empty or missing 'grid'; expected a dict mapping some of "
                             f"{list(KNOWN_HYPERPARAMETERS)} to lists of values, got {grid!r}")
        plain = str(name).replace("_", "").replace("-", "").isalnum()
        if not plain or any(existing.name == name for existing in result):
            raise ValueError(f"stage name {name!r} must be unique and made of letters, digits, '-' and '_'")
        for key, values in grid.items():
            if key not in KNOWN_HYPERPARAMETERS:
                raise ValueError(f"grid key {key!r} of stage {name!r} is not a known hyperparameter; expected one of "
                                 f"{list(KNOWN_HYPERPARAMETERS)}")
            _check_values(name, key, values)
            for field in [key] if "." in key else config_fields({key: None}) or [key]:
                if field in searched:
                    raise ValueError(f"{field} is set by grid key {key!r} of stage {name!r} and by {searched[field]}; "
                                     "each hyperparameter belongs to one stage and one key")
                searched[field] = f"grid key {key!r} of stage {name!r}"
        result.append(Stage(name, {key: list(values) for key, values in grid.items()}))
    return result


def check_trials(stages: list[Stage], check: Callable[[dict], object]) -> None:
    """Call ``check(config_fields)`` for every combination of every stage before any training; a failure names it."""
    for stage in stages:
        for params in stage.combinations():
            try:
                check(config_fields(params))
            except (ValueError, TypeError, AssertionError) as error:
                raise ValueError(f"stage {stage.name!r}, trial {params}: {error}") from error


def meta_model_check(build_model: Callable[[dict], object]) -> Callable[[dict], None]:
    """A ``check`` for :func:`check_trials`: builds the model on the meta device (config and shape errors, no RAM)."""

    def check(fields: dict) -> None:
        with torch.device("meta"):
            build_model(fields)

    return check


class TrialRecorder(TrainerCallback):
    """Builds each trial's model (``model_init``) and records its evaluation losses; the objective is the lowest."""

    def __init__(self, stage: Stage, fixed: dict, build_model: Callable[[dict], torch.nn.Module]):
        self.stage, self.fixed, self.build_model = stage, dict(fixed), build_model
        self.trial, self.losses = None, []

    def suggest(self, trial) -> dict:
        return {key: trial.suggest_categorical(key, values) for key, values in self.stage.grid.items()}

    def hp_space(self, trial) -> dict:
        """What ``hyperparameter_search`` sets on the trial's ``TrainingArguments`` (config fields go to the model)."""
        return training_fields(self.suggest(trial))

    def model_init(self, trial=None):
        params = {**self.fixed, **(self.suggest(trial) if trial is not None else {})}
        model = self.build_model(config_fields(params))
        if trial is not None:
            self.trial, self.losses = trial, []
            trial.set_user_attr("num_parameters", model.num_parameters())
        return model

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_loss" in metrics:
            self.losses.append(float(metrics["eval_loss"]))

    def compute_objective(self, metrics: dict) -> float:
        if not self.losses:
            raise ValueError(f"the search selects by eval_loss, but the evaluation returned only {sorted(metrics)}")
        self.trial.set_user_attr("eval_losses", list(self.losses))
        return min(self.losses)


def _stage_result(stage: Stage, fixed: dict, study) -> dict:
    trials = [{
        "trial": trial.number, "params": trial.params, "eval_loss": trial.value, "state": trial.state.name,
        "eval_losses": trial.user_attrs.get("eval_losses"), "num_parameters": trial.user_attrs.get("num_parameters"),
        "duration_s": round(trial.duration.total_seconds(), 1) if trial.duration else None,
    } for trial in study.trials]
    best = study.best_trial
    return {
        "stage": stage.name, "grid": stage.grid, "fixed": fixed,
        "objective": "eval_loss, the lowest of the trial's evaluations", "trials": trials,
        "best": {"trial": best.number, "params": best.params, "eval_loss": best.value},
    }


def run_search(stages: list[Stage], build_model: Callable[[dict], torch.nn.Module],
               make_trainer: Callable, args, check: Callable[[dict], object] | None = None,
               report: Callable[[str], object] = print) -> dict:
    """Run the stages in order with ``Trainer.hyperparameter_search`` (optuna, ``GridSampler``, one trial a point).

    ``build_model(config_fields)`` makes a fresh model with a trial's config fields over the base settings;
    ``make_trainer(model_init, args)`` a trainer with that ``model_init``; ``check`` (e.g. :func:`meta_model_check`)
    vets every trial first. Stage ``s`` runs in ``<output_dir>/<s>/`` and writes ``<output_dir>/search_<s>.json``;
    ``report`` gets each stage's summary table. Returns every stage's result and ``best_params``.
    """
    import optuna

    if check is not None:
        check_trials(stages, check)
    root, fixed, results = Path(args.output_dir), {}, []
    root.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        recorder = TrialRecorder(stage, fixed, build_model)
        stage_args = replace(args, output_dir=str(root / stage.name), **training_fields(fixed))
        trainer = make_trainer(recorder.model_init, stage_args)
        trainer.add_callback(recorder)
        storage = optuna.storages.InMemoryStorage()
        trainer.hyperparameter_search(
            hp_space=recorder.hp_space, compute_objective=recorder.compute_objective, n_trials=stage.size,
            direction="minimize", backend="optuna", storage=storage, study_name=stage.name,
            sampler=optuna.samplers.GridSampler(stage.grid, seed=args.seed),
        )
        result = _stage_result(stage, fixed, optuna.load_study(study_name=stage.name, storage=storage))
        (root / f"search_{stage.name}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        report(summary_table(result))
        fixed = {**fixed, **result["best"]["params"]}
        results.append(result)
    return {"stages": results, "best_params": fixed}


def summary_table(result: dict) -> str:
    """A stage's trials as an aligned text table, the best marked with ``*``."""
    keys = list(result["grid"])
    header = ["", "trial", *keys, "eval_loss"]
    rows = [["*" if trial["trial"] == result["best"]["trial"] else "", str(trial["trial"]),
             *(str(trial["params"].get(key)) for key in keys),
             "-" if trial["eval_loss"] is None else f"{trial['eval_loss']:.4f}"]
            for trial in sorted(result["trials"], key=lambda trial: trial["trial"])]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in [header, *rows]]
    best = result["best"]
    title = (f"stage {result['stage']!r}: {len(rows)} trials, best trial {best['trial']} "
             f"(eval_loss {best['eval_loss']:.4f}), fixed from earlier stages: {result['fixed'] or 'nothing'}")
    return "\n".join([title, *lines])


#: Config fields with their own flag in the recipes (the rest go into ``--method_settings``).
FLAGGED_FIELDS = ("dropout", "attention_dropout", "label_smoothing")


def train_flags(params: Mapping, method_settings: str | None = None) -> list[str]:
    """Flags that give ``hf-headattn train`` a search's best ``params`` (on top of the other flags used).

    >>> train_flags({"attention_heads": 4, "dropout": 0.3})
    ['--dropout', '0.3', '--method_settings', '{"encoder_attention_heads": 4, "decoder_attention_heads": 4}']
    """
    fields = config_fields(params)
    flags = [item for key in FLAGGED_FIELDS if key in fields for item in (f"--{key}", str(fields.pop(key)))]
    flags += [item for key, value in training_fields(params).items() for item in (f"--{key}", str(value))]
    other = merge_settings(json.loads(method_settings) if method_settings else {}, fields)
    return flags + (["--method_settings", json.dumps(other)] if other else [])
