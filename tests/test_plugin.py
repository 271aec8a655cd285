"""The plug-in interface: ``docs/method_template.py``, a complete method outside the package, imports only
``hf_headattn.plugin``, registers itself, and works as a built-in method does."""

import ast
import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, plugin
from hf_headattn.experiment.kit import kit_of
from hf_headattn.experiment.presets import method_settings
from hf_headattn.registry import import_method_modules

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "docs" / "method_template.py"


@pytest.fixture
def template(monkeypatch):
    monkeypatch.syspath_prepend(str(TEMPLATE.parent))
    monkeypatch.delitem(sys.modules, "method_template", raising=False)
    brought = import_method_modules(["method_template"])
    yield sys.modules["method_template"], brought
    plugin.unregister_method("head_gates")


@pytest.fixture
def template_file(monkeypatch):
    """The template brought in as a user does who has the file only: by its path (``--method_modules
    docs/method_template.py``), relative to the working folder; afterwards sys.path and the registry as they were."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "method_template", raising=False)
    yield import_method_modules(["docs/method_template.py"])
    plugin.unregister_method("head_gates")
    sys.modules.pop("method_template", None)


def test_the_template_imports_only_the_plugin_path():
    imported = {node.module for node in ast.walk(ast.parse(TEMPLATE.read_text()))
                if isinstance(node, ast.ImportFrom) and node.module}
    assert {name for name in imported if name.startswith("hf_headattn")} == {"hf_headattn.plugin"}
    assert set(plugin.__all__) == {name for name in dir(plugin) if not name.startswith("_")} - {
        "attention", "experiment", "head_masks", "hf_compat", "registry", "settings_checks"}


def test_the_template_trains_saves_loads_and_its_kit_is_found(template, tmp_path):
    module, brought = template
    assert brought == {"method_template": ["head_gates"]}
    assert kit_of(module.METHOD) is module.KIT  # found in the defining module: no kit=... needed
    config = HeadAttnMBartConfig(**TINY, head_gates={"encoder_layers": [-1], "weight": 0.5})
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(config)
    stock = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY))
    stock.load_state_dict(model.state_dict(), strict=False)
    inputs = batch()
    with torch.no_grad():  # every gate starts at 1: the stock model's outputs
        torch.testing.assert_close(model.eval()(**inputs).logits, stock.eval()(**inputs).logits)
    out = model.train()(**inputs)
    assert out.head_gates_penalty.item() == pytest.approx(1.0)  # every gate starts at 1
    out.loss.backward()
    gates = model.model.encoder.layers[-1].self_attn.head_gates.logits
    assert gates.grad is not None and gates.grad.abs().sum() > 0
    with torch.no_grad():
        gates.fill_(-2.0)
    model.save_pretrained(tmp_path)
    loaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(loaded.model.encoder.layers[-1].self_attn.head_gates.logits, gates.detach())
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits)
    generated = loaded.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                num_beams=2, max_new_tokens=4)
    assert generated.shape[0] == inputs["input_ids"].shape[0]
    with pytest.raises(ValueError, match="head_gates.weight"):
        HeadAttnMBartConfig(**TINY, head_gates={"weight": -1.0})


def gated_layers(model) -> list[int]:
    return [i for i, layer in enumerate(model.model.encoder.layers) if hasattr(layer.self_attn, "head_gates")]


def test_the_templates_defaults_and_recipe_name_place_it_on_every_encoder_layer(template_file):
    """``head_gates={}`` and ``--method head_gates`` (its kit's recipe name, as the recipes read it) with their
    defaults: every encoder layer gated, weight 0.01, the stock model's outputs at the start; brought in by path."""
    assert template_file == {"docs/method_template.py": ["head_gates"]}
    assert sys.modules["method_template"].__file__ == str(TEMPLATE)
    for settings in ({"head_gates": {}}, method_settings("head_gates")):
        config = HeadAttnMBartConfig(**TINY, **settings)
        assert config.headattn_settings["head_gates"].encoder_layers == "all"
        assert config.headattn_settings["head_gates"].weight == 0.01
        torch.manual_seed(0)
        model = HeadAttnMBartForConditionalGeneration(config).train()
        assert gated_layers(model) == list(range(TINY["encoder_layers"]))
        assert [layer.self_attn.head_gates.logits.shape for layer in model.model.encoder.layers] == [
            (TINY["encoder_attention_heads"],)] * TINY["encoder_layers"]
        out = model(**batch())
        assert out.head_gates_penalty.item() == pytest.approx(1.0)
        assert out.loss.item() == pytest.approx(out.nll_loss.item() + 0.01 * 1.0, rel=1e-5)  # weight * penalty
    layers = HeadAttnMBartConfig(**TINY, head_gates={"encoder_layers": [0]})
    assert gated_layers(HeadAttnMBartForConditionalGeneration(layers)) == [0]
    with pytest.raises(ValueError, match=r"head_gates.encoder_layers contains 5, but the model has 2 layers"):
        HeadAttnMBartConfig(**TINY, head_gates={"encoder_layers": [5]})


def test_the_template_weighs_its_penalty_by_the_head_mask_as_pruning_does(template_file):
    """The head-mask rule (hf_headattn.plugin): a head masked with 0 counts as pruned, so the penalty with that mask
    equals the penalty of the model with the head pruned; without a mask, the plain mean."""
    from method_template import mean_over_heads

    values = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=torch.float64)
    assert mean_over_heads(values, None).item() == pytest.approx(1.875)
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.5], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    expected = ((0.5 + 2.0 + 2.0) / 2.5 + 4.0) / 2
    assert mean_over_heads(values, mask).item() == pytest.approx(expected)
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, head_gates={})).train()
    with torch.no_grad():
        for layer in model.model.encoder.layers:
            layer.self_attn.head_gates.logits.normal_()
    head_mask = torch.ones(TINY["encoder_layers"], TINY["encoder_attention_heads"])
    head_mask[1, 2] = 0.0
    inputs = batch()
    masked = model(**inputs, head_mask=head_mask).head_gates_penalty
    model.prune_heads({"encoder.layers.1.self_attn": [2]})
    assert model.model.encoder.layers[1].self_attn.head_gates.logits.shape == (TINY["encoder_attention_heads"] - 1,)
    torch.testing.assert_close(model(**inputs).head_gates_penalty, masked)


