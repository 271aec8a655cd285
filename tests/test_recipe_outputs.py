"""Every recipe that writes refuses, by name and before it reads anything, an output folder that holds earlier results
or its own inputs (a usage error, exit 2, nothing changed); the shared checks of hf_headattn.experiment.outputs;
average.py's arguments, its --overwrite and its all-or-nothing write."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import hf_headattn
from conftest import TINY
from hf_headattn.commands import average, demo, finetune, parse, prune, train, translate
from hf_headattn.experiment.outputs import check_output_dir, check_output_file, check_trainer_output_dir, replacing_dir

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "research" / "grids" / "tiny_cpu.json"

import search_hyperparameters  # noqa: E402


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (and its siblings' names: no temporary folder may be left beside it)."""
    found = {str(path.relative_to(folder.parent)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    return {**found, "siblings": sorted(p.name for p in folder.parent.iterdir()) if folder.parent.is_dir() else []}


def save_checkpoint(path, fill, optimizer=False):
    """A tiny HeadAttn Marian checkpoint with every floating-point tensor ``fill`` (and an optimizer.pt)."""
    torch.manual_seed(0)
    model = hf_headattn.HeadAttnMarianMTModel(hf_headattn.HeadAttnMarianConfig(**TINY))
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.fill_(fill)
    model.save_pretrained(path)
    if optimizer:
        (path / "optimizer.pt").write_bytes(b"optimizer state")
    return path


@pytest.fixture()
def run(tmp_path):
    """A Trainer run folder: checkpoint-1 (weights 1, an optimizer), -2 (2), -3 (3) and its final model (3)."""
    run = tmp_path / "run"
    for step in (1, 2, 3):
        save_checkpoint(run / f"checkpoint-{step}", float(step), optimizer=True)
    save_checkpoint(run, 3.0)
    return run


def model_folder(path):
    """What prune.py checks before reading: an hf-headattn config and a tokenizer_config.json."""
    hf_headattn.HeadAttnMarianConfig(**TINY).save_pretrained(path)
    (path / "tokenizer_config.json").write_text("{}")
    return path


def holding(*names, folder="out"):
    """A preparation: ``tmp / folder`` holding ``names`` (a name ending in "/" a folder, else a file)."""
    def prepare(tmp):
        (tmp / folder).mkdir(parents=True, exist_ok=True)
        for name in names:
            (tmp / folder / name).mkdir() if name.endswith("/") else (tmp / folder / name).write_bytes(b"earlier")
        return tmp / folder
    return prepare


def run_folder(tmp):
    """A run folder ``tmp / "out"`` with checkpoint-1 and checkpoint-2."""
    for step in (1, 2):
        save_checkpoint(tmp / "out" / f"checkpoint-{step}", float(step))
    return tmp / "out"


trainer_earlier = holding("checkpoint-3/")


# (recipe, arguments given tmp_path and the folder prepared, the refusal's message), the folder being tmp_path / "out"
CASES = {
    "train_translation_checkpoints": (
        train.main, lambda out: ["--output_dir", str(out)],
        trainer_earlier, "holds ['checkpoint-3'] of an earlier run; expected a folder without them, or "
                         "--overwrite_output_dir to replace them (or --resume_from_checkpoint true"),
    "train_translation_own_tokenizer": (
        train.main, lambda out: ["--output_dir", str(out), "--tokenizer_name", str(out)],
        holding(), "is --tokenizer_name"),
    "train_translation_model_in_a_replaced_checkpoint": (
        train.main, lambda out: ["--output_dir", str(out), "--overwrite_output_dir",
                                              "--model_name_or_path", str(out / "checkpoint-3")],
        trainer_earlier, "holds --model_name_or_path {out}/checkpoint-3 in checkpoint-3, which --overwrite_output_dir "
                         "replaces, an input of this run"),
    "train_translation_finished_run": (
        train.main, lambda out: ["--output_dir", str(out)],
        holding("config.json", "model.safetensors", "results.json", "tokenizer/"),
        "holds ['config.json', 'model.safetensors', 'results.json', 'tokenizer'] of an earlier run; expected a folder "
        "without them, or --overwrite_output_dir to replace them\n"),
    "finetune_mbart_finished_run": (
        finetune.main, lambda out: ["--output_dir", str(out)],
        holding("model.safetensors", "predictions_validation.txt"),
        "holds ['model.safetensors', 'predictions_validation.txt'] of an earlier run"),
    "demo_earlier_demo": (
        demo.main, lambda out: ["--output_dir", str(out), "--quick"], holding("baseline/", "summary.json", "x.log"),
        "holds ['baseline', 'summary.json'] of an earlier run; expected a folder without them, or "
        "--overwrite_output_dir to replace them (with make: make demo ARGS=--overwrite_output_dir)"),
    "finetune_mbart_checkpoints": (
        finetune.main, lambda out: ["--output_dir", str(out)],
        trainer_earlier, "holds ['checkpoint-3'] of an earlier run"),
    "finetune_mbart_own_model": (
        finetune.main, lambda out: ["--model_name_or_path", str(out), "--output_dir", str(out),
                                          "--overwrite_output_dir"],
        lambda tmp: model_folder(tmp / "out"), "is --model_name_or_path"),
    "search_earlier_search": (
        search_hyperparameters.main, lambda out: ["--grid", str(GRID), "--output_dir", str(out)],
        holding("architecture/"),
        "holds ['architecture'] of an earlier run; expected a folder without them, or --overwrite_output_dir"),
    "search_into_its_data": (
        search_hyperparameters.main, lambda out: ["--grid", str(GRID), "--multi30k_dir", str(out),
                                                  "--output_dir", str(out), "--overwrite_output_dir"],
        holding("train.en.gz"), "is --multi30k_dir"),
    "parse_sources_earlier_parses": (
        parse.main, lambda out: ["--output_dir", str(out)],
        holding("train.en.conllu"),
        "holds ['train.en.conllu'] of an earlier run; expected a new or empty folder, or --overwrite"),
    "parse_sources_into_its_data": (
        parse.main, lambda out: ["--multi30k_dir", str(out), "--output_dir", str(out), "--overwrite"],
        holding("train.en.gz"), "is --multi30k_dir"),
    "prune_heads_its_model_in_its_results": (
        prune.parse_args, lambda out: ["--model_dir", str(out / "model"),
                                             "--output_dir", str(out), "--overwrite"],
        lambda tmp: model_folder(tmp / "out" / "model").parent,
        "holds --model_dir {out}/model in model, which --overwrite replaces"),
    "prune_heads_into_its_model": (
        prune.parse_args, lambda out: ["--model_dir", str(out),
                                             "--output_dir", str(out)],
        lambda tmp: model_folder(tmp / "out"), "is --model_dir"),
    "average_checkpoints_run_folder": (
        average.main, lambda out: ["--run_dir", str(out), "--last", "2", "--output_dir", str(out),
                                               "--overwrite"],
        run_folder, "is --run_dir"),
    "translate_into_its_input": (
        translate.main, lambda out: ["--model_name_or_path", str(out), "--input", str(out / "test.en"), "--output",
                                     str(out / "test.en")],
        holding("test.en"), "is --input"),
    "translate_into_its_model": (
        translate.main, lambda out: ["--model_name_or_path", str(out), "--input", str(out.parent / "test.en"),
                                     "--output", str(out / "config.json")],
        lambda tmp: holding("test.en", folder=".")(tmp) and model_folder(tmp / "out"), "is in --model_name_or_path"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_output_holding_earlier_results_or_inputs_is_refused_by_name(case, tmp_path, capsys):
    main, argv, prepare, message = CASES[case]
    out = prepare(tmp_path)
    before = files(out)
    with pytest.raises(SystemExit) as stop:
        main(argv(out))
    error = capsys.readouterr().err
    assert stop.value.code == 2 and message.format(out=out) in error and str(out) in error
    assert files(out) == before


def test_a_trainer_recipe_refuses_its_own_entries_only(tmp_path):
    """What the Trainer recipes write (an earlier run) is refused, and replaced with the flag; what they never write
    (a log the shell writes there) is neither."""
    out = holding("train.log", ".gitignore", "notes.txt")(tmp_path)
    assert check_trainer_output_dir(out, {}, False) == []
    holding("checkpoint-2/", "runs/", "predictions_test.txt", "source.spm", "README.md")(tmp_path)
    with pytest.raises(ValueError, match=r"holds \['README.md', 'checkpoint-2', 'predictions_test.txt', 'runs', "
                                         r"'source.spm'\] of an earlier run"):
        check_trainer_output_dir(out, {}, False)
    assert [path.name for path in check_trainer_output_dir(out, {}, True)] == [
        "README.md", "checkpoint-2", "predictions_test.txt", "runs", "source.spm"]
    assert check_trainer_output_dir(out, {}, False, resume=True) == []  # continued, not replaced


def test_check_output_dir_and_output_file(tmp_path):
    (tmp_path / "data.txt").write_text("x")
    assert check_output_dir(tmp_path / "new", {"--data": tmp_path / "data.txt", "--hub": "org/model"}) == []
    assert check_output_dir(tmp_path / "new", {"--hub": None}, results=["a"]) == []
    (tmp_path / "out" / "a").mkdir(parents=True)
    (tmp_path / "out" / "keep").mkdir()
    assert check_output_dir(tmp_path / "out", results=["b"]) == []  # what the recipe does not write is not its
    assert check_output_dir(tmp_path / "out", results=["a"], overwrite=True) == [tmp_path / "out" / "a"]
    with pytest.raises(ValueError, match=r"--output_dir .*out holds \['a', 'keep'\] of an earlier run; expected a new "
                                         r"or empty folder, or --overwrite to replace it$"):
        check_output_dir(tmp_path / "out")
    with pytest.raises(ValueError, match=r"out holds --data .*keep, an input of this run that writing there would "
                                         r"delete"):  # never, not even with overwrite
        check_output_dir(tmp_path / "out", {"--data": tmp_path / "out" / "keep"}, overwrite=True)
    with pytest.raises(ValueError, match=r"data.txt is a file; expected a folder"):
        check_output_dir(tmp_path / "data.txt")
    check_output_file(tmp_path / "data.txt", {"--input": tmp_path / "other.txt"})  # replaced, as > would
    check_output_file("-", {"--input": "-"})
    for output, message in ((tmp_path / "out", "is a folder; expected a file name"),
                            (tmp_path / "nowhere" / "x.txt", "the folder .*nowhere does not exist"),
                            (tmp_path / "out" / "keep" / "x.txt", "is in --model .*keep, an input")):
        with pytest.raises(ValueError, match=message):
            check_output_file(output, {"--model": tmp_path / "out" / "keep"})


def test_replacing_dir_writes_whole_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.txt").write_text("earlier")
    with pytest.raises(RuntimeError, match="killed"):
        with replacing_dir(out) as folder:
            (folder / "half.txt").write_text("half")
            raise RuntimeError("killed")
    assert files(out) == {"out/earlier.txt": b"earlier", "siblings": ["out"]}
    with replacing_dir(out) as folder:
        assert folder.parent == out.parent and folder.name == f".out.tmp-{os.getpid()}" and not out.samefile(folder)
        (folder / "new.txt").write_text("new")
    assert files(out) == {"out/new.txt": b"new", "siblings": ["out"]}


@pytest.mark.parametrize("argv, message", [
    (["--run_dir", "{tmp}/nowhere"],
     "argument --run_dir: expected an existing folder, got '{tmp}/nowhere' (not found)"),
    (["--run_dir", "{run}", "--last", "0"], "argument --last: expected an integer >= 1, got '0'"),
    (["--run_dir", "{run}", "--last", "5"], "asked to average the last 5 checkpoints, but {run} has 3: checkpoint-1, "),
    (["--run_dir", "{run}", "--checkpoints", "{run}/checkpoint-1"], "expected either --run_dir (with --last N) or "),
    ([], "expected either --run_dir (with --last N) or --checkpoints, not both and not neither"),
    (["--checkpoints", "{run}/checkpoint-1", "--last", "1"], "--last 1 goes with --run_dir"),
    (["--checkpoints", "{run}/checkpoint-9"], "argument --checkpoints: expected an existing folder"),
    (["--checkpoints", "{run}/checkpoint-1", "{tmp}"], "{tmp} has no config.json"),
    (["--run_dir", "{run}", "--last", "2", "--output_dir", "{run}/checkpoint-3/optimizer.pt"],
     "optimizer.pt is a file"),
    (["--run_dir", "{run}", "--last", "2", "--output_dir", "{run}/checkpoint-3"],
     "--output_dir {run}/checkpoint-3 is averaged checkpoint"),
    (["--run_dir", "{run}", "--last", "2", "--output_dir", "{run}/checkpoint-1"],
     "--output_dir {run}/checkpoint-1 holds ['"),
    (["--checkpoints", "{run}/checkpoint-2", "{run}/checkpoint-3", "--output_dir", "{run}", "--overwrite"],
     "--output_dir {run} holds --checkpoints {run}/checkpoint-2, an input of this run that writing there would delete"),
])
def test_average_checkpoints_checks_every_argument_before_reading_weights(argv, message, run, tmp_path, capsys):
    argv = [arg.format(run=run, tmp=tmp_path) for arg in argv]
    if "--output_dir" not in argv:
        argv += ["--output_dir", str(tmp_path / "avg")]
    before = files(run)
    with pytest.raises(SystemExit) as stop:
        average.main(argv)
    assert stop.value.code == 2 and message.format(run=run, tmp=tmp_path) in capsys.readouterr().err
    assert files(run) == before and not (tmp_path / "avg").exists()


def test_average_checkpoints_overwrite_replaces_the_whole_folder(run, tmp_path):
    """Regression: an --output_dir naming a checkpoint got the average's weights beside its own optimizer.pt."""
    average.main(["--run_dir", str(run), "--last", "2", "--output_dir", str(run / "checkpoint-1"),
                              "--overwrite"])
    assert (run / "checkpoint-1" / "averaged_from.json").is_file()
    assert not (run / "checkpoint-1" / "optimizer.pt").exists()  # the earlier folder replaced, not written into
    assert torch.all(load_file(run / "checkpoint-1" / "model.safetensors")["model.shared.weight"] == 2.5)
    assert json.loads((run / "checkpoint-1" / "averaged_from.json").read_text())["checkpoints"] == [
        str(run / "checkpoint-2"), str(run / "checkpoint-3")]
    assert (run / "checkpoint-3" / "optimizer.pt").read_bytes() == b"optimizer state"  # the inputs untouched
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


def test_a_failed_average_leaves_the_output_as_it_was(run, tmp_path, monkeypatch):
    out = save_checkpoint(tmp_path / "avg", 7.0)
    before = files(out)

    def save_half(self, folder, **kwargs):
        (Path(folder) / "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(hf_headattn.HeadAttnMarianMTModel, "save_pretrained", save_half)
    with pytest.raises(OSError, match="disk full"):
        average.main(["--run_dir", str(run), "--last", "2", "--output_dir", str(out), "--overwrite"])
    assert files(out) == before


def test_a_study_session_starts_afresh_only_over_incomplete_checkpoints(tmp_path):
    """The study drivers restart a run whose checkpoints are all incomplete (killed while saving) with
    --overwrite_output_dir, which hf-headattn train now needs there; a complete one is resumed instead."""
    from workshop.sessions import StopRules, session_flags

    rules, run = StopRules(patience=1, max_epochs=9, time_cap_minutes=10), tmp_path / "run"
    run.mkdir()
    assert "--overwrite_output_dir" not in session_flags(run, rules)[0]
    (run / "checkpoint-5").mkdir()
    assert "--overwrite_output_dir" in session_flags(run, rules)[0]
    (run / "checkpoint-5" / "trainer_state.json").write_text(json.dumps({"epoch": 1.0, "global_step": 5}))
    (run / "checkpoint-5" / "train_time.json").write_text(json.dumps({"train_time_s": 1.0}))
    flags = session_flags(run, rules)[0]
    assert "--overwrite_output_dir" not in flags and flags[flags.index("--resume_from_checkpoint") + 1] == str(
        run / "checkpoint-5")
