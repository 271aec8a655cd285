"""Where the recipes write: an output folder that holds the run's own inputs or earlier results is refused by name,
and a folder is written whole or not at all.

Each recipe that writes a folder checks it with `check_output_dir` before it reads anything. Refused always
(its overwrite flag included): a file; a folder that *is* one of the run's inputs (the model it starts from, a
checkpoint it averages, its data); a folder whose replaced part holds an input (the overwrite would delete it).
Refused unless the overwrite flag is given: a folder holding earlier results, i.e. the entries the recipe writes
(`results`, a regular expression of entry names; None: any entry, for a recipe that replaces the whole folder).
The Trainer recipes follow HF `run_translation.py`'s convention: an earlier run's entries
(`TRAINER_RESULTS`: `checkpoint-<step>` folders, a finished model, its tokenizer and results) are refused
unless `--overwrite_output_dir` (they are removed before training, so the runs do not mix) or
`--resume_from_checkpoint` (which continues them). A recipe that writes one file checks it with
`check_output_file` (never one of its inputs).

`replacing_dir` writes a folder whole: into a hidden sibling `.<name>.tmp-<pid>`, renamed to the output
folder once complete (an earlier one is removed only then); on failure the sibling is removed and the output
folder is as before. `write_json_atomic` writes a JSON file whole or not at all (a temporary file renamed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

CHECKPOINTS = re.compile(r"checkpoint-\d+")
"""The Trainer's checkpoints: its rotation, `--resume_from_checkpoint true` and `--load_best_model_at_end` read
every one of them, so a new run in the same `output_dir` would mix with them."""
TRAINER_RESULTS = re.compile(
    r"checkpoint-\d+|runs|tokenizer|README\.md|predictions_.+\.txt|(all_|train_|eval_)?results\.json"
    r"|(generation_)?config\.json|model(-\d+-of-\d+)?\.safetensors(\.index\.json)?|pytorch_model.*\.bin"
    r"|training_args\.bin|(tokenizer|tokenizer_config|special_tokens_map|added_tokens|vocab)\.json"
    r"|(source|target)\.spm|sentencepiece\.bpe\.model|spiece\.model|encoder_entropy_.+|\w+\.py")
"""What a Trainer command's run (`hf-headattn train`, `hf-headattn finetune`) writes into `--output_dir`: its
checkpoints, the final model (weights, configs, the model's code files, training arguments, model card), the
tokenizer's files, `tokenizer/` (the scratch tokenizer), `runs/` (TensorBoard), `results.json`,
`predictions_<split>.txt` and the entropy reports. A finished run saved without checkpoints (`--save_strategy
no`) is an earlier run as much as one with them. Other entries (a log the shell or a launcher writes there, a
launcher's own record) are not the recipe's."""
DATA_FLAGS = ("multi30k_dir", "train_file", "validation_file", "test_file")
"""The data flags the recipes read
([`ParallelDataArguments`][hf_headattn.experiment.recipe_parts.ParallelDataArguments]); the methods' input flags:
`input_flags`."""


@dataclass
class OutputArguments:
    """The Trainer recipes' `--overwrite_output_dir` (transformers 5 dropped it from `TrainingArguments`)."""

    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "Start afresh in an --output_dir that holds an earlier run (its checkpoint-<step> folders, or its "
                "finished model, tokenizer and results: they are removed before training); without it (or "
                "--resume_from_checkpoint) such a folder is refused"})


def flag_inputs(args, names) -> dict[str, object]:
    """`{"--<name>": value}` of the attributes `names` of `args` (an argparse namespace or dataclass), for
    `check_output_dir`'s `inputs`."""
    return {f"--{name}": getattr(args, name, None) for name in names}


def _existing(value) -> list[Path]:
    """`value` (a path, several, or None) as the paths among them that exist (a Hub name does not)."""
    values = [value] if isinstance(value, (str, os.PathLike)) or value is None else list(value)
    return [Path(v) for v in values if v is not None and str(v) and Path(v).exists()]


