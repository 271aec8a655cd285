"""`--method_modules` in the recipes: methods kept outside the package (a user's `my_pkg/my_method.py`), imported
by name, or from a `.py` file, before a recipe parses its other flags, so that their `--method` names, presets,
head-importance criteria and kit flags (`MethodKit.recipe_arguments`) are known, and a checkpoint saved with them
loads.

    hf-headattn train --method_modules my_pkg.my_method --method my_method --my_flag 3 ...
    hf-headattn train --method_modules plugins/my_method.py --method my_method ...
    hf-headattn translate --method_modules my_pkg.my_method --model_name_or_path outputs/my_method ...

A file is imported as the module its name gives (`my_method`), which is what its checkpoints record: they load again
with the file's path, or with that name where its folder is on PYTHONPATH.

The modules are imported by [`hf_headattn.registry.import_method_modules`][hf_headattn.registry.import_method_modules]
(which says what a module must do, and why one that brings no method is refused); a bad one is a usage error (exit 2)
naming it. Only the command line chooses them: no environment variable or entry point adds methods behind the user's
back, and a checkpoint's config.json only names the module it needs (docs/design.md, "Adding a method").
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import field

from ..registry import import_method_modules

FLAG = "--method_modules"
HELP = ("Modules that register methods kept outside the package (e.g. my_pkg.my_method, or a file: my_method.py), "
        "imported before the other flags are read, so that their --method names and flags work and their checkpoints "
        "load")


def method_modules_field():
    """The `method_modules` field of a recipe's `HfArgumentParser` dataclass (a list, `nargs="+"`)."""
    return field(default_factory=list, metadata={"help": HELP})


def add_method_modules_argument(parser: argparse.ArgumentParser) -> None:
    """`--method_modules` on an `argparse` recipe's parser."""
    parser.add_argument(FLAG, nargs="+", default=[], metavar="MODULE_OR_FILE", help=HELP)


def method_modules_in(argv: list[str] | None = None) -> list[str]:
    """The modules that `argv` (default `sys.argv[1:]`) gives `--method_modules` (or `--method-modules`), read
    before the recipe's parser exists (the flags it knows depend on them); spelt out in full, as abbreviations would
    match other flags (`--method`). A malformed use is left to the recipe's parser to report."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    pre.add_argument(FLAG, FLAG.replace("_", "-"), nargs="+", default=[], dest="method_modules")
    try:
        known, _ = pre.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    except argparse.ArgumentError:
        return []
    return known.method_modules


def import_or_exit(parser: argparse.ArgumentParser, names: list[str]) -> dict[str, list[str]]:
    """[`import_method_modules`][hf_headattn.registry.import_method_modules], a failure a usage error of `parser` (exit
    2)."""
    try:
        return import_method_modules(names)
    except ValueError as error:
        parser.error(f"{FLAG}: {error}")
