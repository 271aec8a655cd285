"""hf-headattn prune end to end on a tiny model trained on a few real Multi30k lines."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

ROOT = Path(__file__).resolve().parents[1]

from hf_headattn.commands import prune  # noqa: E402
from hf_headattn.commands import train as train_translation  # noqa: E402
from hf_headattn.deprecation import HeadAttnDeprecationWarning  # noqa: E402
from hf_headattn.experiment.analysis import head_pruning  # noqa: E402
from hf_headattn.experiment.analysis.head_pruning import largest_share_within, throughput_ratio  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, multi30k):
    """A tiny DHICM model; the recipes below find Multi30k themselves (no --multi30k_dir), as a user runs them."""
    out = tmp_path_factory.mktemp("dhicm")
    train_translation.main([
        "--multi30k_dir", str(multi30k), "--model_shape", "tiny", "--method", "dhicm", "--output_dir", str(out),
        "--max_train_samples", "200", "--max_eval_samples", "8", "--max_predict_samples", "8", "--vocab_size", "300",
        "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_beams", "1", "--max_target_length", "16",
        "--report_to", "none", "--save_strategy", "no", "--use_cpu", "true", "--test_splits", "test_2016_flickr",
    ])
    return out


@pytest.mark.slow
def test_every_criterion_prunes_scores_plots_and_saves_the_chosen_model(model_dir, tmp_path, capsys, monkeypatch):
    argv = ["--model_dir", str(model_dir), "--output_dir", str(tmp_path),
            "--criteria", "gradient", "confidence", "entropy", "dhicm", "random", "--importance_samples", "16",
            "--eval_samples", "8", "--num_beams", "1", "--max_length", "16", "--step_share", "0.3",
            "--max_share", "0.5", "--finetune_steps", "1", "--finetune_samples", "32", "--timing_repeats", "2",
            "--test_split", "test_2016_flickr"]
    # the test split's first 16 sentences, read, scored and timed as all 1,000 would be (which took 80% of the run)
    load = prune.load_parallel_dataset
    monkeypatch.setattr(prune, "load_parallel_dataset", lambda *a, **k: load(*a, **k, max_predict_samples=16))
    prune.main(argv)
    saved = json.loads((tmp_path / "pruning.json").read_text())
    assert set(saved["criteria"]) == {"gradient", "confidence", "entropy", "dhicm", "random"}
    total = 3 * 3 * 4  # tiny: 3+3 layers of 4 heads: encoder self, decoder self, cross
    for name, records in saved["criteria"].items():
        assert records[0]["share"] == 0 and records[0]["pruned"] == {}
        shares = [r["share"] for r in records]
        assert shares == sorted(shares) and all(0 <= r["bleu"] <= 100 and r["sentences_per_second"] > 0
                                                for r in records)
        assert all(r["heads_pruned"] == sum(map(len, r["pruned"].values())) for r in records)
        assert records[-1]["heads_pruned"] <= total // 2
        assert [r["parameters"] for r in records] == sorted((r["parameters"] for r in records), reverse=True)
        if name != "dhicm":
            assert records[-1]["heads_pruned"] == 18  # 0.3 of 36, then capped at 0.5
    # the unpruned model is evaluated once, for the first criterion (its timing would differ otherwise)
    assert len({json.dumps(records[0]) for records in saved["criteria"].values()}) == 1
    # dhicm scores the last encoder and decoder layers only: it prunes no other module
    for record in saved["criteria"]["dhicm"]:
        assert all(".layers.2." in name for name in record["pruned"])
    best = saved["best"]
    chosen = largest_share_within(saved["criteria"][best])
    assert saved["chosen"][best]["share"] == chosen["share"]
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model")
    assert dict(model.config.pruned_heads) == chosen["pruned"] != {}
    # the saved model is the fine-tuned one of the chosen step, not the trained model pruned again
    kept = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "criteria" / best).state_dict()
    pruned_again = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    pruned_again.prune_heads(chosen["pruned"])
    assert all(torch.equal(value, kept[name]) for name, value in model.state_dict().items())
    assert not all(torch.equal(value, kept[name]) for name, value in pruned_again.state_dict().items())
    card = (tmp_path / "model" / "README.md").read_text()
    assert f"`{best}` criterion" in card and "within 0.5 BLEU" in card
    assert saved["test"]["split"] == "test_2016_flickr" and saved["test"]["throughput_ratio"] > 0
    assert [len(saved["test"]["timing"][name]) for name in ("model", "reference")] == [2, 2]
    assert (tmp_path / "pruning.png").stat().st_size > 0
    capsys.readouterr()
    prune.main(argv)  # a restart: every criterion done before, and the test set is not read again
    printed = capsys.readouterr().out
    assert "gradient: done before, skipped" in printed and "the test set was read before" in printed
    assert json.loads((tmp_path / "pruning.json").read_text())["test"] == saved["test"]


@pytest.mark.slow
def test_common_heads_compare_the_criteria_on_the_heads_that_dhicm_scores(model_dir, tmp_path):
    argv = ["--model_dir", str(model_dir), "--output_dir", str(tmp_path),
            "--criteria", "dhicm", "gradient", "--common_heads", "--importance_samples", "16", "--eval_samples", "4",
            "--num_beams", "1", "--max_length", "8", "--step_share", "0.2", "--max_share", "0.8"]
    saved = prune.main(argv)
    # the tiny model's DHICM: the last encoder layer and the last decoder layer's self- and cross-attention
    assert saved["common_heads"] == {component: [[2, head] for head in range(4)]
                                     for component in ("encoder", "decoder", "cross")}
    for records in saved["criteria"].values():
        assert records[-1]["heads_pruned"] == 9  # three of each module's four heads, then nothing is left
        assert all(".layers.2." in name for record in records for name in record["pruned"])
    assert saved["settings"]["common_heads"] is True
    # criteria that share no head (e.g. dhicm and rhe, in different layers) are refused, naming them
    study = SimpleNamespace(args=SimpleNamespace(common_heads=True), criteria=lambda: ["dhicm", "rhe"], config=None)
    with pytest.raises(ValueError, match=r"the criteria \['dhicm', 'rhe'\] score no head in common"):
        prune.candidate_heads(study, {"common_heads": {"encoder": [], "decoder": [], "cross": []}})
    # a component without common heads (rhe: the first encoder layer only)
    study.config = AutoModelForSeq2SeqLM.from_pretrained(model_dir).config
    among = prune.candidate_heads(study, {"common_heads": {"encoder": [[0, 1]], "decoder": [], "cross": []}})
    assert among["encoder"].nonzero().tolist() == [[0, 1]] and not among["decoder"].any() and not among["cross"].any()


def test_largest_share_stops_at_the_first_step_below_the_tolerance():
    records = [{"share": 0, "bleu": 30.0}, {"share": 0.1, "bleu": 29.8}, {"share": 0.2, "bleu": 29.4},
               {"share": 0.3, "bleu": 29.9}]
    assert largest_share_within(records)["share"] == 0.1
    assert largest_share_within(records[:1])["share"] == 0


def test_throughput_ratio_is_the_median_of_alternate_timings(monkeypatch):
    clock, seconds = [0.0], {"pruned": [1.0, 1.0, 1.0], "unpruned": [2.0, 1.0, 3.0]}  # ratios 2, 1, 3
    calls = []

    def translate(model, tokenizer, sources, **kwargs):
        calls.append(model)
        clock[0] += seconds[model].pop(0)
    monkeypatch.setattr(head_pruning, "translate", translate)
    monkeypatch.setattr(head_pruning.time, "perf_counter", lambda: clock[0])
    timing = throughput_ratio("pruned", "unpruned", None, ["a", "b"], repeats=3)
    assert calls == ["unpruned", "pruned"] * 3
    assert timing == {"ratio": 2.0, "sentences_per_second": {"model": [2.0, 2.0, 2.0], "reference": [1.0, 2.0, 2 / 3]}}


@pytest.mark.slow
def test_bad_arguments(model_dir, tmp_path):
    with pytest.raises(SystemExit):
        prune.parse_args(["--model_dir", str(model_dir), "--num_beams", "0"])
    with pytest.raises(SystemExit):
        prune.parse_args(["--model_dir", str(model_dir), "--finetune_samples", "0"])
    with pytest.raises(SystemExit) as stop:  # a usage error, before the unpruned model is evaluated
        prune.main(["--model_dir", str(model_dir), "--output_dir", str(tmp_path),
                          "--criteria", "random", "--importance_samples", "4", "--eval_samples", "4",
                          "--num_beams", "1", "--max_share", "1.0"])
    assert stop.value.code == 2


@pytest.mark.slow
def test_pruned_generate_speed_benchmark_times_every_step(model_dir, tmp_path):
    import pruned_generate_speed

    steps = [{}, {"encoder.layers.0.self_attn": [1]},
             {"encoder.layers.0.self_attn": [1], "decoder.layers.2.encoder_attn": [0, 3],
              "decoder.layers.1.self_attn": [2]}]
    records = [{"share": sum(map(len, p.values())) / 36, "heads_pruned": sum(map(len, p.values())), "pruned": p}
               for p in steps]
    (tmp_path / "pruning.json").write_text(json.dumps({"criteria": {"confidence": records}}))
    argv = ["--model_dir", str(model_dir), "--pruning_json", str(tmp_path / "pruning.json"),
            "--samples", "3", "--num_beams", "2", "--repeats", "2", "--forced_length", "3"]
    rows = pruned_generate_speed.main([*argv, "--criterion", "confidence", "--out", str(tmp_path / "speed.json")])
    assert [row["by_kind"] for row in rows] == [{"encoder": 1}, {"encoder": 1, "cross": 2, "decoder": 1}]
    assert rows[0]["parameters"] > rows[1]["parameters"]
    assert all(row["throughput_ratio"] > 0 and len(row["sentences_per_second"]["model"]) == 2 for row in rows)
    assert json.loads((tmp_path / "speed.json").read_text())["rows"] == rows
    with pytest.raises(ValueError, match="has no criterion 'gradient'"):
        pruned_generate_speed.main([*argv, "--criterion", "gradient"])


def quick_argv(model_dir, out, *extra):
    return ["--model_dir", str(model_dir), "--output_dir", str(out), "--criteria",
            "random", "--importance_samples", "4", "--eval_samples", "4", "--num_beams", "1", "--max_length", "8",
            "--step_share", "0.5", "--max_share", "0.5", *extra]


def usage_error(argv, capsys) -> str:
    """The message of the usage error (exit 2) that ``prune.main(argv)`` stops with."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        prune.main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.mark.slow
