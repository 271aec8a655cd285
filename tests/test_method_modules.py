"""A method kept outside the package (the toy: ``tests/toy_method.py``, its kit ``tests/toy_kit/``) from the recipes'
command line (``--method_modules``) and in a checkpoint: the modules are imported before the flags are parsed, a bad
one is a usage error naming it, and a config saved with such a method names it and its module, so that loading it
where the method is not registered fails saying what to import (never importing it unasked)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig

import hf_headattn
from hf_headattn.experiment.method_modules import method_modules_in
from hf_headattn.experiment.tokenization import train_joint_sentencepiece
from hf_headattn.registry import import_method_modules, register_method, registered_methods, unregister_method

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
            encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=60, max_position_embeddings=32,
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
SHAPE = {"d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32}


@pytest.fixture
def clean_registry(tmp_path, monkeypatch):
    """``tmp_path``, importable (the test's modules); after the test, the registry as it was and those modules gone."""
    methods = {spec.name: spec for spec in registered_methods()}
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for spec in registered_methods():
        if methods.get(spec.name) is not spec:
            unregister_method(spec.name)
    for spec in methods.values():
        register_method(spec)
    for name, loaded in list(sys.modules.items()):
        if str(getattr(loaded, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def module(folder: Path, name: str, text: str) -> str:
    (folder / f"{name}.py").write_text(text, encoding="utf-8")
    return name


def test_a_module_brings_the_methods_it_registers_or_its_method(clean_registry):
    """One that registers itself on import, and a core module that only defines ``METHOD`` (the toy), both bring it;
    a module named again (already imported) still does."""
    plugin = module(clean_registry, "my_toy_plugin", "from hf_headattn.registry import register_method\n"
                                                     "from toy_method import METHOD\nregister_method(METHOD)\n")
    assert "toy" not in {spec.name for spec in registered_methods()}
    assert import_method_modules([plugin]) == {plugin: ["toy"]}
    assert "toy" in {spec.name for spec in registered_methods()} and hf_headattn.HeadAttnMarianConfig(
        **TINY, toy={"encoder_layers": [-1]}).headattn_settings["toy"].weight == 0.5
    assert import_method_modules([plugin, plugin]) == {plugin: ["toy"]}  # imported already: its held spec
    unregister_method("toy")
    assert import_method_modules(["toy_method"]) == {"toy_method": ["toy"]}  # registers its METHOD
    assert "toy" in {spec.name for spec in registered_methods()}


def test_a_module_that_fails_or_brings_nothing_is_refused_naming_it(clean_registry):
    with pytest.raises(ValueError, match=r"method module 'no_such_module' does not import: ModuleNotFoundError: No "
                                         r"module named 'no_such_module'; expected an importable module \(installed, "
                                         r"or on PYTHONPATH\) that registers a method$"):
        import_method_modules(["no_such_module"])
    needs = module(clean_registry, "needs_a_dependency", "import json\nimport no_such_dependency\n")
    with pytest.raises(ValueError, match=r"method module 'needs_a_dependency' does not import: ModuleNotFoundError: "
                                         r"No module named 'no_such_dependency' \(at .*needs_a_dependency\.py:2\)"):
        import_method_modules([needs])
    broken = module(clean_registry, "broken_method", "\n\nraise RuntimeError('settings file missing')\n")
    with pytest.raises(ValueError, match=r"'broken_method' does not import: RuntimeError: settings file missing "
                                         r"\(at .*broken_method\.py:3\)"):
        import_method_modules([broken])
    with pytest.raises(ValueError, match=r"method module 'toy_kit' imports but brings no method: it registers none "
                                         r"and defines no METHOD = MethodSpec\(\.\.\.\); expected the module of a "
                                         r"method's core"):
        import_method_modules(["toy_kit"])


def test_a_file_is_imported_as_the_module_its_name_gives_and_recorded_so(clean_registry, monkeypatch):
    """``--method_modules plugins/users_method.py``: imported as ``users_method`` (its folder added to the end of
    sys.path, so its own imports of files beside it work), the same file named again brings it again, the checkpoint
    records the name (not the path), which loads again by the path or, its folder on the path, by the name."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(clean_registry)
    (clean_registry / "plugins").mkdir()
    module(clean_registry / "plugins", "users_helper", "WEIGHT = 0.25\n")
    module(clean_registry / "plugins", "users_method", "import users_helper\n" + USERS_METHOD)
    assert import_method_modules(["plugins/users_method.py"]) == {"plugins/users_method.py": ["toy"]}
    assert sys.modules["users_method"].__file__ == str(clean_registry / "plugins" / "users_method.py")
    assert sys.path[-1] == str(clean_registry / "plugins") and sys.modules["users_helper"].WEIGHT == 0.25
    assert import_method_modules([str(clean_registry / "plugins" / "users_method.py")]) == {
        str(clean_registry / "plugins" / "users_method.py"): ["toy"]}  # absolute, and imported already
    hf_headattn.HeadAttnMarianConfig(**TINY, toy={"encoder_layers": [-1]}).save_pretrained(clean_registry / "model")
    saved = json.loads((clean_registry / "model" / "config.json").read_text())
    assert saved["headattn_method_modules"] == {"toy": "users_method"}
    unregister_method("toy")
    with pytest.raises(ValueError, match=r"pass --method_modules users_method to the recipes \(or the path of its "
                                         r"file, users_method.py, where it is not on PYTHONPATH\), or in Python .*"
                                         r"trust_remote_code=True alone cannot load it"):
        AutoConfig.from_pretrained(clean_registry / "model")
    assert import_method_modules(["users_method"]) == {"users_method": ["toy"]}  # its folder is on the path now
    assert "toy" in AutoConfig.from_pretrained(clean_registry / "model").headattn_settings


def test_a_file_that_cannot_be_a_module_of_its_own_is_refused_naming_it(clean_registry, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ValueError, match=r"^method module 'no/such_file.py' is no file; expected the path of a .py "
                                         r"file, or a module name without .py \(my_pkg.my_method\)$"):
        import_method_modules(["no/such_file.py"])
    bad = clean_registry / "my-method.py"
    bad.write_text(USERS_METHOD, encoding="utf-8")
    with pytest.raises(ValueError, match=r"its file name 'my-method.py' gives no module name; expected a file named "
                                         r"as a Python module"):
        import_method_modules([str(bad)])
    (clean_registry / "other").mkdir()
    taken = module(clean_registry / "other", "json", USERS_METHOD)
    with pytest.raises(ValueError, match=r"method module '.*json.py' would be imported as 'json', but that name is "
                                         r"another module's \(.*json.*\); expected a file named after no other"):
        import_method_modules([str(clean_registry / "other" / f"{taken}.py")])
    module(clean_registry, "shadowed", "X = 1\n")  # on sys.path already (the fixture's folder) ...
    (clean_registry / "other" / "shadowed.py").write_text(USERS_METHOD, encoding="utf-8")  # ... and elsewhere
    with pytest.raises(ValueError, match=r"'shadowed', but that name is another module's \(.*shadowed.py\)"):
        import_method_modules([str(clean_registry / "other" / "shadowed.py")])
    assert str(clean_registry / "other") not in sys.path and "shadowed" not in sys.modules  # nothing imported
    (clean_registry / "other" / "failing.py").write_text("\nraise RuntimeError('no settings')\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"^method module '.*failing.py' does not import: RuntimeError: no settings "
                                         r"\(at .*failing.py:2\); expected a .py file whose code runs and "
                                         r"registers a method$"):
        import_method_modules([str(clean_registry / "other" / "failing.py")])


def test_the_flag_is_read_before_the_parser_spelt_out_in_full():
    assert method_modules_in(["--method", "toy", "--method_modules", "a.b", "c", "--use_cpu", "true"]) == ["a.b", "c"]
    assert method_modules_in(["--method-modules=a", "--method_settings", "{}"]) == ["a"]
    assert method_modules_in(["--method", "toy"]) == [] and method_modules_in(["--method_modules"]) == []
    assert method_modules_in(["--method_mod", "a"]) == []  # no abbreviation: "--method" would match it


def test_the_training_recipe_refuses_the_flag_abbreviated(tmp_path, capsys):
    from hf_headattn.commands import train

    with pytest.raises(SystemExit) as exit_info:
        train.main(["--method_module", "toy_method", "--output_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert ("error: --method_modules toy_method: expected the flag spelt out in full (--method_modules)"
            in capsys.readouterr().err)


def test_every_recipe_refuses_a_bad_module_as_a_usage_error(tmp_path, capsys):
    """Before anything is read or trained: the recipes that build or load a model with methods."""
    from hf_headattn.commands import demo, finetune, prune, train, translate

    for main, argv in ((train.main, ["--output_dir", str(tmp_path), "--method", "toy"]),
                       (prune.parse_args, ["--model_dir", str(tmp_path), "--criteria", "toy_scale"]),
                       (translate.parse_args, ["--model_name_or_path", str(tmp_path)]),
                       (finetune.main, ["--output_dir", str(tmp_path)]),
                       (demo.main, ["--methods", "toy"])):
        with pytest.raises(SystemExit) as exit_info:
            main(["--method_modules", "no_such_module", *argv])
        assert exit_info.value.code == 2, main
        assert ("error: --method_modules: method module 'no_such_module' does not import: ModuleNotFoundError"
                in capsys.readouterr().err), main


#: A user's method module: the toy's core with its own settings class (so the config records this module).
USERS_METHOD = """from dataclasses import dataclass, replace
from hf_headattn.registry import register_method
import toy_method
@dataclass(frozen=True)
class UsersSettings(toy_method.ToySettings):
    pass
METHOD = register_method(replace(toy_method.METHOD, settings=UsersSettings))
"""


def test_a_saved_config_names_its_outside_methods_and_refuses_to_load_without_them(clean_registry):
    builtin = hf_headattn.HeadAttnMarianConfig(**TINY, dhicm={"encoder_layers": [-1]})
    assert "headattn_method_modules" not in builtin.to_dict()  # the built-in methods: nothing to import
    import_method_modules([module(clean_registry, "users_method", USERS_METHOD)])
    config = hf_headattn.HeadAttnMarianConfig(**TINY, toy={"encoder_layers": [-1]}, dhicm={"encoder_layers": [-1]})
    config.save_pretrained(clean_registry / "model")
    saved = json.loads((clean_registry / "model" / "config.json").read_text())
    assert saved["headattn_method_modules"] == {"toy": "users_method"} and saved["toy"] == {"encoder_layers": [-1]}
    assert set(AutoConfig.from_pretrained(clean_registry / "model").headattn_settings) == {"toy", "dhicm"}
    unregister_method("toy")  # as in a process that has not imported it
    del sys.modules["users_method"]
    with pytest.raises(ValueError, match=r"^the config field 'toy' holds the settings of the method 'toy', which is "
                                         r"not registered in this process \(headattn_method_modules records it from "
                                         r"the module 'users_method'\); expected it registered before the config "
                                         r"loads: pass --method_modules users_method to the recipes \(or the path "
                                         r"of its file, users_method.py, where it is not on PYTHONPATH\), or in "
                                         r"Python import the module that registers it first"):
        AutoConfig.from_pretrained(clean_registry / "model")
    assert "users_method" not in sys.modules  # named, never imported by the config
    with pytest.raises(ValueError, match=r"headattn_method_modules must be a dict \{method name: module\}, got 3"):
        hf_headattn.HeadAttnMarianConfig(**TINY, headattn_method_modules=3)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, multi30k_lines):
    folder = tmp_path_factory.mktemp("tokenizer")
    train_joint_sentencepiece(multi30k_lines("train", "en", 100) + multi30k_lines("train", "de", 100), 200,
                              folder).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_the_training_recipe_runs_an_outside_method_from_the_command_line(tmp_path, tokenizer_dir, multi30k,
                                                                          clean_registry, capsys):
    """``python -m hf_headattn train --method_modules toy_method --method toy --toy_gate_value 0.5`` in a fresh
    process (the toy's flag is accepted because its module was imported first); its checkpoint loads in a fresh
    process only with the module named, and ``hf-headattn translate`` says so."""
    from hf_headattn.commands import translate as translate_recipe

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests"),
                                                                     os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "model"
    trained = subprocess.run([
        sys.executable, "-m", "hf_headattn", "train", "--method_modules", "toy_method",
        "--method", "toy", "--toy_gate_value", "0.5", "--method_settings", json.dumps(SHAPE),
        "--multi30k_dir", str(multi30k), "--tokenizer_name", str(tokenizer_dir), "--output_dir", str(out),
        "--max_train_samples", "16", "--max_eval_samples", "2", "--max_predict_samples", "2", "--max_steps", "1",
        "--test_splits", "validation", "--num_beams", "1", "--max_target_length", "8", "--max_source_length", "32",
        "--per_device_train_batch_size", "8", "--report_to", "none", "--save_strategy", "no", "--use_cpu", "true",
        "--logging_steps", "1",
    ], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["toy"] == {"encoder_layers": [-1]} and config["toy_gate_value"] == 0.5
    assert config["headattn_method_modules"] == {"toy": "toy_method"}
    results = json.loads((out / "results.json").read_text())
    assert results["args"]["method_modules"] == ["toy_method"]
    assert [entry["toy_penalty"] > 0 for entry in results["log_history"] if "loss" in entry] == [True]

    load = "import sys, hf_headattn\nfrom transformers import AutoModelForSeq2SeqLM\n" \
           "AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1])"
    refused = subprocess.run([sys.executable, "-c", load, str(out)], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode == 1 and ("ValueError: the config field 'toy' holds the settings of the method 'toy', "
                                        "which is not registered in this process") in refused.stderr
    assert "pass --method_modules toy_method to the recipes" in refused.stderr

    (tmp_path / "in.en").write_text("A dog runs.\n", encoding="utf-8")
    argv = ["--model_name_or_path", str(out), "--input", str(tmp_path / "in.en"), "--output", str(tmp_path / "out"),
            "--num_beams", "1", "--max_length", "5"]
    unregister_method("toy")  # (trained in another process: not registered here unless an earlier test left it)
    with pytest.raises(SystemExit) as exit_info:
        translate_recipe.main(argv)
    assert exit_info.value.code == 2 and "pass --method_modules toy_method" in capsys.readouterr().err
    assert len(translate_recipe.main([*argv, "--method_modules", "toy_method"])) == 1


def test_an_outside_method_is_switched_on_by_from_pretrained_as_the_built_in_ones(clean_registry, stock_checkpoint):
    """``from_pretrained(stock checkpoint, <method>={...})``: a method registered from a user's module is no declared
    config field, which HF would hand to the model's __init__ (a TypeError); it is a setting, as a built-in one is."""
    import_method_modules([module(clean_registry, "users_method", USERS_METHOD)])
    family, path = stock_checkpoint
    model_class = {"mbart": hf_headattn.HeadAttnMBartForConditionalGeneration,
                   "marian": hf_headattn.HeadAttnMarianMTModel}[family]
    model = model_class.from_pretrained(path, toy={"encoder_layers": [-1], "weight": 0.25}, dhicm={
        "encoder_layers": [-1]})
    assert set(model.config.headattn_settings) == {"toy", "dhicm"}
    assert model.config.headattn_settings["toy"].weight == 0.25
    assert any(name.endswith("toy_scale") or "toy" in name for name, _ in model.named_parameters())
    model.save_pretrained(clean_registry / "model")
    reloaded = model_class.from_pretrained(clean_registry / "model", toy=None)  # and switched off again
    assert set(reloaded.config.headattn_settings) == {"dhicm"}
