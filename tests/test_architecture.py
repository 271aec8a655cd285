"""The architecture: one registration per method, two import layers without circles, the attention hook."""

import ast
import copy
import dataclasses
import inspect
import re
import sys
from pathlib import Path

import pytest
import torch

import hf_headattn
from conftest import TINY, batch, syntax_batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, cli, remote_code
from hf_headattn.experiment.analysis.head_ranking import criteria, score_heads
from hf_headattn.experiment.kit import kit_of
from hf_headattn.experiment.model_card import write_model_card
from hf_headattn.experiment.presets import method_settings, paper_presets, preset
from hf_headattn.experiment.trainer import loss_components
from hf_headattn.registry import (
    method_inputs,
    readout,
    readout_flags,
    register_method,
    registered_methods,
    unregister_method,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_headattn"
KIT = ("experiment", "commands", "cli", "syntax")


@pytest.fixture
def toy():
    import toy_method

    register_method(toy_method.METHOD)
    yield toy_method.METHOD
    unregister_method("toy")


def run_method(spec, flags=None):
    """The model of the spec's first recipe name, run on :func:`batch` with its kit's example inputs and ``flags``
    (default: every registered read-out flag)."""
    kit = kit_of(spec)
    settings = method_settings(next(iter(kit.method_names)))
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **settings))
    inputs = {**batch(), **(kit.example_inputs(*batch()["input_ids"].shape) if kit.example_inputs else {})}
    return model, model(**inputs, **{flag: True for flag in (readout_flags() if flags is None else flags)})


def test_every_registered_method_is_wired(toy, tmp_path):
    """Outputs, logged components, evaluation read-outs, model card and recipe names come from each MethodSpec."""
    names = [spec.name for spec in registered_methods()]  # the hooks' order: each after what it runs after
    assert all(names.index(other) < names.index(spec.name) for spec in registered_methods()
               for other in spec.runs_after if other in names)
    assert all(names.index(spec.name) < names.index(other) for spec in registered_methods()
               for other in spec.runs_before if other in names)
    # the toy's runs_before moved it ahead of a method registered earlier
    assert names.index("toy") < names.index("dhicm")
    for spec in registered_methods():
        model, out = run_method(spec)
        assert model.config.keys_to_ignore_at_inference[:3] == ["past_key_values", "cache", "nll_loss"]
        for field in spec.outputs:
            assert out[field] is not None, (spec.name, field)
            assert field in model.config.keys_to_ignore_at_inference
        logged = loss_components(out)
        for field in spec.logged:
            assert any(key == field or key.startswith(f"{field}/") for key in logged), (spec.name, field)
        card = write_model_card(model, tmp_path / spec.name, "x").read_text()
        assert kit_of(spec).paper in card and f'"{spec.name}": {{' in card
        other = [s.name for s in registered_methods() if s.name != spec.name]
        assert not any(f"**{name}**" in card for name in other)


def test_a_fourth_method_is_its_core_module_its_kit_folder_and_one_registration(toy):
    """tests/toy_method.py (the core) names its kit folder, tests/toy_kit: registering the core is all it takes for
    the recipes to know its name and preset, for head ranking to know its criterion, and for its analysis to run."""
    import toy_kit.analysis

    assert method_settings("toy") == {"toy": {"encoder_layers": [-1]}}
    chosen = preset("toy_table_1")
    assert chosen.flags == {"learning_rate": 1e-3}
    assert chosen.apply(method_settings("toy+dhicm"))["toy"] == {"encoder_layers": [-1], "weight": 0.25}
    assert chosen.apply({}) == {}  # the override applies only where the toy is on
    assert "toy_scale" in criteria()
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **method_settings("toy"))).eval()
    with torch.no_grad():
        model.model.encoder.layers[1].self_attn.toy.scale.copy_(torch.tensor([1.0, -2.0, 0.0, 0.5]))
    scores = score_heads(model, [batch(), batch()], ["toy_scale"])["toy_scale"]
    assert scores["encoder"][1].tolist() == [1.0, 2.0, 0.0, 0.5] and scores["encoder"][0].isnan().all()
    assert toy_kit.analysis.mean_scales(model, [batch()]) == {"encoder.layers.1.self_attn": [1.0, -2.0, 0.0, 0.5]}
    unregister_method("toy")
    assert "toy_table_1" not in paper_presets() and "toy_scale" not in criteria()
    with pytest.raises(ValueError, match=r"unknown method 'toy'"):
        method_settings("toy")


