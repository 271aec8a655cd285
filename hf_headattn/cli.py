"""The ``hf-headattn`` command: the recipes as subcommands of one console script, as ``accelerate`` and
``huggingface-cli`` have them (pyproject.toml's ``[project.scripts]``).

    hf-headattn --help                    # the commands, one line each
    hf-headattn train --help              # a command's flags
    hf-headattn train --method dhicm --output_dir outputs/dhicm ...
    python -m hf_headattn train ...       # the same (torchrun -m hf_headattn train ...)

Each command is the ``main(argv, prog)`` of one module of :mod:`hf_headattn.experiment` (:data:`COMMANDS`), the code
that ``python recipes/<script>`` runs from a clone; a command's module is imported only when it runs, so ``--help``
and a mistyped command load no model code. ``python -m`` of any other module of the package is a one-line usage error
naming the command to run (:func:`refuse_python_m`, which ``hf_headattn/__init__.py`` calls).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
import textwrap
from dataclasses import dataclass

from .version import __version__

PROG = "hf-headattn"


@dataclass(frozen=True)
class Command:
    """One subcommand: the module whose ``main(argv, prog)`` runs it, its script in ``recipes/`` (a clone's way to run
    it) and the line ``hf-headattn --help`` gives it."""

    module: str
    script: str
    summary: str


#: The subcommands, in the order ``--help`` lists them.
COMMANDS = {
    "train": Command("hf_headattn.experiment.translation_recipe", "train_translation.py",
                     "train and score a translation model with any of the methods"),
    "finetune": Command("hf_headattn.experiment.finetune_mbart", "finetune_mbart.py",
                        "fine-tune an mBART checkpoint with EaDRA and score it"),
    "translate": Command("hf_headattn.experiment.translate_lines", "translate.py",
                         "translate raw text with a trained model, one line in, one line out"),
    "prune": Command("hf_headattn.experiment.prune_heads", "prune_heads.py",
                     "prune a trained model's heads iteratively, criterion by criterion"),
    "average": Command("hf_headattn.experiment.average_checkpoints", "average_checkpoints.py",
                       "average a run's last N checkpoints into one model"),
    "parse": Command("hf_headattn.experiment.parse_sources", "parse_sources.py",
                     "parse the sources once into CoNLL-U files for SEA/RHE (spaCy)"),
    "demo": Command("hf_headattn.experiment.demo", "demo.py",
                    "baseline, DHICM and EaDRA on Multi30k En-De on the CPU (make demo)"),
}
#: Library modules behind a command: ``python -m`` of one names that command.
BEHIND = {"hf_headattn.experiment.translate": "translate", "hf_headattn.experiment.averaging": "average",
          "hf_headattn.analysis.head_pruning": "prune", "hf_headattn.experiment.recipe": "train"}

DESCRIPTION = ("Attention-head methods for mBART and Marian models in HF Transformers: DHICM, SEA+RHE and EaDRA, and\n"
               "the papers' comparison systems fixed attention, Rel_Pos and Localness (hf-headattn train\n"
               "--list_methods and --list_presets name what --method and --preset take).")
EPILOG = textwrap.fill(
    f"{PROG} <command> --help shows a command's flags. python -m hf_headattn <command> runs a command too (torchrun -m "
    "hf_headattn train ...), and so does python recipes/<script> from a clone: "
    f"{', '.join(command.script for command in COMMANDS.values())}.", width=100)


def make_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The parser of the command line before the command: its ``--help`` (the commands, one line each, whatever the
    terminal's width), ``--version`` and usage errors; what follows the command is the command's own to parse."""
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items())
    parser = argparse.ArgumentParser(prog=prog, usage="%(prog)s [-h] [--version] <command> ...",
                                     description=f"{DESCRIPTION}\n\ncommands:\n{listing}", epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run ``argv`` (default ``sys.argv[1:]``): ``<command> [its flags]``, ``--help`` or ``--version``. Returns the
    exit status (0) for the console script; ``--help``, ``--version`` and a usage error exit (``SystemExit``: 0, 0,
    2), as a command's own do."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        try:
            command = importlib.import_module(COMMANDS[argv[0]].module)
            command.main(argv[1:], prog=f"{prog} {argv[0]}")
        except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT (128 + 2), no traceback
            sys.stderr.write(f"\n{prog} {argv[0]}: interrupted (Ctrl-C)\n")
            raise SystemExit(130) from None
        return 0
    parser = make_parser(prog)
    if not argv:
        parser.print_help(sys.stderr)
        parser.exit(2, f"{prog}: error: expected a command\n")
    if argv[0].startswith("-"):
        parser.parse_args(argv[:1])  # --help, --version (exit 0); another flag is a usage error
    close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
    parser.error(f"unknown command {argv[0]!r}{f' (did you mean {close[0]!r}?)' if close else ''}; expected one of "
                 f"{', '.join(COMMANDS)}")


def module_run_by_python(orig_argv: list[str]) -> str | None:
    """The module that ``python ... -m <module>`` runs, from the interpreter's command line (``sys.orig_argv``); None
    for a script, ``-c`` or the interactive interpreter."""
    args = iter(orig_argv[1:])
    for arg in args:
        if arg == "--check-hash-based-pycs":
            next(args, None)
        elif arg.startswith("--"):
            continue
        elif not arg.startswith("-") or arg == "-":
            return None  # a script (or standard input)
        else:
            for index, flag in enumerate(arg[1:], start=2):  # short flags, joined or not: -u -m x, -um x, -mx
                if flag in "mcWX":
                    value = arg[index:] or next(args, None)
                    if flag == "m":
                        return value
                    if flag == "c":
                        return None
                    break
    return None


def refuse_python_m(orig_argv: list[str] | None = None) -> None:
    """``python -m hf_headattn.<module>`` for a module that is no command (``python -m hf_headattn`` is one): a
    one-line usage error naming the command to run instead, exit 2. Called while ``python -m`` imports the package,
    before the module runs (where ``sys.argv[0]`` is ``"-m"``); nothing for any other command line."""
    module = module_run_by_python(sys.orig_argv if orig_argv is None else orig_argv)
    if module is None or module.split(".")[0] != "hf_headattn" or module in ("hf_headattn", "hf_headattn.__main__"):
        return
    name = next((name for name, command in COMMANDS.items() if command.module == module), BEHIND.get(module))
    if name is None:
        hint = (f"run {PROG} <command> ... (or python -m hf_headattn <command> ...), <command> one of "
                f"{', '.join(COMMANDS)} ({PROG} --help)")
    else:
        hint = f"run {PROG} {name} ... (or python -m hf_headattn {name} ...; {PROG} {name} --help for its flags)"
    sys.stderr.write(f"python -m {module}: not a command; {hint}\n")
    raise SystemExit(2)
