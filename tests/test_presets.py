"""Presets (the papers' tables), their precedence under the user's flags, and early stopping in the training recipe."""

import doctest
import importlib
import json
from pathlib import Path

import pytest
import torch
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

import hf_headattn
from conftest import TINY
from hf_headattn import HeadAttnMarianConfig, HeadAttnMarianMTModel
from hf_headattn.experiment.presets import (
    MODEL_SHAPES,
    check_setting_keys,
    expand_argv,
    method_settings,
    model_shape,
    paper_presets,
    preset,
    split_architecture,
)
from hf_headattn.experiment.recipe_parts import collator, pretrained_model

ROOT = Path(__file__).resolve().parents[1]

from hf_headattn.commands import train as train_translation  # noqa: E402


def parse(*argv):
    parser = HfArgumentParser((train_translation.ModelArguments, train_translation.DataArguments,
                               Seq2SeqTrainingArguments))
    return parser.parse_args_into_dataclasses(args=expand_argv(["--output_dir", "unused", *argv]))


# values typed from the papers' tables, independently of presets.py
DHICM_TABLE_2 = {  # ffn, heads, dropout, attention dropout, activation dropout, DHICM dropout, label smoothing
    "dhicm_de_en": (2048, 4, 0.5, 0.1, 0.3, 0.5, 0.1),
    "dhicm_hi_en": (1024, 4, 0.3, 0.0, 0.0, 0.2, 0.1),
    "dhicm_be_en": (128, 2, 0.1, 0.0, 0.0, 0.2, 0.4),
}
EADRA_TABLE_6 = {"eadra_enc_ko_en": ("encoder", 0.01, 0.4), "eadra_x_gl_en": ("cross", 0.15, 5),
                 "eadra_dec_tr_en": ("decoder", 3, 1.5), "eadra_enc_wmt_en_de_100k": ("encoder", 0.02, 0.8)}


@pytest.mark.parametrize("name", sorted(DHICM_TABLE_2))
def test_dhicm_presets_are_table_2(name):
    ffn, heads, dropout, attention_dropout, activation_dropout, dhicm_dropout, smoothing = DHICM_TABLE_2[name]
    model_args, data_args, training_args = parse("--preset", name)
    config = preset(name).config
    assert (config["encoder_ffn_dim"], config["decoder_ffn_dim"]) == (ffn, ffn)
    assert (config["encoder_attention_heads"], config["decoder_attention_heads"]) == (heads, heads)
    assert (config["activation_dropout"], preset(name).method_overrides["dhicm"]["dropout"]) == (
        activation_dropout, dhicm_dropout)
    assert (model_args.dropout, model_args.attention_dropout, model_args.label_smoothing) == (
        dropout, attention_dropout, smoothing)
    # §4.3: lr 5e-4, Adam (0.9, 0.98, 1e-6), inverse sqrt with 4000 warm-up steps, beam 5, early stopping 10
    assert (training_args.learning_rate, training_args.adam_beta2, training_args.adam_epsilon) == (5e-4, 0.98, 1e-6)
    assert training_args.lr_scheduler_type == "inverse_sqrt" and training_args.warmup_steps == 4000
    assert (data_args.num_beams, model_args.early_stopping_patience, model_args.method) == (5, 10, "dhicm")
    assert training_args.eval_strategy == "epoch" == training_args.save_strategy
    assert training_args.load_best_model_at_end and training_args.metric_for_best_model == "loss"
    assert "Table 2" in paper_presets()[name].doc


@pytest.mark.parametrize("name", sorted(EADRA_TABLE_6))
def test_eadra_presets_are_table_6(name):
    component, alpha_dist, alpha_sent = EADRA_TABLE_6[name]
    assert preset(name).config == {"eadra": {component: {"alpha_peak": 0.0, "alpha_dist": alpha_dist,
                                                         "alpha_sent": alpha_sent},
                                             "dist_reduction": "sum", "alpha_scale": 1.0}}  # Eq. 8 as written
    assert "Table 6" in paper_presets()[name].doc and preset(name).flags["model_shape"] == "base"