def test_two_kits_that_claim_one_recipe_name_are_refused(toy, monkeypatch):
    import toy_kit

    kit_module = type(sys)("toy2_kit")
    monkeypatch.setitem(sys.modules, "toy2_kit", kit_module)
    register_method(dataclasses.replace(toy, name="toy2", kit="toy2_kit"))
    try:
        kit_module.KIT = dataclasses.replace(toy_kit.KIT, name="toy2")
        with pytest.raises(ValueError, match=r"the methods 'toy' and 'toy2' both define the recipe name 'toy'"):
            method_settings("toy")
        kit_module.KIT = toy_kit.KIT
        expected = r"its kit module 'toy2_kit' must define KIT = MethodKit\('toy2', \.\.\.\)"
        with pytest.raises(ValueError, match=expected):
            method_settings("toy")
    finally:
        unregister_method("toy2")


def test_a_fourth_method_is_one_module_and_one_registration(toy, tmp_path):
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, toy={"encoder_layers": [-1], "weight": 2.0})
    model = HeadAttnMBartForConditionalGeneration(config).eval()
    assert [n for n, _ in model.named_parameters() if ".toy." in n] == ["model.encoder.layers.1.self_attn.toy.scale"]
    with torch.no_grad():
        model.model.encoder.layers[1].self_attn.toy.scale.copy_(torch.tensor([1.0, 2.0, 0.0, 1.0]))
    out = model(**batch())
    assert out.toy_penalty.item() == pytest.approx(1.5)
    assert out.loss.item() == pytest.approx(out.nll_loss.item() + 2.0 * 1.5, rel=1e-5)  # label_smoothing 0
    model.save_pretrained(tmp_path)
    loaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.toy == {"encoder_layers": [-1], "weight": 2.0}
    torch.testing.assert_close(loaded(**batch()).logits, out.logits)
    with pytest.raises(ValueError, match=r"toy.weight must be a finite number, got 'a lot'"):
        HeadAttnMBartConfig(**TINY, toy={"encoder_layers": [-1], "weight": "a lot"})
    assert method_settings("toy+dhicm")["toy"] == {"encoder_layers": [-1]}