def test_build_gets_num_heads_and_head_dim_where_it_names_them(template, monkeypatch):
    """``MethodSpec.make`` hands ``num_heads`` (the config's, before pruning) and ``head_dim`` to a ``build`` that
    names them or takes ``**kwargs``, and neither to one of an earlier release (``build(settings, config, module)``)."""
    module, _ = template
    seen = []

    def record(name):
        def build(settings, config, attention, **kwargs):
            seen.append((name, attention.num_heads, kwargs))
            return module.HeadGates(attention.num_heads)
        return build

    def old_build(settings, config, attention):
        seen.append(("old", attention.num_heads, {}))
        return module.HeadGates(attention.num_heads)

    def heads_only(settings, config, attention, num_heads):
        seen.append(("heads_only", attention.num_heads, {"num_heads": num_heads}))
        return module.HeadGates(num_heads)

    pruned = {"encoder.layers.1.self_attn": [0, 3]}
    for build in (record("kwargs"), old_build, heads_only):
        plugin.register_method(dataclasses.replace(module.METHOD, build=build))
        model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, head_gates={}, pruned_heads=pruned))
        assert model.model.encoder.layers[1].self_attn.head_gates.logits.shape == (2,)  # built with 4, then pruned
    head_dim = TINY["d_model"] // TINY["encoder_attention_heads"]
    assert seen == [("kwargs", 4, {"num_heads": 4, "head_dim": head_dim})] * 2 + [("old", 4, {})] * 2 + [
        ("heads_only", 4, {"num_heads": 4})] * 2


@pytest.mark.slow
def test_the_recipes_train_and_translate_with_the_template_by_its_path(template_file, tmp_path, multi30k_lines,
                                                                       capsys):
    """``hf-headattn train --method_modules docs/method_template.py --method head_gates`` with the method's defaults
    (every encoder layer gated), its checkpoint recording the module name, not the path; ``translate`` loads it with
    the path again, and without it says what to pass."""
    from hf_headattn.commands import train, translate
    from hf_headattn.experiment.tokenization import train_joint_sentencepiece

    train_joint_sentencepiece(multi30k_lines("train", "en", 100) + multi30k_lines("train", "de", 100), 200,
                              tmp_path / "tokenizer").save_pretrained(tmp_path / "tokenizer")
    out = tmp_path / "model"
    shape = {"d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32}
    results = train.main([
        "--method_modules", "docs/method_template.py", "--method", "head_gates", "--method_settings", json.dumps(shape),
        "--tokenizer_name", str(tmp_path / "tokenizer"), "--output_dir", str(out), "--max_train_samples", "16",
        "--max_eval_samples", "2", "--max_predict_samples", "2", "--max_steps", "1", "--test_splits", "validation",
        "--num_beams", "1", "--max_target_length", "8", "--max_source_length", "32",
        "--per_device_train_batch_size", "8", "--report_to", "none", "--save_strategy", "no", "--use_cpu", "true",
        "--logging_steps", "1"])
    assert results["args"]["method_modules"] == ["docs/method_template.py"]
    assert [entry["head_gates_penalty"] > 0 for entry in results["log_history"] if "loss" in entry] == [True]
    config = json.loads((out / "config.json").read_text())
    assert config["head_gates"] == {"weight": 0.01} and config["headattn_method_modules"] == {
        "head_gates": "method_template"}
    (tmp_path / "in.en").write_text("A dog runs.\n", encoding="utf-8")
    argv = ["--model_name_or_path", str(out), "--input", str(tmp_path / "in.en"), "--output", str(tmp_path / "out"),
            "--num_beams", "1", "--max_length", "5"]
    plugin.unregister_method("head_gates")  # as in a new process
    with pytest.raises(SystemExit) as exit_info:
        translate.main(argv)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "pass --method_modules method_template to the recipes (or the path of its " \
        "file, method_template.py, where it is not on PYTHONPATH)" in error and "trust_remote_code=True alone" in error
    assert len(translate.main([*argv, "--method_modules", "docs/method_template.py"])) == 1
