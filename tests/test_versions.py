"""The package version (one place, ``hf_headattn/version.py``) and the version each config.json records
(``headattn_version``), on which loading keys release 0.1's translation."""

import ast
import importlib.metadata
import json
import sys
from pathlib import Path

import pytest
import tomllib
import torch
from packaging.version import Version
from transformers import AutoConfig

import hf_headattn
from conftest import FAMILIES, TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.deprecation import HeadAttnDeprecationWarning

ROOT = Path(__file__).resolve().parents[1]
RELEASE_0_1 = ROOT / "tests" / "data" / "release_0_1" / "config.json"  # flat dhicm/sea fields, eadra's dict

# the settings of the release 0.1 file, as today's defaults read them, and what release 0.1 read
TODAY = {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1], "kl_weight": 0.05},
         "eadra": {"decoder": {}, "encoder": {"num_heads": 2}}, "sea": {"type": "dea"}}
AS_RELEASE_0_1 = {"dhicm": {**TODAY["dhicm"], "kl_reduction": "per_token"},
                  "eadra": {**TODAY["eadra"], "dist_reduction": "sum", "alpha_scale": 1.0}, "sea": {"type": "dea"}}


def write_config(folder: Path, fields: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


def saved_fields(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def settings(config) -> dict:
    return {name: getattr(config, name) for name in ("dhicm", "eadra", "sea")}


def test_the_version_is_in_one_place():
    """pyproject.toml reads ``hf_headattn/version.py``; no other module assigns it; the installed metadata agrees."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hf_headattn.version.__version__"}
    assert f'"{hf_headattn.__version__}"' not in (ROOT / "pyproject.toml").read_text()
    assigning = []
    for path in sorted((ROOT / "hf_headattn").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(isinstance(target, ast.Name) and target.id == "__version__" for target in targets):
                assigning.append(path.relative_to(ROOT).as_posix())
    assert assigning == ["hf_headattn/version.py"]
    assert Version(hf_headattn.__version__).release >= (0, 3)  # releases 0.1 and 0.2 have shipped
    installed = importlib.metadata.version("hf-headattn")
    assert installed == hf_headattn.__version__, f"installed metadata says {installed}: run pip install -e ."


def test_a_saved_config_records_the_release_that_wrote_it(tmp_path):
    """As transformers_version: None on a config built here, the file's value on a loaded one, and the running release
    in what to_dict (save_pretrained, push_to_hub, to_json_string) writes."""
    config = HeadAttnMBartConfig(**TINY, dhicm={"decoder_layers": [-1]})
    assert config.headattn_version is None
    assert config.to_dict()["headattn_version"] == hf_headattn.__version__
    assert config.to_diff_dict()["headattn_version"] == hf_headattn.__version__
    assert json.loads(config.to_json_string())["headattn_version"] == hf_headattn.__version__
    torch.manual_seed(0)
    HeadAttnMBartForConditionalGeneration(config).save_pretrained(tmp_path / "model")
    assert saved_fields(tmp_path / "model")["headattn_version"] == hf_headattn.__version__
    # a file of another release: the config remembers it; saved again, the file records the release that saved it
    write_config(tmp_path / "older", {**saved_fields(tmp_path / "model"), "headattn_version": "0.2.0"})
    older = HeadAttnMBartConfig.from_pretrained(tmp_path / "older")
    assert older.headattn_version == "0.2.0"
    older.save_pretrained(tmp_path / "again")
    assert saved_fields(tmp_path / "again")["headattn_version"] == hf_headattn.__version__
    assert older.headattn_version == "0.2.0"
    assert HeadAttnMBartConfig.from_pretrained(tmp_path / "again").headattn_version == hf_headattn.__version__


@pytest.mark.parametrize("load", ["config class", "AutoConfig"])
@pytest.mark.parametrize("recorded,by_release_0_1", [
    (None, True),  # no version recorded: release 0.1's fields say so (the heuristic)
    ("0.1.0", True), ("0.1.4", True),
    ("0.2.0rc1", False), ("0.2.0", False), ("0.3.0", False), ("1.0", False),
])
def test_release_0_1_defaults_are_keyed_on_the_recorded_version(tmp_path, load, recorded, by_release_0_1):
    """Release 0.1's config.json (flat fields): translated with release 0.1's defaults when it records < 0.2 or no
    version; the same fields recorded by 0.2 or later are translated with today's defaults (kl_reduction
    'per_batch', not release 0.1's 'per_token'). AutoConfig (and so the Auto model classes) reads it alike."""
    fields = json.loads(RELEASE_0_1.read_text())
    assert "headattn_version" not in fields  # release 0.1 recorded no version
    if recorded is not None:
        fields["headattn_version"] = recorded
    folder = write_config(tmp_path / "config", fields)
    loader = HeadAttnMBartConfig.from_pretrained if load == "config class" else AutoConfig.from_pretrained
    with pytest.warns(HeadAttnDeprecationWarning, match=r"release 0.1's flat settings .*'dhicm_kl_weight'"):
        config = loader(folder)
    assert type(config) is HeadAttnMBartConfig and config.headattn_version == recorded
    assert settings(config) == (AS_RELEASE_0_1 if by_release_0_1 else TODAY)
    assert config.headattn_settings["dhicm"].kl_reduction == ("per_token" if by_release_0_1 else "per_batch")
    # saved again: the dicts as read and the running release, which reads them back unchanged (and warns no more)
    config.save_pretrained(tmp_path / "again")
    assert saved_fields(tmp_path / "again")["headattn_version"] == hf_headattn.__version__
    assert settings(loader(tmp_path / "again")) == settings(config)


def test_a_file_with_the_methods_dicts_is_keyed_on_its_version_too(tmp_path):
    """A config.json in today's convention: with no version (as release 0.2 wrote it) the heuristic finds no release
    0.1 file; recorded by 0.1 (< 0.2), the methods it switches on get release 0.1's defaults."""
    HeadAttnMBartConfig(**TINY, **TODAY).save_pretrained(tmp_path / "today")
    fields = saved_fields(tmp_path / "today")
    assert fields["headattn_version"] == hf_headattn.__version__
    assert settings(HeadAttnMBartConfig.from_pretrained(tmp_path / "today")) == TODAY
    del fields["headattn_version"]
    assert settings(HeadAttnMBartConfig.from_pretrained(write_config(tmp_path / "none", fields))) == TODAY
    fields["headattn_version"] = "0.1.0"
    assert settings(HeadAttnMBartConfig.from_pretrained(write_config(tmp_path / "old", fields))) == AS_RELEASE_0_1


def test_a_bad_recorded_version_is_refused(tmp_path):
    fields = json.loads(RELEASE_0_1.read_text())
    folder = write_config(tmp_path / "config", {**fields, "headattn_version": "zero point two"})
    with pytest.raises(ValueError, match=r"config.json: headattn_version must be the version string of the "
                                         r"hf-headattn release that wrote the config, such as '0.3.0'.*got 'zero"):
        HeadAttnMBartConfig.from_pretrained(folder)
    config = HeadAttnMBartConfig(**TINY)
    with pytest.raises(ValueError, match=r"headattn_version must be the version string .* got 3"):
        config.headattn_version = 3
    assert config.headattn_version is None
    with pytest.raises(ValueError, match=r"headattn_version must be the version string"):
        HeadAttnMBartConfig(**TINY, headattn_version=[0, 3])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_stock_transformers_loads_our_saved_folder_with_the_methods_off(family, tmp_path):
    """The recorded version is one more key to stock transformers: an inert attribute of its config; the model
    loads and computes what ours does."""
    stock_config_cls, stock_cls, ours_cls = FAMILIES[family]
    torch.manual_seed(0)
    ours = ours_cls(ours_cls.config_class(**TINY)).eval()
    ours.save_pretrained(tmp_path)
    assert saved_fields(tmp_path)["headattn_version"] == hf_headattn.__version__
    stock_config = stock_config_cls.from_pretrained(tmp_path)
    assert type(stock_config) is stock_config_cls and stock_config.d_model == TINY["d_model"]
    stock = stock_cls.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(stock(**batch()).logits, ours(**batch()).logits)


def test_remote_code_records_its_own_release(tmp_path):
    """A checkpoint's own copy of the code (trust_remote_code) ships version.py: it writes the release it is."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    folder = tmp_path / "versions_remote_code"
    HeadAttnMBartConfig(**TINY, dhicm={"decoder_layers": [-1]}).save_pretrained(folder)
    assert (folder / "version.py").is_file()
    write_config(folder, {**saved_fields(folder), "headattn_version": "0.3.0"})
    remote_class = get_class_from_dynamic_module("configuration.HeadAttnMBartConfig", str(folder))
    assert remote_class is not HeadAttnMBartConfig
    assert sys.modules[remote_class.__module__].HEADATTN_VERSION == hf_headattn.__version__
    assert remote_class.from_pretrained(folder).to_dict()["headattn_version"] == hf_headattn.__version__



def test_a_config_from_a_newer_release_drops_its_unknown_settings_with_one_warning(tmp_path, recwarn):
    """As peft reads an adapter saved by a newer peft: the settings a newer release added are dropped, with one warning
    naming both releases and the settings (nested ones included); the same file recording this release refuses them
    (a typo, then). Saved again, the config records this release and the settings it used."""
    torch.manual_seed(0)
    HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(
        **TINY, dhicm={"encoder_layers": [-1]}, eadra={"cross": {"num_heads": 2}})).save_pretrained(tmp_path / "new")
    saved = json.loads((tmp_path / "new" / "config.json").read_text())
    saved["dhicm"]["new_setting"] = 1
    saved["eadra"]["cross"]["new_inner"] = True
    for version in ("9.0.0", hf_headattn.__version__):
        (tmp_path / "new" / "config.json").write_text(json.dumps({**saved, "headattn_version": version}))
        if version == hf_headattn.__version__:
            with pytest.raises(ValueError, match=r"has unknown settings \['new_(setting|inner)'\]"):
                AutoConfig.from_pretrained(tmp_path / "new")
            continue
        recwarn.clear()
        model = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path / "new")
        warned = [str(w.message) for w in recwarn if "newer than the running" in str(w.message)]
        assert warned == [f"this config was written by hf-headattn 9.0.0, newer than the running "
                          f"{hf_headattn.__version__}: its settings ['dhicm.new_setting', 'eadra.cross.new_inner'] "
                          "are unknown here and dropped (the model is built without them; upgrade hf-headattn to use "
                          "them)"]
        assert model.config.dhicm == {"encoder_layers": [-1]} and model.config.eadra == {"cross": {"num_heads": 2}}
        assert set(model.config.headattn_settings) == {"dhicm", "eadra"}
        model.save_pretrained(tmp_path / "again")
        recwarn.clear()
        again = AutoConfig.from_pretrained(tmp_path / "again")
        assert again.headattn_version == hf_headattn.__version__ and again.dhicm == {"encoder_layers": [-1]}
        assert not [w for w in recwarn if "newer than the running" in str(w.message)]
