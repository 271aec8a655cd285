#!/usr/bin/env python
"""Grid-search hyperparameters in stages by validation loss (DHICM §4.2), with ``Trainer.hyperparameter_search``.

Takes ``hf-headattn train``'s model, data and training flags (``--preset`` and ``--early_stopping_patience``
included; they set each trial's base settings) plus ``--grid``, a JSON file of stages (see ``workshop.search``):

    # DHICM's two stages: architecture (heads, feed-forward size), then regularization at the best architecture
    python research/search_hyperparameters.py --grid research/grids/dhicm_two_stage.json --method dhicm \
        --model_shape small --output_dir outputs/search \
        --num_train_epochs 50 --early_stopping_patience 10 --save_total_limit 1 --per_device_train_batch_size 64

Needs optuna (``pip install -e ".[search]"``). Each trial trains a fresh model and is scored by its lowest
``eval_loss`` on the validation split (no generation). Writes ``search_<stage>.json`` (every trial's params and eval
loss) per stage and ``search_results.json`` (the best params and the flags that give them to ``hf-headattn train``)
into ``--output_dir``, and prints a summary table per stage. Trial ``n`` of stage ``s`` saves its checkpoints (if
any) in ``<output_dir>/<s>/run-<n>``. An ``--output_dir`` that holds an earlier search's stage folders or
``search_*.json`` is refused unless ``--overwrite_output_dir``, which removes them before the search starts.
"""

from __future__ import annotations

import logging
import re
import shlex
import sys
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, Seq2SeqTrainingArguments, set_seed

from hf_headattn.experiment.kit import kits
from hf_headattn.experiment.method_inputs import input_flags
from hf_headattn.experiment.multi30k import Multi30kError
from hf_headattn.experiment.outputs import (
    DATA_FLAGS,
    OutputArguments,
    check_output_dir,
    flag_inputs,
    remove_entries,
)
from hf_headattn.experiment.presets import early_stopping_callbacks, merge_settings, split_architecture
from hf_headattn.experiment.recipe_parts import (
    MODEL_CLASSES,
    collator,
    found_data,
    method_columns,
    prepare_features,
    pretrained_model,
    read_data,
    scratch_model,
    scratch_tokenizer,
    write_json,
)
from hf_headattn.experiment.tokenization import load_tokenizer
from hf_headattn.experiment.train_arguments import (
    DataArguments,
    ModelArguments,
    parse_recipe_arguments,
    settings_from,
)
from hf_headattn.experiment.trainer import HeadAttnSeq2SeqTrainer
from workshop.search import ARCHITECTURE, load_grid, meta_model_check, run_search, train_flags

logger = logging.getLogger("search_hyperparameters")


@dataclass
class SearchArguments:
    grid: str | None = field(default=None, metadata={"help": "JSON file of the stages' grids, e.g. "
                                                             "research/grids/dhicm_two_stage.json"})


def check_base(stages, model_args: ModelArguments, settings: dict, training_args) -> None:
    """Refuse grids that cannot apply to the base settings (before any data is loaded)."""
    keys = {key for stage in stages for key in stage.grid}
    if model_args.model_name_or_path and keys & set(ARCHITECTURE):
        raise ValueError(f"grid keys {sorted(keys & set(ARCHITECTURE))} change the architecture, which "
                         f"{model_args.model_name_or_path} fixes; search them from scratch (--model_shape)")
    for kit in kits():  # a method's setting (``<method>.<setting>``) searched with the method off
        searched = sorted(key for key in keys if key.startswith(f"{kit.name}."))
        if searched and settings.get(kit.name) is None:
            raise ValueError(f"the grid searches {', '.join(searched)} but {kit.name} is off (--method "
                             f"{model_args.method}); expected a --method that switches it on, e.g. "
                             f"--method {next(iter(kit.method_names), kit.name)}")
    if training_args.label_smoothing_factor > 0:
        raise ValueError(f"label_smoothing_factor={training_args.label_smoothing_factor}: use --label_smoothing "
                         "(computed inside the model) or the grid key label_smoothing")


