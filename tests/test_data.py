"""Tests for hf_headattn.experiment.data on real Multi30k lines and small local files."""

import gzip
import json
from pathlib import Path

import datasets
import pytest

from hf_headattn.experiment import data
from hf_headattn.experiment.data import load_parallel_dataset, read_parallel_file, tokenize_parallel


@pytest.fixture(scope="module")
def pairs(multi30k_lines):
    """200 real en/de pairs from the Multi30k validation split."""
    return list(zip(multi30k_lines("val", "en", 200), multi30k_lines("val", "de", 200)))


def _pairs_of(ds, src="en", tgt="de"):
    return [(t[src], t[tgt]) for t in ds["translation"]]


# ---------------------------------------------------------------- Multi30k


def test_multi30k_full_split_sizes_and_alignment(multi30k, multi30k_lines):
    dsd = load_parallel_dataset("en", "de", multi30k_dir=multi30k, max_train_samples=0)
    assert list(dsd) == ["train", "validation", "test_2016_flickr"]
    assert [len(dsd[s]) for s in dsd] == [0, 1014, 1000]
    test = _pairs_of(dsd["test_2016_flickr"])
    assert test == list(zip(multi30k_lines("test_2016_flickr", "en"), multi30k_lines("test_2016_flickr", "de")))
    assert isinstance(dsd["validation"].features["translation"], datasets.Translation)


@pytest.mark.parametrize(("n_train", "n_eval", "n_pred"), [(7, 5, 3), (30, None, 1)])
def test_multi30k_first_n_per_split(multi30k, multi30k_lines, n_train, n_eval, n_pred):
    dsd = load_parallel_dataset(
        "fr", "cs", multi30k_dir=str(multi30k),
        max_train_samples=n_train, max_eval_samples=n_eval, max_predict_samples=n_pred,
    )  # fmt: skip
    assert len(dsd["train"]) == n_train
    assert len(dsd["validation"]) == (1014 if n_eval is None else n_eval)
    assert len(dsd["test_2016_flickr"]) == n_pred
    expected = list(zip(multi30k_lines("train", "fr", n_train), multi30k_lines("train", "cs", n_train)))
    assert _pairs_of(dsd["train"], "fr", "cs") == expected
    assert set(dsd["train"][0]["translation"]) == {"fr", "cs"}


def test_multi30k_unknown_language_lists_available(multi30k):
    with pytest.raises(ValueError, match=r"'ja'.*available languages: \['cs', 'de', 'en', 'fr'\]"):
        load_parallel_dataset("en", "ja", multi30k_dir=multi30k)


def test_multi30k_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_parallel_dataset("en", "de", multi30k_dir=tmp_path / "nope")


# ---------------------------------------------------------------- local formats


def _write(path: Path, text: str):
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("gz", ["", ".gz"])
def test_plain_parallel_prefix(tmp_path, pairs, gz):
    _write(tmp_path / f"corpus.en{gz}", "".join(e + "\n" for e, _ in pairs))
    _write(tmp_path / f"corpus.de{gz}", "".join(d + "\n" for _, d in pairs))
    dsd = load_parallel_dataset("de", "en", data_files={"train": tmp_path / "corpus"})
    assert _pairs_of(dsd["train"], "de", "en") == [(d, e) for e, d in pairs]


def test_plain_text_splits_on_newline_only(tmp_path):
    # \u2028 and a lone \r are inside sentences, not line breaks; \r\n endings are removed.
    (tmp_path / "c.en").write_bytes("a\u2028b\r\nc\rd\n".encode())
    (tmp_path / "c.de").write_bytes("x\ny\n".encode())
    assert read_parallel_file(tmp_path / "c", "en", "de") == [{"en": "a\u2028b", "de": "x"}, {"en": "c\rd", "de": "y"}]


@pytest.mark.parametrize("gz", ["", ".gz"])
def test_tsv_without_header(tmp_path, pairs, gz):
    path = tmp_path / f"train.tsv{gz}"
    _write(path, "".join(f"{e}\t{d}\n" for e, d in pairs))
    dsd = load_parallel_dataset("en", "de", data_files={"train": path, "validation": path}, max_eval_samples=10)
    assert _pairs_of(dsd["train"]) == pairs
    assert _pairs_of(dsd["validation"]) == pairs[:10]


