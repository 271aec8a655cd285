"""research/converged_study.py over the research workshop (research/workshop): the rows and seeds; the choice on
validation only and a test step that refuses before the confirmation; finished runs skipped, unfinished ones resumed
(a fake training, then a real one of a few steps); the runs' JSON; the tables and the status on hand-made records."""

import json
import sys
from pathlib import Path

import pytest
from transformers import Seq2SeqTrainingArguments

ROOT = Path(__file__).resolve().parents[1]

import converged_study as cs  # noqa: E402
from hf_headattn import HeadAttnMarianConfig  # noqa: E402
from hf_headattn.experiment.outputs import write_json_atomic  # noqa: E402
from hf_headattn.experiment.presets import model_shape  # noqa: E402
from hf_headattn.experiment.train_arguments import (  # noqa: E402
    DataArguments,
    ModelArguments,
    parse_recipe_arguments,
)
from hf_headattn.methods.fixed_attention.equations import PATTERNS  # noqa: E402
from workshop import scoring  # noqa: E402
from workshop.curves import stop_reason, training_curve  # noqa: E402
from workshop.launch import launch  # noqa: E402
from workshop.rows import fixed_attention_row  # noqa: E402
from workshop.runs import record_path, run_dir  # noqa: E402
from workshop.sessions import resumable_checkpoint, session_flags  # noqa: E402

#: The study's commands find Multi30k themselves (no --multi30k_dir: the resolver, as a user runs them).
pytestmark = pytest.mark.usefixtures("multi30k")
SCREEN_ROWS = ["baseline", "dhicm_per_batch", "dhicm_per_token", "eadra_pair_mean_a0.1", "eadra_pair_mean_a0.3",
               "eadra_pair_mean_a1", "dea_rhe", "lpea_rhe"]


def study_argv(tmp_path, *extra, command="screen"):
    return [command, "--output_dir", str(tmp_path / "runs"), "--results_dir", str(tmp_path / "results"),
            "--tokenizer_dir", str(tmp_path / "tokenizer"), "--parses_dir", str(tmp_path / "parses"), *extra]


def study_args(tmp_path, *extra, command="screen"):
    return cs.parse_args(study_argv(tmp_path, *extra, command=command))


def test_rows_seeds_and_settings():
    assert list(cs.ROWS) == SCREEN_ROWS
    assert cs.STEPS.screen_seeds == (1,) and cs.STEPS.confirm_seeds == (2, 3) and cs.TEST_BEAMS == 5
    assert dict(cs.STEPS.rows) == {row: method for row, (method, _) in cs.ROWS.items()} == {
        "baseline": "baseline", "dhicm_per_batch": "dhicm", "dhicm_per_token": "dhicm", "eadra_pair_mean_a0.1": "eadra",
        "eadra_pair_mean_a0.3": "eadra", "eadra_pair_mean_a1": "eadra", "dea_rhe": "sea", "lpea_rhe": "sea"}
    for reduction in ("per_batch", "per_token"):
        assert cs.ROWS[f"dhicm_{reduction}"][1] == {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1],
                                                              "kl_reduction": reduction, "kl_weight": 0.1,
                                                              "mode": "paper"}}
    for row, scale in (("eadra_pair_mean_a0.1", 0.1), ("eadra_pair_mean_a0.3", 0.3), ("eadra_pair_mean_a1", 1.0)):
        eadra = cs.ROWS[row][1]["eadra"]
        assert (eadra["dist_reduction"], eadra["alpha_scale"]) == ("pair_mean", scale)
        assert eadra["encoder"] == {"alpha_peak": 0.0, "alpha_sent": 0.8, "alpha_dist": 0.02}  # Table 6, as written
        assert eadra["decoder"] == {"alpha_peak": 0.0, "alpha_sent": 0.8, "alpha_dist": 2.0} and "cross" not in eadra
    assert cs.ROWS["dea_rhe"][1]["sea"]["type"] == "dea" and cs.ROWS["lpea_rhe"][1]["sea"]["type"] == "lpea"
    assert {cs.ROWS[row][1]["sea"]["head_selection"] for row in ("dea_rhe", "lpea_rhe")} == {"redundant"}
    for _, settings in cs.ROWS.values():  # every row is a valid model
        HeadAttnMarianConfig(**model_shape("tiny"), vocab_size=99, **settings)