def test_rhe_preset_is_transformer_base_with_k_6():
    model_args, _, training_args = parse("--preset", "rhe_base")
    assert model_shape(model_args.model_shape) == MODEL_SHAPES["base"]
    assert MODEL_SHAPES["base"]["encoder_attention_heads"] == 8 and MODEL_SHAPES["base"]["encoder_ffn_dim"] == 2048
    assert preset("rhe_base").method_overrides["sea"]["max_relative_position"] == 6 and model_args.method == "lpea_rhe"
    assert training_args.adam_beta2 == 0.98 and training_args.warmup_steps == 4000
    assert "Table 3" in paper_presets()["rhe_base"].doc and "last 10" in paper_presets()["rhe_base"].doc


@pytest.mark.parametrize("name", sorted(paper_presets()))
def test_every_preset_parses_and_builds_a_valid_model(name):
    model_args, _, _ = parse("--preset", name, "--model_shape", "tiny")
    settings = train_translation.settings_from(model_args)
    shape, rest = split_architecture("tiny", settings)
    # a fine-tuning preset (no flags: eadra_mbart_*, fixed_attention_mbart) meets a pretrained model's 16 heads
    heads = {} if preset(name).flags else {"encoder_attention_heads": 16, "decoder_attention_heads": 16}
    with torch.device("meta"):
        model = hf_headattn.HeadAttnMarianMTModel(hf_headattn.HeadAttnMarianConfig(
            **{**model_shape(shape), **heads}, vocab_size=64, decoder_vocab_size=64, pad_token_id=0, eos_token_id=1,
            decoder_start_token_id=0, **rest))
    for key, value in preset(name).config.items():
        assert getattr(model.config, key) == value
    assert "Table" in paper_presets()[name].doc


def test_your_flags_win_over_the_preset_and_the_preset_over_defaults():
    model_args, _, training_args = parse("--preset", "dhicm_de_en", "--dropout", "0.2", "--eval_strategy", "steps",
                                         "--save_strategy", "steps", "--method", "baseline")
    assert model_args.dropout == 0.2 and model_args.method == "baseline"  # yours
    assert model_args.attention_dropout == 0.1 and training_args.learning_rate == 5e-4  # the preset's
    assert training_args.eval_strategy == "steps" and training_args.load_best_model_at_end  # yours, early stopping's
    model_args, _, training_args = parse()
    assert model_args.dropout == 0.1 and training_args.learning_rate == 5e-5 and training_args.eval_strategy == "no"
    model_args, _, training_args = parse("--preset=dhicm_be_en", "--early-stopping-patience", "3")  # other spellings
    assert model_args.label_smoothing == 0.4 and model_args.early_stopping_patience == 3
    assert training_args.eval_strategy == "epoch" and training_args.load_best_model_at_end


def test_config_fields_method_then_preset_then_method_settings():
    model_args, _, _ = parse("--method", "eadra", "--preset", "eadra_enc_ko_en+eadra_x_ko_en",
                             "--method_settings", '{"activation_dropout": 0.2}')
    eadra = train_translation.settings_from(model_args)["eadra"]
    assert eadra["decoder"] == {}  # the method's component stays (merged, not replaced)
    assert (eadra["encoder"]["alpha_dist"], eadra["cross"]["alpha_sent"]) == (0.01, 8.0)
    model_args, _, _ = parse("--preset", "dhicm_de_en", "--method_settings", '{"dhicm": {"dropout": 0.1}}')
    dhicm = train_translation.settings_from(model_args)["dhicm"]
    assert dhicm["dropout"] == 0.1 and dhicm["encoder_layers"] == [-1]  # merged into the preset's


def test_partial_method_settings_update_the_method_and_a_method_left_off_is_refused():
    """--method dhicm with partial --method_settings must not train a baseline (once it did, saying so only in a log
    line)."""
    from hf_headattn.experiment.train_arguments import check_methods_on

    model_args, _, _ = parse("--method", "dhicm", "--method_settings", '{"dhicm": {"kl_weight": 0.5}}')
    settings = train_translation.settings_from(model_args)
    assert settings["dhicm"] == {**method_settings("dhicm")["dhicm"], "kl_weight": 0.5}
    model = HeadAttnMarianMTModel(HeadAttnMarianConfig(**TINY, **settings))
    check_methods_on(model_args, model)  # on: no error
    off = '{"dhicm": {"encoder_layers": null, "decoder_layers": null}}'
    model_args, _, _ = parse("--method", "dhicm", "--method_settings", off)
    model = HeadAttnMarianMTModel(HeadAttnMarianConfig(**TINY, **train_translation.settings_from(model_args)))
    with pytest.raises(ValueError, match=r"--method dhicm asks for \['dhicm'\], but the final settings leave it off"):
        check_methods_on(model_args, model)
    model_args, _, _ = parse("--method", "dhicm", "--method_settings", '{"dhicm": null}')  # asked for off
    check_methods_on(model_args, HeadAttnMarianMTModel(HeadAttnMarianConfig(**TINY)))


