"""The research workshop: what the study scripts beside it share (``research/converged_study.py``,
``research/fidelity_study.py``, ``research/reproduce_multi30k.py``, ``research/search_hyperparameters.py``). Not
installed: the scripts import it as ``workshop`` from their own folder (``python research/<script>.py`` puts
``research/`` first on ``sys.path``); it imports the installed ``hf_headattn`` and never the reverse.

Here: ``make demo``'s and the reproduction's schedules, the shared tokenizer, the references, the git commit, and
scoring a saved model on a split the way training scores it. The rows' method settings, written out in full:
:mod:`.rows`. Their runs: folders, records and loading in :mod:`.runs`; side by side in :mod:`.jobs`; trained to
convergence and resumed in :mod:`.launch` (each session: :mod:`.sessions`; what a run's log says: :mod:`.curves`;
their command line: :mod:`.arguments`); the choice on validation in :mod:`.protocol`; the one reading of the test set
in :mod:`.scoring`; the tables' cells in :mod:`.tables` (mean ± sd, per-seed paired bootstrap:
:mod:`hf_headattn.experiment.evaluation`); the staged grid search in :mod:`.search`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

#: ``make demo``'s schedule (``hf-headattn demo``) without its length: the tiny shape, batches of 64 sentences, lr 2e-3
#: with inverse-square-root decay after 100 warm-up steps.
DEMO_SCHEDULE = [
    "--source_lang", "en", "--target_lang", "de", "--model_shape", "tiny", "--vocab_size", "6000",
    "--per_device_train_batch_size", "64", "--learning_rate", "2e-3", "--warmup_steps", "100",
    "--lr_scheduler_type", "inverse_sqrt", "--adam_beta2", "0.98", "--weight_decay", "0.0001",
    "--logging_steps", "50", "--report_to", "none", "--per_device_eval_batch_size", "100",
]
#: The reproduction's schedule (research/reproduce_multi30k.py) without its length, evaluation and logging: the small
#: shape, 8k vocabulary, dropout 0.3, batches of 256 sentences, lr 1e-3 with inverse-square-root decay after 500
#: warm-up steps.
REPRODUCTION_SCHEDULE = [
    "--source_lang", "en", "--target_lang", "de", "--model_shape", "small", "--vocab_size", "8000",
    "--dropout", "0.3", "--label_smoothing", "0.1", "--learning_rate", "1e-3", "--lr_scheduler_type", "inverse_sqrt",
    "--warmup_steps", "500", "--adam_beta2", "0.98", "--weight_decay", "0.0001", "--max_grad_norm", "1.0",
    "--per_device_train_batch_size", "256", "--per_device_eval_batch_size", "256",
]


def prepare_tokenizer(tokenizer_dir: str | Path, multi30k_dir: str | Path, vocab_size: int = 6000,
                      source_lang: str = "en", target_lang: str = "de") -> Path:
    """The joint sentencepiece tokenizer every run of a study shares (trained on Multi30k's training split; reused when
    ``tokenizer_dir`` holds one)."""
    from hf_headattn.experiment.recipe_parts import ParallelDataArguments, load_recipe_data, scratch_tokenizer

    data = ParallelDataArguments(multi30k_dir=str(multi30k_dir), source_lang=source_lang, target_lang=target_lang)
    scratch_tokenizer(load_recipe_data(data)["train"], vocab_size, tokenizer_dir, source_lang, target_lang)
    return Path(tokenizer_dir)


def command_line(command: str) -> list[str]:
    """The start of an ``hf-headattn <command>`` process's command line, run by this Python:
    ``python -m hf_headattn <command>``."""
    return [sys.executable, "-m", "hf_headattn", command]


def parse_sources(multi30k_dir: str | Path, parses_dir: str | Path, source_lang: str = "en",
                  target_lang: str = "de") -> None:
    """Parse Multi30k's sources with spaCy into ``parses_dir`` (the parses SEA's rows train on): ``hf-headattn
    parse`` in a subprocess."""
    subprocess.run([*command_line("parse"), "--multi30k_dir", str(multi30k_dir), "--source_lang", source_lang,
                    "--target_lang", target_lang, "--output_dir", str(parses_dir)], check=True)


def references(multi30k_dir: str | Path, splits: Sequence[str], target_lang: str = "de",
               source_lang: str = "en") -> dict[str, list[str]]:
    """The raw (detokenised) references of Multi30k ``splits``, as training scores them."""
    from hf_headattn.experiment.recipe_parts import ParallelDataArguments, load_recipe_data

    raw = load_recipe_data(ParallelDataArguments(multi30k_dir=str(multi30k_dir), source_lang=source_lang,
                                                 target_lang=target_lang))
    return {split: [pair[target_lang] for pair in raw[split]["translation"]] for split in splits}


def git_commit(cwd: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout at ``cwd`` (None outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def git_dirty(cwd: str | Path | None = None) -> bool | None:
    """Whether tracked files of the checkout at ``cwd`` differ from its commit (None outside a git checkout)."""
    try:
        return bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                   capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return None


def score_saved_model(model_dir: str | Path, split: str, multi30k_dir: str | Path, *, settings: dict,
                      parses_dir: str | Path | None = None, num_beams: int = 5, max_length: int = 128,
                      batch_size: int = 100, use_cpu: bool = True, bf16: bool = False,
                      source_lang: str = "en", target_lang: str = "de",
                      output_file: str | Path | None = None) -> dict:
    """Translate a Multi30k ``split`` with the model (and tokenizer) saved in ``model_dir`` and score it exactly as
    ``hf-headattn train`` scores its test splits: the same features (SEA/RHE: the parses of
    ``parses_dir``), collator, ``Trainer.predict`` with beam search, and sacreBLEU/chrF against the raw references.
    ``settings`` are the run's method settings (``results.json``'s ``settings``). Returns the scores."""
    import datasets
    from transformers import AutoModelForSeq2SeqLM, Seq2SeqTrainingArguments

    from hf_headattn.experiment.recipe_parts import (
        ParallelDataArguments,
        collator,
        load_recipe_data,
        method_columns,
        prepare_features,
        translate_and_score,
    )
    from hf_headattn.experiment.tokenization import load_tokenizer
    from hf_headattn.experiment.trainer import HeadAttnSeq2SeqTrainer
    from hf_headattn.syntax_inputs.provider import syntax_parser_name, uses_syntax

    raw = load_recipe_data(ParallelDataArguments(multi30k_dir=str(multi30k_dir), source_lang=source_lang,
                                                 target_lang=target_lang))
    raw = datasets.DatasetDict({split: raw[split]})
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    syntax = uses_syntax(settings)
    features = prepare_features(raw, tokenizer, source_lang, target_lang, settings, max_length, max_length,
                                syntax_parses_dir=parses_dir if syntax else None)
    if syntax and parses_dir is not None and model.config.syntax_parser != syntax_parser_name(None, parses_dir):
        raise ValueError(f"{model_dir} was trained on parses by {model.config.syntax_parser!r}, but {parses_dir} holds "
                         f"parses by {syntax_parser_name(None, parses_dir)!r}")
    args = Seq2SeqTrainingArguments(
        output_dir=str(Path(model_dir) / f"scoring_{split}"), per_device_eval_batch_size=batch_size,
        predict_with_generate=True, use_cpu=use_cpu, bf16=bf16, report_to="none",
        remove_unused_columns=not method_columns(settings),  # the methods' own input columns stay for the collator
        generation_num_beams=num_beams, generation_max_length=max_length,
    )
    trainer = HeadAttnSeq2SeqTrainer(model=model, args=args, data_collator=collator(tokenizer, model, settings),
                                     processing_class=tokenizer)
    return translate_and_score(trainer, features[split], raw[split], tokenizer, target_lang, num_beams, max_length,
                               output_file)