def test_the_comparison_rows_are_the_papers_layouts_screened_beside_not_chosen():
    assert list(cs.COMPARISON) == ["rel_pos", "rel_pos_rhe", "localness", "localness_rhe", "fixed_attention"]
    assert cs.ALL_ROWS == {**cs.ROWS, **cs.COMPARISON} and not set(cs.ROWS) & set(cs.COMPARISON)
    assert not set(cs.STEPS.rows) & set(cs.COMPARISON)  # never candidates of the choice
    rel_pos, rel_pos_rhe = cs.COMPARISON["rel_pos"][1]["rel_pos"], cs.COMPARISON["rel_pos_rhe"][1]["rel_pos"]
    # Shaw et al.'s base model: k = 16, a table per layer and head, both terms, every self-attention, no sinusoids
    assert rel_pos == {"max_relative_position": 16, "tables": "head", "values": True, "encoder_layers": "all",
                       "decoder_layers": "all", "absolute_positions": False, "head_selection": "all"}
    assert rel_pos_rhe == {**rel_pos, "decoder_layers": None, "absolute_positions": True,
                           "head_selection": "redundant"}  # RHE's Table 2: the encoder's redundant heads
    localness, localness_rhe = (cs.COMPARISON[row][1]["localness"] for row in ("localness", "localness_rhe"))
    assert localness == {"encoder_layers": "lower_half", "window": "predicted", "heads": "all", "head_selection": "all",
                         "predictor": "query"} and localness_rhe == {**localness, "head_selection": "redundant"}
    fixed = cs.COMPARISON["fixed_attention"][1]["fixed_attention"]
    assert fixed["patterns"] == ["current", "previous", "next"] and fixed["weights"] == "cubic"  # 3 + 1 of 4 heads
    assert {row: method for row, (method, _) in cs.COMPARISON.items()} == {
        "rel_pos": "rel_pos", "rel_pos_rhe": "rel_pos", "localness": "localness", "localness_rhe": "localness",
        "fixed_attention": "fixed_attention"}
    for shape in ("tiny", "small"):  # valid at both arms' shapes, each a method switched on
        for _, settings in cs.COMPARISON.values():
            config = HeadAttnMarianConfig(**model_shape(shape), vocab_size=99, **settings)
            assert getattr(config, next(iter(settings))) is not None
    with pytest.raises(ValueError, match=r"heads=9: expected 2 to 8 encoder heads"):
        fixed_attention_row(9)
    assert fixed_attention_row(8)["fixed_attention"]["patterns"] == list(PATTERNS)  # Raganato's 7 + 1


def test_compare_screens_the_comparison_rows_into_the_screens_records(tmp_path, monkeypatch, capsys):
    launched = []
    monkeypatch.setattr(cs, "launch", lambda runs, stage, rows, seeds: launched.append((stage, rows, seeds)))
    cs.main(study_argv(tmp_path, command="compare"))
    cs.main(study_argv(tmp_path, "--rows", "localness_rhe", command="compare"))
    cs.main(study_argv(tmp_path, command="screen"))
    assert launched == [("screen", list(cs.COMPARISON), (1,)), ("screen", ["localness_rhe"], (1,)),
                        ("screen", list(cs.ROWS), (1,))]
    args = study_args(tmp_path, command="compare")
    for row in ("rel_pos_rhe", "localness_rhe"):  # RHE reads the dependency parses
        assert cs.train_command(args, "screen", row, 1)[-6:-4] == ["--syntax_parses_dir", str(tmp_path / "parses")]
    for row in ("rel_pos", "localness", "fixed_attention"):
        command = cs.train_command(args, "screen", row, 1)
        assert "--syntax_parses_dir" not in command
        assert json.loads(command[command.index("--method_settings") + 1]) == cs.COMPARISON[row][1]
    assert cs.identity(args, "rel_pos", 1)["settings"] == cs.COMPARISON["rel_pos"][1]
    for command, rows, wrong in (("screen", ["rel_pos"], "rel_pos"), ("compare", ["dea_rhe", "localness"], "dea_rhe")):
        with pytest.raises(SystemExit) as stop:
            study_args(tmp_path, "--rows", *rows, command=command)
        message = capsys.readouterr().err
        assert stop.value.code == 2 and f"--rows {wrong}: not rows of {command}; expected some of" in message


