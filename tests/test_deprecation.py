"""Deprecated spellings (hf_headattn.deprecation): each kind warns through the one helper, naming its replacement and
the release that removes it, at the line that used it; every removal release named in the package is still ahead of
the running release; the aliases added while 0.3 was unreleased are gone."""

import ast
import importlib
import sys
from pathlib import Path

import pytest
from packaging.version import Version

import hf_headattn
from conftest import TINY
from hf_headattn import HeadAttnMBartConfig, deprecation
from hf_headattn.deprecation import HeadAttnDeprecationWarning, deprecation_message, warn_deprecated
from hf_headattn.experiment import presets
from hf_headattn.legacy import FLAT_FIELDS_REMOVED_IN

PACKAGE = Path(hf_headattn.__file__).parent
SYNTAX = "hf_headattn.syntax_inputs"
#: The module paths release 0.2 published that moved in 0.3, and SEA's syntax inputs that left its folder for the
#: shared provider: old -> new.
MOVED_MODULES = {
    "hf_headattn.methods.sea.syntax": SYNTAX,
    "hf_headattn.methods.sea.syntax.collator": f"{SYNTAX}.collator",
    "hf_headattn.methods.sea.inputs": f"{SYNTAX}.provider",
    "hf_headattn.syntax": SYNTAX,
    **{f"hf_headattn.syntax.{name}": f"{SYNTAX}.{name}"
       for name in ("alignment", "collator", "dataset", "features", "parsing", "readers")},
    "hf_headattn.dhicm": "hf_headattn.methods.dhicm.core",
    "hf_headattn.eadra": "hf_headattn.methods.eadra.core",
    "hf_headattn.eadra_math": "hf_headattn.methods.eadra.equations",
    "hf_headattn.fused_passes": "hf_headattn.methods.eadra.compiled",
    "hf_headattn.sea": "hf_headattn.methods.sea.core",
    "hf_headattn.sea_math": "hf_headattn.methods.sea.equations",
    "hf_headattn.experiment.training": "hf_headattn.experiment.recipe_parts",
    "hf_headattn.experiment.recipe": "hf_headattn.commands.train",
    # 0.3's commands, each one module of hf_headattn/commands/, and the analyses, in the kit they import
    "hf_headattn.experiment.translation_recipe": "hf_headattn.commands.train",
    "hf_headattn.experiment.finetune_mbart": "hf_headattn.commands.finetune",
    "hf_headattn.experiment.translate_lines": "hf_headattn.commands.translate",
    "hf_headattn.experiment.prune_heads": "hf_headattn.commands.prune",
    "hf_headattn.experiment.average_checkpoints": "hf_headattn.commands.average",
    "hf_headattn.experiment.parse_sources": "hf_headattn.commands.parse",
    "hf_headattn.experiment.demo": "hf_headattn.commands.demo",
    "hf_headattn.analysis": "hf_headattn.experiment.analysis",
    **{f"hf_headattn.analysis.{name}": f"hf_headattn.experiment.analysis.{name}"
       for name in ("head_pruning", "head_ranking")},
}


def ours(warned) -> list:
    """The hf-headattn deprecation warnings among those ``pytest.warns`` recorded."""
    return [w for w in warned if issubclass(w.category, HeadAttnDeprecationWarning)]


def test_the_message_names_the_old_spelling_the_new_one_and_the_removal_release():
    expected = "a.b is deprecated and will be removed in hf-headattn 0.9; use a.c"
    assert deprecation_message("a.b", "a.c", "0.9") == expected
    assert deprecation_message("x and y", "z", "1.0", plural=True).startswith("x and y are deprecated")
    with pytest.warns(HeadAttnDeprecationWarning, match=r"^old is deprecated and will be removed in hf-headattn 0\.9; "
                                                        r"use new$") as warned:
        warn_deprecated("old", "new", "0.9", stacklevel=1)
    assert [w.filename for w in ours(warned)] == [__file__] and issubclass(HeadAttnDeprecationWarning, FutureWarning)


@pytest.mark.parametrize("old, new", MOVED_MODULES.items())
def test_a_moved_module_path_imports_the_new_module_with_a_warning_naming_the_removal(monkeypatch, old, new):
    for name in [name for name in sys.modules if name in MOVED_MODULES]:  # as in a fresh process
        monkeypatch.delitem(sys.modules, name)
    packages = ("hf_headattn.syntax", "hf_headattn.methods.sea.syntax", "hf_headattn.analysis")
    parent = next((package for package in packages if old.startswith(f"{package}.")), old)  # a package warns
    for package in packages:
        monkeypatch.delitem(sys.modules, package, raising=False)
    with pytest.warns(HeadAttnDeprecationWarning, match=rf"^the module {parent} is deprecated and will be removed in "
                                                        rf"hf-headattn 0\.4; use {MOVED_MODULES[parent]}$") as warned:
        __import__(old)  # an import statement's way (importlib.import_module would be the warning's line)
    assert sys.modules[old] is importlib.import_module(new)  # the module itself, not a copy
    assert [w.filename for w in ours(warned)] == [__file__]  # one warning, at the importing line