def earlier_results(output_dir, results: re.Pattern | None = None) -> list[Path]:
    """The entries of `output_dir` whose names `results` matches (None: every entry), sorted; [] for a folder
    that is missing or holds none."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    return sorted(entry for entry in folder.iterdir() if results is None or results.fullmatch(entry.name))


def _listed(entries: list[Path]) -> str:
    names = [entry.name for entry in entries]
    return repr(names) if len(names) <= 6 else f"{names[:6]!r} and {len(names) - 6} more"


def check_output_dir(output_dir, inputs: Mapping[str, object] = {}, *,
                     results: re.Pattern | Iterable[str] | None = None, overwrite: bool = False,
                     overwrite_flag: str = "--overwrite", option: str = "--output_dir", hint: str = "") -> list[Path]:
    """A `ValueError` naming `output_dir` and what was expected, if a run must not write there (see the module
    docstring); else the earlier results that `overwrite` lets it replace (`[]`: none).

    `inputs`: `{flag: path, several paths or None}` the run reads (paths that do not exist are skipped: Hub
    names). `results`: the names of what the recipe writes, a regular expression or the names themselves (None: it
    replaces the whole folder). `hint` ends the refusal of earlier results (another way out)."""
    if results is not None and not isinstance(results, re.Pattern):
        results = re.compile("|".join(re.escape(name) for name in results))
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{option} {out} is a file; expected a folder (made when missing)")
    check_writable(out, option)
    found = earlier_results(out, results)
    replaced = [out.resolve()] if results is None else [entry.resolve() for entry in found]
    for flag, value in inputs.items():
        for path in _existing(value):
            if path.resolve() == out.resolve():
                raise ValueError(f"{option} {out} is {flag} {path}, an input of this run; expected another folder "
                                 "(the run would write over what it reads)")
            holder = next((entry for entry in replaced if entry in (path.resolve(), *path.resolve().parents)), None)
            if holder is not None:
                what = "" if holder == out.resolve() else f" in {holder.name}, which {overwrite_flag} replaces"
                raise ValueError(f"{option} {out} holds {flag} {path}{what}, an input of this run that writing "
                                 "there would delete; expected a folder that does not hold the run's inputs")
    if found and not overwrite:
        expected = "a new or empty folder" if results is None else "a folder without them"
        raise ValueError(f"{option} {out} holds {_listed(found)} of an earlier run; expected {expected}, or "
                         f"{overwrite_flag} to replace {'it' if results is None else 'them'}{hint}")
    return found


def check_writable(folder, option: str = "--output_dir") -> None:
    """A `ValueError` naming `folder` if a run cannot make it or write into it: it (or the nearest part of its path
    that exists) is a file, or a folder this process may not write into (a read-only file system, no permission)."""
    folder = Path(os.path.abspath(folder))
    existing = next(path for path in (folder, *folder.parents) if path.exists())
    if not existing.is_dir():
        raise ValueError(f"{option} {folder} lies under {existing}, which is a file; expected a folder that exists "
                         "or can be made")
    if not os.access(existing, os.W_OK | os.X_OK):
        why = "read-only file system" if _read_only(existing) else "no permission to write"
        raise ValueError(f"{option} {folder}: {existing} is not writable ({why}); expected a folder this run can "
                         "write into")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def check_trainer_output_dir(output_dir, inputs: Mapping[str, object], overwrite_output_dir: bool,
                             resume=None) -> list[Path]:
    """`check_output_dir` for a Trainer recipe (HF `run_translation.py`'s convention): an earlier run's
    entries (`TRAINER_RESULTS`: its checkpoints, or the finished model, tokenizer and results) are refused
    unless `overwrite_output_dir` or `resume` (the resolved `--resume_from_checkpoint`; None: not resuming).
    Returns the entries to remove before training: all of the earlier run's when starting afresh over them (its
    tokenizer included, so that none is reused), none when resuming."""
    checkpoints = earlier_results(output_dir, CHECKPOINTS)
    found = check_output_dir(output_dir, inputs, results=TRAINER_RESULTS,
                             overwrite=overwrite_output_dir or resume is not None,
                             overwrite_flag="--overwrite_output_dir",
                             hint=" (or --resume_from_checkpoint true to continue that run)" if checkpoints else "")
    return [] if resume is not None else found


def check_output_file(output, inputs: Mapping[str, object], option: str = "--output") -> None:
    """A `ValueError` naming `output` (a file to write, `-`: standard output) if it is one of `inputs`
    (`{flag: path(s) or None}`: files, or folders it must not lie in), a folder, or in a folder that does not
    exist; an existing other file is replaced, as a shell's `>` would."""
    if output in (None, "-"):
        return
    path = Path(output)
    if path.is_dir():
        raise ValueError(f"{option} {output} is a folder; expected a file name")
    if not path.parent.is_dir():
        raise ValueError(f"{option} {output}: the folder {path.parent} does not exist; expected a file in an "
                         "existing folder")
    for flag, value in inputs.items():
        for source in _existing(value):
            if source.resolve() == path.resolve() or source.resolve() in path.resolve().parents:
                raise ValueError(f"{option} {output} is {'in ' if source.is_dir() else ''}{flag} {source}, an input "
                                 "of this run; expected another file (the run would write over what it reads)")


def remove_entries(entries: Iterable[Path], say: Callable[[str], None] = print) -> None:
    """Delete `entries` (what `check_output_dir` found and the overwrite flag replaces), saying so first."""
    entries = list(entries)
    if entries:
        say(f"replacing the earlier run's {_listed(entries)} in {entries[0].parent}")
    for entry in entries:
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


@contextmanager
def removed_on_failure(path):
    """A block after which `path` (a folder the block may make, e.g. a run's scratch tokenizer) is removed if the
    block fails (a usage error's `SystemExit` included) and `path` did not exist before it: a run that fails
    before it starts leaves nothing that makes its rerun an "earlier run"."""
    path = Path(path)
    existed = path.exists() or path.is_symlink()
    try:
        yield path
    except BaseException:
        if not existed and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        raise


@contextmanager
def replacing_dir(output_dir):
    """Yield a new hidden sibling folder `.<name>.tmp-<pid>` of `output_dir` to write into; when the block
    completes it becomes `output_dir` (an earlier `output_dir` is removed then), when it fails it is removed and
    `output_dir` is as it was."""
    out = Path(os.path.abspath(output_dir))
    out.parent.mkdir(parents=True, exist_ok=True)
    temp, old = (out.parent / f".{out.name}.{kind}-{os.getpid()}" for kind in ("tmp", "old"))
    for leftover in (temp, old):  # of a killed run that had this process id
        if leftover.exists():
            shutil.rmtree(leftover)
    temp.mkdir()
    try:
        yield temp
        if out.exists() or out.is_symlink():
            out.rename(old)
        try:
            temp.rename(out)
        except BaseException:
            if old.exists() or old.is_symlink():
                old.rename(out)
            raise
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    if old.is_symlink():
        old.unlink()
    elif old.exists():
        shutil.rmtree(old)


def write_json_atomic(path: str | Path, payload) -> Path:
    """Write JSON through a temporary file and a rename, so that a killed process never leaves half a file (and a
    failed write no temporary file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
