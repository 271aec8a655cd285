"""Alignment of parser words to the model tokenizer's subword tokens.

Each token gets a character span in the source text: from `offset_mapping` for fast (`tokenizers`-backed)
tokenizers such as mBART's, and for sentencepiece tokenizers without offsets (Marian's) by reconstructing the piece
boundaries, walking the pieces along the text
([`sentencepiece_spans`][hf_headattn.syntax_inputs.alignment.sentencepiece_spans]). A token then belongs to the word
that covers its first non-space character ([`token_words`][hf_headattn.syntax_inputs.alignment.token_words]).

Policies:

* special tokens (mBART's `</s>` and language code, Marian's `</s>`; whatever `special_tokens_mask` marks)
  belong to no word (`-1`); the features relate them only to themselves;
* a token with no character of its own (a bare `▁` piece) belongs to the word that follows it;
* a token that straddles two words belongs to the first; the second word keeps the tokens that start in it, if
  any (a word left with no token simply has no token to carry its relations);
* truncation is the tokenizer's own: spans are read from the very encoding whose `input_ids` the model gets.
"""

from __future__ import annotations

import unicodedata

import numpy as np

from .parsing import SyntaxInputError

SPIECE_UNDERLINE = "\u2581"


def _skippable(char: str) -> bool:
    """Characters sentencepiece's normalizer drops or folds into a piece boundary (whitespace, controls)."""
    return char.isspace() or unicodedata.category(char) in ("Cc", "Cf")


def sentencepiece_spans(pieces: list[str], text: str, index: int) -> list[tuple[int, int]]:
    """Character spans in `text` of sentencepiece `pieces` (as `tokenizer.tokenize(text)` returns them).

    Pieces are matched in order against the NFKC-normalized text (character by character, so each normalized
    character maps back to the original character it came from; `ﬁ` gives pieces `f` and `i` that both map
    to it), skipping whitespace and control characters between them. A bare `▁` piece gets the empty span at
    the next character. Raises [`SyntaxInputError`][hf_headattn.syntax_inputs.parsing.SyntaxInputError] when a piece
    does not spell the text where expected.
    """
    norm, back = [], []
    for i, char in enumerate(text):
        for c in unicodedata.normalize("NFKC", char):
            norm.append(c)
            back.append(i)
    back.append(len(text))
    spans, pos = [], 0
    for k, piece in enumerate(pieces):
        begin = None
        for char in piece.replace(SPIECE_UNDERLINE, ""):
            while pos < len(norm) and norm[pos] != char and _skippable(norm[pos]):
                pos += 1
            if pos >= len(norm) or norm[pos] != char:
                hint = ("" if unicodedata.is_normalized("NFC", text) else "; the text is not in Unicode NFC (e.g. "
                        "decomposed accents): unicode_normalization='NFC' normalises it (an option of "
                        "add_syntax_features and hf_headattn.translate; hf-headattn translate --unicode_normalization "
                        "NFC)")
                raise SyntaxInputError(index, f"sentencepiece piece {k} {piece!r} does not spell the text at "
                                              f"character {back[pos]} of {text!r}; expected the tokenizer's pieces "
                                              f"to spell the text in order{hint}")
            begin = pos if begin is None else begin
            pos += 1
        if begin is None:  # bare "▁": empty span where the next word starts
            while pos < len(norm) and _skippable(norm[pos]):
                pos += 1
            spans.append((back[pos], back[pos]))
        else:
            spans.append((back[begin], back[pos - 1] + 1))
    return spans


def token_char_spans(tokenizer, text: str, encoding: dict, index: int) -> list[tuple[int, int] | None]:
    """Character span of every token of one encoded text, `None` for special tokens.

    Parameters
    ----------
    tokenizer : transformers tokenizer
        Fast tokenizers need `encoding["offset_mapping"]`; others are reconstructed from
        `tokenizer.tokenize(text)`, honouring `tokenizer.truncation_side`.
    text : str
    encoding : dict
        One example's `input_ids` and `special_tokens_mask` (and `offset_mapping` for fast tokenizers), as
        returned by `tokenizer(..., return_special_tokens_mask=True)`.
    index : int
        Example index, for error messages.
    """
    special = encoding["special_tokens_mask"]
    if tokenizer.is_fast:
        return [None if s else (int(a), int(b)) for s, (a, b) in zip(special, encoding["offset_mapping"])]
    pieces = tokenizer.tokenize(text)
    kept = slice(0, len(special) - sum(special))  # truncation keeps the first pieces, or the last ones
    if tokenizer.truncation_side == "left":
        kept = slice(max(len(pieces) - kept.stop, 0), len(pieces))
    ids = [i for i, s in zip(encoding["input_ids"], special) if not s]
    if tokenizer.convert_tokens_to_ids(pieces[kept]) != ids:
        raise SyntaxInputError(index, f"tokenize() gives pieces {pieces[kept]} whose ids differ from the encoding's "
                                      f"non-special input_ids {ids}; expected the same tokenization")
    spans = iter(sentencepiece_spans(pieces, text, index)[kept])
    return [None if s else next(spans) for s in special]


def token_words(spans: list[tuple[int, int] | None], starts, ends, text: str, index: int) -> list[int]:
    """Word index of every token (`-1` for `None` spans), for words with character spans `[starts, ends)`.

    A token belongs to the word covering its first non-space character; a token without one (bare `▁`, a
    whitespace-only span) to the word that follows it, or at the very end to the last word. Overlapping word spans
    (the words of one CoNLL-U multiword token) go to the first word.
    """
    owner = np.full(len(text) + 1, -1, dtype=np.int64)
    for w in range(len(starts) - 1, -1, -1):
        owner[starts[w]:ends[w]] = w
    visible = np.flatnonzero([not _skippable(c) for c in text])
    words = []
    for k, span in enumerate(spans):
        if span is None:
            words.append(-1)
            continue
        at = min(int(np.searchsorted(visible, span[0])), len(visible) - 1)  # first visible char at/after start
        if at < 0:
            raise SyntaxInputError(index, f"token {k} has no text to align in {text!r}")
        char = visible[at]
        if owner[char] < 0:
            raise SyntaxInputError(index, f"token {k} covers character {char} ({text[char]!r}) of {text!r}, which "
                                          "no parsed word covers; expected the parse to cover the whole text")
        words.append(int(owner[char]))
    return words
