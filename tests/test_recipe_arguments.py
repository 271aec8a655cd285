"""Every recipe (and study script in research/) turns a bad value into a usage error (argparse's exit 2, naming the
value), not a traceback; the shared argparse types of hf_headattn.experiment.arguments."""

import argparse
from pathlib import Path

import pytest

from hf_headattn.commands import demo, finetune, parse
from hf_headattn.experiment.arguments import (
    existing_dir,
    existing_file,
    non_negative_int,
    positive_float,
    positive_int,
    share,
)

ROOT = Path(__file__).resolve().parents[1]

import fidelity_study  # noqa: E402
import reproduce_multi30k  # noqa: E402


def test_the_argparse_types_name_the_value_and_what_was_expected(tmp_path):
    assert (positive_int("3"), non_negative_int("0"), positive_float("0.5"), share("1")) == (3, 0, 0.5, 1.0)
    assert existing_dir(str(tmp_path)) == tmp_path
    (tmp_path / "f").write_text("")
    assert existing_file(str(tmp_path / "f")) == tmp_path / "f"
    for check, text, message in ((positive_int, "0", "expected an integer >= 1, got '0'"),
                                 (positive_int, "two", "expected an integer >= 1, got 'two'"),
                                 (non_negative_int, "-1", "expected an integer >= 0, got '-1'"),
                                 (positive_float, "-5", "expected a number > 0, got '-5'"),
                                 (positive_float, "nan", "expected a number > 0, got 'nan'"),
                                 (share, "1.5", "expected a share in [0, 1], got '1.5'"),
                                 (existing_dir, str(tmp_path / "f"), "(a file)"),
                                 (existing_dir, str(tmp_path / "typo"), "(not found)"),
                                 (existing_file, str(tmp_path), "(a folder)")):
        with pytest.raises(argparse.ArgumentTypeError) as error:
            check(text)
        assert message in str(error.value)


@pytest.mark.parametrize("main, argv, expected", [
    (demo.main, ["--methods", "baseline", "dhicm+magic"], "unknown method 'magic'"),
    (demo.main, ["--methods", "baseline", "fixed_attention+rel_pos"], "--methods: rel_pos and fixed_attention both "
                                                                      "take over heads [0, 1]"),
    (demo.main, ["--max_steps", "0"], "argument --max_steps: expected an integer >= 1, got '0'"),
    (demo.main, ["--data", "/nowhere/multi30k"], "multi30k_dir '/nowhere/multi30k' is not a folder"),
    (demo.main, ["--quick", "--multi30k_dir", "/nowhere/m"], "multi30k_dir '/nowhere/m' is not a folder"),
    (fidelity_study.main, ["screen", "--parallel", "0"], "argument --parallel: expected an integer >= 1"),
    (fidelity_study.main, ["screen", "--rows", "magic"], "unknown rows ['magic']"),
    (fidelity_study.main, ["table", "--output_dir", "/nowhere/fidelity"], "--output_dir /nowhere/fidelity is not"),
    (reproduce_multi30k.main, ["run", "--output_dir", "/nowhere/x", "--parallel", "0"], "argument --parallel"),
    (reproduce_multi30k.main, ["run", "--output_dir", "/nowhere/x", "--rows", "magic"], "unknown method 'magic'"),
    (reproduce_multi30k.main, ["run", "--output_dir", "/nowhere/x", "--table", "rhe-table-9"],
     "argument --table: invalid choice: 'rhe-table-9'"),
    (reproduce_multi30k.main, ["run", "--output_dir", "/nowhere/x", "--table", "rhe-table-1", "--rows", "dhicm"],
     "not allowed with argument"),
    (reproduce_multi30k.main, ["run", "--output_dir", "/nowhere/x", "--multi30k_dir", "/nowhere/m"], "/nowhere/m"),
    (reproduce_multi30k.main, ["table", "--output_dir", "/nowhere/x"], "/nowhere/x' (not found)"),
    (parse.main, ["--output_dir", "/nowhere/p", "--num_proc", "0"], "--num_proc must be a positive"),
    (parse.main, ["--output_dir", "/nowhere/p", "--target_lang", "xx"],
     "Multi30k has no language ['xx'] to download"),  # before any download
    (parse.main, ["--multi30k_dir", "/nowhere/m", "--output_dir", "/nowhere/p"], "'/nowhere/m' is not a"),
    (finetune.main, ["--model_name_or_path", "m", "--output_dir", "/nowhere/f", "--eadra", "{bad"],
     "--eadra '{bad' is not valid JSON"),
])
def test_a_bad_value_is_a_usage_error(main, argv, expected, capsys, monkeypatch):
    monkeypatch.delenv("HF_HEADATTN_DATA", raising=False)  # the refusals hold for the data found without it
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and expected in capsys.readouterr().err


def test_the_papers_tables_are_rows_the_recipes_know():
    """Every row of ``reproduce_multi30k.PAPER_TABLES`` is a method name with settings (the comparison methods'
    included: Rel_Pos, Localness, Fixed-attention; #54), and each table has the baseline."""
    from hf_headattn.experiment.presets import method_settings

    for table, rows in reproduce_multi30k.PAPER_TABLES.items():
        assert rows[0] == "baseline", table
        for row in rows:
            method_settings(row)
    assert {"rel_pos", "localness", "fixed_attention"} <= {row for rows in reproduce_multi30k.PAPER_TABLES.values()
                                                           for row in rows}