def test_a_method_with_its_own_input_and_read_out_flag_needs_no_edit_elsewhere(toy):
    """The toy method declares ``toy_gate`` and ``output_toy_scales`` on its spec only: the model's forward names them
    (so generate and the Trainer pass them on), the attention calls get the input, the methods see the flag."""
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, toy={"encoder_layers": [-1]})).eval()
    parameters = inspect.signature(model.forward).parameters
    assert parameters["toy_gate"].default is None and parameters["output_toy_scales"].default is False
    assert {"input_ids", "labels", *method_inputs(), *readout_flags()} <= set(parameters)  # every method's
    with torch.no_grad():
        model.model.encoder.layers[1].self_attn.toy.scale.copy_(torch.tensor([1.0, 2.0, 0.5, 1.0]))
        plain = model(**batch())
        ones = model(**batch(), toy_gate=torch.ones(2), output_toy_scales=True)
        gated = model(**batch(), toy_gate=torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(ones.logits, plain.logits)
    assert "toy_scales" not in plain and ones.toy_scales["encoder.layers.1.self_attn"].tolist() == [1.0, 2.0, 0.5, 1.0]
    torch.testing.assert_close(gated.logits[0], plain.logits[0])
    assert not torch.allclose(gated.logits[1], plain.logits[1])
    # positionally, as HF's own forward takes its arguments
    torch.testing.assert_close(model(batch()["input_ids"], batch()["attention_mask"], labels=batch()["labels"]).logits,
                               plain.logits)
    source = {k: v for k, v in batch().items() if k != "labels"}
    kwargs = dict(num_beams=2, max_new_tokens=5, do_sample=False, return_dict_in_generate=True, output_scores=True)
    plain = model.generate(**source, **kwargs).scores[0]  # (batch x beams, vocab): the first step's scores
    torch.testing.assert_close(model.generate(**source, toy_gate=torch.ones(2), **kwargs).scores[0], plain)
    gated = model.generate(**source, toy_gate=torch.tensor([1.0, 50.0]), **kwargs).scores[0]
    torch.testing.assert_close(gated[:2], plain[:2])
    assert (gated[2:] - plain[2:]).abs().max() > 1e-4  # the gate reached the encoder of the second sentence


def test_config_fields_and_read_outs_come_from_the_specs(toy):
    """The config classes declare one field per method registered when they were made (default None); a method
    registered later is an undeclared attribute (saved as well, above). ``readout`` pairs a spec's one flag with its
    one output field that is not logged: the field a forward returns with that flag, and only with it."""
    fields = {f.name: f.default for f in dataclasses.fields(HeadAttnMBartConfig)}
    built_in = [spec.name for spec in registered_methods() if spec is not toy]
    assert built_in and {name: fields[name] for name in built_in} == dict.fromkeys(built_in)
    assert "toy" not in fields and all(HeadAttnMBartConfig(**TINY).to_dict()[name] is None for name in built_in)
    assert readout(toy) == ("output_toy_scales", "toy_scales")
    with_readout = [spec for spec in registered_methods() if spec.flags]
    assert toy in with_readout and len(with_readout) > 1
    for spec in with_readout:
        flag, field = readout(spec)
        assert flag in spec.flags and field in spec.outputs and field not in spec.logged
        assert run_method(spec, [flag])[1].get(field) is not None, (spec.name, field)
        assert run_method(spec, [])[1].get(field) is None, (spec.name, field)
    expected = r"method 'toy' has read-out flags \[\] and read-out fields \['toy_scales'\]; expected one of each"
    with pytest.raises(ValueError, match=expected):
        readout(dataclasses.replace(toy, flags=()))


def test_a_checkpoint_saved_by_release_0_1_loads_with_the_same_outputs():
    """tests/data/release_0_1: DHICM + EaDRA + DEA+RHE saved by release 0.1 (flat config fields, its remote code)."""
    folder = ROOT / "tests" / "data" / "release_0_1"
    expected = torch.load(folder / "expected.pt")
    with pytest.warns(FutureWarning, match=r"release 0.1's flat settings .* are deprecated"):
        model = HeadAttnMBartForConditionalGeneration.from_pretrained(folder).eval()
    # release 0.1's readings of the open choices are kept (today's defaults differ)
    assert model.config.dhicm == {"encoder_layers": [-1], "decoder_layers": [-1], "kl_weight": 0.05,
                                  "kl_reduction": "per_token"}
    assert model.config.eadra == {"decoder": {}, "encoder": {"num_heads": 2}, "dist_reduction": "sum",
                                  "alpha_scale": 1.0}
    assert model.config.sea == {"type": "dea"}
    out = model(**batch(), dependency_mask=expected["dependency_mask"])
    for name in ("logits", "loss", "dhicm_kl", "eadra_loss"):
        torch.testing.assert_close(out[name], expected[name], msg=name)


def test_a_checkpoint_saved_by_release_0_3_before_the_method_folders_loads_with_the_same_outputs():
    """tests/data/release_0_3: DHICM + EaDRA + LPEA+RHE saved at 43b4179 (its methods flat modules, #53); SEA's
    ``heads`` (a head mode) is read as ``head_selection``, warned (the placement vocabulary, #65)."""
    folder = ROOT / "tests" / "data" / "release_0_3"
    expected = torch.load(folder / "expected.pt")
    with pytest.warns(FutureWarning, match=r"older spellings sea.heads are deprecated .* 0\.4; use sea.head_selection"):
        model = HeadAttnMBartForConditionalGeneration.from_pretrained(folder).eval()
    assert sorted(model.config.headattn_settings) == ["dhicm", "eadra", "sea"]
    assert model.config.sea == {"head_selection": "redundant", "type": "lpea"}
    assert model.config.dhicm == {"decoder_layers": [-1], "encoder_layers": [-1]}  # self and cross, as saved
    dhicm = {spec.name: spec for spec in registered_methods()}["dhicm"]
    assert [site for site in dhicm.placements(model.config.headattn_settings["dhicm"], model.config)
            if site[0] == "decoder"] == [("decoder", 1, "self"), ("decoder", 1, "cross")]
    with torch.no_grad():
        out = model(**batch(), dependency_mask=expected["dependency_mask"],
                    phrase_positions=expected["phrase_positions"])
    for name in ("logits", "loss", "dhicm_kl", "eadra_loss"):
        torch.testing.assert_close(out[name], expected[name], msg=name)


def test_a_checkpoint_saved_with_localness_and_rel_pos_before_their_published_layouts_loads_as_trained(tmp_path):
    """tests/data/release_0_3_bias: Localness + Rel_Pos saved by 0.3's development builds at a671707, before
    ``predictor`` and ``tables`` existed (issue #62): it loads with the per-head predictor and the shared tables it was
    trained with, gives the same outputs, and saved again records both settings."""
    folder = ROOT / "tests" / "data" / "release_0_3_bias"
    expected = torch.load(folder / "expected.pt")
    with pytest.warns(FutureWarning, match=r"older spellings localness.layers .*; use localness.encoder_layers"):
        model, info = HeadAttnMBartForConditionalGeneration.from_pretrained(folder, output_loading_info=True)
    assert model.config.localness == {"encoder_layers": [0], "predictor": "head"}
    assert not info["missing_keys"] and not info["unexpected_keys"]
    settings = model.config.headattn_settings
    assert settings["localness"].predictor == "head" and settings["rel_pos"].tables == "layer"
    with torch.no_grad():
        out = model.eval()(**batch())
    for name in ("logits", "loss"):
        torch.testing.assert_close(out[name], expected[name], msg=name)
    model.save_pretrained(tmp_path)  # in today's spellings: it loads without a warning (warnings fail the tests)
    assert HeadAttnMBartConfig.from_pretrained(tmp_path).localness["predictor"] == "head"
    assert HeadAttnMBartConfig.from_pretrained(tmp_path).rel_pos["tables"] == "layer"


def test_loading_remote_code_never_changes_an_already_loaded_model(tmp_path):
    """Each copy of the code registers its attention function under its own name (issue: loading a second remote-code
    checkpoint replaced the function that already-loaded models ran). The checkpoint is saved by this code: release
    0.1's remote code restates transformers 5.23's attention signature and cannot run on 5.24 and later."""
    torch.manual_seed(0)
    ours = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, dhicm={"decoder_layers": [-1]})).eval()
    before = ours(**batch()).logits
    torch.manual_seed(1)
    shared = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, dhicm={"encoder_layers": [-1]})).eval()
    shared.save_pretrained(tmp_path / "shared")
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    # the checkpoint's own code, as trust_remote_code loads it where the package is not installed
    remote_class = get_class_from_dynamic_module("modeling.HeadAttnMBartForConditionalGeneration",
                                                 str(tmp_path / "shared"))
    remote = remote_class.from_pretrained(tmp_path / "shared").eval()
    assert type(remote).__module__ != type(ours).__module__  # its own copy of the code
    remote_attention = remote.model.encoder.layers[1].self_attn.config._attn_implementation
    assert remote_attention != hf_headattn.attention.ATTENTION_NAME
    torch.testing.assert_close(remote(**batch()).logits, shared(**batch()).logits)
    assert torch.equal(ours(**batch()).logits, before)