def test_a_bad_argument_stops_before_anything_is_read_or_deleted(model_dir, tmp_path, capsys, monkeypatch):
    earlier = tmp_path / "out"
    (earlier / "criteria" / "gradient").mkdir(parents=True)
    (earlier / "criteria" / "gradient" / "config.json").write_text("{}")
    (earlier / "pruning.json").write_text(json.dumps({"settings": {"step_share": 0.1}, "criteria": {}}))
    monkeypatch.setattr(prune, "load_parallel_dataset", lambda *a, **k: pytest.fail("data read"))
    assert "--step_share must be in (0, 1], got 0.0" in usage_error(quick_argv(model_dir, earlier, "--step_share", "0"),
                                                                     capsys)
    assert "--max_share must be in (0, 1), got 1.0" in usage_error(quick_argv(model_dir, earlier, "--max_share", "1"),
                                                                    capsys)
    message = usage_error([*quick_argv(model_dir, earlier), "--criteria", "gradient", "rhe"], capsys)
    assert "--criteria ['rhe'] need(s) the model to carry ['sea']" in message and "carries ['dhicm']" in message
    for flag, value, expected in (("--eval_samples", "0", "an integer >= 1"), ("--finetune_steps", "-1", ">= 0"),
                                  ("--finetune_learning_rate", "0", "a number > 0"),
                                  ("--multi30k_dir", str(tmp_path / "nowhere"), "is not a folder"),
                                  ("--syntax_parses_dir", str(tmp_path / "nowhere"), "not found"),
                                  ("--parses_dir", str(tmp_path / "nowhere"), "not found"),
                                  ("--criteria", "gradients", "invalid choice")):
        message = usage_error([*quick_argv(model_dir, earlier), flag, value], capsys)
        assert flag in message and expected in message
    # --parses_dir, --syntax_parses_dir's name from when the parses were SEA's: warned, and read as the new flag
    with pytest.warns(HeadAttnDeprecationWarning, match=r"--parses_dir is deprecated .* 0\.4; use --syntax_parses_dir"):
        message = usage_error(quick_argv(model_dir, earlier, "--parses_dir", str(earlier)), capsys)
    assert f"--output_dir {earlier} is --syntax_parses_dir {earlier}, an input of this run" in message
    message = usage_error(quick_argv(model_dir, earlier, "--parses_dir", str(tmp_path), "--syntax_parses_dir",
                                     str(tmp_path)), capsys)
    assert "--parses_dir is --syntax_parses_dir's deprecated name; expected one of them, got both" in message
    message = usage_error(quick_argv(tmp_path, earlier), capsys)  # a folder without a model
    assert f"--model_dir {tmp_path} holds no config.json" in message
    assert (earlier / "criteria" / "gradient" / "config.json").is_file()  # the earlier results are all there
    assert json.loads((earlier / "pruning.json").read_text())["settings"] == {"step_share": 0.1}