def test_the_training_command_stops_early_on_validation_bleu_and_never_reads_test(tmp_path):
    args = study_args(tmp_path)
    command = cs.train_command(args, "screen", "dea_rhe", 1)
    assert command[1:4] == ["-m", "hf_headattn", "train"]
    _, (model_args, data_args, training_args), options = parse_recipe_arguments(
        (ModelArguments, DataArguments, Seq2SeqTrainingArguments), command[4:])
    assert model_args.model_shape == "tiny" and model_args.early_stopping_patience == 5
    assert training_args.metric_for_best_model == "bleu" and training_args.greater_is_better
    assert training_args.load_best_model_at_end and training_args.restore_callback_states_from_checkpoint
    assert (training_args.eval_strategy, training_args.save_strategy) == ("epoch", "epoch")
    assert training_args.num_train_epochs == 60 and training_args.use_cpu and training_args.generation_num_beams == 1
    assert data_args.test_splits == "validation" and data_args.num_beams == 5
    assert options["syntax_parses_dir"] == str(tmp_path / "parses")
    assert json.loads(model_args.method_settings) == cs.ROWS["dea_rhe"][1]
    assert "--syntax_parses_dir" not in cs.train_command(args, "screen", "baseline", 1)
    gpu = cs.train_command(study_args(tmp_path, "--device", "cuda"), "screen", "baseline", 2)
    assert gpu[gpu.index("--model_shape") + 1] == "small" and "--use_cpu" not in gpu
    assert study_args(tmp_path, "--device", "cuda").parallel == 10 and args.parallel == 2 and args.threads == 1


FAKE_TRAINING = """
import json, sys
from pathlib import Path
calls, argv = Path(sys.argv[1]), sys.argv[2:]
out = Path(argv[argv.index("--output_dir") + 1])
with calls.open("a") as f:
    f.write(json.dumps(argv) + "\\n")
evals = [{"epoch": float(e), "step": 10 * e, "eval_bleu": b, "eval_chrf": 2 * b, "eval_loss": 3.0}
         for e, b in ((1, 5.0), (2, 7.0), (3, 6.0))]
if "--resume_from_checkpoint" not in argv:  # the first session: one epoch, then the machine goes away
    checkpoint = out / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({
        "epoch": 1.0, "global_step": 10, "log_history": evals[:1],
        "stateful_callbacks": {"EarlyStoppingCallback": {"attributes": {"early_stopping_patience_counter": 0}}}}))
    (checkpoint / "train_time.json").write_text(json.dumps({"train_time_s": 30.0}))
    sys.exit(1)
(out / "results.json").write_text(json.dumps({
    "log_history": evals, "epochs": 3.0, "global_step": 30, "stopped_at_time_limit": False, "train_time_s": 60.0,
    "total_train_time_s": 90.0, "device": "cpu", "model": "tiny", "num_parameters": 7,
    "scores": {"validation": {"bleu": 8.0, "chrf": 30.0, "bleu_signature": "nrefs:1"}}}))
(out / "predictions_validation.txt").write_text("Ein Hund.\\nZwei Hunde.\\n")
"""