def test_the_stand_in_config_reads_through_and_backends_are_checked(monkeypatch):
    from torch.nn.attention.flex_attention import create_block_mask
    from transformers import masking_utils

    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, dhicm={"decoder_layers": [-1]})).eval()
    module = model.model.decoder.layers[1].self_attn
    assert module.config._attn_implementation == hf_headattn.attention.ATTENTION_NAME
    assert (module.config.d_model, module.config.dhicm) == (16, {"decoder_layers": [-1]})
    assert copy.deepcopy(module).config.d_model == 16
    sdpa = model(**batch()).logits
    model.set_attn_implementation("eager")
    torch.testing.assert_close(model(**batch()).logits, sdpa, atol=1e-5, rtol=1e-5)
    # a method refuses a backend it does not run on (``backends``; here SEA made to refuse flex attention) at its first
    # attention: here the first (a method on the last layers only: the layers before it run flex attention,
    # compiled, as transformers compiles the block mask, 15-45 CPU-seconds; the block mask built eagerly here)
    monkeypatch.setattr(masking_utils, "create_block_mask",
                        lambda *args, _compile=False, **kwargs: create_block_mask(*args, **kwargs))
    monkeypatch.setattr(hf_headattn.methods.sea.core.SEA, "backends", ("sdpa", "eager"))
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, sea={"type": "dea"})).eval()
    model.config._attn_implementation = "flex_attention"
    with torch.no_grad(), pytest.raises(ValueError, match=r"attn_implementation='flex_attention' is not supported "
                                                          r"by \['sea'\] .*\('sdpa', 'eager'\)"):
        model(**syntax_batch())