def test_release_0_1_flat_fields_warn_naming_the_removal_where_they_are_used(tmp_path):
    """Built, passed to from_pretrained and assigned: each warning points at the caller's line."""
    message = (rf"release 0.1's flat settings \['dhicm_kl_weight'\] are deprecated and will be removed in hf-headattn "
               rf"{FLAT_FIELDS_REMOVED_IN}; use the methods' dicts \(dhicm_kl_weight is read as dhicm\['kl_weight'\]")
    with pytest.warns(HeadAttnDeprecationWarning, match=rf"^HeadAttnMBartConfig\(\.\.\.\): {message}") as built:
        config = HeadAttnMBartConfig(**TINY, dhicm_kl_weight=0.3)
    assert config.dhicm == {"kl_weight": 0.3}
    HeadAttnMBartConfig(**TINY, dhicm={"encoder_layers": [-1]}).save_pretrained(tmp_path)
    with pytest.warns(HeadAttnDeprecationWarning, match=rf"^from_pretrained\(.*\): {message}") as loaded:
        config = HeadAttnMBartConfig.from_pretrained(tmp_path, dhicm_kl_weight=0.4)
    with pytest.warns(HeadAttnDeprecationWarning, match=rf"^config.dhicm_kl_weight = 0.5: {message}") as assigned:
        config.dhicm_kl_weight = 0.5
    assert config.dhicm == {"encoder_layers": [-1], "kl_weight": 0.5}
    for warned in (built, loaded, assigned):
        assert [w.filename for w in ours(warned)] == [__file__]
    assert Version(FLAT_FIELDS_REMOVED_IN) > Version(hf_headattn.__version__)


def test_release_0_2s_presets_dict_warns_naming_the_removal():
    with pytest.warns(HeadAttnDeprecationWarning, match=r"^hf_headattn.experiment.presets.PRESETS is deprecated and "
                                                        r"will be removed in hf-headattn 0\.4; use "
                                                        r"hf_headattn.experiment.presets.paper_presets\(\)$") as warned:
        old = presets.PRESETS
    assert old == presets.paper_presets() and [w.filename for w in ours(warned)] == [__file__]
    with pytest.raises(AttributeError, match="has no attribute 'PRESET'"):
        presets.PRESET


def _removal_releases() -> dict[str, str]:
    """``{"<file>:<line>": removal release}`` of every call of the helper in the package (``removed_in=`` given as a
    string, or as a module constant of the calling module)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "warn_deprecated"
                    and path.name != "deprecation.py"):
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            given = {keyword.arg: keyword.value for keyword in node.keywords}
            value = given.get("removed_in", node.args[2] if len(node.args) > 2 else None)
            assert value is not None, f"{where} names no removal release"
            if isinstance(value, ast.Name):  # deprecation.NEXT_RELEASE, or a constant of the module
                source = deprecation if hasattr(deprecation, value.id) else importlib.import_module(module)
                value = ast.Constant(getattr(source, value.id))
            assert isinstance(value, ast.Constant) and isinstance(value.value, str), f"{where}: removed_in {value}"
            found[where] = value.value
    return found


def test_every_deprecation_in_the_package_names_a_removal_release_still_ahead():
    """Fails at the release that should have removed a spelling: remove it (and its test), or move the date."""
    releases = _removal_releases()
    releases["hf_headattn/deprecation.py (MOVED_MODULES)"] = deprecation.NEXT_RELEASE
    assert {where.split(":")[0] for where in releases} >= {"hf_headattn/experiment/presets.py", "hf_headattn/legacy.py"}
    running = Version(hf_headattn.__version__)
    overdue = {where: release for where, release in releases.items() if Version(release) <= running}
    assert not overdue, f"hf-headattn {running} still has spellings it said it removes: {overdue}"


def test_the_aliases_added_while_0_3_was_unreleased_are_gone():
    """``set_head_mask(kind=...)`` and ``head_ranking.head_importance`` never reached a release."""
    from hf_headattn.experiment.analysis import head_ranking

    model = hf_headattn.HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY))
    with pytest.raises(TypeError, match="kind"):
        model.set_head_mask(kind="decoder", mask=None)
    with pytest.raises(TypeError, match="kind"):
        hf_headattn.head_masks.get_head_mask(model, kind="cross")
    assert not hasattr(head_ranking, "head_importance") and hasattr(head_ranking, "score_heads")
