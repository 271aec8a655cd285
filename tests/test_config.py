"""Configs and registration: Auto classes, save/load round trips, and clear errors for bad settings."""

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, MarianConfig

from conftest import FAMILIES, TINY
from hf_headattn import (
    HeadAttnMarianConfig,
    HeadAttnMarianModel,
    HeadAttnMarianMTModel,
    HeadAttnMBartConfig,
    HeadAttnMBartForConditionalGeneration,
    HeadAttnMBartModel,
)

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
        eadra={"cross": {"alpha_sent": 5.0, "num_heads": 2}}, sea={"type": "lpea", "layers": [0, 1],
                                                                  "max_relative_position": 4},
    )
    HeadAttnMBartConfig(**TINY, **settings).save_pretrained(tmp_path)
    loaded = HeadAttnMBartConfig.from_pretrained(tmp_path)
    assert {k: getattr(loaded, k) for k in settings} == settings


def test_release_0_1_flat_settings_load_read_and_write():
    """Release 0.1's flat fields (keyword arguments, saved config.json, attributes) map to the method dicts."""
    config = HeadAttnMBartConfig(**TINY, dhicm_encoder_layers=[-1], dhicm_kl_weight=0.3, sea_type="dea",
                                 lpea_max_relative_position=4, sea_heads="redundant", rhe_prune=False)
    assert config.dhicm == {"encoder_layers": [-1], "kl_weight": 0.3}
    assert config.sea == {"type": "dea", "max_relative_position": 4}  # release 0.1's defaults are not stored
    assert (config.dhicm_kl_weight, config.dhicm_dropout, config.sea_type) == (0.3, 0.2, "dea")
    config.dhicm_kl_weight = 0.01
    assert config.dhicm["kl_weight"] == 0.01
    # what release 0.1 saved: every flat field, methods off included
    old = HeadAttnMBartConfig.from_dict({**TINY, "dhicm_encoder_layers": None, "dhicm_decoder_layers": None,
                                         "dhicm_kl_weight": 0.1, "sea_type": None, "sea_heads": "all",
                                         "sea_layers": [1], "rhe_prune": False, "eadra": None})
    assert old.dhicm is None and HeadAttnMBartForConditionalGeneration(old).headattn_settings == {}


