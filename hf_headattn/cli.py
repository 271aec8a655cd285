"""The `hf-headattn` command, the package's one entry point: its commands as subcommands of one console script, as
`accelerate` and `huggingface-cli` have them (pyproject.toml's `[project.scripts]`).

    hf-headattn --help                    # the commands, one line each
    hf-headattn train --help              # a command's flags
    hf-headattn train --method dhicm --output_dir outputs/dhicm ...
    python -m hf_headattn train ...       # the same (torchrun -m hf_headattn train ...)

Each command is the `main(argv, prog)` of one module of `hf_headattn.commands` ([`COMMANDS`][hf_headattn.cli.COMMANDS]),
over the library of `hf_headattn.experiment`; a command's module is imported only when it runs, so `--help` and a
mistyped command load no model code. Nothing reads the command line when the package is imported: `python -m` of a
command's module is a one-line usage error naming the command to run
([`refuse_python_m`][hf_headattn.cli.refuse_python_m], from the module's `__main__` guard).
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
    """One subcommand: the module whose `main(argv, prog)` runs it and the line `hf-headattn --help` gives it."""

    module: str
    summary: str


COMMANDS = {
    "train": Command("hf_headattn.commands.train", "train and score a translation model with any of the methods"),
    "finetune": Command("hf_headattn.commands.finetune", "fine-tune an mBART checkpoint with EaDRA and score it"),
    "translate": Command("hf_headattn.commands.translate",
                         "translate raw text with a trained model, one line in, one line out"),
    "prune": Command("hf_headattn.commands.prune", "prune a trained model's heads iteratively, criterion by criterion"),
    "average": Command("hf_headattn.commands.average", "average a run's last N checkpoints into one model"),
    "parse": Command("hf_headattn.commands.parse", "parse the sources once into CoNLL-U files for SEA/RHE (spaCy)"),
    "demo": Command("hf_headattn.commands.demo", "baseline, DHICM and EaDRA on Multi30k En-De on the CPU (make demo)"),
}
"""The subcommands, in the order `--help` lists them: one module each in `hf_headattn/commands/`."""

DESCRIPTION = ("Attention-head methods for mBART and Marian models in HF Transformers: DHICM, SEA+RHE and EaDRA, and\n"
               "the papers' comparison systems fixed attention, Rel_Pos and Localness (hf-headattn train\n"
               "--list_methods and --list_presets name what --method and --preset take).")
EPILOG = textwrap.fill(
    f"{PROG} <command> --help shows a command's flags. python -m hf_headattn <command> runs a command too (torchrun -m "
    "hf_headattn train ...).", width=100)


def make_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The parser of the command line before the command: its `--help` (the commands, one line each, whatever the
    terminal's width), `--version` and usage errors; what follows the command is the command's own to parse."""
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items())
    parser = argparse.ArgumentParser(prog=prog, usage="%(prog)s [-h] [--version] <command> ...",
                                     description=f"{DESCRIPTION}\n\ncommands:\n{listing}", epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run `argv` (default `sys.argv[1:]`): `<command> [its flags]`, `--help` or `--version`. Returns the
    exit status (0) for the console script; `--help`, `--version` and a usage error exit (`SystemExit`: 0, 0,
    2), as a command's own do."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        try:
            command = importlib.import_module(COMMANDS[argv[0]].module)
            command.main(argv[1:], prog=f"{prog} {argv[0]}")
            importlib.import_module("hf_headattn.experiment.launch").end_processes()  # under torchrun
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


def refuse_python_m(module: str) -> None:
    """`python -m <module>` of a command's module (its `if __name__ == "__main__"` guard calls this with its
    `__spec__.name`): a one-line usage error naming the command to run instead, exit 2. The commands run through
    [`main`][hf_headattn.cli.main] only."""
    name = next(name for name, command in COMMANDS.items() if command.module == module)
    sys.stderr.write(f"python -m {module}: not a command; run {PROG} {name} ... (or python -m hf_headattn {name} ...; "
                     f"{PROG} {name} --help for its flags)\n")
    raise SystemExit(2)
