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
        label_smoothing=0.1, dhicm_encoder_layers=[-1], dhicm_kl_weight=0.3, sea_layers=[0, 1],
        eadra={"cross": {"alpha_sent": 5.0, "num_heads": 2}}, lpea_max_relative_position=4,
    )
    HeadAttnMBartConfig(**TINY, **settings).save_pretrained(tmp_path)
    loaded = HeadAttnMBartConfig.from_pretrained(tmp_path)
    assert {k: getattr(loaded, k) for k in settings} == settings


BAD_SETTINGS = [
    ({"label_smoothing": 1.0}, r"label_smoothing must be in \[0, 1\), got 1.0"),
    ({"dhicm_encoder_layers": [2]}, r"dhicm_encoder_layers contains 2, but the model has 2 layers"),
    ({"dhicm_decoder_layers": [-3]}, r"dhicm_decoder_layers contains -3"),
    ({"dhicm_dim": 0}, r"dhicm_dim must be a positive integer .* got 0"),
    ({"dhicm_kl_weight": -0.1}, r"dhicm_kl_weight must be a number in \[0.0, inf\), got -0.1"),
    ({"dhicm_dropout": 1.0}, r"dhicm_dropout must be a number in \[0.0, 1.0\), got 1.0"),
    ({"dhicm_attention": ["selfish"]}, r"dhicm_attention entries must be one of \('self', 'cross'\), got 'selfish'"),
    ({"dhicm_mode": "fast"}, r"dhicm_mode must be one of .* got 'fast'"),
    ({"eadra": {"encoder_self": {}}}, r"eadra has unknown component 'encoder_self'; expected some of"),
    ({"eadra": {"encoder": {"alpha": 1.0}}}, r"eadra\['encoder'\] has unknown settings \['alpha'\]"),
    ({"eadra": {"decoder": {"alpha_sent": -1.0}}}, r"eadra\['decoder'\]\['alpha_sent'\] must be a number in \[0.0, inf\)"),
    ({"eadra": {"cross": {"num_heads": 5}}}, r"eadra\['cross'\]\['num_heads'\] must be an integer in \[1, 4\].* got 5"),
    ({"eadra": {"encoder": {"layers": [7]}}}, r"eadra\['encoder'\]\['layers'\] contains 7"),
    ({"eadra": {}}, r"eadra must map some of"),
    ({"sea_type": "syntax"}, r"sea_type must be one of \(None, 'dea', 'lpea'\), got 'syntax'"),
    ({"sea_heads": "some"}, r"sea_heads must be one of"),
    ({"sea_layers": [5]}, r"sea_layers contains 5"),
    ({"rhe_prune": True, "sea_type": "dea"}, r"rhe_prune=True drops the redundant heads"),
    ({"lpea_max_relative_position": 0}, r"lpea_max_relative_position must be a positive integer, got 0"),
]


@pytest.mark.parametrize("family", ["mbart", "marian"])
@pytest.mark.parametrize("settings,message", BAD_SETTINGS, ids=[m[:30] for _, m in BAD_SETTINGS])
def test_bad_settings_raise_value_error(family, settings, message):
    with pytest.raises(ValueError, match=message):
        CONFIGS[family](**TINY, **settings)


def test_wrong_type_names_the_field():
    with pytest.raises(Exception, match="dhicm_encoder_layers"):
        HeadAttnMBartConfig(**TINY, dhicm_encoder_layers="last")


def test_settings_changed_after_config_creation_are_checked_by_the_model():
    config = HeadAttnMBartConfig(**TINY)
    config.label_smoothing = 2.0
    with pytest.raises(ValueError, match="label_smoothing"):
        HeadAttnMBartForConditionalGeneration(config)


@pytest.mark.parametrize("family", ["mbart", "marian"])
def test_too_long_inputs_raise_a_clear_error(family):
    model = LMS[family](CONFIGS[family](**TINY)).eval()
    long_ids = torch.randint(3, 90, (1, 65))
    with pytest.raises(ValueError, match="source sequence has 65 positions, more than the model's max_position_embeddings=64"):
        model(input_ids=long_ids, labels=long_ids[:, :4])
    with pytest.raises(ValueError, match="target sequence has 65 positions"):
        model(input_ids=long_ids[:, :4], labels=long_ids)