def _imports(path: Path) -> set[str]:
    """Modules of the package that ``path`` imports (as dotted names below hf_headattn)."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                names = [".".join(base + ([node.module] if node.module else []))]
                if not node.module:
                    names = [f"{names[0]}.{alias.name}" for alias in node.names]
            else:
                names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name for name in names if name.split(".")[0] == "hf_headattn"}
    return found


def test_import_graph_has_two_layers_and_no_circle():
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = _imports(path)
    # the model core: what a checkpoint's remote code carries (configuration, modeling and what they import)
    core = {".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
            for path in remote_code.core_files().values()}
    assert {"hf_headattn.methods.dhicm.core", "hf_headattn.methods.sea.equations", "hf_headattn.attention"} <= core
    for name in core:
        kit = {imported for imported in modules[name] if imported in modules and imported not in core}
        assert not kit, f"the model core module {name} imports the experiment kit: {kit}"
        assert name.split(".")[1] not in KIT, name
        if name.startswith("hf_headattn.methods."):  # a method's core imports no other method's folder
            folder = ".".join(name.split(".")[:3])
            other = {i for i in modules[name] if i.startswith("hf_headattn.methods.") and not i.startswith(folder)}
            assert not other, f"{name} imports another method's modules: {other}"
    # no circle: a depth-first search over the imports between modules (packages resolve to their __init__)
    graph = {name: {i for i in imports if i in modules and i != name} for name, imports in modules.items()}
    state = {}

    def visit(name, path):
        state[name] = "open"
        for target in graph[name]:
            assert state.get(target) != "open", f"import circle: {' -> '.join([*path, target])}"
            if target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def _package_modules() -> dict[str, set[str]]:
    """``{module: the package's modules it imports}`` over every module of the package."""
    return {".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): _imports(path)
            for path in PACKAGE.rglob("*.py")}


def test_the_commands_are_one_folder_that_no_library_module_imports():
    """The commands (``hf_headattn/commands/``, run by the CLI, which names them by string) sit above the library:
    no module outside the folder imports one, nor does a research script (they run a command as a process and read
    its flags from the kit); the analyses, which import the experiment kit, live in it."""
    modules = _package_modules()
    assert {name for name in modules if name.startswith("hf_headattn.commands.")} == {
        command.module for command in cli.COMMANDS.values()}
    research = {path.relative_to(ROOT).as_posix(): _imports(path) for path in (ROOT / "research").rglob("*.py")}
    importers = {name: sorted(i for i in imports if i.startswith("hf_headattn.commands"))
                 for name, imports in {**modules, **research}.items() if not name.startswith("hf_headattn.commands")}
    assert {name: found for name, found in importers.items() if found} == {}
    # a folder of the package whose modules import the kit is in the kit, above it (the commands) or a method's
    folders = {name.split(".")[1] for name, imports in modules.items()
               if name.count(".") and (PACKAGE / name.split(".")[1]).is_dir()
               and any(i.startswith("hf_headattn.experiment") for i in imports)}
    # (syntax_inputs: the shared input provider, a kit of its own that the methods' kits declare they read)
    assert folders <= {"experiment", "commands", "methods", "syntax_inputs"}, folders


def _reads_the_command_line(node: ast.AST) -> bool:
    """Whether ``node`` reads ``sys.argv`` / ``sys.orig_argv`` or parses arguments."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute) and inner.attr in ("argv", "orig_argv", "parse_args", "parse_known_args"):
            return True
    return False


def test_importing_the_package_reads_no_command_line():
    """No module's top level (its functions and ``if __name__ == "__main__"`` guard aside) reads the command line."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
                continue
            if _reads_the_command_line(node):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert found == []
    assert _reads_the_command_line(ast.parse("import sys\nif sys.argv[:1] == ['-m']:\n    pass"))  # the check sees


def test_a_cycle_of_hook_constraints_is_refused_at_registration(toy):
    """A method that must run both before and after another cannot be placed: refused, the registry unchanged."""
    before = [spec.name for spec in registered_methods()]
    looped = dataclasses.replace(toy, runs_before=("dhicm",), runs_after=("dhicm",))
    with pytest.raises(ValueError, match=r"the methods \[.*'dhicm'.*'toy'\] declare a cycle"):
        register_method(looped)
    assert [spec.name for spec in registered_methods()] == before and registered_methods()[before.index("toy")] is toy


def test_internals_are_used_only_through_hf_compat():
    """No module of the package, the recipes or the research scripts but ``hf_compat.py`` imports or reaches a module
    of transformers, torch or datasets off the allow-list, reads a private attribute of an object not ours or
    ``torch._*``, defines one of theirs in a class, or spells HF's part and checkpoint names that ``hf_compat.py``
    keeps (``tests/internal_names.py``)."""
    from internal_names import hf_name_uses, internal_uses, library_private_names, scanned_sources

    sources = scanned_sources()
    assert "hf_headattn/hf_compat.py" in sources and "research/fidelity_study.py" in sources
    assert internal_uses(sources, library_names=library_private_names()) == []
    assert hf_name_uses(sources) == []


#: ``(kind, planted source, what the scanner says of it)``: one of each kind of use of the libraries' internals.
PLANTED = [
    ("a module off the allow-list", "from transformers.models.mbart import modeling_mbart\n",
     ["1: imports transformers.models.mbart.modeling_mbart, no public module on the allow-list (PUBLIC_MODULES)"]),
    ("a module off the allow-list, not transformers' model code", "import transformers.masking_utils as masks\n"
     "from transformers.generation.utils import GenerationMixin\n"
     "from transformers.integrations import sdpa_attention\n",
     ["1: imports transformers.masking_utils, no public module on the allow-list (PUBLIC_MODULES)",
      "2: imports transformers.generation.utils, no public module on the allow-list (PUBLIC_MODULES)",
      "3: imports transformers.integrations.sdpa_attention, no public module on the allow-list (PUBLIC_MODULES)"]),
    ("a private module", "import torch._dynamo\n", ["1: imports the private torch._dynamo"]),
    ("a private name of a public module", "from torch.nn.functional import _in_projection\n",
     ["1: imports the private torch.nn.functional._in_projection"]),
    ("a private attribute of torch", "import torch\ntorch._dynamo.reset()\n", ["2: reads the private torch._dynamo"]),
    ("an import by name", "import importlib\nm = importlib.import_module('transformers.models.mbart')\n"
     "n = __import__(f'torch.{name}')\nimport sys\no = sys.modules['datasets.fingerprint']\n",
     ["2: imports 'transformers.models.mbart' by name (import_module); expected an import statement of a public "
      "module (PUBLIC_MODULES)",
      "3: imports 'torch.' by name (__import__); expected an import statement of a public module (PUBLIC_MODULES)",
      "5: imports 'datasets.fingerprint' by name (sys.modules); expected an import statement of a public module "
      "(PUBLIC_MODULES)"]),
    ("an attribute chain into transformers' model code",
     "import transformers\nf = transformers.models.mbart.modeling_mbart.eager_attention_forward\n",
     ["2: reads transformers.models.mbart.modeling_mbart, no public module on the allow-list (PUBLIC_MODULES)"]),
    ("a private attribute", "def f(dataset):\n    return dataset._fingerprint\n",
     ["2: reads the private attribute ._fingerprint"]),
    ("a private attribute by getattr", "def f(p):\n    return getattr(p, '_is_hf_initialized', False)\n",
     ["2: reads the private attribute '_is_hf_initialized' (getattr)"]),
    ("a private attribute by vars and __dict__", "def f(x):\n    a = vars(x)['_cache']\n    x.__dict__['_cache'] = a\n",
     ["2: reads the private attribute ['_cache'] (vars/__dict__)",
      "3: writes the private attribute ['_cache'] (vars/__dict__)"]),
    ("a private dunder", "def f(config_class):\n    return config_class.__dataclass_fields__\n",
     ["2: reads the private attribute .__dataclass_fields__"]),
    ("a private name a class of ours defines, read on another object",
     "class Ours:\n    def __init__(self):\n        self._cache = {}\n\n\ndef f(module):\n    return module._cache\n",
     ["7: reads the private attribute ._cache"]),
    ("a class of ours that defines the libraries' private name",
     "class Routed:\n    _attn_implementation = 'mine'\n\n    def f(self):\n        self._modules = {}\n",
     ["2: defines the libraries' private _attn_implementation (class Routed)",
      "5: defines the libraries' private _modules (class Routed)"]),
]


@pytest.mark.parametrize("kind, source, expected", PLANTED, ids=[kind for kind, _, _ in PLANTED])
def test_the_internals_check_flags_each_kind_of_use(kind, source, expected):
    """Each planted use is named by file and line; the same source is allowed in ``hf_compat.py``."""
    from internal_names import internal_uses

    library = {"_attn_implementation", "_modules", "_is_hf_initialized"}
    assert internal_uses({"hf_headattn/planted.py": source}, library_names=library) == [
        f"hf_headattn/planted.py:{line}" for line in expected]
    assert internal_uses({"hf_headattn/hf_compat.py": source}, library_names=library) == []


OURS = """\
import torch
from torch import nn
from transformers.utils import logging


class Base(nn.Module):
    _shared = None

    def __init__(self):
        super().__init__()
        self._cache = {}


class Derived(Base):
    _copied = Base._shared

    def read(self):
        return self._cache, self._shared, getattr(self, "_cache"), vars(self)["_cache"], type(self).__name__

    @classmethod
    def build(cls):
        return cls._shared


def use(derived: Derived, other: "Base | None"):
    made = Derived()
    return derived._cache, other._shared, made._cache, torch.nn.functional.softmax, nn.Linear, logging.get_logger
"""


def test_the_internals_check_allows_our_own_private_names_and_public_modules():
    """A private name a class of ours (or a base class of ours) defines is ours on ``self``/``cls``, on the class by
    its name and on a name bound to it (``x = Ours()``, ``x: Ours``); public modules are allowed at any depth."""
    from internal_names import hf_name_uses, internal_uses

    assert internal_uses({"hf_headattn/ours.py": OURS}) == []
    planted = 'def f(module, folder, rank):\n    """out_proj, trainer_state.json"""\n' \
              '    g(module.out_proj, module.out_proj_per_head, "scaled_out_proj", folder / "trainer_state.json")\n' \
              '    return g(q_proj=1), f"rng_state_{rank}.pth", r"trainer_state\\.json"\n'
    assert hf_name_uses({"hf_headattn/planted.py": planted}) == [
        f"hf_headattn/planted.py:{line}" for line in (
            "3: spells out_proj", "3: spells trainer_state.json", "4: spells q_proj", "4: spells rng_state",
            "4: spells trainer_state.json")]
    assert hf_name_uses({"hf_headattn/hf_compat.py": planted}) == []


#: The words that name a built-in method (its name, its variants and parts): no class or function outside the
#: method's folder is named with one.
METHOD_WORDS = {"dhicm": {"dhicm"}, "eadra": {"eadra"}, "sea": {"sea", "dea", "lpea", "rhe"},
                "rel_pos": {"rel", "shaw"}, "localness": {"localness"}, "fixed_attention": {"fixed"}}


def _words(name: str) -> set[str]:
    return {word.lower() for word in re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", name)}


def test_each_method_is_one_folder():
    """Every package file that holds a built-in method's code is in ``hf_headattn/methods/<name>/`` (its registration
    line aside), and its tests in ``tests/methods/<name>/`` (#53)."""
    for method, words in METHOD_WORDS.items():
        assert (PACKAGE / "methods" / method / "core.py").is_file() and (PACKAGE / "methods" / method / "README.md")
        assert list((ROOT / "tests" / "methods" / method).glob("test_*.py")), method
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                named = [method for method, words in METHOD_WORDS.items() if _words(node.name) & words]
                if named and not relative.startswith(f"methods/{named[0]}/"):
                    found.append(f"{relative}:{node.lineno}: {node.name}")
    assert found == []
    assert not [path.name for path in (ROOT / "tests").glob("test_*.py")
                if _words(path.stem) & set().union(*METHOD_WORDS.values())]


def test_two_methods_may_read_the_same_input(toy):
    """An input two specs name (RHE's ``dependency_mask``, read by SEA and by a bias method) is one forward argument."""
    import dataclasses as dc

    twin = dc.replace(toy, name="toy_twin", kit=None, flags=(), outputs={}, logged=())
    register_method(twin)
    try:
        assert method_inputs().count("toy_gate") == 1
        model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY))
        assert "toy_gate" in inspect.signature(model.forward).parameters  # (a name twice would raise here)
    finally:
        unregister_method("toy_twin")



