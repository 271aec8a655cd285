"""Parses made elsewhere: CoNLL-U dependency files and Penn-Treebank bracketed constituency trees.

Sentence `k` of a file is the parse of example `k` of the dataset. Its words are matched against the example's
text ([`match_words`][hf_headattn.syntax_inputs.parsing.match_words]), so a file that belongs to another corpus, or has
fewer sentences than the corpus, raises an error naming the example instead of being misaligned; one with more sentences
than the corpus raises a `ValueError` in [`parse_corpus`][hf_headattn.syntax_inputs.dataset.parse_corpus]
(`check_count`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .parsing import Dependencies, PhraseTree, SyntaxInputError, match_words, phrase_tree_from_bracketed


def _fingerprint(path: Path) -> str:
    return f"{path.name}:{hashlib.sha1(path.read_bytes()).hexdigest()}"


def _read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file; a file in another encoding raises `ValueError` naming it and the byte."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 (byte {err.object[err.start]:#04x} at offset {err.start}); expected a "
                         "UTF-8 file, e.g. converted with `iconv -f latin1 -t utf-8`") from None


def _missing(index: int, path: Path, what: str, count: int) -> SyntaxInputError:
    return SyntaxInputError(index, f"{path} has only {count} {what}, expected one for every example "
                                   f"(line up one per example, in order)")


def _check_count(path: Path, what: str, count: int, examples: int) -> None:
    """Refuse a file with more parses than the dataset has examples (fewer are named example by example)."""
    if count > examples:
        raise ValueError(f"{path} has {count} {what} but the dataset has {examples} examples; expected one per "
                         "example, in order (a parse of more lines, or of another corpus?)")


class BracketedTreeFile:
    """Pre-parsed constituency trees, one Penn-Treebank bracketed tree per line (line `k` = example `k`)."""

    def __init__(self, path):
        self.path = Path(path)
        self.trees = _read_lines(self.path)
        self.fingerprint = _fingerprint(self.path)

    def check_count(self, examples: int) -> None:
        """Raise `ValueError` if the file has more trees than the `examples` of the dataset."""
        _check_count(self.path, "trees (lines)", len(self.trees), examples)

    def parse(self, texts: list[str], indices: list[int]) -> list[PhraseTree]:
        out = []
        for text, index in zip(texts, indices):
            if index >= len(self.trees):
                raise _missing(index, self.path, "trees (lines)", len(self.trees))
            out.append(phrase_tree_from_bracketed(self.trees[index], text, index))
        return out


def read_conllu(path) -> list[tuple[list[tuple[str, int, int]], list[int]]]:
    """Sentences of a CoNLL-U file as `(surface, heads)`.

    `surface` lists the forms that appear in the text with the (0-based, inclusive) range of words they cover: a
    multiword token such as `don't` covers its words `do` and `n't`, which then share its span. `heads` are
    0-based (`-1` for the root). Empty nodes (`8.1`) are skipped. Format errors (a HEAD that is not 0 or another
    token of the sentence included) name the file and line, in the file's own numbering.
    """
    path = Path(path)
    sentences, surface, heads, linenos, span_end = [], [], [], [], -1
    lines = _read_lines(path) + [""]
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            if heads:
                _check_conllu_heads(path, heads, linenos)
                sentences.append((surface, heads))
            surface, heads, linenos, span_end = [], [], [], -1
            continue
        if line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise ValueError(f"{path}:{lineno}: expected 10 tab-separated columns, got {len(cols)}: {line!r}")
        wid, form, head = cols[0], cols[1], cols[6]
        if "." in wid:
            continue
        if "-" in wid:
            first, last = (int(x) - 1 for x in wid.split("-"))
            surface.append((form, first, last))
            span_end = last
            continue
        if not wid.isdigit() or int(wid) != len(heads) + 1 or not head.isdigit():
            raise ValueError(f"{path}:{lineno}: expected word id {len(heads) + 1} and an integer head, "
                             f"got id {wid!r} head {head!r}")
        if len(heads) > span_end:
            surface.append((form, len(heads), len(heads)))
        heads.append(int(head) - 1)
        linenos.append(lineno)
    return sentences


def _check_conllu_heads(path: Path, heads: list[int], linenos: list[int]) -> None:
    """Every HEAD is 0 (the root) or the ID of another token of the sentence; errors speak the file's numbering."""
    n = len(heads)
    for token, (head, lineno) in enumerate(zip(heads, linenos), 1):
        if head + 1 == token:
            raise ValueError(f"{path}:{lineno}: token {token} has HEAD {token} (itself); expected 0 for the root or "
                             f"the ID of another token of the sentence (1..{n})")
        if head + 1 > n:
            raise ValueError(f"{path}:{lineno}: token {token} has HEAD {head + 1} but the sentence has only {n} "
                             f"tokens; expected 0 for the root or a token ID 1..{n}")


def write_conllu(path, texts: list[str], parses: list[Dependencies]) -> Path:
    """Write dependency `parses` of `texts` as CoNLL-U (sentence `k` = `texts[k]`), for
    [`ConlluFile`][hf_headattn.syntax_inputs.readers.ConlluFile].

    Only ID, FORM (the word's span of the text), HEAD and DEPREL (`root` or `dep`) are filled. Consecutive words
    sharing one span (a multiword token read from CoNLL-U) get a range line `i-j` with that span. Parse once on a
    machine with the parser, train elsewhere from the file.
    """
    if len(texts) != len(parses):
        raise ValueError(f"got {len(texts)} texts but {len(parses)} parses; expected one parse per text")
    lines = []
    for index, (text, parse) in enumerate(zip(texts, parses)):
        lines.append(f"# sent_id = {index}")
        spans = list(zip(parse.starts, parse.ends))
        for word, ((start, end), head) in enumerate(zip(spans, parse.heads)):
            form = text[start:end]
            if not form or any(c.isspace() for c in form):
                raise SyntaxInputError(index, f"word {word} spans {form!r}; expected a non-empty span without spaces")
            if (word == 0 or spans[word - 1] != (start, end)) and spans[word + 1:word + 2] == [(start, end)]:
                last = word + 1
                while last + 1 < len(spans) and spans[last + 1] == (start, end):
                    last += 1
                lines.append(f"{word + 1}-{last + 1}\t{form}" + "\t_" * 8)
            lines.append("\t".join([str(word + 1), form, "_", "_", "_", "_", str(head + 1),
                                    "root" if head < 0 else "dep", "_", "_"]))
        lines.append("")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class ConlluFile:
    """Dependency parses from a CoNLL-U file (sentence `k` = example `k`), for users who parse elsewhere."""

    def __init__(self, path):
        self.path = Path(path)
        self.sentences = read_conllu(self.path)
        self.fingerprint = _fingerprint(self.path)

    def check_count(self, examples: int) -> None:
        """Raise `ValueError` if the file has more sentences than the `examples` of the dataset."""
        _check_count(self.path, "sentences", len(self.sentences), examples)

    def parse(self, texts: list[str], indices: list[int]) -> list[Dependencies]:
        out = []
        for text, index in zip(texts, indices):
            if index >= len(self.sentences):
                raise _missing(index, self.path, "sentences", len(self.sentences))
            surface, heads = self.sentences[index]
            unit_starts, unit_ends = match_words([form for form, _, _ in surface], text, index)
            starts, ends = [0] * len(heads), [0] * len(heads)
            for (_, first, last), start, end in zip(surface, unit_starts, unit_ends):
                starts[first:last + 1] = [start] * (last + 1 - first)
                ends[first:last + 1] = [end] * (last + 1 - first)
            out.append(Dependencies(starts, ends, list(heads)))
        return out