BAD_SETTINGS = [
    ({"label_smoothing": 1.0}, r"label_smoothing must be a number in \[0, 1\), got 1.0"),
    ({"label_smoothing": "0.1"}, r"label_smoothing must be a number in \[0, 1\), got '0.1'"),
    ({"dhicm": {"encoder_layers": [2]}}, r"dhicm.encoder_layers contains 2, but the model has 2 layers"),
    ({"dhicm": {"decoder_layers": [-3]}}, r"dhicm.decoder_layers contains -3"),
    ({"dhicm_encoder_layers": -1}, r"dhicm.encoder_layers must be a list of \(an integer\) or None, got -1"),
    ({"dhicm": {"encoder_layers": [-1], "dim": 0}}, r"dhicm.dim must be a positive integer .* got 0"),
    ({"dhicm_encoder_layers": [-1], "dhicm_dim": 2.5}, r"dhicm.dim must be an integer or None, got 2.5"),
    ({"dhicm": {"encoder_layers": [-1], "kl_weight": -0.1}}, r"dhicm.kl_weight must be a number in \[0.0, inf\)"),
    ({"dhicm": {"encoder_layers": [-1], "kl_weight": float("inf")}}, r"dhicm.kl_weight must be a finite number, got inf"),
    ({"dhicm": {"encoder_layers": [-1], "dropout": 1.0}}, r"dhicm.dropout must be a number in \[0.0, 1.0\), got 1.0"),
    ({"dhicm": {"encoder_layers": [-1], "attention": ["selfish"]}}, r"dhicm.attention must be a list of \(one of 'self', 'cross'\)"),
    ({"dhicm": {"decoder_layers": [-1], "attention": ["self", "self"]}}, r"dhicm.attention must name distinct entries"),
    ({"dhicm": {"decoder_layers": [-1], "attention": []}}, r"dhicm.attention must name distinct entries"),
    ({"dhicm": {"encoder_layers": [-1], "mode": "fast"}}, r"dhicm.mode must be one of 'paper', 'scaled_out_proj', got 'fast'"),
    ({"dhicm": {"encoder_layers": [], "decoder_layers": []}}, r"places dhicm on no attention module"),
    ({"dhicm": {"encoder_layer": [-1]}}, r"dhicm has unknown settings \['encoder_layer'\]"),
    ({"dhicm": [-1]}, r"dhicm must be a dict of settings \(or None for off\), got \[-1\]"),
    ({"eadra": {"encoder_self": {}}}, r"eadra has unknown settings \['encoder_self'\]; expected some of"),
    ({"eadra": {"encoder": {"alpha": 1.0}}}, r"eadra\['encoder'\] has unknown settings \['alpha'\]"),
    ({"eadra": {"decoder": {"alpha_sent": -1.0}}}, r"eadra\['decoder'\]\['alpha_sent'\] must be a number in \[0.0, inf\)"),
    ({"eadra": {"decoder": {"alpha_dist": float("nan")}}}, r"eadra\['decoder'\].alpha_dist must be a finite number or None, got nan"),
    ({"eadra": {"cross": {"num_heads": 5}}}, r"eadra\['cross'\]\['num_heads'\] must be an integer in \[1, 4\].* got 5"),
    ({"eadra": {"encoder": {"layers": [7]}}}, r"eadra\['encoder'\]\['layers'\] contains 7"),
    ({"eadra": {"encoder": {"layers": []}}}, r"places eadra on no attention module"),
    ({"eadra": {}}, r"eadra must map some of"),
    ({"sea": {"type": "syntax"}}, r"sea.type must be one of 'dea', 'lpea' or None, got 'syntax'"),
    ({"sea_type": "dea", "sea_heads": "some"}, r"sea.heads must be one of"),
    ({"sea_type": "dea", "sea_layers": [5]}, r"sea.layers contains 5"),
    ({"sea_type": "dea", "sea_layers": []}, r"places sea on no attention module"),
    ({"rhe_prune": "yes"}, r"sea.prune must be True or False, got 'yes'"),
    ({"rhe_prune": True, "sea_type": "dea"}, r"sea.prune=True drops the redundant heads"),
    ({"sea": {"type": "lpea", "max_relative_position": 0}}, r"sea.max_relative_position must be a positive integer, got 0"),
]


@pytest.mark.parametrize("family", ["mbart", "marian"])
@pytest.mark.parametrize("settings,message", BAD_SETTINGS, ids=[m[:30] for _, m in BAD_SETTINGS])
def test_bad_settings_raise_value_error(family, settings, message):
    with pytest.raises(ValueError, match=message):
        CONFIGS[family](**TINY, **settings)


def test_settings_changed_after_config_creation_are_checked_by_the_model():
    config = HeadAttnMBartConfig(**TINY)
    config.label_smoothing = 2.0
    with pytest.raises(ValueError, match="label_smoothing"):
        HeadAttnMBartForConditionalGeneration(config)
    config = HeadAttnMBartConfig(**TINY)
    config.sea_layers = []  # a release-0.1 attribute writes into config.sea
    config.sea_type = "dea"
    with pytest.raises(ValueError, match="places sea on no attention module"):
        HeadAttnMBartForConditionalGeneration(config)


def test_settings_changed_after_the_model_was_built_are_refused():
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, eadra={"decoder": {}})).eval()
    ids = torch.randint(3, 90, (1, 5))
    model(input_ids=ids, labels=ids)
    model.config.eadra = {"decoder": {"alpha_dist": 0.0}}
    with pytest.raises(ValueError, match=r"config.eadra was changed after the model was built"):
        model(input_ids=ids, labels=ids)
    model.config.eadra = {"decoder": {}}
    model(input_ids=ids, labels=ids)  # changed back: runs again


@pytest.mark.parametrize("family", ["mbart", "marian"])
def test_too_long_inputs_raise_a_clear_error(family):
    model = LMS[family](CONFIGS[family](**TINY)).eval()
    long_ids = torch.randint(3, 90, (1, 65))
    with pytest.raises(ValueError, match="source sequence has 65 positions, more than the model's max_position_embeddings=64"):
        model(input_ids=long_ids, labels=long_ids[:, :4])
    with pytest.raises(ValueError, match="target sequence has 65 positions"):
        model(input_ids=long_ids[:, :4], labels=long_ids)