@pytest.mark.slow
def test_finished_runs_are_skipped_and_unfinished_ones_resume(tmp_path, monkeypatch, capsys):
    fake, calls = tmp_path / "fake_training.py", tmp_path / "calls.jsonl"
    fake.write_text(FAKE_TRAINING)
    args = study_args(tmp_path, "--patience", "1", "--time_cap_minutes", "10")
    monkeypatch.setattr(cs, "prepare", lambda args, rows: None)
    monkeypatch.setattr(cs, "train_command", lambda args, stage, row, seed: [
        sys.executable, str(fake), str(calls), "--output_dir", str(run_dir(args.output_dir / stage, row, seed))])
    rows = ["baseline", "dhicm_per_token"]
    with pytest.raises(SystemExit, match=r"2 run\(s\) not finished.*The same command resumes them"):
        launch(cs.study_runs(args), "screen", rows, (1,))  # the first session ends before any run finishes
    assert not list((tmp_path / "results").glob("*.json"))
    first = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(first) == 2 and all(argv[argv.index("--max_train_minutes") + 1] == "10.00" for argv in first)

    launch(cs.study_runs(args), "screen", rows, (1,))  # the second resumes both from their last checkpoint
    second = [json.loads(line) for line in calls.read_text().splitlines()][2:]
    assert sorted(argv[argv.index("--resume_from_checkpoint") + 1] for argv in second) == [
        str(run_dir(args.output_dir / "screen", row, 1) / "checkpoint-10") for row in rows]
    assert all(argv[argv.index("--max_train_minutes") + 1] == "9.50" for argv in second)  # the cap less 30 s
    assert all("--max_steps" not in argv for argv in second)
    record = json.loads((tmp_path / "results" / "screen-dhicm_per_token-seed1.json").read_text())
    assert record["settings"] == cs.ROWS["dhicm_per_token"][1] and record["seed"] == 1
    assert record["stage"] == "screen" and record["method"] == "dhicm" and record["schedule"] == "cpu-tiny-demo"
    assert record["git_commit"] and len(record["git_commit"]) == 40
    assert record["epochs"] == 3.0 and record["stop_reason"] == "early_stopping" and not record["stopped_by_time_cap"]
    assert [point["bleu"] for point in record["validation_curve"]] == [5.0, 7.0, 6.0]
    assert (record["best_epoch"], record["best_greedy_validation_bleu"]) == (2.0, 7.0)
    assert record["validation"]["bleu"] == 8.0 and record["validation"]["chrf"] == 30.0
    assert record["train_time_s"] == 90.0 and record["validation_predictions"] == ["Ein Hund.", "Zwei Hunde."]
    assert [session["resumed_from"] is None for session in record["sessions"]] == [True, False]

    capsys.readouterr()
    launch(cs.study_runs(args), "screen", rows, (1,))  # a third: nothing left to run
    assert len(calls.read_text().splitlines()) == 4 and "2 run(s) done, 0 to run" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"other \['patience'\]"):  # a record of another study is not mixed in
        launch(cs.study_runs(study_args(tmp_path, "--patience", "3")), "screen", rows, (1,))


