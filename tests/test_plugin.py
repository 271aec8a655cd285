"""The plug-in interface: ``docs/method_template.py``, a complete method outside the package, imports only
``hf_headattn.plugin``, registers itself, and works as a built-in method does."""

import ast
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, plugin
from hf_headattn.experiment.kit import kit_of
from hf_headattn.registry import import_method_modules

TEMPLATE = Path(__file__).resolve().parents[1] / "docs" / "method_template.py"


@pytest.fixture
def template(monkeypatch):
    monkeypatch.syspath_prepend(str(TEMPLATE.parent))
    monkeypatch.delitem(sys.modules, "method_template", raising=False)
    brought = import_method_modules(["method_template"])
    yield sys.modules["method_template"], brought
    plugin.unregister_method("head_gates")


def test_the_template_imports_only_the_plugin_path():
    imported = {node.module for node in ast.walk(ast.parse(TEMPLATE.read_text()))
                if isinstance(node, ast.ImportFrom) and node.module}
    assert {name for name in imported if name.startswith("hf_headattn")} == {"hf_headattn.plugin"}
    assert set(plugin.__all__) == {name for name in dir(plugin) if not name.startswith("_")} - {
        "attention", "experiment", "hf_compat", "registry", "settings_checks"}


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
