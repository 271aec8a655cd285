"""`hf-headattn train`: train and evaluate a translation model with any combination of the hf-headattn methods.

In the style of HF's `run_translation.py` (its common flags keep their names), plus the method settings:

    # Multi30k En-De from scratch (no data flag: Multi30k, found or downloaded), DHICM on, on the CPU
    hf-headattn train --source_lang en --target_lang de \\
        --model_shape tiny --method dhicm --output_dir outputs/dhicm --num_train_epochs 5 \\
        --per_device_train_batch_size 64 --learning_rate 1e-3 --eval_strategy epoch --save_strategy epoch

    # a pretrained checkpoint, methods combined with "+", extra fields as JSON
    hf-headattn train --model_name_or_path facebook/mbart-large-50 --dataset_name wmt16 \\
        --dataset_config_name ro-en --source_lang en --target_lang ro --method dhicm+eadra \\
        --method_settings '{"dhicm": {"mode": "scaled_out_proj"}}' --output_dir outputs/mbart

    # a paper's preset (hf_headattn.experiment.presets.paper_presets()): DHICM Table 2's Be-En column and §4.3's
    # training, early stopping included; the flags you pass win over the preset's (here the shape and the epochs)
    hf-headattn train --preset dhicm_be_en --model_shape small --num_train_epochs 100 \\
        --output_dir outputs/dhicm_be_en

    # a method kept outside the package: its module is imported first, so --method and its own flags know it
    hf-headattn train --method_modules my_pkg.my_method --method my_method --output_dir outputs/mine

An interrupted run continues with `--resume_from_checkpoint true` (the latest `checkpoint-N` in `--output_dir`)
or `--resume_from_checkpoint <checkpoint folder>`. Without it, an `--output_dir` that holds `checkpoint-N`
folders is refused unless `--overwrite_output_dir` (start afresh: they are removed before training); one that is
the model, tokenizer or data the run reads is refused always.

Writes `results.json` (sacreBLEU/chrF with signatures per test split, settings, train time) and one
`predictions_<split>.txt` per test split into `--output_dir`. `train_time_s` is this run's wall time in
`Trainer.train` (after a resume: the resumed part only); `total_train_time_s` adds the time of the runs before,
up to the resumed checkpoint (each checkpoint keeps it in `train_time.json`; null for a checkpoint written before
that file was); `resumed_from` names that checkpoint, its step and that earlier time (null: not resumed). Loss
components are logged beside `loss` (`--report_to tensorboard` for TensorBoard).

The module is the command's `main` (which the demo, `demo`, runs once per model); its arguments and the
method settings they give are the kit's
[`hf_headattn.experiment.train_arguments`][hf_headattn.experiment.train_arguments].
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

from transformers import Seq2SeqTrainingArguments, set_seed

from hf_headattn.cli import refuse_python_m
from hf_headattn.experiment.evaluation import make_compute_metrics
from hf_headattn.experiment.kit import MissingDependencyError
from hf_headattn.experiment.launch import check_launch
from hf_headattn.experiment.method_inputs import (
    check_method_inputs,
    input_flags,
)
from hf_headattn.experiment.multi30k import Multi30kError
from hf_headattn.experiment.outputs import (
    DATA_FLAGS,
    OutputArguments,
    check_trainer_output_dir,
    flag_inputs,
    remove_entries,
    removed_on_failure,
)
from hf_headattn.experiment.presets import (
    early_stopping_callbacks,
    split_architecture,
)
from hf_headattn.experiment.recipe_parts import (
    collator,
    found_data,
    method_columns,
    prepare_features,
    pretrained_model,
    read_data,
    scratch_model,
    scratch_tokenizer,
    set_languages,
    translate_and_score,
    write_json,
)
from hf_headattn.experiment.tokenization import load_tokenizer
from hf_headattn.experiment.train_arguments import (
    DataArguments,
    ModelArguments,
    check_methods_on,
    model_config,
    names_listing,
    parse_recipe_arguments,
    settings_from,
)
from hf_headattn.experiment.trainer import (
    TRAIN_TIME_FILE,
    HeadAttnSeq2SeqTrainer,
    TrainingClock,
    TrainingTimeLimit,
    check_resume_world_size,
    resume_checkpoint,
    resumed_from,
)
from hf_headattn.hf_compat import parameter_count

logger = logging.getLogger("train_translation")


def main(argv=None, prog: str | None = None) -> dict:
    """The training run of `argv` (default `sys.argv[1:]`): its `results.json`. `prog`: the name its usage and
    errors give (default the script's, argparse's)."""
    parser, parsed, options = parse_recipe_arguments(
        (ModelArguments, DataArguments, OutputArguments, Seq2SeqTrainingArguments), argv, prog=prog,
        description=__doc__)
    model_args, data_args, output_args, training_args = parsed
    if model_args.list_methods or model_args.list_presets:
        print(names_listing(model_args.list_methods, model_args.list_presets))
        raise SystemExit(0)
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", level=logging.INFO, stream=sys.stdout)
    set_seed(training_args.seed)
    max_length = max(data_args.max_source_length, data_args.max_target_length)
    try:  # a usage error (exit 2): the flags' settings and folders, before anything is read or written
        settings = settings_from(model_args)
        check_launch(training_args)
        resume = resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
        if resume:
            check_resume_world_size(resume, training_args)
        inputs = flag_inputs(model_args, ("model_name_or_path", "tokenizer_name")) | flag_inputs(data_args, DATA_FLAGS)
        inputs |= input_flags(options) | found_data(data_args)  # never into the data, however it was found
        earlier = check_trainer_output_dir(training_args.output_dir, inputs, output_args.overwrite_output_dir, resume)
        check_methods_on(model_args, model_config(model_args, settings, max_length))  # the methods' settings checked
        time_limit = None if model_args.max_train_minutes is None else TrainingTimeLimit(model_args.max_train_minutes)
        callbacks = early_stopping_callbacks(model_args.early_stopping_patience, training_args)
    except (ValueError, OSError, Multi30kError) as error:
        parser.error(str(error))
    callbacks += [time_limit] if time_limit else []
    resumed = resumed_from(resume, training_args.output_dir)
    previous_time = (resumed or {}).get("train_time_s", 0.0)
    if previous_time is None:  # the checkpoints of this run cannot know the total either
        logger.warning(f"{resumed['checkpoint']} has no {TRAIN_TIME_FILE} (written before it was recorded); "
                       "results.json's total_train_time_s will be null")
    else:
        callbacks.append(TrainingClock(previous_time))
    raw = read_data(parser, data_args)
    test_splits = data_args.test_splits.split(",") if data_args.test_splits else [s for s in raw if s != "train"]
    unknown = sorted(set(test_splits) - set(raw))
    if unknown:
        parser.error(f"--test_splits: {unknown} are not in the data; it has {sorted(raw)}")
    src, tgt = data_args.source_lang, data_args.target_lang
    try:  # the methods' inputs against the data (e.g. SEA's parse files), still before anything is written
        check_method_inputs(raw, settings, src, options)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    # --overwrite_output_dir: the earlier run's entries go now, its tokenizer included (never reused, never mixed in),
    # removed by the main process; the others wait here, so that every process has checked the folder before it writes
    with training_args.main_process_first(local=training_args.save_on_each_node, desc="the output folder"):
        if training_args.should_save:
            remove_entries(earlier, logger.warning)
    # a failed start leaves no tokenizer (the writer's to remove: the main process)
    with removed_on_failure(f"{training_args.output_dir}/tokenizer") if training_args.should_save else nullcontext():
        if model_args.model_name_or_path:
            tokenizer = load_tokenizer(model_args.tokenizer_name or model_args.model_name_or_path)
            try:  # the settings on the checkpoint's shape (and together): refused as a usage error
                model = pretrained_model(model_args.model_name_or_path, settings,
                                         attn_implementation=model_args.attn_implementation)
            except ValueError as error:
                parser.error(str(error))
        else:
            try:  # trained here, or the resumed run's (only if trained with this run's settings and data); trained
                # and saved by the main process, which the others wait for, then load
                with training_args.main_process_first(local=training_args.save_on_each_node, desc="the tokenizer"):
                    tokenizer = (load_tokenizer(model_args.tokenizer_name) if model_args.tokenizer_name else
                                 scratch_tokenizer(raw["train"], model_args.vocab_size,
                                                   f"{training_args.output_dir}/tokenizer", src, tgt))
            except ValueError as error:
                parser.error(str(error))
            shape, scratch_settings = split_architecture(model_args.model_shape, settings)  # heads etc. over shape
            model = scratch_model(shape, tokenizer, scratch_settings, max_length,
                                  dropout=model_args.dropout, attention_dropout=model_args.attention_dropout)
            model.set_attn_implementation(model_args.attn_implementation)
        check_methods_on(model_args, model)
        if data_args.source_lang_code:  # mBART-50 style tokenizers
            try:
                set_languages(tokenizer, model, data_args.source_lang_code, data_args.target_lang_code)
            except ValueError as error:  # a code the tokenizer does not know
                parser.error(str(error))

        # the methods record on the config what hf_headattn.translate needs to make their inputs alike (SEA: parser)
        try:
            features = prepare_features(raw, tokenizer, src, tgt, settings, data_args.max_source_length,
                                        data_args.max_target_length, data_args.preprocessing_num_workers,
                                        config=model.config, **options)
        except (MissingDependencyError, ValueError) as error:  # e.g. SEA's parser missing, or a text it refuses
            parser.error(str(error))
        if method_columns(settings):
            training_args.remove_unused_columns = False  # the collator makes the methods' columns model inputs
        training_args.predict_with_generate = True
        training_args.generation_num_beams = training_args.generation_num_beams or data_args.num_beams
        training_args.generation_max_length = training_args.generation_max_length or data_args.max_target_length
        trainer = HeadAttnSeq2SeqTrainer(
            model=model, args=training_args, train_dataset=features["train"],
            eval_dataset=features.get("validation"), data_collator=collator(tokenizer, model, settings),
            processing_class=tokenizer, compute_metrics=make_compute_metrics(tokenizer), callbacks=callbacks,
        )
    start = time.perf_counter()
    train_result = trainer.train(resume_from_checkpoint=resume)
    train_time = time.perf_counter() - start
    trainer.save_model()
    if training_args.should_save:  # one writer (the Trainer's: the main process)
        tokenizer.save_pretrained(training_args.output_dir)

    results = {
        "method": model_args.method, "settings": settings, "model": model_args.model_name_or_path or
        model_args.model_shape, "train_time_s": round(train_time, 1),
        "total_train_time_s": None if previous_time is None else round(previous_time + train_time, 1),
        "resumed_from": resumed, "train_loss": train_result.training_loss,
        "global_step": trainer.state.global_step, "epochs": trainer.state.epoch,
        "stopped_at_time_limit": bool(time_limit and time_limit.stopped),
        "num_parameters": parameter_count(model), "device": str(training_args.device),
        "tokenizer": {"name_or_path": tokenizer.name_or_path, "vocab_size": len(tokenizer)},
        "log_history": trainer.state.log_history, "args": {**asdict(model_args), **asdict(data_args), **options},
        "scores": {},
    }
    for split in test_splits:
        scores = translate_and_score(
            trainer, features[split], raw[split], tokenizer, tgt, data_args.num_beams,
            data_args.max_target_length, f"{training_args.output_dir}/predictions_{split}.txt",
        )
        results["scores"][split] = scores
        logger.info(f"{split}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f}  {scores['bleu_signature']}")
    if training_args.should_save:
        path = write_json(f"{training_args.output_dir}/results.json", results)
        logger.info(f"results written to {path}")
    return results


if __name__ == "__main__":  # `python -m` of this module: a usage error naming the command to run
    refuse_python_m(__spec__.name)
