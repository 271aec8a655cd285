"""The recipes' argparse checks: `type=` functions that turn a bad value into a usage error (exit 2) naming it
and what was expected."""

from __future__ import annotations

import argparse
from pathlib import Path

from transformers import HfArgumentParser

from .multi30k import Multi30kError, find_multi30k


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help` with each flag's default (as `HfArgumentParser` shows them) and the description as written (a
    command's module docstring, its example commands line by line)."""


class RecipeArgumentParser(HfArgumentParser):
    """`HfArgumentParser` whose usage error is the one line that says what is wrong (argparse's own prints the
    usage of every flag first: some 40 lines with `Seq2SeqTrainingArguments`), and where `--help` is; its
    `--help` shows a `description` as written (`HelpFormatter`)."""

    def __init__(self, dataclass_types, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(dataclass_types, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n(run {self.prog} --help for the flags)\n")


def _number(text: str, kind: type, expected: str, ok) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _number(text, int, "an integer >= 1", lambda value: value >= 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    return _number(text, int, "an integer >= 0", lambda value: value >= 0)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _number(text, float, "a number > 0", lambda value: 0 < value < float("inf"))


def share(text: str) -> float:
    """A share: a number in [0, 1]."""
    return _number(text, float, "a share in [0, 1]", lambda value: 0 <= value <= 1)


def existing_dir(text: str) -> Path:
    """A folder that exists."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"expected an existing folder, got {text!r}"
                                         + (" (a file)" if Path(text).exists() else " (not found)"))
    return Path(text)


def existing_file(text: str) -> Path:
    """A file that exists."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"expected an existing file, got {text!r}"
                                         + (" (a folder)" if Path(text).exists() else " (not found)"))
    return Path(text)


def multi30k_folder(parser: argparse.ArgumentParser, folder: str | Path | None, languages) -> Path:
    """`multi30k.find_multi30k` for a recipe's `--multi30k_dir` (None: found or downloaded); a folder that
    lacks the files, or no copy at all, is a usage error naming what to do."""
    try:
        return find_multi30k(folder, languages=languages, argument="--multi30k_dir")
    except Multi30kError as error:
        parser.error(str(error))
