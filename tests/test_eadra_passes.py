"""EaDRA's passes behind one dispatcher (:mod:`hf_headattn.eadra_passes`): the ``implementation`` setting is checked
when the settings are resolved, each pass is chosen by ``choose_pass``, and the Triton module, the only one that
imports Triton, is imported only when chosen. (The passes' values: tests/test_fused_passes.py,
tests/test_eadra_triton.py; what a checkpoint's remote code carries: tests/test_hub.py.)"""

import ast
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_headattn
from conftest import TINY
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, eadra_passes, fused_passes
from hf_headattn.eadra import ComponentSettings, EaDRASettings
from hf_headattn.settings_checks import allowed_values

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_settings_list_the_dispatchers_implementations():
    assert allowed_values(EaDRASettings, "implementation") == eadra_passes.IMPLEMENTATIONS


def test_a_bad_implementation_is_refused_when_the_settings_are_resolved():
    config = HeadAttnMBartConfig(**TINY)
    with pytest.raises(ValueError, match=r"eadra.implementation must be one of 'auto', 'eager', 'compiled', 'triton', "
                                         r"got 'fast'"):
        HeadAttnMBartConfig(**TINY, eadra={"encoder": {}, "implementation": "fast"})
    settings = EaDRASettings(encoder=ComponentSettings(), implementation="fast")  # past the dict's type check
    with pytest.raises(ValueError, match=r"eadra.implementation must be one of \('auto', 'eager', 'compiled', "
                                         r"'triton'\), got 'fast'"):
        settings.resolved(config, "eadra")
    with pytest.raises(ValueError, match=r"implementation must be one of .*, got 'fast'"):
        eadra_passes.choose_pass("fast", CPU)


@pytest.mark.parametrize("triton, cuda, interpret, warned", [
    (False, True, None, "needs Triton, which is not installed"),
    (True, False, None, "needs a CUDA device"),
    (True, False, "1", None),  # Triton's interpreter runs the pass on the CPU
    (True, True, None, None),
])
def test_triton_where_it_cannot_run_is_a_warning_when_resolved(monkeypatch, recwarn, triton, cuda, interpret,
                                                              warned):
    """A config choosing the Triton pass loads anywhere (e.g. to translate: no terms, no pass); where the pass cannot
    run, resolving the settings warns, naming what is missing, and the first forward that computes the terms raises
    (tests/test_fused_passes.py)."""
    monkeypatch.setattr(eadra_passes, "_has_triton", lambda: triton)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    config = HeadAttnMBartConfig(**TINY, eadra={"encoder": {}, "implementation": "triton"})
    assert config.headattn_settings["eadra"].implementation == "triton"
    messages = [str(w.message) for w in recwarn if issubclass(w.category, UserWarning) and "triton" in str(w.message)]
    if warned is None:
        assert messages == []
    else:
        assert len(messages) == 1 and messages[0].startswith(f"eadra.implementation='triton' {warned}"), messages
    HeadAttnMBartConfig(**TINY, eadra={"encoder": {}, "implementation": "auto"})  # the others never warn
    assert len([w for w in recwarn if "triton" in str(w.message)]) == len(messages)


def test_triton_where_it_cannot_run_warns_once_for_one_model(monkeypatch, recwarn):
    """Building, copying and saving a model resolve its settings several times: one warning (it was five)."""
    monkeypatch.setattr(eadra_passes, "_has_triton", lambda: False)
    config = HeadAttnMBartConfig(**TINY, eadra={"encoder": {}, "implementation": "triton"})
    model = HeadAttnMBartForConditionalGeneration(config)
    copy.deepcopy(model.config).to_dict()
    assert len([w for w in recwarn if "'triton' needs" in str(w.message)]) == 1


def test_one_function_chooses_every_pass(monkeypatch):
    """"auto": compiled (falling back to eager) on CUDA with Triton and no failed compile, eager elsewhere, never the
    Triton pass; the other values as they say; every pass the plain function inside a compiled model."""
    monkeypatch.setattr(fused_passes, "_auto_failed", [])
    monkeypatch.setattr(eadra_passes, "_has_triton", lambda: True)
    choose = eadra_passes.choose_pass
    assert (choose("auto", CPU), choose("auto", CUDA)) == ("eager", "compiled_or_eager")
    for implementation in ("eager", "compiled", "triton"):
        assert choose(implementation, CPU) == choose(implementation, CUDA) == implementation
    monkeypatch.setattr(eadra_passes, "_has_triton", lambda: False)
    assert choose("auto", CUDA) == "eager"
    monkeypatch.setattr(eadra_passes, "_has_triton", lambda: True)
    monkeypatch.setattr(fused_passes, "_auto_failed", ["an earlier failure"])
    assert choose("auto", CUDA) == "eager" and choose("compiled", CUDA) == "compiled"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert {choose(implementation, CUDA) for implementation in eadra_passes.IMPLEMENTATIONS} == {"eager"}