@pytest.mark.slow
def test_a_rerun_with_other_settings_is_refused_unless_overwrite_says_what_it_replaces(model_dir, tmp_path, capsys):
    prune.main(quick_argv(model_dir, tmp_path))
    before = (tmp_path / "pruning.json").read_text()
    message = usage_error(quick_argv(model_dir, tmp_path, "--seed", "1"), capsys)
    assert f"--output_dir {tmp_path} holds ['pruning.json'," in message and "of an earlier run" in message
    assert "seed 0 (now 1)" in message and "--overwrite" in message
    assert (tmp_path / "pruning.json").read_text() == before and (tmp_path / "model" / "config.json").is_file()
    capsys.readouterr()
    prune.main(quick_argv(model_dir, tmp_path, "--seed", "1", "--overwrite"))
    assert "--overwrite: replacing the earlier run's ['pruning.json'" in capsys.readouterr().out
    assert json.loads((tmp_path / "pruning.json").read_text())["settings"]["seed"] == 1


def test_a_stock_checkpoint_is_a_usage_error_that_says_how_to_convert_it(tmp_path, capsys):
    from transformers import MarianConfig, MarianMTModel

    from hf_headattn.experiment.model_card import method_settings_of

    config = MarianConfig(vocab_size=20, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
                          max_position_embeddings=16, pad_token_id=0, decoder_start_token_id=0)
    assert method_settings_of(config) == {}  # the model card of a stock model: no method, no loss settings
    MarianMTModel(config).save_pretrained(tmp_path / "stock")
    message = usage_error(quick_argv(tmp_path / "stock", tmp_path / "out"), capsys)
    assert "holds a stock 'marian' model (MarianConfig)" in message
    assert "HeadAttnMarianMTModel" in message and "from_pretrained" in message and "save_pretrained" in message
    assert not (tmp_path / "out").exists()