def test_tsv_header_selects_columns(tmp_path, pairs):
    path = tmp_path / "dev.tsv"
    _write(path, "de\tid\ten\n" + "".join(f"{d}\t{i}\t{e}\n" for i, (e, d) in enumerate(pairs)))
    assert _pairs_of(load_parallel_dataset("en", "de", data_files={"validation": path})["validation"]) == pairs
    with pytest.raises(ValueError, match=r"'fr' not found in the header.*\['de', 'en', 'id'\]"):
        load_parallel_dataset("en", "fr", data_files={"validation": path})


def test_tsv_header_of_other_languages_is_not_data(tmp_path):
    path = tmp_path / "dev.tsv"
    _write(path, "fr\tcs\nbonjour\tahoj\n")
    with pytest.raises(ValueError, match=r"'en' not found.*\['cs', 'fr'\]"):
        read_parallel_file(path, "en", "de")


def test_tsv_bad_row_names_line(tmp_path):
    path = tmp_path / "bad.tsv"
    _write(path, "a\tb\nonly one field\n")
    with pytest.raises(ValueError, match=r"bad\.tsv line 2: expected 2 tab-separated fields, got 1"):
        read_parallel_file(path, "en", "de")


@pytest.mark.parametrize("name", ["train.jsonl", "train.json", "train.jsonl.gz"])
def test_json_lines(tmp_path, pairs, name):
    rows = [{"id": i, "translation": {"en": e, "de": d, "fr": "x"}} for i, (e, d) in enumerate(pairs)]
    _write(tmp_path / name, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    dsd = load_parallel_dataset("en", "de", data_files={"train": tmp_path / name})
    assert _pairs_of(dsd["train"]) == pairs
    assert dsd["train"].column_names == ["translation"]
    with pytest.raises(ValueError, match=r"'cs' not found in .*line 1; available languages: \['de', 'en', 'fr'\]"):
        load_parallel_dataset("cs", "de", data_files={"train": tmp_path / name})


def test_json_lines_without_translation_field(tmp_path):
    _write(tmp_path / "x.jsonl", '{"en": "a", "de": "b"}\n')
    with pytest.raises(ValueError, match="x.jsonl line 1: expected an object with a 'translation' dict"):
        read_parallel_file(tmp_path / "x.jsonl", "en", "de")


# ---------------------------------------------------------------- errors


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "nothing.tsv"
    with pytest.raises(FileNotFoundError, match="nothing.tsv"):
        load_parallel_dataset("en", "de", data_files={"train": missing})
    with pytest.raises(FileNotFoundError, match="nothing"):
        load_parallel_dataset("en", "de", data_files={"train": tmp_path / "nothing"})


def test_missing_language_of_prefix_lists_available(tmp_path):
    _write(tmp_path / "c.en", "a\n")
    _write(tmp_path / "c.fr.gz", "b\n")
    with pytest.raises(ValueError, match=r"'de' not found in the files .*c\.\*; available languages: \['en', 'fr'\]"):
        read_parallel_file(tmp_path / "c", "en", "de")


def test_unequal_line_counts_name_both_files(tmp_path, pairs):
    _write(tmp_path / "c.en", "".join(e + "\n" for e, _ in pairs))
    _write(tmp_path / "c.de", "".join(d + "\n" for _, d in pairs[:-1]))
    with pytest.raises(ValueError, match=r"c\.en has 200 lines, .*c\.de has 199"):
        load_parallel_dataset("en", "de", data_files={"train": tmp_path / "c"})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of"),
        ({"multi30k_dir": "any", "dataset_name": "wmt16"}, "exactly one of"),
        ({"multi30k_dir": "any", "max_train_samples": -1}, "max_train_samples must be a non-negative int"),
        ({"multi30k_dir": "any", "max_eval_samples": 2.5}, "max_eval_samples .* got 2.5"),
        ({"data_files": {}}, "data_files is empty"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_parallel_dataset("en", "de", **kwargs)


def test_same_language_twice():
    with pytest.raises(ValueError, match="'en' twice"):
        load_parallel_dataset("en", "en", multi30k_dir="any")  # refused before any file is read


# ---------------------------------------------------------------- hub path (load_dataset replaced by local data)


@pytest.mark.parametrize("layout", ["translation", "columns"])
def test_hub_dataset_is_converted(monkeypatch, pairs, layout):
    if layout == "translation":
        raw = {"translation": [{"en": e, "de": d, "fr": "-"} for e, d in pairs]}
    else:
        raw = {"en": [e for e, _ in pairs], "de": [d for _, d in pairs], "id": list(range(len(pairs)))}
    fake = datasets.DatasetDict({"train": datasets.Dataset.from_dict(raw), "test": datasets.Dataset.from_dict(raw)})
    calls = []
    monkeypatch.setattr(data.datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or fake)
    dsd = load_parallel_dataset(
        "de", "en", dataset_name="someone/corpus", dataset_config_name="de-en", cache_dir="/c", max_predict_samples=4,
    )  # fmt: skip
    assert calls == [(("someone/corpus", "de-en"), {"cache_dir": "/c"})]
    assert dsd["train"].column_names == ["translation"]
    assert _pairs_of(dsd["train"], "de", "en") == [(d, e) for e, d in pairs]
    assert len(dsd["test"]) == 4
    with pytest.raises(ValueError, match=r"'cs' not found in dataset 'someone/corpus' split 'train'"):
        load_parallel_dataset("cs", "en", dataset_name="someone/corpus")


# ---------------------------------------------------------------- tokenize_parallel


class _WordTokenizer:
    """Minimal tokenizer following the HF call convention: ids are word lengths, with a side marker."""

    def __call__(self, text=None, text_target=None, max_length=None, truncation=False):
        texts, offset = (text, 0) if text is not None else (text_target, 1000)
        ids = [[offset + len(w) for w in t.split()] for t in texts]
        if truncation:
            ids = [x[:max_length] for x in ids]
        return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]}


