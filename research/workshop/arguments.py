"""The command line of a study whose runs train to convergence (:mod:`~workshop.launch`): the
folders, runs at a time and the stop rules, with defaults per ``--device``; and the flags after ``--``, which a study
passes on to every training run.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

from hf_headattn.experiment.arguments import positive_float, positive_int

#: How the help names a device.
DEVICE_NAMES = {"cpu": "the CPU", "cuda": "a GPU"}
#: The arguments whose default depends on the device: folders, then values.
DEVICE_FOLDERS = ("output_dir", "results_dir")
DEVICE_VALUES = ("parallel", "time_cap_minutes", "max_epochs")


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` up to ``--``, and the flags after it (for every training run)."""
    argv = list(argv)
    return (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])


def _per_device(devices: Mapping[str, dict], name: str) -> str:
    return ", ".join(f"{defaults[name]:g} on {DEVICE_NAMES.get(device, device)}"
                     for device, defaults in devices.items())


def add_run_arguments(parser: argparse.ArgumentParser, devices: Mapping[str, dict]) -> None:
    """``--device`` (a key of ``devices``; default the first), the folders (runs, records, Multi30k, tokenizer,
    parses), runs at a time and CPU threads each, and the stop rules; ``devices`` holds each device's defaults of
    :data:`DEVICE_FOLDERS` and :data:`DEVICE_VALUES` (see :func:`apply_device_defaults`)."""
    parser.add_argument("--device", choices=sorted(devices), default=next(iter(devices)))
    parser.add_argument("--output_dir", type=Path, help="run folders (checkpoints); default per device")
    parser.add_argument("--results_dir", type=Path, help="the records and tables; default per device")
    parser.add_argument("--multi30k_dir", type=Path, help="default: found or downloaded (docs/usage.md, Multi30k)")
    parser.add_argument("--tokenizer_dir", type=Path, help="default <output_dir>/tokenizer (made when missing)")
    parser.add_argument("--parses_dir", type=Path, help="default <output_dir>/parses (made when missing, spaCy)")
    parser.add_argument("--parallel", type=positive_int,
                        help=f"runs at a time (default: {_per_device(devices, 'parallel')})")
    parser.add_argument("--threads", type=positive_int, default=1, help="CPU threads per run")
    parser.add_argument("--patience", type=positive_int, default=5,
                        help="evaluations (epochs) without a better validation BLEU")
    parser.add_argument("--max_epochs", type=positive_int,
                        help=f"the most epochs a run trains (default: {_per_device(devices, 'max_epochs')})")
    parser.add_argument("--time_cap_minutes", type=positive_float, help="training minutes per run, across sessions "
                        f"(default: {_per_device(devices, 'time_cap_minutes')})")


def apply_device_defaults(args: argparse.Namespace, defaults: Mapping) -> None:
    """Fill in the arguments left out with the device's ``defaults``; the tokenizer and the parses default to
    ``<output_dir>/tokenizer`` and ``<output_dir>/parses``."""
    for name in DEVICE_FOLDERS:
        setattr(args, name, getattr(args, name) or Path(defaults[name]))
    args.tokenizer_dir = args.tokenizer_dir or args.output_dir / "tokenizer"
    args.parses_dir = args.parses_dir or args.output_dir / "parses"
    for name in DEVICE_VALUES:
        if getattr(args, name) is None:  # not "or": an explicit 0 is refused above, never the default
            setattr(args, name, defaults[name])
