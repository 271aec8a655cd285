"""Parallel data loading for the training recipes.

Every loader returns a `datasets.DatasetDict` with one column, `translation`, holding
`{source_lang: str, target_lang: str}` per row: the format of HF's `run_translation.py` and of
hub datasets such as `wmt16`.

Sources
-------
- a hub dataset (`dataset_name` + `dataset_config_name`) through `datasets.load_dataset`;
- local files (`data_files={split: path}`): `.tsv`, `.jsonl`/`.json` (JSON lines with a
  `translation` field), or a prefix `P` of plain parallel text files `P.<src>` / `P.<tgt>`;
  each may be gzipped (`.gz`);
- Multi30k (Elliott et al. 2016, "Multi30K: Multilingual English-German Image Descriptions") from a
  directory of `{train,val,test_2016_flickr}.<lang>.gz` files (`multi30k_dir`), found or downloaded by
  `multi30k.find_multi30k`.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Mapping
from pathlib import Path

import datasets

from .multi30k import SPLITS as MULTI30K_SPLITS
from .multi30k import TEST_SPLIT as TEST_SPLIT  # re-exported: the recipes import it from here

# A TSV first line whose every field looks like this is a header (en, de, en_XX, pt-BR, ...).
_LANG_CODE = re.compile(r"^[a-z]{2,3}([_-][A-Za-z]{2,4})?$")


def _open_text(path: Path):
    """Open a (possibly gzipped) UTF-8 file; lines end at `\\n` only (no other Unicode breaks)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="\n")
    return open(path, encoding="utf-8", newline="\n")


def _read_lines(path: Path) -> list[str]:
    """All lines of `path` without their line ending (`\\n` or `\\r\\n`)."""
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    try:
        with _open_text(path) as f:
            return [line.rstrip("\r\n") for line in f]
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:  # a cut or damaged download
        raise ValueError(f"{path} is a damaged gzip file ({error}); expected a complete .gz file: download it again "
                         "or replace it") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text ({error}); expected UTF-8") from None


def _stem(path: Path) -> str:
    """File name without `.gz` and lower-cased, for format detection."""
    name = path.name.lower()
    return name[:-3] if name.endswith(".gz") else name


def _missing_language(lang: str, available, where) -> ValueError:
    return ValueError(f"language {lang!r} not found in {where}; available languages: {sorted(available)}")


def _read_tsv(path: Path, src_lang: str, tgt_lang: str) -> list[dict]:
    """Rows of a two-column TSV (source, target) or of a TSV whose header names its languages.

    The first line is a header when it contains `src_lang` or `tgt_lang` as a field, or when every
    field looks like a language code.
    """
    lines = _read_lines(path)
    if lines and lines[-1] == "":
        lines = lines[:-1]
    first = lines[0].split("\t") if lines else []
    if first and (src_lang in first or tgt_lang in first or all(_LANG_CODE.match(f) for f in first)):
        for lang in (src_lang, tgt_lang):
            if lang not in first:
                raise _missing_language(lang, first, f"the header of {path}")
        columns, body, start = first, lines[1:], 2
        i_src, i_tgt = first.index(src_lang), first.index(tgt_lang)
    else:
        columns, body, start = [src_lang, tgt_lang], lines, 1
        i_src, i_tgt = 0, 1
    rows = []
    for n, line in enumerate(body, start=start):
        fields = line.split("\t")
        if len(fields) != len(columns):
            raise ValueError(f"{path} line {n}: expected {len(columns)} tab-separated fields, got {len(fields)}")
        rows.append({src_lang: fields[i_src], tgt_lang: fields[i_tgt]})
    return rows


def _read_jsonl(path: Path, src_lang: str, tgt_lang: str) -> list[dict]:
    """Rows of a JSON-lines file whose objects carry `{"translation": {lang: text, ...}}`."""
    rows = []
    for n, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {n}: invalid JSON ({err})") from None
        pair = record.get("translation") if isinstance(record, dict) else None
        if not isinstance(pair, dict):
            raise ValueError(f"{path} line {n}: expected an object with a 'translation' dict, got {line[:80]!r}")
        for lang in (src_lang, tgt_lang):
            if lang not in pair:
                raise _missing_language(lang, pair, f"{path} line {n}")
        rows.append({src_lang: pair[src_lang], tgt_lang: pair[tgt_lang]})
    return rows


def _lang_file(prefix: Path, lang: str) -> Path | None:
    for candidate in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if candidate.is_file():
            return candidate
    return None


def _prefix_languages(prefix: Path) -> list[str]:
    """Languages `L` for which `prefix.L` or `prefix.L.gz` exists."""
    if not prefix.parent.is_dir():
        return []
    langs = set()
    for p in prefix.parent.glob(f"{prefix.name}.*"):
        suffix = p.name[len(prefix.name) + 1 :]
        suffix = suffix[:-3] if suffix.endswith(".gz") else suffix
        if suffix and "." not in suffix:
            langs.add(suffix)
    return sorted(langs)


