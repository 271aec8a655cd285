"""What a new user meets when something is wrong around a recipe: a corrupt data file or an unusable cache is a one-line
usage error naming the file or the variable (exit 2, no traceback) in every recipe that reads Multi30k; the data
folder a run reads is never its output folder, however it was found; a missing spaCy names the ``parsers`` extra; a
scratch tokenizer is reused only for the settings and data it was trained with; a usage error is one line."""

import shutil
import sys

import datasets
import pytest

from hf_headattn.commands import demo, finetune, parse, train
from hf_headattn.experiment import multi30k as m
from hf_headattn.experiment.recipe_parts import TOKENIZER_RECORD, scratch_tokenizer

EN_DE = m.file_names(("en", "de"))

#: recipe -> its arguments given the output folder (the data: Multi30k, found as the recipe finds it)
RECIPES = {
    "train_translation": (train.main, lambda out: ["--output_dir", str(out)]),
    "finetune_mbart": (finetune.main, lambda out: ["--output_dir", str(out)]),
    "parse_sources": (parse.main, lambda out: ["--output_dir", str(out)]),
    "demo": (demo.main, lambda out: ["--output_dir", str(out), "--quick"]),
}


@pytest.fixture
def only_here(tmp_path, monkeypatch):
    """Multi30k nowhere but where the test puts it: no HF_HEADATTN_DATA, no ../shared, an empty cache, an unreachable
    download address."""
    monkeypatch.delenv(m.DATA_ENV, raising=False)
    monkeypatch.setenv(m.URL_ENV, "http://127.0.0.1:9/unreachable/")
    monkeypatch.setattr(m, "BESIDE_REPOSITORY", tmp_path / "no-shared")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def en_de_copy(multi30k, folder):
    """``folder`` holding a copy of Multi30k's En-De files."""
    folder.mkdir(parents=True)
    for name in EN_DE:
        shutil.copy(multi30k / name, folder / name)
    return folder


def usage_error(main, argv, capsys) -> str:
    """The recipe's standard error, asserting a usage error (exit 2) without a traceback."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    error = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in error, error
    return error


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_truncated_data_file_is_named_never_a_traceback(recipe, only_here, multi30k, monkeypatch, capsys):
    folder = en_de_copy(multi30k, only_here / "data")
    data = (folder / "val.de.gz").read_bytes()
    (folder / "val.de.gz").write_bytes(data[: len(data) // 2])
    monkeypatch.setenv(m.DATA_ENV, str(folder))
    main, argv = RECIPES[recipe]
    error = usage_error(main, argv(only_here / "out"), capsys)
    assert "val.de.gz" in error and not (only_here / "out").exists()


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_an_unusable_cache_location_is_named_never_a_traceback(recipe, only_here, monkeypatch, capsys):
    (only_here / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(only_here / "a-file"))
    main, argv = RECIPES[recipe]
    error = usage_error(main, argv(only_here / "out"), capsys)
    assert "XDG_CACHE_HOME" in error and str(only_here / "a-file") in error


@pytest.mark.parametrize("recipe", ["train_translation", "finetune_mbart", "parse_sources"])
@pytest.mark.parametrize("found", ["environment", "cache"])
@pytest.mark.parametrize("overwrite", [True, False])
def test_the_data_folder_found_without_a_flag_is_never_the_output(recipe, found, overwrite, only_here, multi30k,
                                                                  monkeypatch, capsys):
    """``--output_dir`` equal to the Multi30k folder that ``HF_HEADATTN_DATA`` or the cache names (as the refusal of
    ``--multi30k_dir`` itself): refused, the folder unchanged; never answered with advice to overwrite it (#64)."""
    if found == "environment":
        folder = en_de_copy(multi30k, only_here / "data")
        monkeypatch.setenv(m.DATA_ENV, str(folder))
    else:
        folder = en_de_copy(multi30k, m.cache_dir())
    before = sorted(path.name for path in folder.iterdir())
    main, argv = RECIPES[recipe]
    flag = ["--overwrite"] if recipe == "parse_sources" else ["--overwrite_output_dir"]
    error = usage_error(main, argv(folder) + (flag if overwrite else []), capsys)
    assert f"--output_dir {folder} is the Multi30k folder" in error and "overwrite" not in error
    assert ("$HF_HEADATTN_DATA" in error) == (found == "environment")
    assert sorted(path.name for path in folder.iterdir()) == before


def test_parsing_without_spacy_names_the_extra(multi30k, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy: ImportError, as where it is not installed
    error = usage_error(parse.main, ["--multi30k_dir", str(multi30k), "--output_dir", str(tmp_path / "out")],
                        capsys)
    assert "spaCy is not installed" in error and "pip install 'hf-headattn[parsers]'" in error
    assert not (tmp_path / "out").exists()


def test_a_usage_error_is_the_line_that_says_what_is_wrong(tmp_path, capsys):
    error = usage_error(train.main, ["--output_dir", str(tmp_path), "--method", "magic"], capsys)
    lines = error.strip().splitlines()
    assert len(lines) == 2 and "unknown method 'magic'" in lines[0] and "--help" in lines[1], error


def test_a_scratch_tokenizer_is_reused_only_for_its_settings_and_data(tmp_path):
    def pairs(n, offset=0):
        return datasets.Dataset.from_list([{"translation": {"en": f"a small dog number {i}", "de": f"ein Hund {i}"}}
                                           for i in range(offset, offset + n)])

    folder = tmp_path / "tokenizer"
    first = scratch_tokenizer(pairs(200), 40, folder, "en", "de")
    assert len(first) == 40 and (folder / TOKENIZER_RECORD).is_file()
    stamp = (folder / "source.spm").stat().st_mtime_ns
    assert len(scratch_tokenizer(pairs(200), 40, folder, "en", "de")) == 40  # the same run resumed: reused
    assert (folder / "source.spm").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match=r"trained with other settings or data than this run's \(vocab_size: 40 "
                                         r"there, 30 here\); expected"):
        scratch_tokenizer(pairs(200), 30, folder, "en", "de")
    with pytest.raises(ValueError, match=r"\(train_sha256: '[0-9a-f]{64}' there, '[0-9a-f]{64}' here\)"):
        scratch_tokenizer(pairs(200, offset=1), 40, folder, "en", "de")
    with pytest.raises(ValueError, match=r"train_pairs: 200 there, 150 here"):
        scratch_tokenizer(pairs(150), 40, folder, "en", "de")
