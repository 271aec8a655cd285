"""A joint source/target SentencePiece vocabulary wrapped as a HF `MarianTokenizer`.

Small NMT systems trained from scratch (Multi30k) share one subword vocabulary between source and
target. `train_joint_sentencepiece` trains one unigram model (Kudo 2018, "Subword Regularization")
and lays it out as Marian's converted checkpoints do: `</s>` = 0, `<unk>` = 1, the pieces in
SentencePiece order, and `<pad>` appended last (id `vocab_size - 1`, Marian's
`decoder_start_token_id`). The same `.spm` file serves as `source.spm` and `target.spm`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path

import datasets
import sentencepiece as spm
from transformers import AutoTokenizer, MarianTokenizer

EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
SACREMOSES_ADVICE = "Recommended: pip install sacremoses"
"""What `MarianTokenizer` warns when sacremoses is missing; transformers 5's never uses it (its `normalize`, the
only user, is called nowhere: `tests/test_tokenization.py` checks it), so the advice is noise to our users."""


@contextlib.contextmanager
def _without_sacremoses_advice():
    """Leave out `MarianTokenizer`'s advice to install sacremoses (`SACREMOSES_ADVICE`), every other warning
    kept."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SACREMOSES_ADVICE)
        yield


def load_tokenizer(name_or_path, **kwargs):
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)`, without `MarianTokenizer`'s advice to install
    sacremoses (`SACREMOSES_ADVICE`), and `trust_remote_code=False` unless given: a checkpoint saved by this
    package carries remote code (`auto_map`), for which transformers would otherwise ask at the terminal and wait
    15 s; the package's own classes load it without."""
    kwargs.setdefault("trust_remote_code", False)
    with _without_sacremoses_advice():
        return AutoTokenizer.from_pretrained(name_or_path, **kwargs)


def _training_texts(texts) -> list[str]:
    """Strings from an iterable of str, a `translation` Dataset, or a DatasetDict (its `train` split)."""
    if isinstance(texts, datasets.DatasetDict):
        if "train" not in texts:
            raise ValueError(f"a DatasetDict needs a 'train' split to train on, got splits {list(texts)}")
        texts = texts["train"]
    if isinstance(texts, datasets.Dataset):
        if "translation" not in texts.column_names:
            raise ValueError(f"expected a 'translation' column, got columns {texts.column_names}")
        return [s for pair in texts["translation"] for s in pair.values()]
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of sentences, got a single str")
    out = list(texts)
    for i, s in enumerate(out):
        if not isinstance(s, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(s).__name__}")
    return out


def train_joint_sentencepiece(
    texts: Iterable[str] | datasets.Dataset | datasets.DatasetDict,
    vocab_size: int,
    output_dir: str | os.PathLike,
    *,
    source_lang: str | None = None,
    target_lang: str | None = None,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    normalization_rule_name: str = "nmt_nfkc",
    input_sentence_size: int = 1_000_000,
    num_threads: int = 1,
    seed: int = 0,
    model_max_length: int = 512,
) -> MarianTokenizer:
    """Train one joint SentencePiece model and save it as a `MarianTokenizer` in `output_dir`.

    Parameters
    ----------
    texts : iterable of str, datasets.Dataset or datasets.DatasetDict
        Training sentences. A Dataset contributes every language of its `translation` column
        (source and target); a DatasetDict contributes its `train` split only.
    vocab_size : int
        Size of the final vocabulary, `<pad>` included (SentencePiece learns `vocab_size - 1` pieces).
    output_dir : path
        Created if needed; receives `source.spm`, `target.spm`, `vocab.json` and the tokenizer config,
        loadable with `AutoTokenizer.from_pretrained(output_dir)`.
    source_lang, target_lang : str, optional
        Stored in the tokenizer config.
    model_type : {"unigram", "bpe"}
    character_coverage : float
        Fraction of characters covered; 1.0 for small alphabets (European languages).
    normalization_rule_name : str
        SentencePiece normalisation (`"nmt_nfkc"`, `"identity"`, ...).
    input_sentence_size : int
        At most this many sentences, sampled with `seed`, are used for training.
    num_threads : int
        Training threads. The learned model depends on it: keep it fixed for reproducible vocabularies.
    seed : int
        Seed of SentencePiece's (global) random generator, used when sampling sentences.
    model_max_length : int

    Returns
    -------
    transformers.MarianTokenizer
        Reading its files in `output_dir`; `len(tokenizer) == vocab_size`, `pad_token_id == vocab_size - 1`.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 4:
        raise ValueError(f"vocab_size must be an int >= 4 (</s>, <unk>, <pad> and pieces), got {vocab_size!r}")
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
    sentences = _training_texts(texts)
    if not any(s.strip() for s in sentences):
        raise ValueError(f"no non-empty training sentence among {len(sentences)} given")

    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            vocab_size=vocab_size - 1,  # <pad> is appended to the vocab, as in Marian's conversion
            model_type=model_type,
            character_coverage=character_coverage,
            normalization_rule_name=normalization_rule_name,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            num_threads=num_threads,
            eos_id=0,
            unk_id=1,
            bos_id=-1,
            pad_id=-1,
            eos_piece=EOS,
            unk_piece=UNK,
            minloglevel=2,  # no progress logs
        )
    except RuntimeError as err:
        msg = str(err).split("] ", 1)[-1]
        limit = re.search(r"value <= (\d+)", msg)
        if limit:
            msg = f"at most {int(limit.group(1)) + 1} (with <pad>) is possible on this data"
        raise ValueError(
            f"cannot train a vocabulary of vocab_size={vocab_size} on {len(sentences)} sentences: {msg}"
        ) from None

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("source.spm", "target.spm"):
        (out / name).write_bytes(model.getvalue())
    proc = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = {proc.id_to_piece(i): i for i in range(proc.get_piece_size())}
    vocab[PAD] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0), encoding="utf-8")

    with _without_sacremoses_advice():
        tokenizer = MarianTokenizer(
            source_spm=str(out / "source.spm"),
            target_spm=str(out / "target.spm"),
            vocab=str(out / "vocab.json"),
            source_lang=source_lang,
            target_lang=target_lang,
            unk_token=UNK,
            eos_token=EOS,
            pad_token=PAD,
            model_max_length=model_max_length,
            name_or_path=str(out),  # where it is saved, as a loaded one records
        )
    tokenizer.save_pretrained(out)
    return tokenizer
