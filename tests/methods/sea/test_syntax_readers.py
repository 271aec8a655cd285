"""Pre-parsed input: Penn-Treebank bracketed trees, CoNLL-U files; mismatches and short files name the example."""

import datasets
import pytest

from hf_headattn.syntax_inputs import (
    BracketedTreeFile,
    ConlluFile,
    Dependencies,
    MissingParserError,
    SyntaxInputError,
    load_benepar,
    load_spacy,
    match_words,
    parse_bracketed,
    parse_corpus,
    read_conllu,
    write_conllu,
)

TEXTS = ["A dog (brown) runs.", "Don't stop."]
TREES = ["( (S (NP (DT A) (NN dog) (PRN (-LRB- -LRB-) (JJ brown) (-RRB- -RRB-))) (VP (VBZ runs)) (. .)) )",
         "(S (VP (VB Do) (RB n't) (VP (VB stop))) (. .))"]
CONLLU = """# sent_id = 1
# text = A dog (brown) runs.
1\tA\ta\tDET\tDT\t_\t2\tdet\t_\t_
2\tdog\tdog\tNOUN\tNN\t_\t6\tnsubj\t_\t_
3\t(\t(\tPUNCT\t-LRB-\t_\t4\tpunct\t_\tSpaceAfter=No
4\tbrown\tbrown\tADJ\tJJ\t_\t2\tappos\t_\tSpaceAfter=No
5\t)\t)\tPUNCT\t-RRB-\t_\t4\tpunct\t_\t_
5.1\tis\tbe\tAUX\t_\t_\t_\t_\t4:cop\t_
6\truns\trun\tVERB\tVBZ\t_\t0\troot\t_\tSpaceAfter=No
7\t.\t.\tPUNCT\t.\t_\t6\tpunct\t_\t_

1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tDo\tdo\tAUX\tVB\t_\t3\taux\t_\t_
2\tn't\tnot\tPART\tRB\t_\t3\tneg\t_\t_
3\tstop\tstop\tVERB\tVB\t_\t0\troot\t_\tSpaceAfter=No
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "trees.txt").write_text("\n".join(TREES) + "\n")
    (tmp_path / "deps.conllu").write_text(CONLLU)
    return tmp_path


def test_parse_bracketed_words_and_parents():
    words, parents = parse_bracketed("(S (NP (DT a) (NN talk)) (VBZ ends))")
    assert words == ["a", "talk", "ends"]
    # nodes: 0-2 words, 3 S, 4 NP, 5 DT, 6 NN, 7 VBZ
    assert parents == [5, 6, 7, -1, 3, 4, 4, 3]


@pytest.mark.parametrize("tree, match", [("(S (NP a)", "unclosed"), ("(S a))", r"unbalanced '\)'"),
                                         ("(S a) (S b)", "more than one tree"), ("a (S b)", "outside brackets")])
def test_parse_bracketed_rejects_malformed(tree, match):
    with pytest.raises(ValueError, match=match):
        parse_bracketed(tree)


def test_match_words_spans_and_mismatch():
    assert match_words(["A", "(", "dog"], "A  (dog", 0) == ([0, 3, 4], [1, 4, 7])
    assert match_words(["-LRB-"], "(", 0, {"-LRB-": ("(",)}) == ([0], [1])
    with pytest.raises(SyntaxInputError, match=r"example 7: parsed word 1 'cat'.*found 'dog'"):
        match_words(["A", "cat"], "A dog", 7)
    with pytest.raises(SyntaxInputError, match=r"example 7: .*goes on with ' runs'"):
        match_words(["A", "dog"], "A dog runs", 7)


def test_bracketed_tree_file(files):
    a, b = BracketedTreeFile(files / "trees.txt").parse(TEXTS, [0, 1])
    assert [TEXTS[0][s:e] for s, e in zip(a.starts, a.ends)] == ["A", "dog", "(", "brown", ")", "runs", "."]
    assert [TEXTS[1][s:e] for s, e in zip(b.starts, b.ends)] == ["Do", "n't", "stop", "."]
    assert len(a.parents) == 7 + 12 and a.parents.count(-1) == 1


def test_bracketed_tree_file_errors_name_the_example(files):
    trees = BracketedTreeFile(files / "trees.txt")
    with pytest.raises(SyntaxInputError, match=r"example 1: parsed word 0 'Do' does not match"):
        trees.parse(["A dog (brown) runs.", "Stop it."], [0, 1])
    with pytest.raises(SyntaxInputError, match=r"example 2: .*trees.txt has only 2 trees"):
        trees.parse(TEXTS + ["More."], [0, 1, 2])


def test_read_conllu_multiword_tokens_and_empty_nodes(files):
    (s1, h1), (s2, h2) = read_conllu(files / "deps.conllu")
    assert h1 == [1, 5, 3, 1, 3, -1, 5]  # the empty node 5.1 is skipped
    assert s2 == [("Don't", 0, 1), ("stop", 2, 2), (".", 3, 3)]
    assert h2 == [2, 2, -1, 2]


def test_conllu_file_spans(files):
    a, b = ConlluFile(files / "deps.conllu").parse(TEXTS, [0, 1])
    assert [TEXTS[0][s:e] for s, e in zip(a.starts, a.ends)] == ["A", "dog", "(", "brown", ")", "runs", "."]
    assert [TEXTS[1][s:e] for s, e in zip(b.starts, b.ends)] == ["Don't", "Don't", "stop", "."]  # share the MWT
    assert b.heads == [2, 2, -1, 2]


def test_write_conllu_round_trips_multiword_tokens(files, tmp_path):
    parses = ConlluFile(files / "deps.conllu").parse(TEXTS, [0, 1])
    path = write_conllu(tmp_path / "out" / "written.conllu", TEXTS, parses)
    assert "1-2\tDon't" in path.read_text()
    assert ConlluFile(path).parse(TEXTS, [0, 1]) == parses
    assert [heads for _, heads in read_conllu(path)] == [p.heads for p in parses]


def test_write_conllu_refuses_bad_input(tmp_path):
    parses = [Dependencies([0], [1], [-1])]
    with pytest.raises(ValueError, match="got 2 texts but 1 parses"):
        write_conllu(tmp_path / "x.conllu", ["A", "B"], parses)
    with pytest.raises(SyntaxInputError, match=r"example 0: word 0 spans 'A b'"):
        write_conllu(tmp_path / "x.conllu", ["A b"], [Dependencies([0], [3], [-1])])


def test_conllu_errors_name_the_example_or_line(files):
    conllu = ConlluFile(files / "deps.conllu")
    with pytest.raises(SyntaxInputError, match=r"example 0: parsed word 1 'dog'.*found 'cat'"):
        conllu.parse(["A cat (brown) runs."], [0])
    with pytest.raises(SyntaxInputError, match=r"example 2: .*deps.conllu has only 2 sentences"):
        conllu.parse(TEXTS + ["More."], [0, 1, 2])
    (files / "bad.conllu").write_text("1\tA\ta\tDET\n")
    with pytest.raises(ValueError, match=r"bad.conllu:1: expected 10 tab-separated columns, got 4"):
        read_conllu(files / "bad.conllu")


def test_files_with_more_parses_than_examples_are_refused(files):
    # regression: extra trailing sentences (a parse of more lines than the dataset has) were accepted silently
    one = datasets.Dataset.from_dict({"en": TEXTS[:1]})
    with pytest.raises(ValueError, match=r"deps\.conllu has 2 sentences but the dataset has 1 examples; expected one "
                                         r"per example"):
        parse_corpus(one, "en", dependencies=ConlluFile(files / "deps.conllu"))
    with pytest.raises(ValueError, match=r"trees\.txt has 2 trees \(lines\) but the dataset has 1 examples"):
        parse_corpus(one, "en", phrases=BracketedTreeFile(files / "trees.txt"))
    both = datasets.Dataset.from_dict({"en": TEXTS})
    assert len(parse_corpus(both, "en", dependencies=ConlluFile(files / "deps.conllu"),
                            phrases=BracketedTreeFile(files / "trees.txt"))) == 2


@pytest.mark.parametrize("old, new, message", [
    ("6\truns\trun\tVERB\tVBZ\t_\t0", "6\truns\trun\tVERB\tVBZ\t_\t6",
     r"deps\.conllu:9: token 6 has HEAD 6 \(itself\); expected 0 for the root or the ID of another token of the "
     r"sentence \(1\.\.7\)"),
    ("3\tstop\tstop\tVERB\tVB\t_\t0", "3\tstop\tstop\tVERB\tVB\t_\t9",
     r"deps\.conllu:15: token 3 has HEAD 9 but the sentence has only 4 tokens; expected 0 for the root or a token ID "
     r"1\.\.4"),
])
def test_conllu_head_errors_speak_the_files_numbering(files, old, new, message):
    # regression: "heads[5] = 5" / "heads[2] = 8" in 0-based indices for a file that says 6 and 9, and no line
    (files / "deps.conllu").write_text(CONLLU.replace(old, new))
    with pytest.raises(ValueError, match=message):
        ConlluFile(files / "deps.conllu")


@pytest.mark.parametrize("reader, name", [(ConlluFile, "latin1.conllu"), (BracketedTreeFile, "latin1.txt")])
def test_a_file_that_is_not_utf8_is_named(tmp_path, reader, name):
    # regression: a bare UnicodeDecodeError that did not say which file
    text = CONLLU.replace("dog", "caf\u00e9") if reader is ConlluFile else TREES[0].replace("dog", "caf\u00e9")
    (tmp_path / name).write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{name} is not UTF-8 \(byte 0xe9 at offset \d+\); expected a UTF-8 file"):
        reader(tmp_path / name)


def test_missing_parsers_say_what_to_install():
    with pytest.raises(MissingParserError, match=r"pip install en-core-web-nonexistent"):
        load_spacy("en_core_web_nonexistent")
    try:
        import benepar  # noqa: F401
    except ImportError:
        with pytest.raises(MissingParserError, match=r"pip install benepar"):
            load_benepar()
    else:
        pytest.skip("benepar is installed; its model download needs the internet")
