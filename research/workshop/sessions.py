"""A run trained to a stop condition over several sessions (a study stopped and restarted at will): each session
resumes the run from its newest complete checkpoint (the early-stopping counter and best score included) with the
training time it has left, and a run whose checkpoint already met a stop condition (its process died while scoring)
only scores. A run folder or record made with another identity is refused, not resumed, and a run whose training
process still runs (a study killed alone leaves its runs going) is not joined.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hf_headattn.hf_compat import TRAINER_STATE_FILE

from .runs import now


@dataclass(frozen=True)
class StopRules:
    """When a run stops: ``patience`` evaluations without a better validation BLEU (early stopping), ``max_epochs``
    epochs, or ``time_cap_minutes`` minutes of training in all its sessions together."""

    patience: int
    max_epochs: int
    time_cap_minutes: float


def resumable_checkpoint(folder: str | Path) -> Path | None:
    """The newest complete ``checkpoint-N`` of a run (its trainer state and training time written, the last files a
    checkpoint gets), or None."""
    found = []
    for path in Path(folder).glob("checkpoint-*"):
        step = path.name.removeprefix("checkpoint-")
        if step.isdigit() and (path / TRAINER_STATE_FILE).is_file() and (path / "train_time.json").is_file():
            found.append((int(step), path))
    return max(found)[1] if found else None


def checkpoint_progress(checkpoint: Path) -> tuple[dict, float]:
    """A checkpoint's trainer state and the run's training time up to it (seconds, all sessions)."""
    state = json.loads((checkpoint / TRAINER_STATE_FILE).read_text())
    return state, json.loads((checkpoint / "train_time.json").read_text())["train_time_s"]


def _callback_attribute(state: dict, callback: str, name: str):
    stored = state.get("stateful_callbacks", {}).get(callback)
    stored = stored[-1] if isinstance(stored, list) and stored else stored
    return (stored or {}).get("attributes", {}).get(name)


def _condition_met(state: dict, train_time_s: float, rules: StopRules) -> str | None:
    """The stop condition a checkpoint already met, or None."""
    if (_callback_attribute(state, "EarlyStoppingCallback", "early_stopping_patience_counter") or 0) >= rules.patience:
        return "early_stopping"
    if (state.get("epoch") or 0) >= rules.max_epochs - 1e-6:
        return "max_epochs"
    return "time_cap" if train_time_s >= 60 * rules.time_cap_minutes else None


def session_flags(folder: str | Path, rules: StopRules) -> tuple[list[str], dict]:
    """The per-session flags of a run (``--max_train_minutes``: the cap less the training time so far; resuming: the
    last checkpoint; ``--overwrite_output_dir`` where the checkpoints are all incomplete) and the session's record.
    A run whose last checkpoint already met a stop condition only scores: ``--max_steps`` its step, so the Trainer
    trains no further."""
    checkpoint = resumable_checkpoint(folder)
    session = {"started_at": now(), "resumed_from": None, "previous_train_time_s": 0.0, "finish_only": None}
    flags = []
    if checkpoint is not None:
        state, previous = checkpoint_progress(checkpoint)
        session.update(resumed_from=str(checkpoint), resumed_epoch=state.get("epoch"),
                       resumed_step=state.get("global_step"), previous_train_time_s=previous)
        session["finish_only"] = _condition_met(state, previous, rules)
        flags += ["--resume_from_checkpoint", str(checkpoint)]
        if session["finish_only"]:
            flags += ["--max_steps", str(state["global_step"])]
    elif any(Path(folder).glob("checkpoint-*")):  # only incomplete ones: start afresh, without them
        flags.append("--overwrite_output_dir")
    minutes = max(rules.time_cap_minutes - session["previous_train_time_s"] / 60, 0.1)
    session["max_train_minutes"] = round(minutes, 2)
    return ["--max_train_minutes", f"{minutes:.2f}", *flags], session


def check_identity(path: str | Path, expected: dict) -> None:
    """Refuse a run folder's or record's JSON (``path``) whose identity (its ``"identity"``, or the whole record)
    differs from ``expected`` in any of its keys."""
    stored = json.loads(Path(path).read_text())
    stored = stored.get("identity", stored)
    different = sorted(key for key in expected if stored.get(key) != expected[key])
    if different:
        found = {key: stored.get(key) for key in different}
        raise SystemExit(f"{path} belongs to a run with other {different} than this study's: expected "
                         f"{ {key: expected[key] for key in different} }, found {found}. Use another "
                         "--output_dir/--results_dir, or remove it to start that run afresh")


def training_processes(folder: str | Path) -> list[int]:
    """Ids of live ``hf-headattn train`` processes (``python -m hf_headattn train``, or the recipe of
    releases 0.1-0.2, ``train_translation.py``) writing into ``folder`` (read from ``/proc``; none found where
    there is no ``/proc``): a study process killed alone leaves its runs going, and a second one must not join them."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        training = any(arg.endswith("train_translation.py") for arg in argv) or argv[1:4] == ["-m", "hf_headattn",
                                                                                                 "train"]
        if training and "--output_dir" in argv:
            target = argv[argv.index("--output_dir") + 1] if argv.index("--output_dir") + 1 < len(argv) else ""
            if target and Path(target).resolve() == Path(folder).resolve():
                pids.append(int(cmdline.parent.name))
    return pids