def _read_parallel_text(prefix: Path, src_lang: str, tgt_lang: str) -> list[dict]:
    """Rows from the line-aligned files `prefix.<src_lang>[.gz]` and `prefix.<tgt_lang>[.gz]`."""
    files = {lang: _lang_file(prefix, lang) for lang in (src_lang, tgt_lang)}
    available = _prefix_languages(prefix)
    if not available:
        raise FileNotFoundError(
            f"data file not found: {prefix} (expected a .tsv/.jsonl/.json file or a prefix of "
            f"{prefix}.{src_lang}[.gz] and {prefix}.{tgt_lang}[.gz])"
        )
    for lang, path in files.items():
        if path is None:
            raise _missing_language(lang, available, f"the files {prefix}.*")
    src, tgt = _read_lines(files[src_lang]), _read_lines(files[tgt_lang])
    if len(src) != len(tgt):
        raise ValueError(
            f"parallel files have unequal line counts: {files[src_lang]} has {len(src)} lines, "
            f"{files[tgt_lang]} has {len(tgt)}"
        )
    return [{src_lang: s, tgt_lang: t} for s, t in zip(src, tgt)]


def read_parallel_file(path: str | Path, src_lang: str, tgt_lang: str) -> list[dict]:
    """Read one local parallel file (or prefix) into `[{src_lang: ..., tgt_lang: ...}, ...]`.

    Parameters
    ----------
    path : str or Path
        `*.tsv[.gz]`, `*.jsonl[.gz]` / `*.json[.gz]` (JSON lines), or a prefix `P` of
        `P.<src_lang>[.gz]` and `P.<tgt_lang>[.gz]`.
    src_lang, tgt_lang : str
        Language keys, e.g. `"en"` and `"de"`.

    Returns
    -------
    list of dict
        One `{src_lang: str, tgt_lang: str}` per example, in file order.
    """
    path = Path(path)
    stem = _stem(path)
    if stem.endswith(".tsv"):
        return _read_tsv(path, src_lang, tgt_lang)
    if stem.endswith(".jsonl") or stem.endswith(".json"):
        return _read_jsonl(path, src_lang, tgt_lang)
    return _read_parallel_text(path, src_lang, tgt_lang)


def _to_dataset(rows: list[dict], src_lang: str, tgt_lang: str) -> datasets.Dataset:
    features = datasets.Features({"translation": datasets.Translation(languages=[src_lang, tgt_lang])})
    return datasets.Dataset.from_dict({"translation": rows}, features=features)


def _from_hub(name, config_name, src_lang, tgt_lang, **load_kwargs) -> datasets.DatasetDict:
    """Hub dataset with a `translation` column, or with one column per language."""
    raw = datasets.load_dataset(name, config_name, **load_kwargs)
    out = {}
    for split, ds in raw.items():
        if "translation" in ds.column_names:
            available = set(ds[0]["translation"]) if len(ds) else {src_lang, tgt_lang}
            for lang in (src_lang, tgt_lang):
                if lang not in available:
                    raise _missing_language(lang, available, f"dataset {name!r} split {split!r}")
            ds = ds.map(
                lambda b: {"translation": [{src_lang: t[src_lang], tgt_lang: t[tgt_lang]} for t in b["translation"]]},
                batched=True,
                remove_columns=ds.column_names,
            )
        elif src_lang in ds.column_names and tgt_lang in ds.column_names:
            ds = ds.map(
                lambda b: {"translation": [{src_lang: s, tgt_lang: t} for s, t in zip(b[src_lang], b[tgt_lang])]},
                batched=True,
                remove_columns=ds.column_names,
            )
        else:
            missing = src_lang if src_lang not in ds.column_names else tgt_lang
            raise _missing_language(missing, ds.column_names, f"dataset {name!r} split {split!r} (columns)")
        out[split] = ds
    return datasets.DatasetDict(out)


def _limit(split: str, max_train_samples, max_eval_samples, max_predict_samples):
    if split == "train":
        return max_train_samples
    if split == "validation":
        return max_eval_samples
    return max_predict_samples


