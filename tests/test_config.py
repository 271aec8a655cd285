"""Configs and registration: Auto classes, save/load round trips, and clear errors for bad settings."""

import copy
import dataclasses
import json
import logging
import pickle

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, MarianConfig

from conftest import TINY
from hf_headattn import (
    HeadAttnMarianConfig,
    HeadAttnMarianModel,
    HeadAttnMarianMTModel,
    HeadAttnMBartConfig,
    HeadAttnMBartForConditionalGeneration,
    HeadAttnMBartModel,
)
from hf_headattn.deprecation import HeadAttnDeprecationWarning
from hf_headattn.registry import registered_methods

CONFIGS = {"mbart": HeadAttnMBartConfig, "marian": HeadAttnMarianConfig}
BASES = {"mbart": HeadAttnMBartModel, "marian": HeadAttnMarianModel}
LMS = {"mbart": HeadAttnMBartForConditionalGeneration, "marian": HeadAttnMarianMTModel}


@pytest.mark.parametrize("family", ["mbart", "marian"])
def test_auto_classes_return_our_classes(family, tmp_path):
    torch.manual_seed(0)
    model = LMS[family](CONFIGS[family](**TINY, label_smoothing=0.1))
    model.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is CONFIGS[family]
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert type(loaded) is LMS[family] and loaded.config.label_smoothing == 0.1
    assert type(AutoModel.from_pretrained(tmp_path)) is BASES[family]
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, msg=name)


def test_stock_checkpoint_loads_with_settings_as_kwargs(stock_checkpoint):
    family, path = stock_checkpoint
    model = LMS[family].from_pretrained(path, label_smoothing=0.2)
    assert model.config.model_type == CONFIGS[family].model_type and model.config.label_smoothing == 0.2


def test_checkpoint_of_another_architecture_is_refused(tmp_path):
    MarianConfig(**TINY).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds a 'marian' model; HeadAttnMBartConfig loads 'mbart'"):
        HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path)


def test_settings_round_trip(tmp_path):
    settings = dict(
        label_smoothing=0.1, dhicm={"encoder_layers": [-1], "kl_weight": 0.3},
        eadra={"cross": {"alpha_sent": 5.0, "num_heads": 2}}, sea={"type": "lpea", "encoder_layers": [0, 1],
                                                                  "max_relative_position": 4},
    )
    HeadAttnMBartConfig(**TINY, **settings).save_pretrained(tmp_path)
    loaded = HeadAttnMBartConfig.from_pretrained(tmp_path)
    assert {k: getattr(loaded, k) for k in settings} == settings


def test_syntax_parser_is_saved_only_when_recorded_and_an_older_null_still_loads(tmp_path):
    """A config with no parser (no method on, or one that parses nothing) has no ``syntax_parser`` key; one that
    records a parser keeps it; a file of an older release with ``"syntax_parser": null`` loads as before."""
    plain = HeadAttnMarianConfig(**TINY)
    assert "syntax_parser" not in plain.to_dict() and "syntax_parser" not in plain.to_diff_dict()
    assert "syntax_parser" not in HeadAttnMarianConfig(**TINY, dhicm={"encoder_layers": [-1]}).to_dict()
    parsed = HeadAttnMarianConfig(**TINY, syntax_parser="spacy:en_core_web_sm")
    assert parsed.to_dict()["syntax_parser"] == parsed.to_diff_dict()["syntax_parser"] == "spacy:en_core_web_sm"
    plain.save_pretrained(tmp_path / "plain")
    assert "syntax_parser" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    assert HeadAttnMarianConfig.from_pretrained(tmp_path / "plain").syntax_parser is None
    older = {**json.loads((tmp_path / "plain" / "config.json").read_text()), "syntax_parser": None,
             "headattn_version": "0.3.0"}
    (tmp_path / "plain" / "config.json").write_text(json.dumps(older))
    loaded = AutoConfig.from_pretrained(tmp_path / "plain")
    assert loaded.syntax_parser is None and "syntax_parser" not in loaded.to_dict()
    older["syntax_parser"] = "spacy:en_core_web_sm"
    (tmp_path / "plain" / "config.json").write_text(json.dumps(older))
    assert AutoConfig.from_pretrained(tmp_path / "plain").syntax_parser == "spacy:en_core_web_sm"


