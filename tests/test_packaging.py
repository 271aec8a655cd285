"""The wheel holds the library alone: setuptools' package discovery, as pyproject.toml configures it, finds
``hf_headattn`` and its subpackages (the core, the experiment kit with its analyses, the commands), none of the research
workshop (``research/``: the study scripts, their runs, search and jobs); the package never imports the workshop, and
the study scripts run from ``research/``. The wheel's one console script is ``hf-headattn`` (hf_headattn/cli.py), with
the commands' modules beside it."""

import ast
import configparser
import importlib
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution
from setuptools.warnings import SetuptoolsDeprecationWarning

ROOT = Path(__file__).resolve().parents[1]
#: What only the studies use (research/workshop): no module or package of the wheel has these names.
WORKSHOP = {"study", "search", "jobs", "workshop", "research"}


@pytest.fixture(scope="module")
def wheel_modules() -> set[str]:
    """The modules a wheel built from pyproject.toml holds: each found package's ``*.py`` files (``build_py``'s rule;
    a folder without one, such as ``__pycache__``, adds nothing), ``__init__`` named as its package."""
    with warnings.catch_warnings():  # a deprecated pyproject.toml field fails the build once setuptools drops it
        warnings.simplefilter("error", SetuptoolsDeprecationWarning)
        dist = apply_configuration(Distribution(), str(ROOT / "pyproject.toml"))
    assert dist.metadata.license_expression == "Apache-2.0" and "LICENSE" in dist.metadata.license_files
    assert (ROOT / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]
    assert not dist.py_modules, dist.py_modules  # top-level modules beside the package: none
    assert dist.entry_points == {"console_scripts": ["hf-headattn = hf_headattn.cli:main"]}, dist.entry_points
    modules = set()
    for package in dist.packages:
        for path in (ROOT / Path(*package.split("."))).glob("*.py"):
            modules.add(package if path.stem == "__init__" else f"{package}.{path.stem}")
    return modules


def test_the_wheel_holds_the_library_and_none_of_the_workshop(wheel_modules):
    assert all(module.split(".")[0] == "hf_headattn" for module in wheel_modules), sorted(wheel_modules)
    from hf_headattn.cli import COMMANDS

    commands = {command.module for command in COMMANDS.values()}
    assert {"hf_headattn.cli", "hf_headattn.__main__", *commands} <= wheel_modules  # the command, its modules
    assert {"hf_headattn.configuration", "hf_headattn.legacy", "hf_headattn.deprecation",
            "hf_headattn.experiment.recipe_parts", "hf_headattn.experiment.translate", "hf_headattn.experiment.data",
            "hf_headattn.experiment.tokenization", "hf_headattn.experiment.analysis.head_ranking",
            "hf_headattn.syntax_inputs.parsing"} <= wheel_modules
    shipped = {module for module in wheel_modules if set(module.split(".")) & WORKSHOP}
    assert not shipped, f"the wheel would ship research code: {sorted(shipped)}"


def test_the_package_never_imports_the_workshop():
    for path in sorted((ROOT / "hf_headattn").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not {name.split(".")[0] for name in names} & WORKSHOP, f"{path.relative_to(ROOT)} imports {names}"


def test_the_study_scripts_import_the_package_and_their_workshop_only():
    scripts = sorted((ROOT / "research").glob("*.py"))
    assert {path.stem for path in scripts} >= {"converged_study", "fidelity_study", "reproduce_multi30k",
                                               "search_hyperparameters"}
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not {name.split(".")[0] for name in names} & {p.stem for p in scripts}, path.name
        assert "sys.path.insert" not in path.read_text(encoding="utf-8"), path.name


@pytest.mark.slow
def test_a_study_script_runs_from_research_and_finds_its_workshop(tmp_path):
    """``python research/<script>.py`` from anywhere: Python puts the script's folder first on ``sys.path``."""
    result = subprocess.run([sys.executable, str(ROOT / "research" / "fidelity_study.py"), "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "screen" in result.stdout, result.stderr[-2000:]


@pytest.mark.slow
def test_the_wheels_console_script_is_the_command(tmp_path, capsys):
    """A wheel built (``pip wheel``, from a copy of the sources: the clone stays clean) names ``hf-headattn`` in its
    entry_points.txt; the function it names lists the seven commands (tests/test_cli.py tests them)."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "hf_headattn", source / "hf_headattn", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("hf_headattn-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        entries = configparser.ConfigParser(delimiters=("=",))
        entries.read_string(archive.read(entry_points).decode())
    assert {"hf_headattn/cli.py", "hf_headattn/__main__.py", "hf_headattn/commands/demo.py"} <= set(names)
    assert entries.sections() == ["console_scripts"]
    assert dict(entries["console_scripts"]) == {"hf-headattn": "hf_headattn.cli:main"}
    module, function = entries["console_scripts"]["hf-headattn"].split(":")
    with pytest.raises(SystemExit) as stop:
        getattr(importlib.import_module(module), function)(["--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and all(f"\n  {name} " in out for name in
                                        ("train", "finetune", "translate", "prune", "average", "parse", "demo"))