def test_a_run_whose_checkpoint_met_a_stop_condition_only_scores(tmp_path):
    args = study_args(tmp_path, "--patience", "2", "--time_cap_minutes", "1", "--max_epochs", "9")
    checkpoint = tmp_path / "run" / "checkpoint-40"
    checkpoint.mkdir(parents=True)
    (tmp_path / "run" / "checkpoint-50").mkdir()  # an incomplete checkpoint (killed while saving) is not resumed

    def state(epoch, counter, seconds):
        stopping = {"EarlyStoppingCallback": {"attributes": {"early_stopping_patience_counter": counter}}}
        (checkpoint / "trainer_state.json").write_text(json.dumps({"epoch": epoch, "global_step": 40,
                                                                   "stateful_callbacks": stopping}))
        (checkpoint / "train_time.json").write_text(json.dumps({"train_time_s": seconds}))
        return session_flags(tmp_path / "run", cs.study_runs(args).rules)

    flags, session = state(4.0, 2, 10.0)
    assert session["finish_only"] == "early_stopping" and flags[flags.index("--max_steps") + 1] == "40"
    assert flags[flags.index("--resume_from_checkpoint") + 1] == str(checkpoint)
    assert state(9.0, 0, 10.0)[1]["finish_only"] == "max_epochs"
    flags, session = state(4.0, 1, 61.0)
    assert session["finish_only"] == "time_cap" and flags[flags.index("--max_train_minutes") + 1] == "0.10"
    flags, session = state(4.0, 1, 30.0)
    assert session["finish_only"] is None and "--max_steps" not in flags
    assert flags[flags.index("--max_train_minutes") + 1] == "0.50"
    results = {"stopped_at_time_limit": True, "epochs": 3.0}
    curve = [{"bleu": 1.0}, {"bleu": 2.0}, {"bleu": 2.0}, {"bleu": 1.5}]  # a tie is not an improvement
    assert stop_reason(results, curve, 2, 9, None) == "time_cap"
    assert stop_reason({**results, "stopped_at_time_limit": False}, curve, 2, 9, None) == "early_stopping"
    assert stop_reason({"epochs": 9.0}, curve, 3, 9, None) == "max_epochs"


def fake_record(args, stage, row, seed, bleu, predictions, epochs=12.0, reason="early_stopping"):
    record = {**cs.identity(args, row, seed), "stage": stage, "method": cs.ALL_ROWS[row][0],
              "validation": {"bleu": bleu, "chrf": 2 * bleu, "bleu_signature": "nrefs:1|tok:13a"},
              "best_greedy_validation_bleu": bleu - 1, "best_epoch": epochs - args.patience, "epochs": epochs,
              "stop_reason": reason, "train_time_s": 3600.0, "run_dir": "-",
              "validation_curve": [{"epoch": 1.0, "step": 453, "bleu": 3.0}, {"epoch": 2.0, "step": 906, "bleu": 9.5}],
              "validation_predictions": predictions}
    write_json_atomic(record_path(args.results_dir, stage, row, seed), record)


def status(tmp_path, capsys) -> list[str]:
    capsys.readouterr()
    cs.main(study_argv(tmp_path, command="status"))
    return capsys.readouterr().out.splitlines()