def test_release_0_1_flat_settings_are_translated_once_with_a_deprecation_warning(tmp_path):
    """Release 0.1's flat fields map to the method dicts when the config is built; they are no attributes."""
    with pytest.warns(FutureWarning, match=r"release 0.1's flat settings .*'dhicm_kl_weight'.* are deprecated"):
        config = HeadAttnMBartConfig(**TINY, dhicm_encoder_layers=[-1], dhicm_kl_weight=0.3, sea_type="dea",
                                     lpea_max_relative_position=4, sea_heads="redundant", rhe_prune=False)
    assert config.dhicm == {"encoder_layers": [-1], "kl_weight": 0.3}
    assert config.sea == {"type": "dea", "max_relative_position": 4}  # release 0.1's defaults are not stored
    assert not hasattr(config, "dhicm_kl_weight") and "dhicm_kl_weight" not in config.to_dict()
    # keyword arguments are no release-0.1 file: today's defaults
    assert config.headattn_settings["dhicm"].kl_reduction == "per_batch"
    # what release 0.1 saved: every flat field, methods off included
    with pytest.warns(FutureWarning):
        old = HeadAttnMBartConfig.from_dict({**TINY, "dhicm_encoder_layers": None, "dhicm_decoder_layers": None,
                                             "dhicm_kl_weight": 0.1, "sea_type": None, "sea_heads": "all",
                                             "sea_layers": [1], "rhe_prune": False, "eadra": None})
    assert old.dhicm is None and HeadAttnMBartForConditionalGeneration(old).headattn_settings == {}
    # from_pretrained's keyword arguments: each updates its method's dict as saved
    HeadAttnMBartConfig(**TINY, sea={"type": "dea", "encoder_layers": [1]}).save_pretrained(tmp_path)
    with pytest.warns(FutureWarning, match="'sea_type'"):
        loaded = HeadAttnMBartConfig.from_pretrained(tmp_path, sea_type="lpea")
    assert loaded.sea == {"type": "lpea", "encoder_layers": [1]}
    with pytest.raises(ValueError, match=r"gives sea=\{'type': 'dea'\} and release 0.1's flat fields"):
        HeadAttnMBartConfig.from_pretrained(tmp_path, sea={"type": "dea"}, sea_layers=[0])


#: Each method's spellings before the shared placement vocabulary (#65), and today's: the same placement.
OLDER_SPELLINGS = [
    ("dhicm", {"decoder_layers": [-1], "attention": ["cross"]}, {"decoder_layers": None, "cross_layers": [-1]}),
    ("dhicm", {"encoder_layers": [0], "decoder_layers": [1], "attention": None},
     {"encoder_layers": [0], "decoder_layers": [1], "cross_layers": "decoder_layers"}),
    ("eadra", {"encoder": {"layers": None, "num_heads": 2}}, {"encoder": {"layers": "all", "num_heads": 2}}),
    ("fixed_attention", {"patterns": ["previous", "start"], "encoder_layers": None, "decoder": True, "cross": False},
     {"patterns": ["previous", "start"], "encoder_layers": "all", "decoder_layers": "all", "cross_layers": None}),
    ("fixed_attention", {"patterns": ["start"], "encoder_layers": None},
     {"patterns": ["start"], "encoder_layers": "all"}),
    ("localness", {"layers": None, "heads": 2}, {"encoder_layers": "lower_half", "heads": [0, 1]}),
    ("localness", {"layers": [-1], "heads": "redundant"}, {"encoder_layers": [-1], "head_selection": "redundant"}),
    ("rel_pos", {"heads": "redundant"}, {"head_selection": "redundant"}),
    ("sea", {"type": "dea", "layers": None, "heads": "all"},
     {"type": "dea", "encoder_layers": [0], "head_selection": "all"}),
]


@pytest.mark.parametrize("method, older, today", OLDER_SPELLINGS, ids=[f"{m}-{i}" for i, (m, _, _) in
                                                                       enumerate(OLDER_SPELLINGS)])