def _crossing_imports() -> list[str]:
    """``"<file> imports <module>"`` for each import of a module in ``methods/<a>/`` from ``methods/<b>/``, and for
    each import of any method's module from the shared syntax input provider (``syntax_inputs/``)."""
    crossing = []
    for path in sorted([*(PACKAGE / "methods").rglob("*.py"), *(PACKAGE / "syntax_inputs").rglob("*.py")]):
        parts = path.relative_to(PACKAGE).parts
        if parts[0] == "methods" and len(parts) < 3:  # methods/__init__.py: the registration of every built-in method
            continue
        for imported in sorted(_imports(path)):
            target = imported.split(".")
            if target[1:2] == ["methods"] and (parts[0] != "methods" or len(target) > 2 and target[2] != parts[1]):
                crossing.append(f"{path.relative_to(PACKAGE).as_posix()} imports {imported}")
    return crossing


def test_no_method_folder_imports_another():
    """No module in ``hf_headattn/methods/<a>/`` imports from ``hf_headattn/methods/<b>/`` (#65): inputs two methods
    read (RHE's ``dependency_mask``, the parses) come from a provider outside every method folder
    (``hf_headattn.syntax_inputs``), which imports no method (the values its inputs take are the model core's,
    ``hf_headattn.phrase_values``). Read from the imports (absolute and relative), not the names."""
    assert _crossing_imports() == []