@pytest.mark.slow
def test_choice_on_validation_test_once_after_confirmation_and_tables(tmp_path, monkeypatch, capsys, multi30k_lines):
    args = study_args(tmp_path)
    valid, test = multi30k_lines("val", "de"), multi30k_lines("test_2016_flickr", "de")
    worse = [" ".join(line.split()[:-3]) for line in valid]
    screen = {"baseline": 30.0, "dhicm_per_batch": 29.0, "dhicm_per_token": 31.0, "eadra_pair_mean_a0.1": 30.5,
              "eadra_pair_mean_a0.3": 32.0, "eadra_pair_mean_a1": 5.0, "dea_rhe": 30.2, "lpea_rhe": 30.2}
    for row, bleu in list(screen.items())[:-1]:
        fake_record(args, "screen", row, 1, bleu, worse if bleu < 10 else valid)
    fake_record(args, "screen", "rel_pos", 1, 33.0, worse)  # compare's: the best validation BLEU, not a candidate
    with pytest.raises(SystemExit, match=r"screen is not complete .*lpea_rhe seed 1"):
        cs.STEPS.choice(args.results_dir, cs.HERE.parent)
    with pytest.raises(SystemExit, match="run the screen and confirm steps first"):
        cs.main(study_argv(tmp_path, command="test"))
    lines = status(tmp_path, capsys)
    assert "screen lpea_rhe seed 1: not started" in lines and len(lines) == 14  # the screen, compare's 5, choice
    assert lines[8:10] == ["screen rel_pos seed 1: done, 12 epochs (early_stopping), valid BLEU 33.00",
                           "screen rel_pos_rhe seed 1: not started"]
    assert lines[-1] == "choice: not made (the screen is not complete); test set: not read"
    fake_record(args, "screen", "lpea_rhe", 1, screen["lpea_rhe"], valid, epochs=40.0, reason="time_cap")
    # the greedy curves' bests say otherwise: the choice reads the best checkpoint's validation BLEU only
    path = record_path(args.results_dir, "screen", "eadra_pair_mean_a0.1", 1)
    write_json_atomic(path, {**json.loads(path.read_text()), "best_greedy_validation_bleu": 99.0})
    choice = cs.STEPS.choice(args.results_dir, cs.HERE.parent)
    assert choice["chosen"] == {"dhicm": "dhicm_per_token", "eadra": "eadra_pair_mean_a0.3", "sea": "dea_rhe"}
    assert choice["rows"] == ["baseline", "dhicm_per_token", "eadra_pair_mean_a0.3", "dea_rhe"]  # a tie: the first
    assert json.loads((tmp_path / "results" / "choice.json").read_text())["chosen"] == choice["chosen"]
    assert not (tmp_path / "results" / "test.json").exists()

    for row in choice["rows"][:-1]:
        for seed in cs.STEPS.confirm_seeds:
            fake_record(args, "confirm", row, seed, 30.0 + seed, valid if row != "eadra_pair_mean_a0.3" else worse)
    with pytest.raises(SystemExit, match=r"confirmation is not complete \(\['dea_rhe seed 2', 'dea_rhe seed 3'\]"):
        cs.main(study_argv(tmp_path, command="test"))
    markdown = cs.table(args)  # the table before the test set is read
    assert "| dhicm_per_token | 2 | 32.50 ± 0.71 | +0.00 (p 1.000) / +0.00 (p 1.000) | not read yet | - |" in markdown
    for seed in cs.STEPS.confirm_seeds:
        fake_record(args, "confirm", "dea_rhe", seed, 31.0, valid)

    def score_command(args, row, seed):  # the baseline's translations lose their last 3 words, the rest are exact
        lines = [" ".join(line.split()[:-3]) for line in test] if row == "baseline" else test
        payload = {"row": row, "seed": seed, "bleu": 20.0 if row == "baseline" else 25.0, "chrf": 50.0,
                   "predictions": lines}
        path = record_path(args.results_dir, "test", row, seed)
        return [sys.executable, "-c", f"import json, sys; open(sys.argv[1], 'w').write(json.dumps({payload!r}))",
                str(path)]

    monkeypatch.setattr(cs, "score_command", score_command)
    cs.main(study_argv(tmp_path, command="test"))
    read = json.loads((tmp_path / "results" / "test.json").read_text())
    assert read["finished_at"] and read["rows"] == choice["rows"] and read["seeds"] == [2, 3]
    assert read["bleu"]["dea_rhe"] == {"2": 25.0, "3": 25.0} and read["bleu"]["baseline"]["3"] == 20.0
    monkeypatch.setattr(scoring, "run_jobs", lambda *a: pytest.fail("the test set was read twice"))
    cs.main(study_argv(tmp_path, command="test"))  # a second call reads nothing

    markdown = cs.table(args)
    assert (tmp_path / "results" / "README.md").read_text() == markdown
    lines = markdown.splitlines()
    assert "| baseline | 30.00 | 60.00 | - | 29.00 | 7 | 12 | 1.00 |" in lines
    assert "| eadra_pair_mean_a1 | 5.00 | 10.00 | 0.001 | 4.00 | 7 | 12 | 1.00 |" in lines
    assert "| lpea_rhe | 30.20 | 60.40 | 1.000 | 29.20 | 35 | 40 (time cap) | 1.00 |" in lines
    assert "| baseline | 2 | 32.50 ± 0.71 | - | 20.00 ± 0.00 | - | 50.00 ± 0.00 |" in markdown
    dea = next(line for line in lines if line.startswith("| dea_rhe | 2 |"))
    assert dea.startswith("| dea_rhe | 2 | 31.00 ± 0.00 | -1.00 (p 1.000) / -2.00 (p 1.000) | 25.00 ± 0.00 | "
                          "+5.00 (p 0.001) / +5.00 (p 0.001) | 50.00 ± 0.00 |")
    eadra = next(line for line in lines if line.startswith("| eadra_pair_mean_a0.3 | 2 |"))
    assert "| +0.00 (p 0.001) / +0.00 (p 0.001) |" in eadra  # its validation predictions are worse than the baseline's
    assert "- screen lpea_rhe seed 1 (time_cap): 3.0, 9.5" in lines
    comparison = lines.index("## The papers' comparison systems (screen, seed 1, validation)")
    assert lines.index("## Screen (seed 1, validation)") < comparison < lines.index("## Confirmation (fresh seeds "
                                                                                    "[2, 3]; test read once, for "
                                                                                    "these rows)")
    assert "| rel_pos | 33.00 | 66.00 | 0.001 | 32.00 | 7 | 12 | 1.00 |" in lines[comparison:]  # p: worse lines
    assert "| fixed_attention | (running or not started) |" in markdown and "- screen rel_pos seed 1 (" in markdown
    assert not any(line.startswith("| rel_pos |") for line in lines[:comparison])
    assert "Chosen on validation: {'dhicm': 'dhicm_per_token', 'eadra': 'eadra_pair_mean_a0.3', 'sea': 'dea_rhe'}" in (
        markdown)
    lines = status(tmp_path, capsys)  # the screen's 8 runs, the confirmation's 8, the choice and the test set
    assert "screen lpea_rhe seed 1: done, 40 epochs (time_cap), valid BLEU 30.20" in lines and len(lines) == 22
    assert "confirm dea_rhe seed 3: done, 12 epochs (early_stopping), valid BLEU 31.00" in lines
    assert lines[-1] == (f"choice: {choice['chosen']}; test set: read at {read['finished_at']}")