def main(argv=None) -> dict:
    parser, parsed, options = parse_recipe_arguments(
        (ModelArguments, DataArguments, SearchArguments, OutputArguments, Seq2SeqTrainingArguments), argv)
    model_args, data_args, search_args, output_args, training_args = parsed
    if not search_args.grid:
        parser.error("--grid is required: a JSON file of stages, e.g. research/grids/dhicm_two_stage.json")
    stages = load_grid(search_args.grid)
    try:  # an earlier search's stage folders (their trials' checkpoints), tokenizer and results, replaced only if asked
        inputs = flag_inputs(model_args, ("model_name_or_path", "tokenizer_name")) | flag_inputs(data_args, DATA_FLAGS)
        inputs |= input_flags(options)
        results_pattern = re.compile("|".join(re.escape(stage.name) for stage in stages)
                                     + r"|tokenizer|search_.*\.json")
        earlier = check_output_dir(training_args.output_dir, {**inputs, "--grid": search_args.grid},
                                   results=results_pattern, overwrite=output_args.overwrite_output_dir,
                                   overwrite_flag="--overwrite_output_dir")
        check_output_dir(training_args.output_dir, found_data(data_args), results=results_pattern, overwrite=True)
        settings = settings_from(model_args)
    except (ValueError, Multi30kError) as error:
        parser.error(str(error))
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", level=logging.INFO, stream=sys.stdout)
    set_seed(training_args.seed)
    check_base(stages, model_args, settings, training_args)
    callbacks = early_stopping_callbacks(model_args.early_stopping_patience, training_args)
    raw = read_data(parser, data_args)
    if "validation" not in raw:
        parser.error(f"the search selects by validation loss, but the data has no validation split: {sorted(raw)}")
    src, tgt = data_args.source_lang, data_args.target_lang
    max_length = max(data_args.max_source_length, data_args.max_target_length)
    remove_entries(earlier, logger.warning)  # --overwrite_output_dir: the earlier search's, its tokenizer included

    path = model_args.model_name_or_path
    if path:
        tokenizer = load_tokenizer(model_args.tokenizer_name or path)
        config_class = MODEL_CLASSES[AutoConfig.from_pretrained(path).model_type].config_class
        check = lambda fields: config_class.from_pretrained(path, **{**settings, **fields})  # noqa: E731
    else:
        tokenizer = (load_tokenizer(model_args.tokenizer_name) if model_args.tokenizer_name else
                     scratch_tokenizer(raw["train"], model_args.vocab_size, f"{training_args.output_dir}/tokenizer",
                                       src, tgt))
        check = None
    base = settings if path else {"dropout": model_args.dropout,
                                  "attention_dropout": model_args.attention_dropout, **settings}

    def build_model(fields: dict):
        """A fresh model with a trial's config fields merged over the base settings (flags, preset, method)."""
        if path:
            return pretrained_model(path, merge_settings(base, fields),
                                    attn_implementation=model_args.attn_implementation)
        shape, rest = split_architecture(model_args.model_shape, merge_settings(base, fields))
        model = scratch_model(shape, tokenizer, rest, max_length)
        model.set_attn_implementation(model_args.attn_implementation)
        return model

    features = prepare_features(raw, tokenizer, src, tgt, settings, data_args.max_source_length,
                                data_args.max_target_length, data_args.preprocessing_num_workers, **options)
    if method_columns(settings):
        training_args.remove_unused_columns = False  # the collator turns the methods' columns into model inputs
    training_args.predict_with_generate = False  # the objective is the loss
    data_collator = collator(tokenizer, None, settings)  # the models shift the labels themselves

    def make_trainer(model_init, args):
        return HeadAttnSeq2SeqTrainer(
            model_init=model_init, args=args, train_dataset=features["train"], eval_dataset=features["validation"],
            data_collator=data_collator, processing_class=tokenizer, callbacks=callbacks,
        )

    results = run_search(stages, build_model, make_trainer, training_args,
                         check=check or meta_model_check(build_model))
    results["train_translation_flags"] = train_flags(results["best_params"], model_args.method_settings)
    out = write_json(f"{training_args.output_dir}/search_results.json", results)
    print(f"best: {results['best_params']}\n"
          f"hf-headattn train flags: {shlex.join(results['train_translation_flags'])}")
    logger.info(f"search results written to {out}")
    return results


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