def test_tokenize_parallel_maps_sources_and_targets(multi30k):
    dsd = load_parallel_dataset("en", "de", multi30k_dir=multi30k, max_train_samples=50, max_eval_samples=20,
                                max_predict_samples=0)  # fmt: skip
    out = tokenize_parallel(dsd, _WordTokenizer(), "en", "de", max_source_length=6, max_target_length=4)
    assert out["train"].column_names == ["input_ids", "attention_mask", "labels"]
    assert [len(out[s]) for s in out] == [50, 20, 0]
    for row, ex in zip(out["validation"], dsd["validation"]["translation"]):
        assert row["input_ids"] == [len(w) for w in ex["en"].split()][:6]
        assert row["labels"] == [1000 + len(w) for w in ex["de"].split()][:4]
        assert row["attention_mask"] == [1] * len(row["input_ids"])
    # a single Dataset works too, and the languages can be swapped
    swapped = tokenize_parallel(dsd["train"], _WordTokenizer(), "de", "en", 100, 100)
    assert swapped[0]["input_ids"] == [len(w) for w in dsd["train"][0]["translation"]["de"].split()]


def test_tokenize_parallel_errors(multi30k):
    ds = load_parallel_dataset("en", "de", multi30k_dir=multi30k, max_train_samples=3)["train"]
    with pytest.raises(ValueError, match=r"'fr' not found in the 'translation' column; available .*\['de', 'en'\]"):
        tokenize_parallel(ds, _WordTokenizer(), "fr", "de", 8, 8)
    with pytest.raises(ValueError, match="max_target_length must be a positive int, got 0"):
        tokenize_parallel(ds, _WordTokenizer(), "en", "de", 8, 0)
    with pytest.raises(ValueError, match=r"expected a 'translation' column, got columns \['text'\]"):
        tokenize_parallel(datasets.Dataset.from_dict({"text": ["a"]}), _WordTokenizer(), "en", "de", 8, 8)