def test_older_placement_spellings_load_as_today_s_with_a_warning_naming_the_removal(method, older, today):
    """The same resolved settings and attention modules as today's spelling; the config keeps (and saves) today's;
    the warning names the release that removes them and points at the line that used them."""
    with pytest.warns(HeadAttnDeprecationWarning, match=rf"^the older spellings {method}\..* are deprecated and will "
                                                        rf"be removed in hf-headattn 0\.4; use {method}\.") as warned:
        config = HeadAttnMBartConfig(**TINY, **{method: older})
    assert [w.filename for w in warned if w.category is HeadAttnDeprecationWarning] == [__file__]
    expected = HeadAttnMBartConfig(**TINY, **{method: today})  # (no warning: they fail the tests)
    assert getattr(config, method) == today
    assert config.headattn_settings[method] == expected.headattn_settings[method]
    spec = next(spec for spec in registered_methods() if spec.name == method)
    assert spec.placements(config.headattn_settings[method], config) == spec.placements(
        expected.headattn_settings[method], expected)


def test_mixed_conventions_are_refused_and_misspelt_flat_fields_warned(tmp_path, caplog):
    """A dict and flat fields of one method raise, naming both; a new-style config.json with one flat field
    added gets no release-0.1 defaults; a misspelt flat field is named in a warning."""
    with pytest.raises(ValueError, match=r"gives dhicm=\{'kl_weight': 0.2\} and release 0.1's flat fields "
                                         r"\{'dhicm_kl_weight': 0.5\}"):
        HeadAttnMBartConfig(**TINY, dhicm={"kl_weight": 0.2}, dhicm_kl_weight=0.5)
    HeadAttnMBartConfig(**TINY, dhicm={"decoder_layers": [-1]}).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["dhicm"] == {"decoder_layers": [-1]} and saved["sea"] is None
    (tmp_path / "config.json").write_text(json.dumps({**saved, "dhicm": None, "dhicm_encoder_layers": [-1]}))
    with pytest.warns(FutureWarning, match="dhicm_encoder_layers"):
        loaded = HeadAttnMBartConfig.from_pretrained(tmp_path)
    assert loaded.dhicm == {"encoder_layers": [-1]} and loaded.headattn_settings["dhicm"].kl_reduction == "per_batch"
    (tmp_path / "config.json").write_text(json.dumps({**saved, "dhicm_kl_weight": 0.5}))
    with pytest.raises(ValueError, match=r"config.json gives dhicm=.* and release 0.1's flat fields"):
        HeadAttnMBartConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**saved, "dhicm_klweight": 0.5}))
    with caplog.at_level(logging.WARNING):
        HeadAttnMBartConfig.from_pretrained(tmp_path)
    assert "'dhicm_klweight' is no setting of hf-headattn and is ignored (did you mean 'dhicm_kl_weight'" in caplog.text


def test_settings_are_read_only_resolved_once_and_frozen():
    config = HeadAttnMBartConfig(**TINY, dhicm={"encoder_layers": [-1]}, eadra={"decoder": {"num_heads": 2}})
    with pytest.raises(TypeError, match=r"read-only; assign a new dict instead"):
        config.dhicm["kl_weight"] = 0.5
    with pytest.raises(TypeError, match=r"read-only"):
        config.dhicm["encoder_layers"].append(0)
    resolved = config.headattn_settings
    assert config.headattn_settings is resolved  # not resolved again on reading
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved["dhicm"].kl_weight = 0.5
    decoder = resolved["eadra"].decoder  # EaDRA's components are resolved dataclasses
    assert (type(decoder).__name__, decoder.num_heads, decoder.alpha_dist, decoder.layers) == (
        "ComponentSettings", 2, 2.0, [0, 1])
    config.dhicm = {**config.dhicm, "kl_weight": 0.5}
    assert config.headattn_settings["dhicm"].kl_weight == 0.5 and config.headattn_settings is not resolved
    for copied in (copy.deepcopy(config), pickle.loads(pickle.dumps(config))):
        assert copied.dhicm == config.dhicm and copied.headattn_settings == config.headattn_settings
        with pytest.raises(TypeError, match="read-only"):
            copied.dhicm["kl_weight"] = 0.1
    assert json.loads(config.to_json_string())["dhicm"] == {"encoder_layers": [-1], "kl_weight": 0.5}


