"""Translate raw text with a trained model, whatever its methods: `hf_headattn.translate` (and
`hf-headattn translate`, a `marian-decoder` / `fairseq-interactive` for the command line).

Methods with forward inputs of their own need them at inference too (SEA/RHE: the source's parse).
[`translate`][hf_headattn.experiment.translate.translate] makes them as training does: each switched-on method's kit
makes its columns for the texts (`MethodKit. inference_inputs`, e.g. SEA's parser recorded in the model's config by
`hf-headattn train`), then the collator of `collator` turns them into the batch, as in training.
"""

from __future__ import annotations

import logging
import sys
import unicodedata
from collections.abc import Callable, Mapping
from contextlib import contextmanager

import datasets

from ..deprecation import NEXT_RELEASE, warn_deprecated
from ..registry import active_methods
from ..settings_checks import check_choice
from .kit import MethodInputError
from .method_inputs import input_kits
from .recipe_parts import collator, set_languages

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 32
_ON_PARSE_ERROR = ("error", "skip")
_POSITIVE_GENERATE_KWARGS = ("num_beams", "max_length", "max_new_tokens")
_SHOWN_LINES = 10  # truncated lines named in the warning
UNICODE_FORMS = ("NFC", "NFKC", "NFD", "NFKD")


def translate(model, tokenizer, texts: list[str], *, input_options: Mapping | None = None,
              batch_size: int = DEFAULT_BATCH_SIZE,
              max_source_length: int | None = None, source_lang_code: str | None = None,
              target_lang_code: str | None = None, on_parse_error: str | Callable = "error",
              unicode_normalization: str | None = None, progress: bool = False, **generate_kwargs) -> list[str]:
    """Translate raw sentences with `model.generate`; one translation per text, in the order given.

    Texts are sorted by length and translated `batch_size` at a time on the model's device (the model is put in
    eval mode meanwhile). Empty (or whitespace-only) texts give `""` without running the model. The inputs of
    the model's methods that have their own (SEA/RHE: the sources' parses) are made as in training.

    Parameters
    ----------
    model
        HeadAttn mBART/Marian model (any method, or none), or a stock one
    tokenizer
        its tokenizer
    texts
        list of str
    input_options : dict, optional
        Options for the providers of the methods' own inputs (each switched-on kit's `inference_inputs`), e.g.
        `{"parser": "spacy:en_core_web_trf"}` (a name or a parser object): for methods whose inputs come from a
        parse of the source (SEA, Rel_Pos+RHE, Localness+RHE; `hf_headattn.syntax_inputs`), the parser instead
        of the one the model's config records (`config.syntax_parser`). `parser=` (before 0.3.0) is
        deprecated for it.
    batch_size : int
    max_source_length : int, optional
        Source truncation in tokens (default: the model's `max_position_embeddings`). Texts longer than that are
        truncated, with a warning naming them (1-based, as line numbers).
    source_lang_code, target_lang_code : str, optional
        mBART language codes (`"en_XX"`, `"de_DE"`), given together; set up with
        `set_languages`. Without them the tokenizer's `src_lang` and the
        model's saved generation config apply.
    on_parse_error : "error", "skip" or callable
        A text for which a method cannot make its inputs (SEA/RHE: the parser or the alignment cannot handle it)
        raises that [`MethodInputError`][hf_headattn.experiment.kit.MethodInputError] (SEA's: `SyntaxInputError`) naming
        its index in `texts` ("error"), or is translated without the methods' own inputs: with the inputs that change
        nothing (`MethodSpec.neutral_inputs`; SEA's: a dependency mask that relates every pair and phrase positions 0,
        which select no RHE head and leave the attention of SEA-on-all-heads unchanged), so the model computes what
        the same weights without those methods compute ("skip" logs a warning; a callable gets the error instead).
        Never dropped.
    unicode_normalization : "NFC", "NFKC", "NFD" or "NFKD", optional
        Normalise the texts to this Unicode form first (default None: the text as it is). SEA/RHE need it for
        sources whose characters the tokenizer normalises differently: decomposed accents (NFD) with a
        sentencepiece tokenizer raise SEA's `SyntaxInputError` otherwise, and "NFC" fixes
        that. The training pipeline (`prepare_features`, `hf-headattn train`) does not normalise:
        it reads the text as it is (Multi30k is NFC; `add_syntax_features` takes the same option). Sentencepiece
        tokenizers NFKC-normalise anyway, so NFC leaves their tokens unchanged.
    progress : bool
        A progress bar (sentences) on stderr.
    **generate_kwargs
        Passed to `model.generate` (`num_beams`, `max_new_tokens`, ...). Without `max_length` or
        `max_new_tokens`, the model's generation config applies, and where it sets neither (transformers would
        stop after 20 tokens) `max_length` is `max_position_embeddings`.
    """
    if "parser" in generate_kwargs:  # the keyword of releases before 0.3.0
        warn_deprecated("translate(parser=...)", "translate(input_options={'parser': ...})", NEXT_RELEASE)
        input_options = {"parser": generate_kwargs.pop("parser"), **(input_options or {})}
    input_options = dict(input_options or {})
    if isinstance(texts, str) or not all(isinstance(text, str) for text in texts):
        raise ValueError(f"texts must be a list of strings, got {type(texts).__name__}"
                         + ("" if isinstance(texts, str) else f" holding {sorted({type(t).__name__ for t in texts})}"))
    if on_parse_error not in _ON_PARSE_ERROR and not callable(on_parse_error):
        raise ValueError(f"on_parse_error must be one of {_ON_PARSE_ERROR} or a callable, got {on_parse_error!r}")
    positive = {"batch_size": batch_size, "max_source_length": max_source_length,
                **{key: generate_kwargs.get(key) for key in _POSITIVE_GENERATE_KWARGS}}
    for name, value in positive.items():
        if (value is not None or name == "batch_size") and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if unicode_normalization is not None:
        check_choice(unicode_normalization, "unicode_normalization", UNICODE_FORMS)
        texts = [unicodedata.normalize(unicode_normalization, text) for text in texts]
    if (source_lang_code is None) != (target_lang_code is None):
        raise ValueError(f"give source_lang_code and target_lang_code together, got {source_lang_code!r} and "
                         f"{target_lang_code!r}")
    if source_lang_code is not None:
        set_languages(tokenizer, model, source_lang_code, target_lang_code)
    max_source_length = max_source_length or model.config.max_position_embeddings
    generation = model.generation_config
    if not {"max_length", "max_new_tokens"} & set(generate_kwargs) and generation.max_length is None \
            and generation.max_new_tokens is None:
        generate_kwargs["max_length"] = model.config.max_position_embeddings
    # each switched-on method with inputs of its own prepares once (SEA loads its parser: a missing one fails now)
    makers = [kit.inference_inputs(model, tokenizer, max_source_length=max_source_length, **input_options)
              for kit in input_kits({spec.name: getattr(model.config, spec.name) or {}
                                     for spec in active_methods(model.config)})
              if kit.inference_inputs is not None]
    if not makers and any(value is not None for value in input_options.values()):
        logger.warning(f"the model switches on no method that makes inputs of its own from the text; the input "
                       f"options {sorted(input_options)} are not used")

    todo = [i for i, text in enumerate(texts) if text.strip()]
    full = [len(ids) for ids in tokenizer([texts[i] for i in todo], verbose=False)["input_ids"]] if todo else []
    _warn_truncated([i for i, n in zip(todo, full) if n > max_source_length], max_source_length,
                    model.config.max_position_embeddings)
    lengths = [min(n, max_source_length) for n in full]
    order = [todo[k] for k in sorted(range(len(todo)), key=lambda k: -lengths[k])]  # longest first, stable
    out = [""] * len(texts)
    batcher = _Batcher(model, tokenizer, texts, makers, max_source_length, on_parse_error)
    was_training = model.training
    model.eval()
    try:
        with _quiet_datasets(), _progress_bar(len(order), progress) as bar:
            for start in range(0, len(order), batch_size):
                chunk = order[start:start + batch_size]
                for indices, batch in batcher(chunk):
                    batch = {key: value.to(model.device) for key, value in batch.items() if value is not None}
                    generated = model.generate(**batch, **generate_kwargs)
                    for index, text in zip(indices, tokenizer.batch_decode(generated, skip_special_tokens=True)):
                        out[index] = text.strip()
                bar.update(len(chunk))
    finally:
        model.train(was_training)
    return out


