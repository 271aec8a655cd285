"""Tests for hf_headattn.experiment.tokenization on real Multi30k sentences."""

import importlib.util
import json
import re
import unicodedata
import warnings

import datasets
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2
from transformers import AutoTokenizer, MarianTokenizer

from hf_headattn.experiment.data import load_parallel_dataset
from hf_headattn.experiment.tokenization import SACREMOSES_ADVICE, load_tokenizer, train_joint_sentencepiece

VOCAB = 700


@pytest.fixture(scope="module")
def corpus(multi30k):
    return load_parallel_dataset("en", "de", multi30k_dir=multi30k, max_train_samples=1000, max_eval_samples=100)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    return train_joint_sentencepiece(corpus, VOCAB, out, source_lang="en", target_lang="de"), out


def _normalized(s):
    """What nmt_nfkc normalisation keeps of a sentence: NFKC with runs of whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", s).split())


def test_layout_follows_marian(trained):
    tok, out = trained
    assert isinstance(tok, MarianTokenizer)
    assert len(tok) == tok.vocab_size == VOCAB
    assert (tok.eos_token_id, tok.unk_token_id, tok.pad_token_id) == (0, 1, VOCAB - 1)
    assert (out / "source.spm").read_bytes() == (out / "target.spm").read_bytes()
    # vocab.json is the SentencePiece model's pieces, in its id order, plus <pad> last
    proc = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    assert vocab == {**{proc.id_to_piece(i): i for i in range(VOCAB - 1)}, "<pad>": VOCAB - 1}
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(proc.serialized_model_proto())
    assert proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.UNIGRAM
    assert proto.trainer_spec.vocab_size == VOCAB - 1
    assert proto.normalizer_spec.name == "nmt_nfkc"


def test_joint_vocabulary_covers_both_languages(trained):
    tok, _ = trained
    for sentence in ("Männer spielen Fußball.", "Two dogs are running."):
        ids = tok(sentence)["input_ids"]
        assert tok.unk_token_id not in ids
        assert ids[-1] == tok.eos_token_id
    assert tok(text_target="Männer")["input_ids"] == tok("Männer")["input_ids"]  # one shared vocabulary
    assert tok("Ein Mann ☃")["input_ids"][-2] == tok.unk_token_id


def test_round_trip_on_multi30k(trained, corpus):
    tok, _ = trained
    pairs = corpus["train"]["translation"][:200]
    src = [p["en"] for p in pairs]
    tgt = [p["de"] for p in pairs]
    enc = tok(src, text_target=tgt)
    assert tok.batch_decode(enc["input_ids"], skip_special_tokens=True) == [_normalized(s) for s in src]
    assert tok.batch_decode(enc["labels"], skip_special_tokens=True) == [_normalized(s) for s in tgt]
    # the first decode keeps </s>; padding is dropped with the special tokens
    assert tok.decode(enc["input_ids"][0]).endswith("</s>")
    padded = enc["labels"][0] + [tok.pad_token_id] * 3
    assert tok.decode(padded, skip_special_tokens=True) == _normalized(tgt[0])


def test_save_and_reload(trained, corpus, tmp_path):
    tok, out = trained
    reloaded = AutoTokenizer.from_pretrained(out)
    assert type(reloaded) is MarianTokenizer
    assert reloaded.get_vocab() == tok.get_vocab()
    assert (reloaded.source_lang, reloaded.target_lang) == ("en", "de")
    assert reloaded.all_special_tokens == tok.all_special_tokens
    val = corpus["validation"]["translation"]
    src, tgt = [p["en"] for p in val], [p["de"] for p in val]
    assert reloaded(src, text_target=tgt) == tok(src, text_target=tgt)
    reloaded.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(src, text_target=tgt) == tok(src, text_target=tgt)
    assert again.pad_token_id == VOCAB - 1


def test_the_sacremoses_advice_is_left_out_as_transformers_never_uses_it(trained, corpus, monkeypatch):
    """MarianTokenizer advises installing sacremoses, which it would use only in ``normalize``; transformers 5 calls
    ``normalize`` nowhere (the contract: tokenizing and decoding with it raising), so ``load_tokenizer`` drops the
    advice and no other warning."""
    tok, out = trained
    monkeypatch.setattr(MarianTokenizer, "normalize", lambda self, x: pytest.fail("normalize was called"))
    src = [pair["en"] for pair in corpus["validation"]["translation"][:8]]
    encoded = tok(src, text_target=src)
    assert tok.batch_decode(encoded["labels"], skip_special_tokens=True) == [_normalized(s) for s in src]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AutoTokenizer.from_pretrained(out)
        stock = [str(w.message) for w in caught]
        caught.clear()
        warnings.warn("another warning")
        ours = load_tokenizer(out)
    assert [str(w.message) for w in caught] == ["another warning"] and type(ours) is MarianTokenizer
    if importlib.util.find_spec("sacremoses") is None:
        assert any(SACREMOSES_ADVICE in message for message in stock)  # what is left out is there to leave out


def test_deterministic(corpus, trained, tmp_path):
    _, out = trained
    train_joint_sentencepiece(corpus, VOCAB, tmp_path, source_lang="en", target_lang="de")
    for name in ("source.spm", "vocab.json"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()


@pytest.mark.parametrize("vocab_size", [120, 1500])
def test_vocab_size_respected_from_plain_texts(corpus, tmp_path, vocab_size):
    texts = [p[lang] for p in corpus["train"]["translation"] for lang in ("en", "de")]
    tok = train_joint_sentencepiece(texts, vocab_size, tmp_path, model_type="bpe" if vocab_size == 120 else "unigram")
    assert len(tok) == vocab_size == len(AutoTokenizer.from_pretrained(tmp_path))
    assert tok.pad_token_id == vocab_size - 1
    assert max(max(ids) for ids in tok(texts[:50])["input_ids"]) < vocab_size - 1


def test_dataset_source_uses_every_language_of_the_train_split(corpus, tmp_path):
    # training on the English side only leaves German-only characters unknown
    en_only = datasets.Dataset.from_dict({"translation": [{"en": p["en"]} for p in corpus["train"]["translation"]]})
    tok = train_joint_sentencepiece(en_only, 500, tmp_path)
    assert tok.unk_token_id in tok("Fußball")["input_ids"]


@pytest.mark.parametrize("bad", [0, 3, -5, 2.5, True, "8000", None])
def test_bad_vocab_size(corpus, tmp_path, bad):
    expected = f"vocab_size must be an int >= 4 (</s>, <unk>, <pad> and pieces), got {bad!r}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        train_joint_sentencepiece(corpus, bad, tmp_path)
    assert not (tmp_path / "vocab.json").exists()


def test_vocab_size_too_large_names_the_limit(corpus, tmp_path):
    texts = [p["en"] for p in corpus["train"]["translation"][:300]]
    with pytest.raises(ValueError, match=r"vocab_size=50000 on 300 sentences: at most (\d+) \(with <pad>\)") as err:
        train_joint_sentencepiece(texts, 50000, tmp_path)
    limit = int(re.search(r"at most (\d+)", str(err.value)).group(1))
    assert len(train_joint_sentencepiece(texts, limit, tmp_path)) == limit  # the stated limit is reachable


def test_vocab_size_below_alphabet(corpus, tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size=10 .*smaller than required_chars"):
        train_joint_sentencepiece(corpus, 10, tmp_path)


@pytest.mark.parametrize(
    ("texts", "kwargs", "error", "match"),
    [
        ("one string", {}, TypeError, "got a single str"),
        (["ok", 3], {}, TypeError, r"texts\[1\] must be a str, got int"),
        (["", "  "], {}, ValueError, "no non-empty training sentence among 2"),
        (datasets.DatasetDict({"validation": datasets.Dataset.from_dict({"translation": [{"en": "a"}]})}), {},
         ValueError, r"needs a 'train' split.*\['validation'\]"),
        (["a b c"], {"model_type": "word"}, ValueError, "model_type must be 'unigram' or 'bpe', got 'word'"),
        (["a b c"], {"num_threads": 0}, ValueError, "num_threads must be a positive int, got 0"),
    ],
)  # fmt: skip
def test_bad_inputs(tmp_path, texts, kwargs, error, match):
    with pytest.raises(error, match=match):
        train_joint_sentencepiece(texts, 100, tmp_path, **kwargs)


def test_a_checkpoints_tokenizer_loads_without_asking_about_remote_code(trained, tmp_path, monkeypatch):
    """A folder saved by the package carries remote code (``auto_map``); transformers asks at the terminal (and
    waits 15 s) where ``trust_remote_code`` is left None: load_tokenizer passes False unless told (#64)."""
    from hf_headattn import HeadAttnMarianConfig

    tokenizer = trained[0]
    HeadAttnMarianConfig(d_model=16, encoder_layers=1, decoder_layers=1, vocab_size=len(tokenizer),
                         pad_token_id=tokenizer.pad_token_id, decoder_start_token_id=tokenizer.pad_token_id
                         ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    asked, load = [], AutoTokenizer.from_pretrained
    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        lambda *args, **kwargs: asked.append(kwargs.get("trust_remote_code")) or load(*args, **kwargs))
    assert len(load_tokenizer(tmp_path)) == len(tokenizer) and asked == [False]
    assert len(load_tokenizer(tmp_path, trust_remote_code=True)) == len(tokenizer) and asked[1] is True