def test_the_folder_import_check_sees_absolute_and_relative_imports_of_another_folder(tmp_path, monkeypatch):
    package = tmp_path / "hf_headattn"
    (package / "methods" / "sea").mkdir(parents=True)
    (package / "methods" / "__init__.py").write_text("from .sea import core\n")  # the registrations: allowed
    (package / "methods" / "sea" / "core.py").write_text("from . import equations\n")
    (package / "methods" / "rel_pos").mkdir()
    (package / "methods" / "rel_pos" / "kit.py").write_text(
        "from . import core\nfrom ..sea.inputs import x\nimport hf_headattn.methods.sea.core\n"
        "from hf_headattn.syntax_inputs import provider\n")
    (package / "syntax_inputs").mkdir()
    (package / "syntax_inputs" / "collator.py").write_text(
        "from hf_headattn.phrase_values import RULE2\n\n\ndef f():\n    from ..methods.sea.core import METHOD\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert _crossing_imports() == ["methods/rel_pos/kit.py imports hf_headattn.methods.sea.core",
                                   "methods/rel_pos/kit.py imports hf_headattn.methods.sea.inputs",
                                   "syntax_inputs/collator.py imports hf_headattn.methods.sea.core"]


#: The one module of the package that a method folder imports from: the plug-in surface, as for a plug-in.
SURFACE = "hf_headattn.plugin"