def _warn_truncated(indices: list[int], max_source_length: int, limit: int) -> None:
    """Warn that the texts at `indices` were truncated, naming them as 1-based line numbers (the first few)."""
    if not indices:
        return
    shown = ", ".join(str(i + 1) for i in indices[:_SHOWN_LINES])
    more = f" and {len(indices) - _SHOWN_LINES} more" if len(indices) > _SHOWN_LINES else ""
    logger.warning(f"{len(indices)} source line(s) longer than max_source_length={max_source_length} tokens were "
                   f"truncated: line(s) {shown}{more} (1-based); split them, or raise max_source_length (the "
                   f"model's limit: max_position_embeddings={limit})")


class _Batcher:
    """Model inputs for a chunk of texts: `[(indices, batch), ...]`, one batch, or two where the methods could
    not make their inputs for some texts (those go with the inputs that change nothing)."""

    def __init__(self, model, tokenizer, texts, makers, max_source_length, on_parse_error):
        self.model, self.tokenizer, self.texts, self.makers = model, tokenizer, texts, makers
        self.max_source_length, self.on_parse_error = max_source_length, on_parse_error
        self.plain_collator = collator(tokenizer, model, {})
        self.method_collator = collator(tokenizer, model, model.config.to_dict())

    def __call__(self, indices: list[int]) -> list[tuple[list[int], dict]]:
        if not self.makers:
            return [(indices, self.plain_collator(self._tokenized(indices)))]
        try:
            return [(indices, self.method_collator(self._with_inputs(indices)))]
        except MethodInputError:
            if self.on_parse_error == "error":
                raise
        made, failed = [], []  # one text at a time, to find every text that fails
        for index in indices:
            try:
                made.append((index, self._with_inputs([index])[0]))
            except MethodInputError as err:
                failed.append(index)
                self._failed(err)
        batches = []
        if made:
            batches.append(([i for i, _ in made], self.method_collator([f for _, f in made])))
        if failed:
            batches.append((failed, self._neutral(self.plain_collator(self._tokenized(failed)))))
        return batches

    def _tokenized(self, indices: list[int]) -> list[dict]:
        """Tokenized as `tokenize_parallel` tokenizes sources."""
        encoded = self.tokenizer([self.texts[i] for i in indices], max_length=self.max_source_length, truncation=True)
        return [{key: encoded[key][k] for key in ("input_ids", "attention_mask")} for k in range(len(indices))]

    def _with_inputs(self, indices: list[int]) -> list[dict]:
        """The tokenized texts with every method's columns (`MethodKit.inference_inputs`); errors name their
        index in `texts`."""
        features = self._tokenized(indices)
        for make in self.makers:
            try:
                columns = make([self.texts[i] for i in indices])
            except MethodInputError as err:
                raise err.renumbered(indices[err.index]) from err
            for feature, own in zip(features, columns):
                feature.update(own)
        return features

    def _failed(self, err) -> None:
        if callable(self.on_parse_error):
            self.on_parse_error(err)
        else:
            logger.warning(f"{err}; translated without the methods' own inputs")

    def _neutral(self, batch: dict) -> dict:
        """The switched-on methods' inputs that change nothing (`MethodSpec.neutral_inputs`)."""
        for spec in active_methods(self.model.config):
            if spec.neutral_inputs is not None:
                batch.update(spec.neutral_inputs(*batch["input_ids"].shape))
        return batch


@contextmanager
def _quiet_datasets():
    """No `datasets` progress bars for the per-batch maps."""
    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


def _progress_bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="sentence", desc="Translating", disable=not enabled, file=sys.stderr)
