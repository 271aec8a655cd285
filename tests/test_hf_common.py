"""HF's own common model tests (``ModelTesterMixin``, ``ConfigTester``) on our models, for both families, with every
method off and with each registered method (the settings of its kit's ``model_test_names``, its own inputs from its
kit's ``example_inputs``), so that a new method meets them with no edit here; the toy fourth method
(``tests/toy_method.py``, registered from outside the package as a user registers one) meets them too.

The HF test files are vendored in tests/hf_common/ (see its README), a folder for each end of the supported range (the
lowest release, in .venv; the newest, in .venv-newest): the module runs the installed release's, and skips itself
(naming ``make hf-common``) where none is vendored. The model tester is ours, modelled on HF's
MBart/Marian testers (their test files are not in the sdist): HF's tiny sizes, the two model classes per family.

Every HF test that passes on the stock classes (``HF_COMMON_STOCK=1`` adds ``TestStockMBartOff``/
``TestStockMarianOff``, HF's tests on MBartModel/MBartForConditionalGeneration and MarianModel/MarianMTModel) passes
on ours or is skipped below with its reason (``skips``; ``EXPECTED_WARNINGS``: those run with a transformers
deprecation warning allowed); which tests run per class is ``selected`` (time budget).
HF tests that skip themselves on stock too (GPU, flash attention, kernels, composite or multimodal models) skip here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import unittest
from unittest import mock

import pytest
import transformers
from packaging.version import Version

from hf_common.refresh import vendored

#: The releases vendored in tests/hf_common (one folder each; ``make hf-common`` vendors the one of .venv-newest).
VENDORED = vendored()
if transformers.__version__ not in VENDORED:
    pytest.skip(
        f"tests/hf_common has HF's common model tests of transformers {', '.join(VENDORED)}, not of the installed "
        f"{transformers.__version__}: `make hf-common` vendors them (tests/hf_common/README.md)",
        allow_module_level=True,
    )
#: The folder of the installed release, e.g. ``hf_common.v5_24_0``.
VENDORED_PACKAGE = f"hf_common.{VENDORED[transformers.__version__].name}"
#: The lowest end of the range (.venv, ``make test-lowest``) runs every class; the newest (.venv-newest) a part.
AT_LOWEST = transformers.__version__ == min(VENDORED, key=Version)
pytest.importorskip("parameterized", reason="HF's test_modeling_common needs `parameterized` (the dev extra)")

from transformers import (  # noqa: E402
    MarianConfig,
    MarianModel,
    MarianMTModel,
    MBartConfig,
    MBartForConditionalGeneration,
    MBartModel,
)
from transformers.models.auto.modeling_auto import (  # noqa: E402
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    MODEL_MAPPING_NAMES,
)
from transformers.testing_utils import torch_device  # noqa: E402

import hf_headattn  # noqa: E402
import toy_method  # noqa: E402
from hf_headattn.experiment.kit import kit_of  # noqa: E402
from hf_headattn.registry import MethodSpec, register_method, registered_methods, unregister_method  # noqa: E402

ConfigTester = importlib.import_module(f"{VENDORED_PACKAGE}.test_configuration_common").ConfigTester
_modeling_common = importlib.import_module(f"{VENDORED_PACKAGE}.test_modeling_common")
ModelTesterMixin, ids_tensor = _modeling_common.ModelTesterMixin, _modeling_common.ids_tensor

FAMILIES = {
    # name: (config class, base model, LM model)
    "MBart": (hf_headattn.HeadAttnMBartConfig, hf_headattn.HeadAttnMBartModel,
              hf_headattn.HeadAttnMBartForConditionalGeneration),
    "Marian": (hf_headattn.HeadAttnMarianConfig, hf_headattn.HeadAttnMarianModel, hf_headattn.HeadAttnMarianMTModel),
}
#: The stock classes, as reference (which HF tests pass there): HF_COMMON_STOCK=1 pytest tests/test_hf_common.py
STOCK = {
    "StockMBart": (MBartConfig, MBartModel, MBartForConditionalGeneration),
    "StockMarian": (MarianConfig, MarianModel, MarianMTModel),
}
if os.environ.get("HF_COMMON_STOCK") == "1":
    FAMILIES.update(STOCK)

#: Methods registered from outside the package, as a user registers a fourth method: registered while their test
#: classes run (registering them for the whole session would change what every other test module sees).
PLUGINS = (toy_method.METHOD,)


def method_cases() -> dict[str, tuple[MethodSpec | None, dict]]:
    """``{class name suffix: (method, config settings)}``: "Off" (every method off), then each registered method and
    plug-in with the settings of each recipe name in its kit's ``model_test_names`` (default: its first recipe
    name), the suffix that name in CamelCase (``dea_rhe`` -> ``DeaRhe``)."""
    cases = {"Off": (None, {})}
    for spec in [*registered_methods(), *PLUGINS]:
        kit = kit_of(spec)
        for name in kit.model_test_names or list(kit.method_names)[:1]:
            cases["".join(part.title() for part in name.split("_"))] = (spec, {spec.name: kit.method_names[name]})
    return cases


METHODS = method_cases()


#: Selection (time budget). The lowest end (.venv) runs all that is selected below; the newest end (.venv-newest,
#: where `make test-newest` runs the module too) the Off classes in full, mBART's method classes the core
#: (``CORE_METHOD_TESTS``) and Marian's none: a new release meets our subclasses in every HF test, and each method's
#: attention in the core.
#: The "Off" classes run every HF test except the fp16/bf16 eager-vs-SDPA variants (half precision on CPU is slow
#: and the model is the stock one; the 7 fp32 variants run). The method classes run the tests below: forward,
#: backward, outputs, attentions, save/load, init, attention dispatch and the cache's forward argument (its old
#: name too, from 5.24), i.e. what the methods change (a name a release's mixin lacks selects nothing). Not run there:
#: embedding resizing, dtype/device/offload loading, FFN chunking, input-grad hooks for PEFT, and the reentrant
#: gradient-checkpointing variants: code the methods do not touch (the Off classes run them).
METHOD_TESTS = {
    "test_config", "test_save_load", "test_torch_save_load", "test_can_use_safetensors", "test_determinism",
    "test_batching_equivalence", "test_training", "test_training_gradient_checkpointing", "test_attention_outputs",
    "test_hidden_states_output", "test_retain_grad_hidden_states_attentions", "test_model_outputs_equivalence",
    "test_inputs_embeds", "test_inputs_embeds_matches_input_ids", "test_all_tensors_are_parameter_or_buffer",
    "test_can_init_all_missing_weights", "test_init_weights_can_init_buffers", "test_load_save_without_tied_weights",
    "test_model_weights_reload_no_missing_tied_weights", "test_tied_weights_keys",
    "test_sdpa_can_dispatch_non_composite_models", "test_can_set_attention_dynamically",
    "test_config_attn_implementation_setter", "test_capture_outputs_decorator",
    "test_model_forward_default_config_values", "test_encoder_decoder_loss_no_double_shift",
    "test_eager_matches_sdpa_inference_09_fp32_pad_left", "test_eager_matches_sdpa_inference_13_fp32_pad_right",
    "test_eager_matches_sdpa_inference_24_fp32_pad_left_output_attentions", "test_bc_cache_name_forward",
}
#: Marian's attention is a copy of mBART's, so the methods run the same code: Marian's method classes run this core
#: (not test_model_outputs_equivalence, the slowest: the output classes are the same as mBART's). On the newest end
#: mBART's method classes run it too, and Marian's none (the end of the module).
#: The methods whose mBART classes run every selected HF test at the lowest end (the others, the papers' comparison
#: methods: the core set, as on the newest end; their own folders test them in depth).
FULL_HF_TESTS = ("dhicm", "eadra", "sea", "toy")
CORE_METHOD_TESTS = {
    "test_config", "test_save_load", "test_training", "test_batching_equivalence", "test_attention_outputs",
    "test_hidden_states_output", "test_all_tensors_are_parameter_or_buffer",
    "test_can_init_all_missing_weights", "test_eager_matches_sdpa_inference_09_fp32_pad_left",
    "test_eager_matches_sdpa_inference_24_fp32_pad_left_output_attentions", "test_bc_cache_name_forward",
}
#: The slowest test: only where a method adds output fields to every forward (its ``logged`` fields; SEA adds none;
#: the Off classes run it).
FIELD_TESTS = {"test_model_outputs_equivalence"}
HALF_PRECISION = ("_fp16_", "_bf16_")


def skips(spec: MethodSpec | None) -> dict[str, str]:
    """HF tests that pass on the stock classes but not with the method, by design: ``{test: reason}``."""
    if spec is None or not spec.logged:
        return {}
    return {"test_attention_outputs": f"{spec.name} adds the output fields {'/'.join(spec.logged)}: HF counts "
                                      "exactly 5 fields (attention shapes: tests/test_model_outputs.py)"}


#: HF tests that check one of transformers' deprecation warnings with ``warnings.catch_warnings(record=True)``, which
#: keeps the filters in force: pyproject.toml makes every FutureWarning an error, so the warning would be raised
#: instead of recorded (on the stock classes too). They run with that warning shown: ``{test: filterwarnings mark}``.
EXPECTED_WARNINGS = {
    # 5.24: forward's `past_key_values` argument is `cache`; the old name still works, with a FutureWarning
    "test_bc_cache_name_forward": "always:`past_key_values` is deprecated:FutureWarning",
}


def allowing_warning(name: str, action: str):
    """HF's test ``name``, run with the warnings filter ``action`` (pytest's ``filterwarnings`` mark)."""
    test = getattr(ModelTesterMixin, name)

    @pytest.mark.filterwarnings(action)
    @functools.wraps(test)
    def run(self):
        return test(self)
    return run


def skipped(reason: str):
    def test(self):
        self.skipTest(reason)
    return test


def selected(name: str, family: str, method: str) -> bool:
    spec = METHODS[method][0]
    if spec is not None and not spec.logged and name in FIELD_TESTS:
        return False
    if method != "Off":  # (the papers' comparison methods: the core set on both ends, time budget)
        full = family == "MBart" and AT_LOWEST and (spec is None or spec.name in FULL_HF_TESTS)
        return name in (METHOD_TESTS if full else CORE_METHOD_TESTS)
    return not (name.startswith("test_eager_matches_sdpa_inference") and any(p in name for p in HALF_PRECISION))


class HeadAttnModelTester:
    """HF's MBart/Marian tester sizes (batch 13, length 7, vocab 99, d_model 16, 2+2 layers, 4 heads, ffn 4), the
    method settings added to the config, and the method's own inputs (its kit's ``example_inputs``) added to the
    model inputs."""

    def __init__(self, parent, config_class, settings, example_inputs=None, batch_size=13, seq_length=7,
                 vocab_size=99, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=4):
        self.parent, self.config_class, self.settings = parent, config_class, settings
        self.example_inputs = example_inputs
        self.batch_size, self.seq_length, self.vocab_size = batch_size, seq_length, vocab_size
        self.hidden_size, self.num_hidden_layers = hidden_size, num_hidden_layers
        self.num_attention_heads, self.intermediate_size = num_attention_heads, intermediate_size
        self.is_training = True
        self.encoder_seq_length = self.decoder_seq_length = seq_length

    def get_config(self):
        return self.config_class(
            vocab_size=self.vocab_size, d_model=self.hidden_size, encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers, encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads, encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size, dropout=0.1, attention_dropout=0.1, max_position_embeddings=100,
            eos_token_id=2, pad_token_id=1, bos_token_id=0, decoder_start_token_id=3, forced_eos_token_id=None,
            **self.settings,
        )

    def prepare_config_and_inputs(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = 2
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        inputs = {
            "input_ids": input_ids, "attention_mask": input_ids.ne(1), "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": decoder_input_ids.ne(1),
        }
        if self.example_inputs is not None:
            own = self.example_inputs(self.batch_size, self.seq_length)
            inputs.update({key: value.to(torch_device) for key, value in own.items()})
        return self.get_config(), inputs

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()


class HeadAttnModelTestBase(ModelTesterMixin):
    """Shared by every family x method test class (made by :func:`make_test_class`)."""

    family = method = plugin = None
    is_encoder_decoder = True
    additional_model_inputs = []  # the method's inputs (MethodSpec.inputs): HF's tests keep these where present
    test_missing_keys = False  # as HF's MBart/Marian tests
    # HF's MBart/Marian tests also run the generate() tests of GenerationTesterMixin, not in the sdist

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if cls.plugin is not None:
            register_method(cls.plugin)

    @classmethod
    def tearDownClass(cls):
        if cls.plugin is not None:
            unregister_method(cls.plugin.name)
        super().tearDownClass()

    def setUp(self):
        # HF's tests tell base models (no loss) and seq2seq LMs (given labels) by class name, from these tables
        base, lm = self.all_model_classes
        model_type = FAMILIES[self.family][0].model_type
        for table, cls in ((MODEL_MAPPING_NAMES, base), (MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, lm)):
            patcher = mock.patch.dict(table, {model_type: cls.__name__})
            patcher.start()
            self.addCleanup(patcher.stop)
        config_class = FAMILIES[self.family][0]
        spec, settings = METHODS[self.method]
        example_inputs = None if spec is None else kit_of(spec).example_inputs
        self.model_tester = HeadAttnModelTester(self, config_class, settings, example_inputs)
        self.config_tester = ConfigTester(self, config_class=config_class, d_model=16, **settings)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_generation_tester_mixin_inheritance(self):
        self.skipTest("GenerationTesterMixin (tests/generation/) is not in the sdist; "
                      "generate() is tested in our files")


def make_test_class(family: str, method: str) -> type:
    _, base, lm = FAMILIES[family]
    spec = METHODS[method][0]
    attributes = {"family": family, "method": method, "all_model_classes": (base, lm), "__module__": __name__,
                  "plugin": spec if spec in PLUGINS else None,
                  "additional_model_inputs": [] if spec is None else list(spec.inputs)}
    # a test set to None is not collected
    attributes.update({name: None for name in dir(HeadAttnModelTestBase)
                       if name.startswith("test_") and not selected(name, family, method)})
    attributes.update({name: allowing_warning(name, action) for name, action in EXPECTED_WARNINGS.items()
                       if hasattr(ModelTesterMixin, name) and selected(name, family, method)})
    attributes.update({name: skipped(reason) for name, reason in skips(spec).items()})
    return type(f"Test{family}{method}", (HeadAttnModelTestBase, unittest.TestCase), attributes)


def test_vendored_files_unchanged():
    """The installed release's vendored files are HF's, as ``refresh.py`` wrote them (their sha256 in ``VERSION``)."""
    folder = VENDORED[transformers.__version__]
    _, *lines = (folder / "VERSION").read_text().splitlines()
    recorded = dict(reversed(line.split()) for line in lines)
    assert recorded == {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
                        for path in folder.glob("test_*.py")}


for _family in FAMILIES:
    for _method in METHODS if not _family.startswith("Stock") else ["Off"]:
        # the newest end: the methods' tests on mBART only (Marian's attention is a copy of mBART's, so the methods
        # run the same code; TestMarianOff still runs every HF test on Marian)
        if _family == "Marian" and _method != "Off" and not AT_LOWEST:
            continue
        _cls = make_test_class(_family, _method)
        globals()[_cls.__name__] = _cls
del _cls
