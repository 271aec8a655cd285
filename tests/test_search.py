"""Staged grid search: grid checks, the two-stage recipe on Multi30k lines (trials get their settings, the second stage
keeps the first's best architecture, every trial saved), early stopping per trial, bad input."""

import itertools
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

import search_hyperparameters  # noqa: E402
from workshop.search import (  # noqa: E402
    KNOWN_HYPERPARAMETERS,
    Stage,
    check_trials,
    config_fields,
    load_grid,
    meta_model_check,
    summary_table,
    train_flags,
)

TWO_STAGES = {"stages": [{"name": "architecture", "grid": {"ffn_dim": [32, 64]}},
                         {"name": "regularization", "grid": {"dropout": [0.1, 0.3], "dhicm.dropout": [0.2, 0.5]}}]}


def search(tmp_path, grid, *extra):
    """The recipe on Multi30k found as a user's run finds it (the tests that call this take the multi30k fixture)."""
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(grid))
    return search_hyperparameters.main([
        "--grid", str(path), "--model_shape", "tiny", "--output_dir", str(tmp_path),
        "--max_train_samples", "100", "--max_eval_samples", "8", "--max_predict_samples", "8", "--vocab_size", "200",
        "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--max_target_length", "16",
        "--report_to", "none", "--use_cpu", "true", "--logging_steps", "1", "--save_strategy", "no", *extra,
    ])


@pytest.fixture(scope="module")
def two_stage(tmp_path_factory, multi30k):
    """(output dir, results, the config of every model built for training) of a DHICM two-stage search."""
    out, built = tmp_path_factory.mktemp("search"), []
    scratch_model = search_hyperparameters.scratch_model

    def recording(*args, **kwargs):
        model = scratch_model(*args, **kwargs)
        if model.device.type != "meta":  # not the checks before the search
            built.append((model.config.encoder_ffn_dim, model.config.dropout,
                          model.config.headattn_settings["dhicm"].dropout))
        return model

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search_hyperparameters, "scratch_model", recording)
        results = search(out, TWO_STAGES, "--max_steps", "2", "--method", "dhicm")
    return out, results, built


@pytest.mark.slow
def test_every_trial_is_saved_and_the_best_has_the_lowest_loss(two_stage):
    out, results, _ = two_stage
    for name in ("architecture", "regularization"):
        saved = json.loads((out / f"search_{name}.json").read_text())
        tried = sorted(tuple(trial["params"][key] for key in saved["grid"]) for trial in saved["trials"])
        assert tried == sorted(itertools.product(*saved["grid"].values()))  # each grid point once
        assert all(trial["state"] == "COMPLETE" and trial["eval_losses"] for trial in saved["trials"])
        assert saved["best"]["eval_loss"] == min(trial["eval_loss"] for trial in saved["trials"])
    assert json.loads((out / "search_results.json").read_text())["best_params"] == results["best_params"]
    assert set(results["best_params"]) == {"ffn_dim", "dropout", "dhicm.dropout"}


@pytest.mark.slow
def test_trials_get_their_architecture_and_stage_two_keeps_the_best(two_stage):
    _, results, _ = two_stage
    architecture, regularization = results["stages"]
    params = {trial["params"]["ffn_dim"]: trial["num_parameters"] for trial in architecture["trials"]}
    # tiny: 3 + 3 layers of d_model 128; each FFN has 2 * 128 * ffn weights and ffn + 128 biases
    assert params[64] - params[32] == 6 * (2 * 128 * 32 + 32)
    best_ffn = architecture["best"]["params"]["ffn_dim"]
    assert regularization["fixed"] == {"ffn_dim": best_ffn}
    assert {trial["num_parameters"] for trial in regularization["trials"]} == {params[best_ffn]}


@pytest.mark.slow
def test_trials_get_their_regularization(two_stage):
    _, results, built = two_stage
    architecture, regularization = results["stages"]
    losses = {(trial["params"]["dropout"], trial["params"]["dhicm.dropout"]): trial["eval_loss"]
              for trial in regularization["trials"]}
    # dropout 0.1 and DHICM dropout 0.2 are the base values: same model and seed as the first stage's best trial
    assert losses[0.1, 0.2] == architecture["best"]["eval_loss"] and losses[0.3, 0.2] != losses[0.1, 0.2]
    best_ffn = architecture["best"]["params"]["ffn_dim"]
    assert {(best_ffn, dropout, dhicm_dropout) for dropout, dhicm_dropout in losses} <= set(built)


@pytest.mark.slow
def test_summary_table_and_train_flags(two_stage):
    _, results, _ = two_stage
    table = summary_table(results["stages"][0]).splitlines()
    assert table[0].startswith("stage 'architecture': 2 trials, best trial")
    assert table[1].split() == ["trial", "ffn_dim", "eval_loss"] and sum(line.startswith("*") for line in table) == 1
    flags = results["train_translation_flags"]
    assert flags[:2] == ["--dropout", str(results["best_params"]["dropout"])]
    assert json.loads(flags[3]) == {"encoder_ffn_dim": results["best_params"]["ffn_dim"],
                                    "decoder_ffn_dim": results["best_params"]["ffn_dim"],
                                    "dhicm": {"dropout": results["best_params"]["dhicm.dropout"]}}


@pytest.mark.slow
def test_early_stopping_applies_to_each_trial(tmp_path, multi30k):
    grid = {"stages": [{"name": "heads", "grid": {"attention_heads": [2, 4]}}]}
    out = tmp_path
    results = search(out, grid, "--num_train_epochs", "4", "--max_train_samples", "16", "--vocab_size", "150",
                     "--learning_rate", "0", "--early_stopping_patience", "1", "--save_strategy", "epoch",
                     "--save_total_limit", "1")
    for trial in results["stages"][0]["trials"]:
        assert len(trial["eval_losses"]) == 2  # lr 0: no improvement after the first epoch, patience 1
        assert (out / "heads" / f"run-{trial['trial']}").is_dir()


