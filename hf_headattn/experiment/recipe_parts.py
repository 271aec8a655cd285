"""The parts the training recipes are built from (`hf_headattn.commands.train` and the other commands of
`hf_headattn.commands`): data, model and tokenizer, features, collator, test-set translation and scoring. (The
Trainer itself: `trainer`.)"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
from transformers import AutoConfig

from ..configuration import HeadAttnMarianConfig
from ..modeling import HeadAttnMarianMTModel, HeadAttnMBartForConditionalGeneration
from .data import load_parallel_dataset, tokenize_parallel
from .evaluation import compute_translation_metrics
from .method_inputs import input_kits, method_collator, prepare_method_features
from .multi30k import DATA_ENV, Multi30kError, find_multi30k
from .outputs import write_json_atomic
from .presets import check_setting_keys, model_shape
from .tokenization import load_tokenizer, train_joint_sentencepiece

logger = logging.getLogger(__name__)

write_json = write_json_atomic
"""The recipes' JSON writer (results.json, ...): the atomic one, so that a killed run never leaves half a file."""

MODEL_CLASSES = {
    "mbart": HeadAttnMBartForConditionalGeneration,
    "headattn_mbart": HeadAttnMBartForConditionalGeneration,
    "marian": HeadAttnMarianMTModel,
    "headattn_marian": HeadAttnMarianMTModel,
}
"""Which of our classes loads a checkpoint of each model type."""


@dataclass
class ParallelDataArguments:
    """The data flags the recipes share (run_translation.py's names); `load_recipe_data` reads them."""

    source_lang: str = field(default="en", metadata={"help": "Key of the source side in the data"})
    target_lang: str = field(default="de", metadata={"help": "Key of the target side in the data"})
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset"})
    dataset_config_name: str | None = field(default=None)
    train_file: str | None = field(default=None, metadata={"help": "TSV, JSON lines or a prefix of PREFIX.<lang>"})
    validation_file: str | None = field(default=None)
    test_file: str | None = field(default=None)
    multi30k_dir: str | None = field(default=None, metadata={
        "help": "Folder of Multi30k's {train,val,test_2016_flickr}.<lang>.gz. Without any data flag the recipes use "
                "Multi30k found or downloaded: $HF_HEADATTN_DATA, ../shared/data/multi30k, the cache, the download"})
    max_source_length: int = field(default=128)
    max_target_length: int = field(default=128)
    max_train_samples: int | None = field(default=None)
    max_eval_samples: int | None = field(default=None)
    max_predict_samples: int | None = field(default=None)
    num_beams: int = field(default=5, metadata={"help": "Beam size for evaluation and test (the papers use 5)"})


def found_data(args: ParallelDataArguments) -> dict[str, str]:
    """The Multi30k folder a recipe reads when no data flag names it (found through `$HF_HEADATTN_DATA`,
    `../shared` or the cache, or downloaded: `multi30k.find_multi30k`), as
    `check_output_dir`'s `inputs` (`{}` when a flag names the data: the flags are checked as
    given), so that no run writes into it however it was found. The folder is recorded in `args.multi30k_dir`
    (what `load_recipe_data` then reads, and `results.json` records). Raises
    `Multi30kError`."""
    if args.multi30k_dir or not _reads_multi30k(args):
        return {}
    args.multi30k_dir = str(find_multi30k(languages=(args.source_lang, args.target_lang)))
    found = f"${DATA_ENV}" if os.environ.get(DATA_ENV) else "found or downloaded"
    return {f"the Multi30k folder ({found})": args.multi30k_dir}


def _reads_multi30k(args: ParallelDataArguments) -> bool:
    """Multi30k is the data: named by `--multi30k_dir`, or no other data flag given."""
    return bool(args.multi30k_dir) or not (args.dataset_name or args.train_file or args.validation_file
                                           or args.test_file)


def load_recipe_data(args: ParallelDataArguments) -> datasets.DatasetDict:
    """The recipes' data: `args` carries run_translation-style fields (`source_lang`, `target_lang`,
    `dataset_name`, `dataset_config_name`, `train_file`/`validation_file`/`test_file`, `multi30k_dir`,
    `max_train_samples`/`max_eval_samples`/`max_predict_samples`). With no data source at all, Multi30k
    (found or downloaded by `multi30k.find_multi30k`)."""
    files = {split: path for split, path in (("train", args.train_file), ("validation", args.validation_file),
                                             ("test", args.test_file)) if path}
    multi30k_dir = None
    if _reads_multi30k(args):
        multi30k_dir = find_multi30k(args.multi30k_dir or None, languages=(args.source_lang, args.target_lang))
    return load_parallel_dataset(
        args.source_lang, args.target_lang, dataset_name=args.dataset_name,
        dataset_config_name=args.dataset_config_name, data_files=files or None, multi30k_dir=multi30k_dir,
        max_train_samples=args.max_train_samples, max_eval_samples=args.max_eval_samples,
        max_predict_samples=args.max_predict_samples,
    )


