"""EaDRA's passes behind one dispatcher (:mod:`hf_headattn.methods.eadra.passes`): the ``implementation`` setting is
checked when the settings are resolved, each pass is chosen by ``choose_pass``; "triton" (a pass removed before 0.3.0)
still loads, warning once, and runs "auto". (The passes' values: test_eadra_compiled.py.)"""

import ast
import json
from pathlib import Path

import pytest
import torch

import hf_headattn
from conftest import TINY
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.methods.eadra import compiled as fused_passes
from hf_headattn.methods.eadra import passes as eadra_passes
from hf_headattn.methods.eadra.core import ComponentSettings, EaDRASettings
from hf_headattn.settings_checks import allowed_values

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_settings_list_the_dispatchers_implementations():
    assert allowed_values(EaDRASettings, "implementation") == (*eadra_passes.IMPLEMENTATIONS,
                                                               *eadra_passes.REMOVED_IMPLEMENTATIONS)


def test_a_bad_implementation_is_refused_when_the_settings_are_resolved():
    config = HeadAttnMBartConfig(**TINY)
    with pytest.raises(ValueError, match=r"eadra.implementation must be one of 'auto', 'eager', 'compiled', 'triton', "
                                         r"got 'fast'"):  # (the type check: "triton" is still read)
        HeadAttnMBartConfig(**TINY, eadra={"encoder": {}, "implementation": "fast"})
    settings = EaDRASettings(encoder=ComponentSettings(), implementation="fast")  # past the dict's type check
    with pytest.raises(ValueError, match=r"eadra.implementation must be one of \('auto', 'eager', 'compiled'\), "
                                         r"got 'fast'"):
        settings.resolved(config, "eadra")
    with pytest.raises(ValueError, match=r"implementation must be one of .*, got 'fast'"):
        eadra_passes.choose_pass("fast", CPU)


def test_a_saved_config_choosing_the_removed_triton_pass_loads_warns_once_and_runs_auto(tmp_path, recwarn):
    """A config.json written while the Triton pass existed (``"implementation": "triton"``) still loads: one warning
    for the process, the settings resolved to "auto", the same loss as "auto"."""
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, eadra={"encoder": {}})).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["eadra"]["implementation"] = "triton"
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    HeadAttnMBartConfig.from_pretrained(tmp_path)  # resolved again: no second warning
    warned = [str(w.message) for w in recwarn if "Triton pass was removed" in str(w.message)]
    assert warned == ["eadra.implementation='triton': EaDRA's Triton pass was removed (slower than the compiled "
                      "pass); running 'auto', which gives the same terms"]
    assert loaded.config.headattn_settings["eadra"].implementation == "auto"
    ids = torch.tensor([[5, 6, 7, 2]])
    with torch.no_grad():
        expected, found = (m(input_ids=ids, labels=ids) for m in (model, loaded))
    torch.testing.assert_close(found.eadra_loss, expected.eadra_loss)


def test_one_function_chooses_every_pass(monkeypatch):
    """"auto": compiled (falling back to eager) on CUDA with Triton (Inductor's GPU code needs it) and no failed
    compile, eager elsewhere; the other values as they say; every pass the plain function inside a compiled model."""
    monkeypatch.setattr(fused_passes, "_auto_failed", [])
    monkeypatch.setattr(eadra_passes, "_has_triton", lambda: True)
    choose = eadra_passes.choose_pass
    assert (choose("auto", CPU), choose("auto", CUDA)) == ("eager", "compiled_or_eager")
    for implementation in ("eager", "compiled"):
        assert choose(implementation, CPU) == choose(implementation, CUDA) == implementation
    monkeypatch.setattr(eadra_passes, "_has_triton", lambda: False)
    assert choose("auto", CUDA) == "eager"
    monkeypatch.setattr(eadra_passes, "_has_triton", lambda: True)
    monkeypatch.setattr(fused_passes, "_auto_failed", ["an earlier failure"])
    assert choose("auto", CUDA) == "eager" and choose("compiled", CUDA) == "compiled"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert {choose(implementation, CUDA) for implementation in eadra_passes.IMPLEMENTATIONS} == {"eager"}


def test_the_chosen_pass_runs(monkeypatch):
    """The dispatcher hands the arguments to the fused function with the mode it chose."""
    calls = []
    monkeypatch.setattr(eadra_passes, "fused_layer_regularizers", lambda *args: calls.append(args[-1]))
    heads = ([torch.zeros(1, 2, 3, 4)], [torch.zeros(1, 2, 3, 4)], 2, 0.5, None, None)
    for implementation in ("auto", "eager", "compiled"):
        eadra_passes.layer_regularizers(*heads, implementation=implementation)
    assert calls == ["eager", "eager", "compiled"]


def test_no_module_of_the_package_imports_triton():
    """Triton is Inductor's business (torch imports it where installed): no module of ours imports it."""
    package = Path(hf_headattn.__file__).parent
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(name.split(".")[0] == "triton" for name in names), path