def load_parallel_dataset(
    src_lang: str,
    tgt_lang: str,
    *,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    data_files: Mapping[str, str | Path] | None = None,
    multi30k_dir: str | Path | None = None,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    max_predict_samples: int | None = None,
    **load_kwargs,
) -> datasets.DatasetDict:
    """Load a parallel corpus as a `DatasetDict` with a `translation` column.

    Give exactly one of `dataset_name`, `data_files` and `multi30k_dir`.

    Parameters
    ----------
    src_lang, tgt_lang : str
        Language keys of the source and target side (`"en"`, `"de"`, ...).
    dataset_name, dataset_config_name : str, optional
        Hub dataset, passed to `datasets.load_dataset` with `load_kwargs` (`cache_dir`,
        `revision`, `token`...). Its splits need a `translation` column or one column per language.
    data_files : mapping of str to path, optional
        Split name -> local file; see `read_parallel_file` for the formats.
    multi30k_dir : path, optional
        Directory with `{train,val,test_2016_flickr}.<lang>.gz`; loaded as the splits `train`,
        `validation` and `test_2016_flickr`.
    max_train_samples, max_eval_samples, max_predict_samples : int, optional
        Keep the first N examples of `train`, of `validation`, and of every other split.

    Returns
    -------
    datasets.DatasetDict
        Rows `{"translation": {src_lang: str, tgt_lang: str}}`.
    """
    sources = {"dataset_name": dataset_name, "data_files": data_files, "multi30k_dir": multi30k_dir}
    given = [k for k, v in sources.items() if v is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of {list(sources)}, got {given or 'none'}")
    if src_lang == tgt_lang:
        raise ValueError(f"src_lang and tgt_lang must differ, got {src_lang!r} twice")
    for key, n in [("max_train_samples", max_train_samples), ("max_eval_samples", max_eval_samples),
                   ("max_predict_samples", max_predict_samples)]:  # fmt: skip
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ValueError(f"{key} must be a non-negative int or None, got {n!r}")

    if dataset_name is not None:
        dsd = _from_hub(dataset_name, dataset_config_name, src_lang, tgt_lang, **load_kwargs)
    else:
        if multi30k_dir is not None:
            root = Path(multi30k_dir)
            if not root.is_dir():
                raise FileNotFoundError(f"Multi30k directory not found: {root}")
            data_files = {split: root / prefix for split, prefix in MULTI30K_SPLITS.items()}
        if not data_files:
            raise ValueError("data_files is empty; expected a mapping such as {'train': 'train.tsv'}")
        dsd = datasets.DatasetDict(
            {
                split: _to_dataset(read_parallel_file(path, src_lang, tgt_lang), src_lang, tgt_lang)
                for split, path in data_files.items()
            }
        )

    for split in list(dsd):
        n = _limit(split, max_train_samples, max_eval_samples, max_predict_samples)
        if n is not None and n < len(dsd[split]):
            dsd[split] = dsd[split].select(range(n))
    return dsd


def tokenize_parallel(
    dataset: datasets.Dataset | datasets.DatasetDict,
    tokenizer,
    src_lang: str,
    tgt_lang: str,
    max_source_length: int = 128,
    max_target_length: int = 128,
    *,
    batch_size: int = 1000,
    num_proc: int | None = None,
):
    """Tokenize a `translation` dataset into `input_ids`, `attention_mask` and `labels`.

    The `preprocess_function` of `run_translation.py`: batched `tokenizer(sources, truncation=True)`
    and `tokenizer(text_target=targets, truncation=True)`, each with its own maximum length, no padding
    (`DataCollatorForSeq2Seq` pads and masks labels with -100). The raw columns are removed. For
    multilingual tokenizers (mBART) set `tokenizer.src_lang`/`tgt_lang` to their codes (`"en_XX"`) first.

    Parameters
    ----------
    dataset : datasets.Dataset or datasets.DatasetDict
        Rows with `{"translation": {src_lang: str, tgt_lang: str}}`.
    tokenizer : transformers.PreTrainedTokenizerBase
    src_lang, tgt_lang : str
        Keys of the `translation` dicts.
    max_source_length, max_target_length : int
        Truncation lengths (in tokens, special tokens included) of inputs and labels.

    Returns
    -------
    datasets.Dataset or datasets.DatasetDict
        Same splits and row order, columns `input_ids`, `attention_mask`, `labels`.
    """
    for key, n in (("max_source_length", max_source_length), ("max_target_length", max_target_length)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{key} must be a positive int, got {n!r}")
    splits = dataset.values() if isinstance(dataset, datasets.DatasetDict) else [dataset]
    for ds in splits:
        if "translation" not in ds.column_names:
            raise ValueError(f"expected a 'translation' column, got columns {ds.column_names}")
        if len(ds):
            for lang in (src_lang, tgt_lang):
                if lang not in ds[0]["translation"]:
                    raise _missing_language(lang, ds[0]["translation"], "the 'translation' column")
    columns = next(iter(splits)).column_names if splits else []

    def preprocess(batch):
        sources = [ex[src_lang] for ex in batch["translation"]]
        targets = [ex[tgt_lang] for ex in batch["translation"]]
        model_inputs = tokenizer(sources, max_length=max_source_length, truncation=True)
        labels = tokenizer(text_target=targets, max_length=max_target_length, truncation=True)
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    return dataset.map(
        preprocess, batched=True, batch_size=batch_size, num_proc=num_proc, remove_columns=columns,
        desc="Tokenizing",
    )  # fmt: skip