def test_bad_presets_and_pretrained_architecture_are_refused():
    with pytest.raises(ValueError, match=r"unknown preset 'dhicm_xx' in 'dhicm_de_en\+dhicm_xx'"):
        parse("--preset", "dhicm_de_en+dhicm_xx")
    model_args, _, _ = parse("--preset", "dhicm_be_en", "--model_name_or_path", "facebook/mbart-large-50")
    with pytest.raises(ValueError, match=r"\['decoder_attention_heads', .*only a model trained from scratch"):
        train_translation.settings_from(model_args)
    model_args, _, _ = parse("--preset", "eadra_mbart_enc", "--model_name_or_path", "facebook/mbart-large-50")
    assert train_translation.settings_from(model_args)["eadra"]["encoder"]["num_heads"] == 2
    model_args, _, _ = parse("--preset", "fixed_attention_mbart", "--model_name_or_path", "facebook/mbart-large-50")
    assert len(train_translation.settings_from(model_args)["fixed_attention"]["patterns"]) == 7  # Table 5's row
    with pytest.raises(ValueError, match=r"shape overrides \['dropout'\] are not architecture fields"):
        model_shape({"shape": "tiny", "dropout": 0.1})


@pytest.mark.parametrize("argv, message", [
    (["--method_settings", '{"dhicm_dropot": 0.3}'],
     r"unknown settings \['dhicm_dropot'\] \(did you mean \{\"dhicm\": \{\"dropout\": ...\}\}"),
    (["--method_settings", "{dhicm_dropout: 0.3}"], r"--method_settings '\{dhicm_dropout: 0.3\}' is not valid JSON"),
    (["--method_settings", "[1]"], r"must be a JSON object"),
    (["--method", "dea_rhe+lpea_rhe"],
     r"'dea_rhe' and 'lpea_rhe' .* conflict: they set sea to \{'type': 'dea'.*\} and \{'type': 'lpea'"),
    (["--method", "eadra+eadra_all"], r"'eadra' and 'eadra_all' .* conflict: they set eadra"),
])
def test_bad_method_settings_are_refused(argv, message):
    # regression: a misspelled key was ignored, bad JSON gave a raw JSONDecodeError, dea_rhe+lpea_rhe kept LPEA
    model_args, _, _ = parse(*argv)
    with pytest.raises(ValueError, match=message):
        train_translation.settings_from(model_args)


def test_valid_keys_come_from_the_config_class(stock_checkpoint):
    model_args, _, _ = parse("--method", "dhicm+dea_rhe+dhicm", "--method_settings",
                             '{"activation_dropout": 0.2, "hidden_size": 64, "sea": {"encoder_layers": [0]}}')
    sea = train_translation.settings_from(model_args)["sea"]  # repeats agree; attribute_map aliases
    assert (sea["type"], sea["encoder_layers"]) == ("dea", [0])
    check_setting_keys({"share_encoder_decoder_embeddings": False}, hf_headattn.HeadAttnMarianConfig)
    with pytest.raises(ValueError, match=r"\['share_encoder_decoder_embeddings'\].*HeadAttnMBartConfig"):
        check_setting_keys({"share_encoder_decoder_embeddings": False}, hf_headattn.HeadAttnMBartConfig)
    family, path = stock_checkpoint  # a pretrained model checks against its own config class (was a raw TypeError)
    config_name = {"mbart": "HeadAttnMBartConfig", "marian": "HeadAttnMarianConfig"}[family]
    with pytest.raises(ValueError, match=rf"unknown settings \['dhicm_layers'\].*{config_name}"):
        pretrained_model(str(path), {"dhicm_layers": [-1]})


