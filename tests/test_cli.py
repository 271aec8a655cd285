"""The ``hf-headattn`` command (hf_headattn/cli.py): its help lists the seven subcommands, each one's ``--help`` shows
its flags, an unknown one is a two-line usage error, ``--version``; each subcommand is the ``main`` of one module of
``hf_headattn/commands/``, ``--method_modules`` included; ``python -m`` of a command's module says which command to
run. (The console script in the wheel: tests/test_packaging.py.)"""

import ast
import importlib
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import hf_headattn
from hf_headattn import cli
from hf_headattn.registry import registered_methods, unregister_method

ROOT = Path(__file__).resolve().parents[1]
SEVEN = ["train", "finetune", "translate", "prune", "average", "parse", "demo"]


def run(argv, capsys) -> tuple[int, str, str]:
    """``hf-headattn <argv>`` in this process: (exit status, stdout, stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_the_seven_commands_one_line_each(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and out.startswith("usage: hf-headattn [-h] [--version] <command> ...\n")
    assert list(cli.COMMANDS) == SEVEN
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and line.split()}
    for name, command in cli.COMMANDS.items():
        assert lines[name] == f"  {name:<9}  {command.summary}", lines.get(name)
    assert run(["-h"], capsys)[:2] == (0, out)


def test_the_readme_shows_the_help_as_it_is(capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = readme.split("```text\n$ hf-headattn --help\n", 1)[1].split("\n...\n```", 1)[0]
    assert run(["--help"], capsys)[1].startswith(shown + "\n")


@pytest.mark.parametrize("name, flags", [
    ("train", ["--method", "--preset", "--method_modules", "--per_device_train_batch_size"]),
    ("finetune", ["--eadra", "--source_lang_code", "--method_modules"]),
    ("translate", ["--model_name_or_path", "--on_parse_error", "--method_modules"]),
    ("prune", ["--model_dir", "--criteria", "--method_modules"]),
    ("average", ["--run_dir", "--last", "--checkpoints"]),
    ("parse", ["--spacy_model", "--num_proc", "--output_dir"]),
    ("demo", ["--quick", "--methods", "--method_modules"]),
])
def test_each_commands_help_exits_0_with_its_flags_and_its_description(name, flags, capsys):
    code, out, err = run([name, "--help"], capsys)
    assert code == 0 and not err, err
    assert out.startswith(f"usage: hf-headattn {name} [-h]"), out[:200]
    assert all(flag in out for flag in flags), [flag for flag in flags if flag not in out]
    assert f"`hf-headattn {name}`" in out  # the description: its module's docstring, as written


def test_an_unknown_command_is_a_two_line_usage_error_naming_it_and_the_known_ones(capsys):
    code, out, err = run(["trian", "--output_dir", "x"], capsys)
    assert code == 2 and not out
    assert err.splitlines() == ["usage: hf-headattn [-h] [--version] <command> ...",
                                "hf-headattn: error: unknown command 'trian' (did you mean 'train'?); expected one of "
                                "train, finetune, translate, prune, average, parse, demo"]
    code, _, err = run(["--verbose", "train"], capsys)  # a flag before the command
    assert code == 2 and err.splitlines()[1] == "hf-headattn: error: unrecognized arguments: --verbose"
    code, _, err = run([], capsys)  # no command: the help, then the error
    assert code == 2 and "  translate  " in err and err.endswith("hf-headattn: error: expected a command\n")


def test_version(capsys):
    assert run(["--version"], capsys) == (0, f"hf-headattn {hf_headattn.__version__}\n", "")


def test_a_commands_usage_errors_name_the_command(tmp_path, capsys):
    code, _, err = run(["average", "--output_dir", str(tmp_path / "a")], capsys)
    assert code == 2 and "hf-headattn average: error: expected either --run_dir" in err
    code, _, err = run(["train", "--method_modules", "no_such_module", "--output_dir", str(tmp_path)], capsys)
    assert code == 2 and err.splitlines() == [
        "hf-headattn train: error: --method_modules: method module 'no_such_module' does not import: "
        "ModuleNotFoundError: No module named 'no_such_module'; expected an importable module (installed, or on "
        "PYTHONPATH) that registers a method", "(run hf-headattn train --help for the flags)"]


@pytest.fixture
def toy_unregistered():
    """The toy method (tests/toy_method.py) registered by the test, if at all, and unregistered after it."""
    before = {spec.name for spec in registered_methods()}
    yield
    if "toy" not in before and "toy" in {spec.name for spec in registered_methods()}:
        unregister_method("toy")


@pytest.mark.parametrize("name, own", [("train", "--toy_gate_value"), ("prune", "toy_scale")])
def test_method_modules_come_in_through_the_subcommands(name, own, toy_unregistered, capsys):
    """The module is imported before the command's flags are read: the toy's own flag (train) and head-importance
    criterion (prune's --criteria choices) are in the command's help."""
    if "toy" not in {spec.name for spec in registered_methods()}:  # (an earlier test of this process may have it)
        assert own not in run([name, "--help"], capsys)[1]
    code, out, err = run([name, "--method_modules", "toy_method", "--help"], capsys)
    assert code == 0 and own in out, err


def test_each_command_is_one_module_of_the_commands_folder_and_runs_only_through_the_cli():
    """``hf_headattn/commands/`` holds the seven commands' modules and nothing else; each has its ``main`` and, run
    with ``python -m``, refuses (its ``__main__`` guard calls :func:`cli.refuse_python_m`)."""
    folder = ROOT / "hf_headattn" / "commands"
    assert sorted(path.stem for path in folder.glob("*.py") if path.stem != "__init__") == sorted(
        command.module.rsplit(".", 1)[1] for command in cli.COMMANDS.values())
    assert not (ROOT / "recipes").exists()  # the commands' one home is the package
    for name, command in cli.COMMANDS.items():
        tree = ast.parse((folder / f"{command.module.rsplit('.', 1)[1]}.py").read_text(encoding="utf-8"))
        assert ast.unparse(tree.body[-1]) == "if __name__ == '__main__':\n    refuse_python_m(__spec__.name)", name
        assert callable(importlib.import_module(command.module).main)


def test_python_m_hf_headattn_is_the_command(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["hf_headattn", "--version"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module("hf_headattn", run_name="__main__")
    assert stop.value.code == 0 and capsys.readouterr().out == f"hf-headattn {hf_headattn.__version__}\n"


def test_python_m_of_a_commands_module_says_which_command_to_run(capsys):
    for module, name in (("hf_headattn.commands.train", "train"), ("hf_headattn.commands.average", "average")):
        with pytest.raises(SystemExit) as stop:
            cli.refuse_python_m(module)
        assert stop.value.code == 2 and capsys.readouterr().err == (
            f"python -m {module}: not a command; run hf-headattn {name} ... (or python -m hf_headattn {name} ...; "
            f"hf-headattn {name} --help for its flags)\n")


@pytest.mark.slow
def test_python_m_of_a_commands_module_is_a_usage_error_naming_the_command():
    """The module's ``__main__`` guard refuses (importing the package reads no command line): exit 2, one line."""
    result = subprocess.run([sys.executable, "-m", "hf_headattn.commands.train", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("python -m hf_headattn.commands.train: not a command; run "
                                    "hf-headattn train ..."), result.stderr


@pytest.mark.slow
def test_the_installed_console_script():
    """The ``hf-headattn`` that ``pip install`` (``make env``'s editable one) put beside this Python, if any."""
    script = Path(sys.executable).with_name("hf-headattn")
    if not script.is_file():
        pytest.skip(f"no console script {script}: the package was installed before it had one (pip install -e .)")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert all(f"\n  {name} " in result.stdout for name in SEVEN), result.stdout


def test_ctrl_c_ends_a_command_in_one_line_with_status_130(monkeypatch, capsys):
    from hf_headattn.commands import train

    def interrupted(argv, prog):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "main", interrupted)
    code, out, err = run(["train", "--output_dir", "x"], capsys)
    assert code == 130 and not out and err.strip() == "hf-headattn train: interrupted (Ctrl-C)", err


def test_the_help_names_every_method_and_train_lists_the_names_it_takes(capsys):
    help_text = " ".join(run(["--help"], capsys)[1].split())
    for method in ("DHICM", "SEA+RHE", "EaDRA", "fixed attention", "Rel_Pos", "Localness", "--list_methods"):
        assert method in help_text, method
    code, out, _ = run(["train", "--list_methods"], capsys)
    names = [line.split()[0] for line in out.splitlines()[1:]]
    assert code == 0 and {"baseline", "dhicm", "eadra", "dea_rhe", "rel_pos", "localness", "fixed_attention"} <= set(
        names) and "presets" not in out
    code, out, _ = run(["train", "--list_presets"], capsys)
    names = [line.split()[0] for line in out.splitlines()[1:]]
    assert code == 0 and {"dhicm_be_en", "rhe_base", "rel_pos_shaw"} <= set(names) and "methods" not in out
    assert "DHICM (Goindani & Shrivastava 2021) Table 2" in out