BAD_SETTINGS = [
    ({"label_smoothing": 1.0}, r"label_smoothing must be a number in \[0, 1\), got 1.0"),
    ({"label_smoothing": "0.1"}, r"label_smoothing must be a number in \[0, 1\), got '0.1'"),
    ({"dhicm": {"encoder_layers": [2]}}, r"dhicm.encoder_layers contains 2, but the model has 2 layers"),
    ({"dhicm": {"decoder_layers": [-3]}}, r"dhicm.decoder_layers contains -3"),
    ({"dhicm": {"encoder_layers": -1}},
     r"dhicm.encoder_layers must be a list of \(an integer\) or one of 'all' or None, got -1"),
    ({"dhicm": {"cross_layers": "most"}}, r"dhicm.cross_layers must be .*one of 'all', 'decoder_layers' or None"),
    ({"dhicm": {"encoder_layers": [-1], "dim": 0}}, r"dhicm.dim must be a positive integer .* got 0"),
    ({"dhicm": {"encoder_layers": [-1], "dim": 2.5}}, r"dhicm.dim must be an integer or None, got 2.5"),
    ({"dhicm": {"encoder_layers": [-1], "kl_weight": -0.1}}, r"dhicm.kl_weight must be a number in \[0.0, inf\)"),
    ({"dhicm": {"encoder_layers": [-1], "kl_weight": float("inf")}},
     r"dhicm.kl_weight must be a finite number, got inf"),
    ({"dhicm": {"encoder_layers": [-1], "dropout": 1.0}}, r"dhicm.dropout must be a number in \[0.0, 1.0\), got 1.0"),
    ({"dhicm": {"encoder_layers": [-1], "attention": ["selfish"]}},
     r"dhicm: attention \(an older spelling\) must name distinct entries of \('self', 'cross'\).*got \['selfish'\]"),
    ({"dhicm": {"decoder_layers": [-1], "attention": ["self", "self"]}}, r"dhicm: attention .*must name distinct"),
    ({"dhicm": {"decoder_layers": [-1], "attention": []}}, r"dhicm: attention .*must name distinct entries"),
    ({"dhicm": {"decoder_layers": [-1], "attention": ["self"], "cross_layers": None}},
     r"dhicm: the settings give 'attention' \(an older spelling\) and \['cross_layers'\]; expected 'cross_layers'"),
    ({"dhicm": {"encoder_layers": [-1], "mode": "fast"}},
     r"dhicm.mode must be one of 'paper', 'scaled_out_proj', got 'fast'"),
    ({"dhicm": {"encoder_layers": [], "decoder_layers": []}}, r"places dhicm on no attention module"),
    ({"dhicm": {"decoder_layers": [-1], "cross_layers": None}, "fixed_attention": {"patterns": ["previous"]},
      "localness": {"encoder_layers": None}}, r"places localness on no attention module"),
    ({"dhicm": {"encoder_layer": [-1]}}, r"dhicm has unknown settings \['encoder_layer'\]"),
    ({"dhicm": [-1]}, r"dhicm must be a dict of settings \(or None for off\), got \[-1\]"),
    ({"eadra": {"encoder_self": {}}}, r"eadra has unknown settings \['encoder_self'\]; expected some of"),
    ({"eadra": {"encoder": {"alpha": 1.0}}}, r"eadra\['encoder'\] has unknown settings \['alpha'\]"),
    ({"eadra": {"decoder": {"alpha_sent": -1.0}}},
     r"eadra\['decoder'\]\['alpha_sent'\] must be a number in \[0.0, inf\)"),
    ({"eadra": {"decoder": {"alpha_dist": float("nan")}}},
     r"eadra\['decoder'\].alpha_dist must be a finite number or None, got nan"),
    ({"eadra": {"cross": {"num_heads": 5}}}, r"eadra\['cross'\]\['num_heads'\] must be an integer in \[1, 4\].* got 5"),
    ({"eadra": {"encoder": {"layers": [7]}}}, r"eadra\['encoder'\]\['layers'\] contains 7"),
    ({"eadra": {"encoder": {"layers": []}}}, r"places eadra on no attention module"),
    ({"eadra": {"encoder": {"layers": "lower_half"}}},
     r"eadra\['encoder'\].layers must be a list of .*or one of 'all', got 'lower_half'"),
    ({"eadra": {"encoder": {"heads": []}}},
     r"eadra\['encoder'\]\['heads'\] must be 'all' or a non-empty list of head numbers in \[-4, 3\], got \[\]"),
    ({"localness": {"heads": [0, 4]}},
     r"localness.heads must be 'all' or a non-empty list of head numbers in \[-4, 3\], got \[0, 4\]"),
    ({"localness": {"heads": [1], "head_selection": "redundant"}},
     r"localness.head_selection='redundant' chooses among every head, got localness.heads=\[1\]"),
    ({"localness": {"encoder_layers": "upper_half"}}, r"localness.encoder_layers must be .*'lower_half'"),
    ({"rel_pos": {"head_selection": "redundant", "decoder_layers": [0]}},
     r"rel_pos.head_selection='redundant' needs RHE's dependency_mask"),
    ({"fixed_attention": {"patterns": ["left"], "cross_layers": [-1]}},
     r"fixed_attention.patterns contains \['left'\], which fixed_attention.cross_layers=\[-1\] cannot use"),
    ({"eadra": {}}, r"eadra must map some of"),
    ({"sea": {"type": "syntax"}}, r"sea.type must be one of 'dea', 'lpea' or None, got 'syntax'"),
    ({"sea": {"type": "dea", "head_selection": "some"}}, r"sea.head_selection must be one of"),
    ({"sea": {"type": "dea", "encoder_layers": [5]}}, r"sea.encoder_layers contains 5"),
    ({"sea": {"type": "dea", "encoder_layers": []}}, r"places sea on no attention module"),
    ({"sea": {"type": "dea", "encoder_layers": None}}, r"places sea on no attention module"),
    ({"sea": {"type": "dea", "layers": [0], "encoder_layers": [0]}},
     r"sea: the settings give 'layers' \(an older spelling\) and \['encoder_layers'\]; expected 'encoder_layers' "
     r"alone"),
    ({"sea": {"prune": "yes"}}, r"sea.prune must be True or False, got 'yes'"),
    ({"sea": {"prune": True, "type": "dea"}}, r"sea.prune=True drops the redundant heads"),
    ({"sea": {"type": "lpea", "max_relative_position": 0}},
     r"sea.max_relative_position must be a positive integer, got 0"),
]