def _off_surface_imports(package: Path, core: set[str]) -> list[str]:
    """``"<file>:<line>: ..."`` for each import in a method folder (``methods/<name>/*.py``, function bodies included)
    of anything from the package outside that folder but a name ``hf_headattn.plugin`` exports (``__all__``).
    ``core``: the folder's model-core files (paths under ``package``), which a checkpoint carries as flat remote code
    without ``plugin.py``: they import such a name relatively from the module that defines it (the same object,
    checked); every other file (kits, analyses) imports it from ``hf_headattn.plugin``."""
    import importlib

    from hf_headattn import plugin

    found = []
    for path in sorted((package / "methods").rglob("*.py")):
        relative = path.relative_to(package)
        if len(relative.parts) < 3:  # methods/__init__.py: the registration of every built-in method
            continue
        own = ".".join(["hf_headattn", *relative.parts[:2]])
        here = ["hf_headattn", *relative.parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{relative.as_posix()}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [f"{where}: imports the module {alias.name}; expected 'from {SURFACE} import <name>'"
                          for alias in node.names if alias.name.split(".")[0] == "hf_headattn"
                          and alias.name != own and not alias.name.startswith(f"{own}.")]
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            module = (".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                      if node.level else node.module or "")
            if module.split(".")[0] != "hf_headattn" or module == own or module.startswith(f"{own}."):
                continue
            if relative.as_posix() not in core and module != SURFACE:
                found.append(f"{where}: imports from {module}; expected 'from {SURFACE} import <name>'")
                continue
            for alias in node.names:
                if alias.name not in plugin.__all__:
                    found.append(f"{where}: imports {alias.name} from {module}, which {SURFACE} does not export")
                elif getattr(importlib.import_module(module), alias.name, None) is not getattr(plugin, alias.name):
                    found.append(f"{where}: {module}.{alias.name} is not {SURFACE}.{alias.name}")
    return found


def test_every_built_in_method_uses_the_plugin_surface_only():
    """Every module of every method folder imports from the package only names that ``hf_headattn.plugin`` exports,
    plus its own folder's modules (#65): kits and analyses from ``hf_headattn.plugin`` itself, as a plug-in does; the
    model core (what ``save_pretrained`` ships flat, ``remote_code.core_files``) the same objects from the modules
    that define them, relatively."""
    core = {path.relative_to(PACKAGE).as_posix() for path in remote_code.core_files().values()
            if path.is_relative_to(PACKAGE / "methods")}
    assert {"methods/sea/core.py", "methods/eadra/equations.py"} <= core and "methods/sea/kit.py" not in core
    assert _off_surface_imports(PACKAGE, core) == []


def test_the_surface_check_sees_each_kind_of_import_off_the_surface(tmp_path):
    package = tmp_path / "hf_headattn"
    (package / "methods" / "toy").mkdir(parents=True)
    (package / "methods" / "__init__.py").write_text("from .toy import core\n")  # the registrations: allowed
    (package / "methods" / "toy" / "core.py").write_text(
        "from . import equations\nfrom .equations import f\nfrom ...redundancy import real_tokens\n"
        "from ...losses import IGNORE_INDEX, chunk_rows\n\n\ndef g():\n    from ...hf_compat import OUTPUT_PROJECTION\n"
        "    from ...phrase_values import NOT_IN_PHRASE as X\n    from ...head_masks import RULE2\n")
    (package / "methods" / "toy" / "kit.py").write_text(
        "import hf_headattn.methods.toy.core\nfrom hf_headattn.methods.toy import core\n"
        "from hf_headattn.plugin import TRANSFORMER_BASE, MethodKit\nfrom hf_headattn.registry import readout\n"
        "import hf_headattn.experiment.kit\n\n\ndef h():\n    from ...experiment.presets import TRANSFORMER_BASE\n")
    assert _off_surface_imports(package, {"methods/toy/core.py"}) == [
        "methods/toy/core.py:4: imports chunk_rows from hf_headattn.losses, which hf_headattn.plugin does not export",
        "methods/toy/core.py:10: hf_headattn.head_masks.RULE2 is not hf_headattn.plugin.RULE2",
        "methods/toy/kit.py:4: imports from hf_headattn.registry; expected 'from hf_headattn.plugin import <name>'",
        "methods/toy/kit.py:5: imports the module hf_headattn.experiment.kit; expected 'from hf_headattn.plugin import "
        "<name>'",
        "methods/toy/kit.py:9: imports from hf_headattn.experiment.presets; expected 'from hf_headattn.plugin import "
        "<name>'"]