def test_rule2_setting_reaches_the_config_and_the_collator():
    from conftest import TINY

    model_args, _, _ = parse("--method", "lpea_rhe", "--method_settings", '{"sea": {"rule2": "literal"}}')
    settings = train_translation.settings_from(model_args)
    assert settings["sea"]["rule2"] == "literal"
    model = hf_headattn.HeadAttnMarianMTModel(hf_headattn.HeadAttnMarianConfig(**TINY, **settings))
    assert model.config.to_dict()["sea"]["rule2"] == "literal"  # saved with the model, for inference
    # the collator hands the syntax provider SEA's settings from the model (what rule2 does: test_syntax_collator.py)
    readers = collator(None, model, {"sea": {"type": "lpea"}}).method_settings["syntax_inputs"]
    assert readers["sea"]["rule2"] == "literal"
    with pytest.raises(ValueError, match=r"sea.rule2 must be one of 'symmetric', 'literal', got 'j<i'"):
        hf_headattn.HeadAttnMarianConfig(**TINY, sea={"type": "lpea", "rule2": "j<i"})


def run(tmp_path, *extra):
    """The recipe on Multi30k found as a user's run finds it (the tests that call this take the multi30k fixture)."""
    return train_translation.main([
        "--output_dir", str(tmp_path), "--max_train_samples", "16",
        "--max_eval_samples", "4", "--max_predict_samples", "4", "--vocab_size", "150", "--per_device_train_batch_size",
        "8", "--per_device_eval_batch_size", "4", "--num_beams", "1", "--max_source_length", "16",
        "--max_target_length", "6", "--report_to", "none", "--use_cpu", "true", "--logging_steps", "1",
        "--test_splits", "test_2016_flickr", *extra,
    ])


@pytest.mark.slow
def test_recipe_with_a_preset_builds_its_model(tmp_path, multi30k):
    run(tmp_path, "--preset", "dhicm_be_en", "--model_shape", "tiny", "--max_steps", "1")
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["encoder_attention_heads"], config["decoder_ffn_dim"], config["d_model"]) == (2, 128, 128)
    assert (config["label_smoothing"], config["dhicm"]["dropout"], config["dropout"]) == (0.4, 0.2, 0.1)
    assert config["dhicm"]["encoder_layers"] == [-1]
    assert (tmp_path / "checkpoint-1").is_dir()  # saved at the end of the (cut) epoch, as early stopping needs


@pytest.mark.slow
def test_early_stopping_stops_after_patience_and_keeps_the_best(tmp_path, multi30k):
    results = run(tmp_path, "--early_stopping_patience", "1", "--learning_rate", "0", "--num_train_epochs", "5",
                  "--model_shape", "tiny")  # lr 0: the validation loss never improves after the first epoch
    evals = [entry for entry in results["log_history"] if "eval_loss" in entry]
    assert [entry["epoch"] for entry in evals] == [1.0, 2.0] and evals[0]["eval_loss"] == evals[1]["eval_loss"]
    state = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"].endswith("checkpoint-2") and not (tmp_path / "checkpoint-6").exists()


@pytest.mark.parametrize("extra,message", [
    (["--eval_strategy", "no", "--save_strategy", "no"], "needs evaluations during training, got eval_strategy='no'"),
    (["--load_best_model_at_end", "false"], "expected load_best_model_at_end=True"),
])
def test_early_stopping_needs_evaluations_and_the_best_checkpoint(tmp_path, extra, message, capsys):
    with pytest.raises(SystemExit) as stop:  # a usage error, before anything is written
        run(tmp_path, "--early_stopping_patience", "3", *extra)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_early_stopping_with_unmatched_strategies_is_transformers_own_refusal(tmp_path):
    with pytest.raises(ValueError, match="save and eval strategy to match"):
        run(tmp_path, "--early_stopping_patience", "3", "--eval_strategy", "no")


@pytest.mark.parametrize("module", ["hf_headattn.experiment.presets", "workshop.search"])
def test_the_docstring_examples_hold(module):
    """The modules with ``>>>`` examples (``grep -rl '>>>' hf_headattn research``): each example's output as shown."""
    results = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert results.attempted and not results.failed