def test_the_chosen_pass_runs(monkeypatch):
    """The dispatcher hands the arguments to the pass it chose: the fused function with its mode, or the Triton
    module's function (imported by name)."""
    calls = []
    monkeypatch.setattr(eadra_passes, "fused_layer_regularizers", lambda *args: calls.append(("fused", args[-1])))

    class Triton:
        @staticmethod
        def layer_regularizers(*args):
            calls.append(("triton", len(args)))

    monkeypatch.setattr(eadra_passes, "_triton_pass", lambda: Triton)
    heads = ([torch.zeros(1, 2, 3, 4)], [torch.zeros(1, 2, 3, 4)], 2, 0.5, None, None)
    for implementation in ("auto", "eager", "compiled", "triton"):
        eadra_passes.layer_regularizers(*heads, implementation=implementation)
    assert calls == [("fused", "eager"), ("fused", "eager"), ("fused", "compiled"), ("triton", 7)]


IMPORTS = """
import json, sys, torch
def loaded():
    return sorted(name for name in sys.modules if name.startswith("hf_headattn") and "triton" in name)
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
seen = {"import hf_headattn": loaded()}
ids = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 12, 2, 1, 1]])
labels = torch.tensor([[13, 14, 15, 2], [16, 2, -100, -100]])
inputs = {"input_ids": ids, "attention_mask": ids.ne(1).long(), "labels": labels}
for implementation in sys.argv[2:]:
    eadra = {"encoder": {}, "decoder": {}, "cross": {}, "implementation": implementation}
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**json.loads(sys.argv[1]), eadra=eadra)).train()
    try:
        out = model(**inputs)
        out.loss.backward()
        model.generate(input_ids=ids, attention_mask=inputs["attention_mask"], max_new_tokens=3)
        result = float(out.eadra_loss)
    except ValueError as error:  # the Triton pass on the CPU, outside Triton's interpreter
        result = str(error)
    seen[implementation] = [result, loaded()]
print(json.dumps(seen))
"""


def imported_modules(path: Path) -> set[str]:
    """The modules a source file imports (relative ones with their leading dots)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_only_the_triton_module_imports_triton_and_only_the_remote_code_entry_imports_it():
    """Triton is imported by ``eadra_triton.py`` alone, and ``eadra_triton.py`` by name (the dispatcher) and by
    ``modeling_eadra_triton.py`` (what a checkpoint that chooses it loads), by no other module of the package.
    (torch imports Triton itself where it is installed: ``torch._dynamo``, which transformers' generation imports.)"""
    package = Path(hf_headattn.__file__).parent
    imports = {path.relative_to(package).as_posix(): imported_modules(path) for path in package.rglob("*.py")}
    assert sorted(name for name, names in imports.items() if any(n.split(".")[0] == "triton" for n in names)) == [
        "eadra_triton.py"]
    assert sorted(name for name, names in imports.items()
                  if names & {".eadra_triton", "hf_headattn.eadra_triton"}) == ["modeling_eadra_triton.py"]


@pytest.mark.slow
def test_the_triton_module_is_imported_only_when_chosen():
    """In a fresh process: importing the package, building, training and generating with "auto" and "eager" leave
    ``hf_headattn.eadra_triton`` unimported; a model that chooses "triton" imports it at its first pass."""
    root = Path(__file__).resolve().parents[1]
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", IMPORTS, json.dumps(TINY), "auto", "eager", "triton"], cwd=root,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["import hf_headattn"] == []
    for implementation in ("auto", "eager"):
        loss, modules = seen[implementation]
        assert isinstance(loss, float) and modules == [], (implementation, seen[implementation])
    outcome, modules = seen["triton"]
    assert modules == ["hf_headattn.eadra_triton"], modules
    assert isinstance(outcome, float) or "eadra implementation='triton'" in outcome, outcome