@pytest.mark.slow
def test_a_real_run_resumes_from_its_last_checkpoint(tmp_path, monkeypatch):
    """A few steps of the real recipe: the first session dies after its first epoch (its results.json lost), the
    second resumes from that epoch's checkpoint and trains to --max_epochs."""
    from hf_headattn.experiment.recipe_parts import ParallelDataArguments, load_recipe_data, scratch_tokenizer

    data = ParallelDataArguments(max_train_samples=200)
    scratch_tokenizer(load_recipe_data(data)["train"], 300, tmp_path / "tokenizer", "en", "de")
    args = study_args(tmp_path, "--max_epochs", "3", "--", "--max_train_samples", "32", "--max_eval_samples", "8",
                      "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "8",
                      "--max_target_length", "16", "--logging_steps", "1")
    monkeypatch.setattr(cs, "prepare", lambda args, rows: None)
    real = cs.train_command
    folder = run_dir(args.output_dir / "screen", "baseline", 1)
    dies = ("import os, subprocess, sys; subprocess.run(sys.argv[2:], check=True); "
            "os.remove(os.path.join(sys.argv[1], 'results.json')); sys.exit(1)")
    monkeypatch.setattr(cs, "train_command", lambda *a: [sys.executable, "-c", dies, str(folder), *real(*a),
                                                         "--num_train_epochs", "1"])
    with pytest.raises(SystemExit, match="not finished"):
        launch(cs.study_runs(args), "screen", ["baseline"], (1,))
    assert resumable_checkpoint(folder).name == "checkpoint-2"
    monkeypatch.setattr(cs, "train_command", real)
    launch(cs.study_runs(args), "screen", ["baseline"], (1,))
    record = json.loads(record_path(args.results_dir, "screen", "baseline", 1).read_text())
    assert record["sessions"][1]["resumed_from"] == str(folder / "checkpoint-2")
    assert [point["epoch"] for point in record["validation_curve"]] == [1.0, 2.0, 3.0]
    assert record["epochs"] == 3.0 and record["global_step"] == 6 and record["stop_reason"] == "max_epochs"
    assert record["train_time_s_is_total"] and record["train_time_s"] > 0
    assert len(record["validation_predictions"]) == 8 and 0 <= record["validation"]["bleu"] <= 100
    # the training logs of both sessions, per epoch (2 steps an epoch, a log per step)
    assert [(point["epoch"], point["logs"]) for point in record["training_curve"]] == [(1, 2), (2, 2), (3, 2)]
    assert all(point["loss"] > 0 and "nll_loss" in point for point in record["training_curve"])


