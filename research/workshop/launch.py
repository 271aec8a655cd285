"""Launching a study's runs trained to convergence, several at a time, each recorded the moment it finishes.

A run trains until its greedy validation BLEU has not improved for ``patience`` evaluations, for at most
``max_epochs`` epochs and ``time_cap_minutes`` minutes of training in all (:class:`StopRules`); its best checkpoint
by validation BLEU is scored on validation. It trains in ``<output_dir>/<stage>/<row>/seed<k>``, which keeps
``study_run.json`` (its identity and sessions) and a log per session (``train.<n>.log``), and resumes across
sessions (:mod:`~workshop.sessions`). Finished, it is recorded in
``<results_dir>/<stage>-<row>-seed<k>.json``: identity, git commit, epochs, stop reason (``early_stopping``,
``time_cap`` or ``max_epochs``), validation curve, the training logs per epoch, best validation BLEU/chrF and
predictions, training time; a recorded run is skipped. Stop a launch with Ctrl-C (or kill its process group): killing
its process alone leaves the training runs going, and a later launch skips a run whose training still runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hf_headattn.experiment.outputs import write_json_atomic

from . import git_commit, git_dirty
from .curves import best_index, stop_reason, training_curve, validation_curve
from .jobs import run_jobs
from .runs import now, record_path, run_dir
from .sessions import (
    StopRules,
    check_identity,
    checkpoint_progress,
    resumable_checkpoint,
    session_flags,
    training_processes,
)

VALID = "validation"


def convergence_flags(patience: int, max_epochs: int, num_beams: int) -> list[str]:
    """The ``hf-headattn train`` flags of a run trained to convergence: evaluate (greedy validation BLEU) and save
    at each epoch, keeping the best checkpoint by validation BLEU and the newest; stop after ``patience`` evaluations
    without a better one, or ``max_epochs``; at the end, score the best checkpoint on validation with ``num_beams``
    beams. Callback states (the early-stopping counter) are restored on resume."""
    return ["--eval_strategy", "epoch", "--save_strategy", "epoch", "--save_total_limit", "2",
            "--load_best_model_at_end", "true", "--metric_for_best_model", "bleu", "--greater_is_better", "true",
            "--early_stopping_patience", str(patience), "--num_train_epochs", str(max_epochs),
            "--restore_callback_states_from_checkpoint", "true",
            "--generation_num_beams", "1", "--num_beams", str(num_beams), "--test_splits", VALID]


@dataclass(frozen=True)
class ConvergenceRuns:
    """A study's runs and how to train them: ``command(stage, row, seed)`` (the ``hf-headattn train`` command,
    before the per-session flags; it scores ``validation`` with ``num_beams`` beams), ``identity(row, seed)`` (what
    makes a run the run it is: another one's folder or record is refused), ``method_of(row)``, ``prepare(rows)``
    (what the rows' runs need, made before they start), ``repo`` (the checkout whose commit a record names);
    ``parallel`` runs at a time with ``threads`` CPU threads each."""

    output_dir: Path
    results_dir: Path
    rules: StopRules
    command: Callable[[str, str, int], list[str]]
    identity: Callable[[str, int], dict]
    method_of: Callable[[str], str]
    prepare: Callable[[Sequence[str]], None]
    repo: Path
    num_beams: int
    parallel: int = 1
    threads: int = 1

    def folder(self, stage: str, row: str, seed: int) -> Path:
        """The run's folder: ``<output_dir>/<stage>/<row>/seed<seed>``."""
        return run_dir(Path(self.output_dir) / stage, row, seed)


def make_record(runs: ConvergenceRuns, stage: str, row: str, seed: int, sessions: list[dict]) -> dict:
    """The run's record, from its ``results.json`` and ``predictions_validation.txt``."""
    folder = runs.folder(stage, row, seed)
    results = json.loads((folder / "results.json").read_text())
    curve = validation_curve(results["log_history"])
    best = best_index(curve)
    finish_only = sessions[-1].get("finish_only") if sessions else None
    reason = stop_reason(results, curve, runs.rules.patience, runs.rules.max_epochs, finish_only)
    valid, train_time = results["scores"][VALID], results.get("total_train_time_s")
    return {
        **runs.identity(row, seed), "stage": stage, "method": runs.method_of(row),
        "git_commit": git_commit(runs.repo), "git_dirty": git_dirty(runs.repo), "device": results.get("device"),
        "model": results.get("model"), "num_parameters": results.get("num_parameters"),
        "time_cap_minutes": runs.rules.time_cap_minutes,
        "epochs": results.get("epochs"), "global_step": results.get("global_step"), "stop_reason": reason,
        "stopped_by_time_cap": reason == "time_cap",
        "best_epoch": None if best is None else curve[best]["epoch"],
        "best_step": None if best is None else curve[best]["step"],
        "best_greedy_validation_bleu": None if best is None else curve[best]["bleu"],
        "validation_curve": curve,
        "training_curve": training_curve(results["log_history"]),
        "validation": {"bleu": valid["bleu"], "chrf": valid["chrf"], "num_beams": runs.num_beams,
                       "bleu_signature": valid.get("bleu_signature"), "chrf_signature": valid.get("chrf_signature"),
                       "of": "the best checkpoint by greedy validation BLEU"},
        "train_time_s": train_time if train_time is not None else results.get("train_time_s"),
        "train_time_s_is_total": train_time is not None,
        "sessions": sessions, "run_dir": str(folder), "finished_at": now(),
        "command": runs.command(stage, row, seed),
        "validation_predictions": (folder / f"predictions_{VALID}.txt").read_text(encoding="utf-8").splitlines(),
    }


def _usable_results(folder: Path) -> bool:
    """Whether the run wrote a complete ``results.json`` (one cut off while being written is put aside)."""
    results = folder / "results.json"
    if results.is_file():
        try:
            json.loads(results.read_text())
        except ValueError:  # cut off while being written: score again
            results.replace(folder / "results.json.broken")
    return results.is_file()


def _train_session(runs: ConvergenceRuns, stage: str, row: str, seed: int, sessions: list[dict]) -> bool:
    """Train the run for one session (from its last checkpoint); False when its process failed."""
    name, folder = f"{stage} {row} seed {seed}", runs.folder(stage, row, seed)
    spec, identity = folder / "study_run.json", runs.identity(row, seed)
    flags, session = session_flags(folder, runs.rules)
    sessions.append(session)
    write_json_atomic(spec, {"identity": identity, "sessions": sessions})
    resumed = f", resuming {session['resumed_from']}" if session["resumed_from"] else ""
    print(f"{name}: starting{resumed}{', scoring only' if session['finish_only'] else ''}", flush=True)
    log = folder / f"train.{len(sessions)}.log"  # one log per session; run_jobs overwrites its log
    if run_jobs([(name, [*runs.command(stage, row, seed), *flags], log)], 1, runs.threads):
        return False
    sessions[-1]["ended_at"] = now()
    write_json_atomic(spec, {"identity": identity, "sessions": sessions})
    return True


def run_one(runs: ConvergenceRuns, stage: str, row: str, seed: int) -> str | None:
    """Train (or resume) one run and write its record; returns None when it is done, else why not."""
    name, folder = f"{stage} {row} seed {seed}", runs.folder(stage, row, seed)
    out = record_path(runs.results_dir, stage, row, seed)
    if out.is_file():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "study_run.json"
    if spec.is_file():
        check_identity(spec, runs.identity(row, seed))
    running = training_processes(folder)
    if running:
        print(f"{name}: skipped, training processes {running} still write into {folder} (a study stopped without "
              "its runs?); stop them or let them end, then run this again", flush=True)
        return "busy"
    sessions = json.loads(spec.read_text()).get("sessions", []) if spec.is_file() else []
    if not _usable_results(folder) and not _train_session(runs, stage, row, seed, sessions):
        return "failed"
    write_json_atomic(out, make_record(runs, stage, row, seed, sessions))
    print(f"{name}: recorded in {out}", flush=True)
    return None


def launch(runs: ConvergenceRuns, stage: str, rows: Sequence[str], seeds: Sequence[int]) -> None:
    """Run the unfinished runs of ``rows`` x ``seeds``, ``parallel`` at a time; each is recorded when it ends."""
    todo = [(row, seed) for seed in seeds for row in rows
            if not record_path(runs.results_dir, stage, row, seed).is_file()]
    for row, seed in [(row, seed) for seed in seeds for row in rows if (row, seed) not in todo]:
        check_identity(record_path(runs.results_dir, stage, row, seed), runs.identity(row, seed))
    print(f"{stage}: {len(rows) * len(seeds) - len(todo)} run(s) done, {len(todo)} to run, {runs.parallel} at a "
          "time", flush=True)
    if not todo:
        return
    runs.prepare(rows)
    pool = ThreadPoolExecutor(max_workers=runs.parallel)
    try:
        futures = [(job, pool.submit(run_one, runs, stage, *job)) for job in todo]
        outcomes = [(job, future.result()) for job, future in futures]
    except BaseException:  # Ctrl-C: start no further run (the running ones got the signal too)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    failed = [f"{row} seed {seed} ({why})" for (row, seed), why in outcomes if why]
    if failed:
        raise SystemExit(f"{stage}: {len(failed)} run(s) not finished: {failed}; see train.*.log in their folders "
                         f"under {Path(runs.output_dir) / stage}. The same command resumes them")


def run_status(runs: ConvergenceRuns, stage: str, row: str, seed: int) -> str:
    """One line on a run: recorded (epochs, stop reason, validation BLEU), under way (from its last checkpoint), or
    not started."""
    name = f"{stage} {row} seed {seed}"
    out = record_path(runs.results_dir, stage, row, seed)
    if out.is_file():
        run = json.loads(out.read_text())
        return (f"{name}: done, {run['epochs']:.0f} epochs ({run['stop_reason']}), valid BLEU "
                f"{run['validation']['bleu']:.2f}")
    checkpoint = resumable_checkpoint(runs.folder(stage, row, seed))
    if checkpoint is None:
        return f"{name}: not started"
    state, train_time = checkpoint_progress(checkpoint)
    return (f"{name}: {state['epoch']:.0f} epochs so far, best greedy valid BLEU {state.get('best_metric') or 0:.2f}, "
            f"{train_time / 3600:.1f} h; resumes from {checkpoint.name}")