def read_data(parser, args: ParallelDataArguments) -> datasets.DatasetDict:
    """`load_recipe_data` for a recipe: a bad data flag (a missing or corrupt file, an unknown language, unequal
    line counts, no Multi30k to be found or downloaded) is a usage error (exit 2) naming it."""
    try:
        return load_recipe_data(args)
    except (Multi30kError, FileNotFoundError, ValueError) as error:
        parser.error(str(error))


def set_languages(tokenizer, model, source_code: str, target_code: str) -> None:
    """Language codes for the tokenizer, and how generation starts with the target code.

    mBART-50 tokenizers write targets as `[code] X </s>`: generation starts from `</s>` and forces the code
    (`forced_bos_token_id`). mBART (cc25, en-ro) tokenizers write `X </s> [code]`: the code starts the decoder
    (`decoder_start_token_id`), as `shift_tokens_right` does in training.
    """
    for code in (source_code, target_code):
        if tokenizer.convert_tokens_to_ids(code) in (None, tokenizer.unk_token_id):
            raise ValueError(f"language code {code!r} is not in the tokenizer's vocabulary (e.g. en_XX, de_DE)")
    tokenizer.src_lang, tokenizer.tgt_lang = source_code, target_code
    code_id = tokenizer.convert_tokens_to_ids(target_code)
    target = tokenizer(text_target="a")["input_ids"]
    if target[0] == code_id:
        model.generation_config.forced_bos_token_id = code_id
    elif target[-1] == code_id:
        model.config.decoder_start_token_id = model.generation_config.decoder_start_token_id = code_id
    else:
        raise ValueError(f"the tokenizer does not mark targets with {target_code!r}; expected an mBART tokenizer")


def pretrained_config(name_or_path: str, settings: dict):
    """`(model class, config)` of a pretrained mBART or Marian checkpoint (hub name or folder) with the method
    `settings`: the settings are checked (keys, values, layers against the model's) without loading any weights, so
    that a recipe refuses bad ones before it writes anything."""
    model_type = AutoConfig.from_pretrained(name_or_path).model_type
    if model_type not in MODEL_CLASSES:
        raise ValueError(f"{name_or_path} is a {model_type!r} model; expected one of {sorted(MODEL_CLASSES)}")
    model_class = MODEL_CLASSES[model_type]
    check_setting_keys(settings, model_class.config_class)
    return model_class, model_class.config_class.from_pretrained(name_or_path, **settings)


def pretrained_model(name_or_path: str, settings: dict, **kwargs):
    """A pretrained mBART or Marian checkpoint (hub name or folder) as our model, with the method `settings`."""
    model_class, config = pretrained_config(name_or_path, settings)
    return model_class.from_pretrained(name_or_path, config=config, **kwargs)


def scratch_config(shape, settings: dict, max_length: int, tokenizer=None, vocab_size: int | None = None,
                   **config_kwargs) -> HeadAttnMarianConfig:
    """The config of a Marian-style model of a named shape (`presets.MODEL_SHAPES`) trained from scratch for
    `tokenizer`; without one (`vocab_size` then, stand-in special ids), the config that checks `settings`
    before the tokenizer is trained: the methods' settings are validated when a config is built."""
    ids = (dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id) if tokenizer is not None
           else dict(pad_token_id=0, eos_token_id=1))
    vocab = len(tokenizer) if tokenizer is not None else vocab_size
    return HeadAttnMarianConfig(
        **model_shape(shape), vocab_size=vocab, decoder_vocab_size=vocab, **ids,
        decoder_start_token_id=ids["pad_token_id"], forced_eos_token_id=ids["eos_token_id"],
        max_position_embeddings=max_length, scale_embedding=True, share_encoder_decoder_embeddings=True,
        **config_kwargs, **settings,
    )


def scratch_model(shape: str, tokenizer, settings: dict, max_length: int, **config_kwargs) -> HeadAttnMarianMTModel:
    """A randomly initialised Marian-style model of a named shape (`presets.MODEL_SHAPES`) for `tokenizer`."""
    return HeadAttnMarianMTModel(scratch_config(shape, settings, max_length, tokenizer, **config_kwargs))


TOKENIZER_RECORD = "headattn_tokenizer.json"
"""Beside a scratch tokenizer: what it was trained with (`scratch_tokenizer`), so that it is reused only for
the same settings and data."""