def test_the_training_curve_averages_each_epochs_training_logs():
    history = [
        {"epoch": 0.5, "step": 1, "loss": 4.0, "nll_loss": 3.0, "learning_rate": 1e-3, "grad_norm": 2.0},
        {"epoch": 1.0, "step": 2, "loss": 2.0, "nll_loss": 1.0, "dhicm_kl": 0.5, "learning_rate": 1e-3},
        {"epoch": 1.0, "step": 2, "eval_loss": 9.0, "eval_bleu": 10.0},  # an evaluation, not a training log
        {"epoch": 1.5, "step": 3, "loss": 1.0, "dhicm_kl": 1.5, "note": "not a number"},
        {"epoch": 2.0, "step": 4, "loss": 3.0, "note": 7.0},  # numbers only
        {"epoch": 1.5, "step": 3, "train_loss": 2.3, "train_runtime": 60.0},  # the run's summary
    ]
    assert training_curve(history) == [
        {"epoch": 1, "logs": 2, "dhicm_kl": 0.5, "loss": 3.0, "nll_loss": 2.0},  # a value's mean over the logs with it
        {"epoch": 2, "logs": 2, "dhicm_kl": 1.5, "loss": 2.0, "note": 7.0},
    ]
    assert training_curve([]) == []


@pytest.mark.parametrize("flag, value, expected", [
    ("--parallel", "0", "an integer >= 1, got '0'"), ("--max_epochs", "0", "an integer >= 1, got '0'"),
    ("--time_cap_minutes", "0", "a number > 0, got '0'"), ("--time_cap_minutes", "-5", "a number > 0, got '-5'"),
    ("--threads", "0", "an integer >= 1"), ("--patience", "-1", "an integer >= 1"),
])
def test_a_value_below_the_minimum_is_a_usage_error_not_the_default(tmp_path, capsys, flag, value, expected):
    with pytest.raises(SystemExit) as stop:
        study_args(tmp_path, flag, value)
    message = capsys.readouterr().err
    assert stop.value.code == 2 and f"argument {flag}: expected {expected}" in message
    assert study_args(tmp_path, flag, "3").__dict__[flag[2:]] == 3


def test_a_missing_results_folder_is_a_usage_error_naming_it(tmp_path, capsys):
    typo = tmp_path / "resluts"
    for command in ("table", "status", "confirm", "test"):
        with pytest.raises(SystemExit) as stop:
            cs.main([command, "--results_dir", str(typo), "--output_dir", str(tmp_path / "runs")])
        assert stop.value.code == 2 and f"--results_dir {typo} is not a folder" in capsys.readouterr().err
    assert not typo.exists()
    with pytest.raises(SystemExit) as stop:
        study_args(tmp_path, "--multi30k_dir", str(tmp_path / "nowhere"))
    assert stop.value.code == 2 and "nowhere" in capsys.readouterr().err


def test_the_gpu_script_refuses_to_run_without_what_pack_makes(tmp_path):
    import subprocess

    def script(*argv):
        return subprocess.run(["bash", "research/gpu_comparison.sh", *argv], cwd=ROOT, capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "CARRY": str(tmp_path / "carry"), "OUT": str(tmp_path)})

    missing = script("run")
    assert missing.returncode == 2 and f"{tmp_path / 'carry'}/ lacks the tokenizer" in missing.stderr
    assert "run 'pack' here first" in missing.stderr and not list(tmp_path.iterdir())  # nothing started
    wrong = script("train")
    assert wrong.returncode == 2 and "usage: bash research/gpu_comparison.sh pack|run" in wrong.stderr