@pytest.mark.parametrize("family", ["mbart", "marian"])
@pytest.mark.parametrize("settings,message", BAD_SETTINGS, ids=[m[:30] for _, m in BAD_SETTINGS])
def test_bad_settings_raise_value_error(family, settings, message):
    with pytest.raises(ValueError, match=message):
        CONFIGS[family](**TINY, **settings)


def test_settings_are_validated_when_set_and_a_bad_value_is_not_kept():
    """label_smoothing (and every method setting) set after the config was built is checked right there."""
    config = HeadAttnMBartConfig(**TINY, dhicm={"encoder_layers": [-2]})
    for value in (2.0, -1.0):
        with pytest.raises(ValueError, match=r"label_smoothing must be a number in \[0, 1\), got"):
            config.label_smoothing = value
    assert config.label_smoothing == 0.0
    with pytest.raises(ValueError, match="places sea on no attention module"):
        config.sea = {"type": "dea", "encoder_layers": []}
    assert config.sea is None
    with pytest.raises(ValueError, match=r"dhicm.encoder_layers contains -2, but the model has 1 layers"):
        config.encoder_layers = 1  # what the settings are resolved against
    assert config.encoder_layers == 2


def test_settings_changed_after_the_model_was_built_are_refused():
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, eadra={"decoder": {}})).eval()
    ids = torch.randint(3, 90, (1, 5))
    model(input_ids=ids, labels=ids)
    model.config.label_smoothing = 0.1  # read at each forward: no method setting
    model.config.eadra = {"decoder": {"alpha_dist": 0.0}}
    with pytest.raises(ValueError, match=r"config.eadra was changed after the model was built"):
        model(input_ids=ids, labels=ids)
    model.config.eadra = {"decoder": {}}
    model(input_ids=ids, labels=ids)  # changed back: runs again


