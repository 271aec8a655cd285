"""EaDRA's passes behind one dispatcher (:mod:`hf_headattn.methods.eadra.passes`): the ``implementation`` setting is
checked when the settings are resolved, each pass is chosen by ``choose_pass``; "triton" (the tiled pass, removed
before 0.3.0 and back) runs it again from a saved config. (The passes' values: test_eadra_compiled.py,
test_eadra_tiled.py.)"""

import ast
import importlib.util
import json
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

import hf_headattn
from conftest import TINY
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.methods.eadra import compiled as fused_passes
from hf_headattn.methods.eadra import passes as eadra_passes
from hf_headattn.methods.eadra import tiled, tiled_kernels
from hf_headattn.methods.eadra.core import ComponentSettings, EaDRASettings
from hf_headattn.settings_checks import allowed_values

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_settings_list_the_dispatchers_implementations():
    assert allowed_values(EaDRASettings, "implementation") == eadra_passes.IMPLEMENTATIONS


def test_a_bad_implementation_is_refused_when_the_settings_are_resolved():
    config = HeadAttnMBartConfig(**TINY)
    with pytest.raises(ValueError, match=r"eadra.implementation must be one of 'auto', 'eager', 'compiled', 'triton', "
                                         r"got 'fast'"):  # (the type check)
        HeadAttnMBartConfig(**TINY, eadra={"encoder": {}, "implementation": "fast"})
    settings = EaDRASettings(encoder=ComponentSettings(), implementation="fast")  # past the dict's type check
    with pytest.raises(ValueError, match=r"eadra.implementation must be one of \('auto', 'eager', 'compiled', "
                                         r"'triton'\), "
                                         r"got 'fast'"):
        settings.resolved(config, "eadra")
    with pytest.raises(ValueError, match=r"implementation must be one of .*, got 'fast'"):
        eadra_passes.choose_pass("fast", CPU)


def test_a_saved_config_choosing_the_triton_pass_runs_it_or_names_what_it_lacks(tmp_path, recwarn, monkeypatch):
    """A config.json that chooses ``"implementation": "triton"`` (written before the pass was removed, or now) loads
    without a warning and keeps "triton"; its forward runs the tiled pass, which raises a ``ValueError`` naming what
    this machine lacks where it cannot run (here: no Triton)."""
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, eadra={"encoder": {}})).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["eadra"]["implementation"] = "triton"
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert not [w for w in recwarn if "triton" in str(w.message).lower()]
    assert loaded.config.headattn_settings["eadra"].implementation == "triton"
    ids = torch.tensor([[5, 6, 7, 2]])
    with mock.patch.dict(sys.modules, {"triton": None, "triton.language": None}):  # import triton -> ImportError
        spec = importlib.util.spec_from_file_location("hf_headattn.methods.eadra._kernels_without",
                                                      tiled_kernels.__file__)
        kernels = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (patch.dict takes it out)
        spec.loader.exec_module(kernels)
    monkeypatch.setattr(tiled, "kernels", kernels)  # the tiled pass as on a machine without Triton
    with pytest.raises(ValueError, match=r"eadra implementation='triton' needs Triton \(pip install triton\); "
                                         r"expected 'auto', 'eager' or 'compiled' without it"), torch.no_grad():
        loaded(input_ids=ids, labels=ids)


def test_one_function_chooses_every_pass(monkeypatch):
    """"auto": compiled (falling back to eager) on CUDA with Triton (Inductor's GPU code needs it) and no failed
    compile, eager elsewhere (never "triton": the GPU run decides); the other values as they say; inside a compiled
    model every pass but "triton" (opaque operators there) the plain function."""
    monkeypatch.setattr(fused_passes, "_auto_failed", [])
    monkeypatch.setattr(eadra_passes, "triton_installed", lambda: True)
    choose = eadra_passes.choose_pass
    assert (choose("auto", CPU), choose("auto", CUDA)) == ("eager", "compiled_or_eager")
    for implementation in ("eager", "compiled", "triton"):
        assert choose(implementation, CPU) == choose(implementation, CUDA) == implementation
    monkeypatch.setattr(eadra_passes, "triton_installed", lambda: False)
    assert choose("auto", CUDA) == "eager"
    monkeypatch.setattr(eadra_passes, "triton_installed", lambda: True)
    monkeypatch.setattr(fused_passes, "_auto_failed", ["an earlier failure"])
    assert choose("auto", CUDA) == "eager" and choose("compiled", CUDA) == "compiled"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert [choose(implementation, CUDA) for implementation in eadra_passes.IMPLEMENTATIONS] == [
        "eager", "eager", "eager", "triton"]


def test_the_chosen_pass_runs(monkeypatch):
    """The dispatcher hands the arguments to the fused function with the mode it chose, or to the tiled pass."""
    calls = []
    monkeypatch.setattr(eadra_passes, "fused_layer_regularizers", lambda *args: calls.append(args[-1]))
    monkeypatch.setattr(tiled, "layer_regularizers", lambda *args: calls.append(("tiled", len(args))))
    heads = ([torch.zeros(1, 2, 3, 4)], [torch.zeros(1, 2, 3, 4)], 2, 0.5, None, None)
    for implementation in ("auto", "eager", "compiled", "triton"):
        eadra_passes.layer_regularizers(*heads, implementation=implementation)
    assert calls == ["eager", "eager", "compiled", ("tiled", 7)]


def test_only_the_tiled_kernels_import_triton():
    """Triton is Inductor's business (torch imports it where installed): no module of ours imports it but the tiled
    kernels (EaDRA's and Rel_Pos's `tiled_kernels`, imported only when "triton" is chosen), so that every other
    module imports without it."""
    package = Path(hf_headattn.__file__).parent
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if path.name != "tiled_kernels.py":
                assert not any(name.split(".")[0] == "triton" for name in names), path