@pytest.mark.parametrize("grid,message", [
    ({"stages": []}, "non-empty list 'stages'"),
    ({"stages": [{"name": "a", "grid": {}}]}, "stage 'a' has an empty or missing 'grid'"),
    ({"stages": [{"name": "a", "grid": {"n_heads": [2]}}]}, r"grid key 'n_heads' of stage 'a' is not a known "
                                                            r"hyperparameter; expected one of \['attention_heads'"),
    ({"stages": [{"name": "a", "grid": {"dropout": []}}]}, "non-empty list of values, got"),
    ({"stages": [{"name": "a", "grid": {"dropout": [0.1, 1.5]}}]}, r"has 1.5; expected numbers in \[0, 1\)"),
    ({"stages": [{"name": "a", "grid": {"attention_heads": [0]}}]}, "has 0; expected positive integers"),
    ({"stages": [{"name": "a", "grid": {"ffn_dim": [True]}}]}, "has True; expected positive integers"),
    ({"stages": [{"name": "a", "grid": {"dropout": [0.1, 0.1]}}]}, "repeats a value"),
    ({"stages": [{"name": "a", "grid": {"dropout": [0.1]}}, {"name": "b", "grid": {"dropout": [0.2]}}]},
     "dropout is set by grid key 'dropout' of stage 'b' and by grid key 'dropout' of stage 'a'"),
    ({"stages": [{"name": "a", "grid": {"attention_heads": [2], "encoder_attention_heads": [4]}}]},
     "encoder_attention_heads is set by grid key 'encoder_attention_heads'"),
    ({"stages": [{"name": "a", "grid": {"dropout": [0.1]}}, {"name": "a", "grid": {"ffn_dim": [8]}}]},
     "stage name 'a' must be unique"),
])
def test_bad_grids_are_refused(grid, message):
    with pytest.raises(ValueError, match=message):
        load_grid(grid)


def test_grid_files_and_aliases():
    stages = load_grid(ROOT / "research" / "grids" / "dhicm_two_stage.json")
    assert [stage.name for stage in stages] == ["architecture", "regularization"]
    assert set(stages[0].grid) == {"attention_heads", "ffn_dim"} and stages[1].size == 48
    assert set(stages[1].grid) == {"dropout", "attention_dropout", "activation_dropout", "dhicm.dropout",
                                   "label_smoothing"}
    assert load_grid(ROOT / "research" / "grids" / "tiny_cpu.json")[0].size == 2
    assert config_fields({"attention_heads": 2, "ffn_dim": 8, "learning_rate": 1e-3}) == {
        "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 8, "decoder_ffn_dim": 8}
    assert train_flags({"learning_rate": 0.001, "label_smoothing": 0.4}, '{"dhicm": {"dim": 64}}') == [
        "--label_smoothing", "0.4", "--learning_rate", "0.001", "--method_settings", '{"dhicm": {"dim": 64}}']
    assert "label_smoothing" in KNOWN_HYPERPARAMETERS


def test_impossible_trials_are_refused_before_training():
    import hf_headattn
    from hf_headattn.experiment.presets import model_shape, split_architecture

    def build(fields):
        shape, rest = split_architecture("tiny", fields)
        return hf_headattn.HeadAttnMarianMTModel(hf_headattn.HeadAttnMarianConfig(
            **model_shape(shape), vocab_size=64, decoder_vocab_size=64, pad_token_id=0, decoder_start_token_id=0,
            **rest))

    check_trials([Stage("a", {"attention_heads": [2, 4]})], meta_model_check(build))
    with pytest.raises(ValueError, match=r"stage 'a', trial \{'attention_heads': 3\}: embed_dim must be divisible"):
        check_trials([Stage("a", {"attention_heads": [2, 3]})], meta_model_check(build))
    with pytest.raises(ValueError, match=r"trial \{'label_smoothing': 0.5\}: .*eadra\['encoder'\]\['num_heads'\]"):
        check_trials([Stage("a", {"label_smoothing": [0.5]})],
                     meta_model_check(lambda fields: build({**fields, "eadra": {"encoder": {"num_heads": 9}}})))


@pytest.mark.parametrize("extra,grid,message", [
    ([], {"stages": [{"name": "a", "grid": {"dhicm.dropout": [0.2]}}]}, "dhicm.dropout but dhicm is off"),
    (["--model_name_or_path", "facebook/mbart-large-50"], {"stages": [{"name": "a", "grid": {"ffn_dim": [8]}}]},
     r"\['ffn_dim'\] change the architecture, which facebook/mbart-large-50 fixes"),
    (["--label_smoothing_factor", "0.1"], {"stages": [{"name": "a", "grid": {"dropout": [0.1]}}]},
     "use --label_smoothing"),
    (["--max_steps", "1"], {"stages": [{"name": "a", "grid": {"attention_heads": [3]}}]},
     "trial {'attention_heads': 3}: embed_dim must be divisible"),
])
def test_recipe_refuses_bad_input(tmp_path, multi30k, extra, grid, message):
    with pytest.raises(ValueError, match=message):
        search(tmp_path, grid, *extra)


def test_recipe_needs_a_grid(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        search_hyperparameters.main(["--output_dir", str(tmp_path)])
    assert stop.value.code == 2 and "--grid is required" in capsys.readouterr().err