@pytest.mark.parametrize("family", ["mbart", "marian"])
def test_too_long_inputs_raise_a_clear_error(family):
    model = LMS[family](CONFIGS[family](**TINY)).eval()
    long_ids = torch.randint(3, 90, (1, 65))
    with pytest.raises(ValueError,
                       match="source sequence has 65 positions, more than the model's max_position_embeddings=64"):
        model(input_ids=long_ids, labels=long_ids[:, :4])
    with pytest.raises(ValueError, match="target sequence has 65 positions"):
        model(input_ids=long_ids[:, :4], labels=long_ids)
    for num_beams in (1, 3):  # generate runs the encoder itself (was a raw IndexError)
        with pytest.raises(ValueError, match="source sequence has 65 positions"):
            model.generate(input_ids=long_ids, num_beams=num_beams, max_new_tokens=2)
    with pytest.raises(ValueError, match="target sequence has 65 positions"):
        model.generate(input_ids=long_ids[:, :4], max_new_tokens=70, min_new_tokens=70)


def test_a_flat_field_assigned_after_build_is_translated_saved_and_refused_by_the_built_model(tmp_path):
    """Regression: ``config.dhicm_kl_weight = 0.5`` was kept as a stray attribute that changed nothing, and the
    config.json it was written to was refused by from_pretrained (both conventions in one file)."""
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, dhicm={"decoder_layers": [-1]})).eval()
    ids = torch.randint(3, 90, (1, 5))
    with pytest.warns(HeadAttnDeprecationWarning, match=r"config.dhicm_kl_weight = 0.5: release 0.1's flat settings "
                                                        r"\['dhicm_kl_weight'\] are deprecated.*dhicm\['kl_weight'\]"):
        model.config.dhicm_kl_weight = 0.5
    assert model.config.dhicm == {"decoder_layers": [-1], "kl_weight": 0.5}
    assert model.config.headattn_settings["dhicm"].kl_weight == 0.5 and "dhicm_kl_weight" not in model.config.__dict__
    with pytest.raises(ValueError, match=r"config.dhicm was changed after the model was built"):
        model(input_ids=ids, labels=ids)  # as for config.dhicm = {...}
    model.save_pretrained(tmp_path)
    assert "dhicm_kl_weight" not in json.loads((tmp_path / "config.json").read_text())
    loaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.dhicm == {"decoder_layers": [-1], "kl_weight": 0.5}
    assert loaded.headattn_settings["dhicm"].kl_weight == 0.5
    with pytest.raises(ValueError, match=r"dhicm.kl_weight must be a number in \[0.0, inf\)"), pytest.warns(
            HeadAttnDeprecationWarning):
        loaded.config.dhicm_kl_weight = -1.0  # validated as the dict is, and not kept
    assert loaded.config.dhicm["kl_weight"] == 0.5


def test_a_flat_field_at_its_default_leaves_an_off_method_off():
    config = HeadAttnMBartConfig(**TINY)
    with pytest.warns(HeadAttnDeprecationWarning):
        config.rhe_prune = False  # release 0.1's default
    assert config.sea is None and config.headattn_settings == {}
    with pytest.warns(HeadAttnDeprecationWarning):
        config.sea_type = "dea"
    assert config.sea == {"type": "dea"} and "sea" in config.headattn_settings


@pytest.mark.parametrize("key, method", [("dhcim", "dhicm"), ("DHICM", "dhicm"), ("eadar", "eadra"), ("sae", "sea"),
                                         ("seaa", "sea")])
def test_a_misspelt_method_is_refused_naming_it(key, method, stock_checkpoint, tmp_path):
    """HF keeps unknown keywords on a config: misspelt, a method would be silently off (built, from_pretrained's
    keywords, a saved file)."""
    message = rf"'{key}' is not a config field; did you mean '{method}'\?"
    with pytest.raises(ValueError, match=r"HeadAttnMarianConfig\(\.\.\.\): " + message):
        HeadAttnMarianConfig(**TINY, **{key: {"encoder_layers": [-1]}})
    family, path = stock_checkpoint
    with pytest.raises(ValueError, match=r"from_pretrained\(.*\): " + message):
        LMS[family].from_pretrained(path, **{key: {"encoder_layers": [-1]}})
    saved = {**json.loads((path / "config.json").read_text()), key: {"encoder_layers": [-1]}}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=message):
        CONFIGS[family].from_pretrained(tmp_path)


def test_keywords_unlike_a_method_are_kept_as_hf_keeps_them():
    config = HeadAttnMarianConfig(**TINY, seed=3, my_note="x")  # far from every method's name
    assert config.seed == 3 and config.my_note == "x" and config.headattn_settings == {}