def tokenizer_record(train: datasets.Dataset, vocab_size: int, src: str, tgt: str) -> dict:
    """What a scratch tokenizer is trained from: the vocabulary size, the languages and the training pairs (their
    number and the SHA-256 of their text)."""
    digest = hashlib.sha256()
    for pair in train["translation"]:
        digest.update(f"{pair[src]}\t{pair[tgt]}\n".encode())
    return {"vocab_size": vocab_size, "source_lang": src, "target_lang": tgt, "train_pairs": len(train),
            "train_sha256": digest.hexdigest()}


def scratch_tokenizer(train: datasets.Dataset, vocab_size: int, output_dir: str | Path, src: str, tgt: str):
    """A joint sentencepiece tokenizer trained on the training sources and targets, saved in `output_dir` with
    `TOKENIZER_RECORD`. One already saved there is reused only when its record equals this run's (a resumed
    run, a study's shared tokenizer); else a `ValueError` names what differs (a tokenizer saved without a record,
    by release 0.3 or before, is reused with a warning: it cannot be checked)."""
    path = Path(output_dir)
    record = tokenizer_record(train, vocab_size, src, tgt)
    if (path / "source.spm").is_file():
        saved = path / TOKENIZER_RECORD
        if not saved.is_file():
            logger.warning(f"reusing the tokenizer in {path}, which records no {TOKENIZER_RECORD} (saved by an "
                           "earlier release), unchecked against this run's vocabulary size and data")
            return load_tokenizer(path)
        earlier = json.loads(saved.read_text(encoding="utf-8"))
        differ = {key: (earlier.get(key), value) for key, value in record.items() if earlier.get(key) != value}
        if differ:
            raise ValueError(
                f"the tokenizer in {path} was trained with other settings or data than this run's "
                f"({', '.join(f'{key}: {old!r} there, {new!r} here' for key, (old, new) in differ.items())}); "
                "expected the settings and data it was trained with, or a new folder for a new tokenizer")
        return load_tokenizer(path)
    tokenizer = train_joint_sentencepiece(train, vocab_size, path, source_lang=src, target_lang=tgt)
    write_json_atomic(path / TOKENIZER_RECORD, record)
    return tokenizer


def prepare_features(raw: datasets.DatasetDict, tokenizer, src: str, tgt: str, settings: dict,
                     max_source_length: int, max_target_length: int, num_proc: int | None = None, *,
                     config=None, **method_options) -> datasets.DatasetDict:
    """Tokenized splits (`tokenize_parallel`), with the own columns of the methods `settings` switch
    on (their kits' `prepare_features`, e.g. SEA's parses aligned to the tokens: `method_inputs`).

    `method_options`: the kits' recipe flags by name (e.g. SEA's `spacy_model=`, `syntax_parses_dir=`);
    `config`: the model's config, on which the methods record what `translate` needs to make the same inputs
    (SEA: the parser)."""
    features = tokenize_parallel(raw, tokenizer, src, tgt, max_source_length, max_target_length, num_proc=num_proc)
    job = {"tokenizer": tokenizer, "source": src, "target": tgt, "max_source_length": max_source_length,
           "max_target_length": max_target_length, "num_proc": num_proc, "config": config}
    return prepare_method_features(raw, features, settings, job, method_options)


def method_columns(settings: dict) -> list[str]:
    """The feature columns of the methods `settings` switch on (`MethodKit.columns`): the Trainer must keep them
    for the collator (`remove_unused_columns=False`)."""
    return [column for kit in input_kits(settings) for column in kit.columns]


def collator(tokenizer, model, settings: dict):
    """The batch collator: `DataCollatorForSeq2Seq`, plus the own inputs of the methods `settings` switch on
    (their kits' `collate`, with the method's settings read from the model's config, else from `settings`:
    `method_collator`)."""
    return method_collator(tokenizer, model, settings, pad_to_multiple_of=8)


def translate_and_score(trainer, features: datasets.Dataset, raw: datasets.Dataset, tokenizer, tgt: str,
                        num_beams: int, max_length: int, output_file: str | Path | None = None) -> dict:
    """Translate a split with beam search and score it with sacreBLEU/chrF against the raw (detokenised) references;
    the hypotheses go one a line into `output_file`, written by the main process only (every process translates:
    `trainer.predict` is collective, and gives each the whole split in order)."""
    prediction = trainer.predict(features, num_beams=num_beams, max_length=max_length, metric_key_prefix="test")
    ids = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    ids = torch.as_tensor(ids)
    ids = ids.masked_fill(ids < 0, tokenizer.pad_token_id)
    hypotheses = [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]
    references = [pair[tgt] for pair in raw["translation"]]
    scores = compute_translation_metrics(hypotheses, references)
    if output_file is not None and trainer.args.should_save:
        Path(output_file).write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    return scores
