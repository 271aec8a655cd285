#!/usr/bin/env python
"""The methods at convergence (issue #26): every run trained to early stopping on validation BLEU, with a wall-clock
cap; a study that accumulates run by run and can be stopped and resumed at will.

Rows (``ROWS``): the baseline; DHICM (last encoder and decoder layer, lambda 0.1) with the KL joined ``per_batch`` and
``per_token``; EaDRA (encoder and decoder self-attention, Table 6's WMT En-De alphas, Eq. 8 per query pair) with
``alpha_scale`` 0.1, 0.3 and 1.0; DEA+RHE and LPEA+RHE (first encoder layer, k = 6). Three steps, every choice on
validation:

1. ``screen``: every row with seed 1;
2. ``confirm``: per method (DHICM, EaDRA, SEA+RHE) the row with the best validation BLEU of the screen, and the
   baseline, with seeds 2 and 3 (``CONFIRM_SEEDS``); it refuses before the screen is complete, and writes the choice
   to ``choice.json``;
3. ``test``: test_2016_flickr, read once, after the choice and only for the confirmed runs; it refuses before the
   confirmation is complete, and records in ``test.json`` that it ran (a second call reads nothing);

then ``table`` writes the markdown tables (stdout and ``<results_dir>/README.md``) and ``status`` says what is done.

Each run trains until its validation BLEU (greedy decoding, ``eval_bleu``, at the end of each epoch) has not improved
for ``--patience`` evaluations (``EarlyStoppingCallback``, ``metric_for_best_model bleu``), for at most
``--max_epochs`` epochs and ``--time_cap_minutes`` minutes of training in all (across resumed sessions); its stop
reason (``early_stopping``, ``time_cap`` or ``max_epochs``) is recorded. The best checkpoint by validation BLEU is kept
and scored (beam 5). A checkpoint is saved at each evaluation, so a restart resumes every unfinished run from its last
checkpoint (the early-stopping counter and best score included) and skips the finished ones: each writes
``<results_dir>/<stage>-<row>-seed<k>.json`` the moment it finishes (settings, git commit, seed, epochs, stop reason,
validation curve, the training logs per epoch (the loss and the methods' terms and statistics), best validation
BLEU/chrF and predictions, train time). Checkpoints go to ``--output_dir``.

Stop the study with Ctrl-C (or kill its process group, ``kill -- -PGID``): killing the study's process alone leaves
its training runs going, and a restart skips a run whose training process still runs. A session loses at most the
epoch in progress of each run.

    # CPU (2 cores): the tiny shape, 2 runs at a time with 1 thread each. The same line starts and resumes the study
    # (each step skips what is done; confirm, test and table wait for the step before). An epoch is 454 steps:
    # 0.52 s a step alone on an idle machine, 0.8-1.2 s with two runs and other jobs: 4-10 min an epoch with the
    # 20-30 s evaluation. At 15-40 epochs a run (early stopping decides) that is 1.5-6 h a run, about 3 h typically;
    # 16 runs two at a time: about 24 h (15-45 h), eight 3-hour sessions.
    python recipes/converged_study.py screen --parallel 2 && \
    python recipes/converged_study.py confirm --parallel 2 && \
    python recipes/converged_study.py test --parallel 2 && \
    python recipes/converged_study.py table
    python recipes/converged_study.py status          # what is done, what is under way

    # GPU: the small shape, 10 runs sharing the GPU (start CUDA MPS first: nvidia-cuda-mps-control -d). On one H200
    # the 8 rows of the screen, 8 at a time, stopped early after 24-40 epochs, 5-10 min of training each; the
    # confirmation's 8 runs and the test reading took 9 minutes. The checkpoints stay on that machine: confirm and
    # test there (test scores the confirmed runs' checkpoints). Make the tokenizer and the parses first where spaCy
    # is installed (the CPU machine), then carry them over (or pass --tokenizer_dir / --parses_dir):
    python recipes/converged_study.py prepare --device cuda       # -> runs/converged-cuda/{tokenizer,parses}
    python recipes/converged_study.py screen --device cuda --parallel 10 && \
    python recipes/converged_study.py confirm --device cuda --parallel 10 && \
    python recipes/converged_study.py test --device cuda --parallel 10 && \
    python recipes/converged_study.py table --device cuda

Defaults per device: CPU ``--output_dir runs/converged``, ``--results_dir benchmarks/results/converged``, the tiny
shape with ``make demo``'s schedule (``DEMO_SCHEDULE``: batch 64, lr 2e-3, inverse_sqrt after 100 steps), 6k vocabulary,
at most 60 epochs and 600 minutes per run; GPU (``--device cuda``): ``runs/converged-cuda``,
``benchmarks/results/converged-cuda``, the small shape with the reproduction's schedule (``GPU_SCHEDULE``: batch 256,
lr 1e-3, 500 warm-up steps, dropout 0.3, bf16), 8k vocabulary, at most 150 epochs and 180 minutes per run. Both:
patience 5 evaluations (epochs). Flags after ``--`` go to every ``train_translation.py`` run (and become part of the
runs' identity).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from hf_headattn.experiment.data import TEST_SPLIT
from hf_headattn.experiment.evaluation import markdown_table, mean_sd, per_seed, per_seed_p_values
from hf_headattn.experiment.arguments import existing_file, positive_float, positive_int
from hf_headattn.experiment.jobs import run_jobs
from hf_headattn.experiment.presets import uses_syntax as settings_use_syntax
from hf_headattn.experiment.study import (
    DEMO_SCHEDULE, dhicm_settings, eadra_settings, git_commit, git_dirty, prepare_tokenizer, references, sea_settings,
    write_json_atomic,
)

HERE = Path(__file__).resolve().parent
STUDY = "converged"
VALID, TEST = "validation", TEST_SPLIT
SCREEN_SEEDS = (1,)
#: Fresh seeds: the screen's seed 1 chose the rows, so its scores carry the choice's optimism.
CONFIRM_SEEDS = (2, 3)
TEST_BEAMS = 5

#: row -> (method, settings). Every setting written out, so later default changes do not change a row.
ROWS: dict[str, tuple[str, dict]] = {
    "baseline": ("baseline", {}),
    "dhicm_per_batch": ("dhicm", dhicm_settings("per_batch", 0.1)),
    "dhicm_per_token": ("dhicm", dhicm_settings("per_token", 0.1)),
    "eadra_pair_mean_a0.1": ("eadra", eadra_settings("pair_mean", alpha_scale=0.1)),
    "eadra_pair_mean_a0.3": ("eadra", eadra_settings("pair_mean", alpha_scale=0.3)),
    "eadra_pair_mean_a1": ("eadra", eadra_settings("pair_mean", alpha_scale=1.0)),
    "dea_rhe": ("sea", sea_settings("dea")),
    "lpea_rhe": ("sea", sea_settings("lpea")),
}
#: The methods compared, one chosen row each, in the order of ``ROWS``.
METHODS = tuple(dict.fromkeys(method for method, _ in ROWS.values() if method != "baseline"))

#: The GPU schedule: the reproduction's (recipes/reproduce_multi30k.py COMMON_FLAGS) for the small shape.
GPU_SCHEDULE = [
    "--source_lang", "en", "--target_lang", "de", "--model_shape", "small", "--vocab_size", "8000",
    "--dropout", "0.3", "--label_smoothing", "0.1", "--learning_rate", "1e-3", "--lr_scheduler_type", "inverse_sqrt",
    "--warmup_steps", "500", "--adam_beta2", "0.98", "--weight_decay", "0.0001", "--max_grad_norm", "1.0",
    "--per_device_train_batch_size", "256", "--per_device_eval_batch_size", "256", "--logging_steps", "50",
    "--report_to", "none", "--dataloader_num_workers", "0", "--bf16", "true",
]
#: Per device: the schedule (name, flags, vocabulary size) and the defaults of the folders, the time cap per run
#: (minutes), the most epochs and the runs at a time. The CPU's epoch is 454 steps (batches of 64), the GPU's 114.
DEVICES = {
    "cpu": {"schedule": "cpu-tiny-demo", "flags": [*DEMO_SCHEDULE, "--use_cpu", "true"], "vocab_size": 6000,
            "output_dir": "runs/converged", "results_dir": "benchmarks/results/converged", "time_cap_minutes": 600.0,
            "max_epochs": 60, "parallel": 2},
    "cuda": {"schedule": "cuda-small-reproduction", "flags": GPU_SCHEDULE, "vocab_size": 8000,
             "output_dir": "runs/converged-cuda", "results_dir": "benchmarks/results/converged-cuda",
             "time_cap_minutes": 180.0, "max_epochs": 150, "parallel": 10},
}


def convergence_flags(patience: int, max_epochs: int) -> list[str]:
    """Evaluate (greedy validation BLEU) and save at each epoch, keeping the best checkpoint by validation BLEU and the
    newest; stop after ``patience`` evaluations without a better one; at the end, score the best checkpoint on
    validation with beam 5. Callback states (the early-stopping counter) are restored on resume."""
    return ["--eval_strategy", "epoch", "--save_strategy", "epoch", "--save_total_limit", "2",
            "--load_best_model_at_end", "true", "--metric_for_best_model", "bleu", "--greater_is_better", "true",
            "--early_stopping_patience", str(patience), "--num_train_epochs", str(max_epochs),
            "--restore_callback_states_from_checkpoint", "true",
            "--generation_num_beams", "1", "--num_beams", str(TEST_BEAMS), "--test_splits", VALID]


def method_of(row: str) -> str:
    return ROWS[row][0]


def uses_syntax(row: str) -> bool:
    return settings_use_syntax(ROWS[row][1])


def run_dir(output_dir: Path, stage: str, row: str, seed: int) -> Path:
    return Path(output_dir) / stage / row / f"seed{seed}"


def record_path(results_dir: Path, stage: str, row: str, seed: int) -> Path:
    return Path(results_dir) / f"{stage}-{row}-seed{seed}.json"


def test_path(results_dir: Path, row: str, seed: int) -> Path:
    return Path(results_dir) / f"test-{row}-seed{seed}.json"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def identity(args, row: str, seed: int) -> dict:
    """What makes a run the run it is: a run directory or record with another identity is refused, not resumed."""
    name, flags = DEVICES[args.device]["schedule"], DEVICES[args.device]["flags"]
    return {"study": STUDY, "row": row, "seed": seed, "settings": ROWS[row][1], "schedule": name,
            "schedule_flags": flags, "patience": args.patience, "max_epochs": args.max_epochs,
            "extra_flags": list(args.extra)}


def train_command(args, stage: str, row: str, seed: int) -> list[str]:
    """The ``train_translation.py`` command of a run, before the per-session flags (resume, time left)."""
    flags = DEVICES[args.device]["flags"]
    return [
        sys.executable, str(HERE / "train_translation.py"), "--multi30k_dir", str(args.multi30k_dir), *flags,
        *convergence_flags(args.patience, args.max_epochs), "--method", "baseline",
        "--method_settings", json.dumps(ROWS[row][1]), "--tokenizer_name", str(args.tokenizer_dir),
        *(["--syntax_parses_dir", str(args.parses_dir)] if uses_syntax(row) else []),
        "--seed", str(seed), "--output_dir", str(run_dir(args.output_dir, stage, row, seed)), *args.extra,
    ]


# --- one run: resume, stop, record -------------------------------------------------------------------------------


def resumable_checkpoint(folder: Path) -> Path | None:
    """The newest complete ``checkpoint-N`` of a run (its trainer state and training time written, the last files a
    checkpoint gets), or None."""
    found = []
    for path in Path(folder).glob("checkpoint-*"):
        step = path.name.removeprefix("checkpoint-")
        if step.isdigit() and (path / "trainer_state.json").is_file() and (path / "train_time.json").is_file():
            found.append((int(step), path))
    return max(found)[1] if found else None


def _callback_attribute(state: dict, callback: str, name: str):
    stored = state.get("stateful_callbacks", {}).get(callback)
    stored = stored[-1] if isinstance(stored, list) and stored else stored
    return (stored or {}).get("attributes", {}).get(name)


def session_flags(args, folder: Path) -> tuple[list[str], dict]:
    """The per-session flags of a run (``--max_train_minutes``: the cap less the training time so far; resuming: the
    last checkpoint) and the session's record. A run whose last checkpoint already met a stop condition (the process
    died while scoring) only scores: ``--max_steps`` its step, so the Trainer trains no further."""
    checkpoint = resumable_checkpoint(folder)
    session = {"started_at": now(), "resumed_from": None, "previous_train_time_s": 0.0, "finish_only": None}
    flags = []
    if checkpoint is not None:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        previous = json.loads((checkpoint / "train_time.json").read_text())["train_time_s"]
        session.update(resumed_from=str(checkpoint), resumed_epoch=state.get("epoch"),
                       resumed_step=state.get("global_step"), previous_train_time_s=previous)
        counter = _callback_attribute(state, "EarlyStoppingCallback", "early_stopping_patience_counter") or 0
        if counter >= args.patience:
            session["finish_only"] = "early_stopping"
        elif (state.get("epoch") or 0) >= args.max_epochs - 1e-6:
            session["finish_only"] = "max_epochs"
        elif previous >= 60 * args.time_cap_minutes:
            session["finish_only"] = "time_cap"
        flags += ["--resume_from_checkpoint", str(checkpoint)]
        if session["finish_only"]:
            flags += ["--max_steps", str(state["global_step"])]
    minutes = max(args.time_cap_minutes - session["previous_train_time_s"] / 60, 0.1)
    session["max_train_minutes"] = round(minutes, 2)
    return ["--max_train_minutes", f"{minutes:.2f}", *flags], session


def validation_curve(log_history: list[dict]) -> list[dict]:
    """One entry per evaluation: epoch, step, greedy validation BLEU and chrF (against the decoded references, as
    early stopping reads them), validation loss."""
    return [{"epoch": entry.get("epoch"), "step": entry.get("step"), "bleu": entry["eval_bleu"],
             "chrf": entry.get("eval_chrf"), "loss": entry.get("eval_loss")}
            for entry in log_history if "eval_bleu" in entry]


#: Training-log values that describe the schedule, not the model: left out of :func:`training_curve`.
SCHEDULE_LOG_KEYS = frozenset({"epoch", "step", "learning_rate", "grad_norm"})


def training_curve(log_history: list[dict]) -> list[dict]:
    """Per epoch k (the training logs with epoch in (k-1, k]), the mean of each logged training value: the loss, the
    NLL and the methods' terms and statistics (e.g. ``dhicm_kl``, ``dhicm_stats/top_head_share``), as the Trainer
    logged them every ``logging_steps`` (numbers only); ``logs`` says how many logs each mean joins."""
    epochs: dict[int, list[dict]] = {}
    for entry in log_history:
        if "loss" in entry:  # a training log (evaluations log eval_loss, the run's summary train_loss)
            epochs.setdefault(max(math.ceil(entry["epoch"] - 1e-9), 1), []).append(entry)
    curve = []
    for epoch, entries in sorted(epochs.items()):
        values: dict[str, list[float]] = {}
        for entry in entries:
            for key, value in entry.items():
                if key not in SCHEDULE_LOG_KEYS and isinstance(value, (int, float)):
                    values.setdefault(key, []).append(value)
        means = {key: sum(numbers) / len(numbers) for key, numbers in sorted(values.items())}
        curve.append({"epoch": epoch, "logs": len(entries), **means})
    return curve


def best_index(curve: list[dict]) -> int | None:
    """The evaluation the Trainer keeps: the first with the highest BLEU (a later one must be strictly higher)."""
    return max(range(len(curve)), key=lambda i: (curve[i]["bleu"], -i)) if curve else None


def stop_reason(results: dict, curve: list[dict], patience: int, max_epochs: int, finish_only: str | None) -> str:
    if results.get("stopped_at_time_limit") or finish_only == "time_cap":
        return "time_cap"
    best = best_index(curve)
    if best is not None and len(curve) - 1 - best >= patience:
        return "early_stopping"
    if (results.get("epochs") or 0) >= max_epochs - 1e-6:
        return "max_epochs"
    return finish_only or "unknown"


def make_record(args, stage: str, row: str, seed: int, folder: Path, sessions: list[dict]) -> dict:
    """The run's JSON, from its ``results.json`` and ``predictions_validation.txt``."""
    results = json.loads((folder / "results.json").read_text())
    curve = validation_curve(results["log_history"])
    best = best_index(curve)
    finish_only = sessions[-1].get("finish_only") if sessions else None
    reason = stop_reason(results, curve, args.patience, args.max_epochs, finish_only)
    valid = results["scores"][VALID]
    train_time = results.get("total_train_time_s")
    return {
        **identity(args, row, seed), "stage": stage, "method": method_of(row),
        "git_commit": git_commit(HERE.parent), "git_dirty": git_dirty(HERE.parent), "device": results.get("device"),
        "model": results.get("model"), "num_parameters": results.get("num_parameters"),
        "time_cap_minutes": args.time_cap_minutes,
        "epochs": results.get("epochs"), "global_step": results.get("global_step"), "stop_reason": reason,
        "stopped_by_time_cap": reason == "time_cap",
        "best_epoch": None if best is None else curve[best]["epoch"],
        "best_step": None if best is None else curve[best]["step"],
        "best_greedy_validation_bleu": None if best is None else curve[best]["bleu"],
        "validation_curve": curve,
        "training_curve": training_curve(results["log_history"]),
        "validation": {"bleu": valid["bleu"], "chrf": valid["chrf"], "num_beams": TEST_BEAMS,
                       "bleu_signature": valid.get("bleu_signature"), "chrf_signature": valid.get("chrf_signature"),
                       "of": "the best checkpoint by greedy validation BLEU"},
        "train_time_s": train_time if train_time is not None else results.get("train_time_s"),
        "train_time_s_is_total": train_time is not None,
        "sessions": sessions, "run_dir": str(folder), "finished_at": now(),
        "command": train_command(args, stage, row, seed),
        "validation_predictions": (folder / f"predictions_{VALID}.txt").read_text(encoding="utf-8").splitlines(),
    }


def check_identity(path: Path, expected: dict) -> None:
    stored = json.loads(path.read_text())
    stored = stored.get("identity", stored)
    different = sorted(key for key in expected if stored.get(key) != expected[key])
    if different:
        found = {key: stored.get(key) for key in different}
        raise SystemExit(f"{path} belongs to a run with other {different} than this study's: expected "
                         f"{ {key: expected[key] for key in different} }, found {found}. Use another "
                         "--output_dir/--results_dir, or remove it to start that run afresh")


def training_processes(folder: Path) -> list[int]:
    """Ids of live ``train_translation.py`` processes writing into ``folder`` (read from ``/proc``; none found where
    there is no ``/proc``): a study process killed alone leaves its runs going, and a second one must not join them."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(arg.endswith("train_translation.py") for arg in argv) and "--output_dir" in argv:
            target = argv[argv.index("--output_dir") + 1] if argv.index("--output_dir") + 1 < len(argv) else ""
            if target and Path(target).resolve() == Path(folder).resolve():
                pids.append(int(cmdline.parent.name))
    return pids


def run_one(args, stage: str, row: str, seed: int) -> str | None:
    """Train (or resume) one run and write its JSON; returns None when it is done, else why not."""
    name, folder = f"{stage} {row} seed {seed}", run_dir(args.output_dir, stage, row, seed)
    out = record_path(args.results_dir, stage, row, seed)
    if out.is_file():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "study_run.json"
    if spec.is_file():
        check_identity(spec, identity(args, row, seed))
    running = training_processes(folder)
    if running:
        print(f"{name}: skipped, training processes {running} still write into {folder} (a study stopped without "
              "its runs?); stop them or let them end, then run this again", flush=True)
        return "busy"
    sessions = json.loads(spec.read_text()).get("sessions", []) if spec.is_file() else []
    results = folder / "results.json"
    if results.is_file():
        try:
            json.loads(results.read_text())
        except ValueError:  # cut off while being written: score again
            results.replace(folder / "results.json.broken")
    if not results.is_file():
        flags, session = session_flags(args, folder)
        sessions.append(session)
        write_json_atomic(spec, {"identity": identity(args, row, seed), "sessions": sessions})
        resumed = f", resuming {session['resumed_from']}" if session["resumed_from"] else ""
        print(f"{name}: starting{resumed}{', scoring only' if session['finish_only'] else ''}", flush=True)
        log = folder / f"train.{len(sessions)}.log"  # one log per session; run_jobs overwrites its log
        if run_jobs([(name, [*train_command(args, stage, row, seed), *flags], log)], 1, args.threads):
            return "failed"
        sessions[-1]["ended_at"] = now()
        write_json_atomic(spec, {"identity": identity(args, row, seed), "sessions": sessions})
    write_json_atomic(out, make_record(args, stage, row, seed, folder, sessions))
    print(f"{name}: recorded in {out}", flush=True)
    return None


def launch(args, stage: str, rows: list[str], seeds) -> None:
    """Run the unfinished runs of ``rows`` x ``seeds``, ``--parallel`` at a time; each is recorded when it ends."""
    todo = [(row, seed) for seed in seeds for row in rows
            if not record_path(args.results_dir, stage, row, seed).is_file()]
    for row, seed in [(row, seed) for seed in seeds for row in rows if (row, seed) not in todo]:
        check_identity(record_path(args.results_dir, stage, row, seed), identity(args, row, seed))
    print(f"{stage}: {len(rows) * len(seeds) - len(todo)} run(s) done, {len(todo)} to run, {args.parallel} at a "
          "time", flush=True)
    if not todo:
        return
    prepare(args, rows)
    pool = ThreadPoolExecutor(max_workers=args.parallel)
    try:
        futures = [(job, pool.submit(run_one, args, stage, *job)) for job in todo]
        outcomes = [(job, future.result()) for job, future in futures]
    except BaseException:  # Ctrl-C: start no further run (the running ones got the signal too)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    failed = [f"{row} seed {seed} ({why})" for (row, seed), why in outcomes if why]
    if failed:
        raise SystemExit(f"{stage}: {len(failed)} run(s) not finished: {failed}; see train.*.log in their folders "
                         f"under {Path(args.output_dir) / stage}. The same command resumes them")


def prepare(args, rows) -> None:
    """The shared tokenizer, and the parses when a row uses SEA (both reused when already there)."""
    if not (Path(args.tokenizer_dir) / "source.spm").is_file():
        print(f"training the shared tokenizer into {args.tokenizer_dir}", flush=True)
    prepare_tokenizer(args.tokenizer_dir, args.multi30k_dir, DEVICES[args.device]["vocab_size"])
    if any(uses_syntax(row) for row in rows) and not (Path(args.parses_dir) / "parser.json").is_file():
        print(f"parsing the sources into {args.parses_dir} (spaCy)", flush=True)
        subprocess.run([sys.executable, str(HERE / "parse_sources.py"), "--multi30k_dir", str(args.multi30k_dir),
                        "--source_lang", "en", "--target_lang", "de", "--output_dir", str(args.parses_dir)],
                       check=True)


# --- the steps: choice on validation, test once ------------------------------------------------------------------


def load(results_dir: Path, stage: str, rows=None, seeds=None) -> dict[str, dict[int, dict]]:
    """The records of a stage, ``{row: {seed: record}}``."""
    runs = {}
    for row in rows or ROWS:
        for seed in seeds or (SCREEN_SEEDS if stage == "screen" else CONFIRM_SEEDS):
            path = record_path(results_dir, stage, row, seed)
            if path.is_file():
                runs.setdefault(row, {})[seed] = json.loads(path.read_text())
    return runs


def missing(runs: dict[str, dict[int, dict]], rows, seeds) -> list[str]:
    return [f"{row} seed {seed}" for row in rows for seed in seeds if seed not in runs.get(row, {})]


def choose(screen: dict[str, dict[int, dict]]) -> dict[str, str]:
    """Per method, the row with the highest validation BLEU (beam 5, best checkpoint) of the screen's seed 1; ties go
    to the row listed first. Reads nothing but ``record["validation"]``."""
    chosen = {}
    for method in METHODS:
        rows = [row for row in ROWS if method_of(row) == method and SCREEN_SEEDS[0] in screen.get(row, {})]
        if rows:
            chosen[method] = max(rows, key=lambda row: (screen[row][SCREEN_SEEDS[0]]["validation"]["bleu"],
                                                        -list(ROWS).index(row)))
    return chosen


def confirmed_rows(chosen: dict[str, str]) -> list[str]:
    return ["baseline", *(chosen[method] for method in METHODS if method in chosen)]


def the_choice(args) -> dict:
    """The choice of ``choice.json``, made from the complete screen on its first call and fixed after."""
    screen = load(args.results_dir, "screen")
    lacking = missing(screen, ROWS, SCREEN_SEEDS)
    if lacking:
        raise SystemExit(f"the screen is not complete ({len(lacking)} of {len(ROWS)} runs missing: {lacking}); run "
                         "the screen step first: the choice is made on all its rows")
    chosen = choose(screen)
    path = Path(args.results_dir) / "choice.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored["chosen"] != chosen:
            raise SystemExit(f"{path} holds the choice {stored['chosen']}, but the screen's records now choose "
                             f"{chosen}; a choice is not remade after the confirmation started")
        return stored
    choice = {"chosen": chosen, "rows": confirmed_rows(chosen), "seeds": list(CONFIRM_SEEDS),
              "criterion": "screen seed 1, validation BLEU (beam 5) of the best checkpoint by greedy validation BLEU",
              "screen_validation_bleu": {row: screen[row][SCREEN_SEEDS[0]]["validation"]["bleu"] for row in ROWS},
              "made_at": now(), "git_commit": git_commit(HERE.parent)}
    write_json_atomic(path, choice)
    return choice


def confirm(args) -> None:
    choice = the_choice(args)
    print(f"chosen on validation: {choice['chosen']}; confirming {choice['rows']} with seeds {choice['seeds']}",
          flush=True)
    launch(args, "confirm", choice["rows"], choice["seeds"])


def score_command(args, row: str, seed: int) -> list[str]:
    record = record_path(args.results_dir, "confirm", row, seed)
    return [sys.executable, str(Path(__file__).resolve()), "score", "--record", str(record), "--split", TEST,
            "--out", str(test_path(args.results_dir, row, seed)), "--device", args.device,
            "--multi30k_dir", str(args.multi30k_dir), "--parses_dir", str(args.parses_dir)]


def test(args) -> None:
    """Read test_2016_flickr once, for the confirmed runs only, after the confirmation is complete."""
    path = Path(args.results_dir) / "choice.json"
    if not path.is_file():
        raise SystemExit("no choice.json: run the screen and confirm steps first; the test set is read only after the "
                         "choice and the confirmation")
    choice = json.loads(path.read_text())
    rows, seeds = choice["rows"], choice["seeds"]
    lacking = missing(load(args.results_dir, "confirm", rows, seeds), rows, seeds)
    if lacking:
        raise SystemExit(f"the confirmation is not complete ({lacking} missing); the test set is read after it")
    record = Path(args.results_dir) / "test.json"
    ran = json.loads(record.read_text()) if record.is_file() else None
    if ran and ran.get("finished_at"):
        print(f"the test set was read at {ran['finished_at']} ({record}); it is not read again", flush=True)
        return
    if ran and (ran["rows"], ran["seeds"]) != (rows, seeds):
        raise SystemExit(f"{record} started reading the test set for {ran['rows']} x {ran['seeds']}, not {rows} x "
                         f"{seeds}")
    ran = ran or {"split": TEST, "num_beams": TEST_BEAMS, "rows": rows, "seeds": seeds, "chosen": choice["chosen"],
                  "started_at": now(), "git_commit": git_commit(HERE.parent)}
    write_json_atomic(record, ran)
    jobs = [(f"test {row} seed {seed}", score_command(args, row, seed),
             run_dir(args.output_dir, "confirm", row, seed) / "test.log")
            for seed in seeds for row in rows if not test_path(args.results_dir, row, seed).is_file()]
    failed = run_jobs(jobs, args.parallel, args.threads)
    if failed:
        raise SystemExit(f"{len(failed)} test scoring(s) failed: {failed}; see test.log in their run folders")
    ran["finished_at"] = now()
    ran["bleu"] = {row: {seed: json.loads(test_path(args.results_dir, row, seed).read_text())["bleu"]
                         for seed in seeds} for row in rows}
    write_json_atomic(record, ran)
    print(f"test set read for {rows} x {seeds}; recorded in {record}", flush=True)


def score(args) -> None:
    """One confirmed run's best checkpoint on ``--split`` (what ``test`` runs for each run)."""
    from hf_headattn.experiment.study import score_saved_model

    record = json.loads(Path(args.record).read_text())
    folder = Path(record["run_dir"])
    scores = score_saved_model(folder, args.split, args.multi30k_dir, settings=record["settings"],
                               parses_dir=args.parses_dir if settings_use_syntax(record["settings"]) else None,
                               num_beams=TEST_BEAMS, use_cpu=args.device == "cpu", bf16=args.device == "cuda",
                               batch_size=256 if args.device == "cuda" else 100,
                               output_file=folder / f"predictions_{args.split}.txt")
    write_json_atomic(args.out, {
        "study": STUDY, "stage": "test", "row": record["row"], "seed": record["seed"], "split": args.split,
        "of": Path(args.record).name, "num_beams": TEST_BEAMS, **scores, "scored_at": now(),
        "git_commit": git_commit(HERE.parent),
        "predictions": (folder / f"predictions_{args.split}.txt").read_text(encoding="utf-8").splitlines(),
    })


# --- tables ------------------------------------------------------------------------------------------------------


def _epochs(record: dict) -> str:
    mark = {"early_stopping": "", "time_cap": " (time cap)", "max_epochs": " (max epochs)"}
    return f"{record['epochs']:.0f}{mark.get(record['stop_reason'], ' (' + record['stop_reason'] + ')')}"


def screen_table(screen: dict[str, dict[int, dict]], refs: dict[str, list[str]]) -> tuple[list[dict], str]:
    """Seed 1 of every row on validation: the best checkpoint's beam-5 BLEU and chrF, its p against the baseline,
    the best greedy BLEU of the curve, epochs to the best and trained, training hours."""
    seed = SCREEN_SEEDS[0]
    base = {seed: screen["baseline"][seed]["validation_predictions"]} if seed in screen.get("baseline", {}) else {}
    header = ["row", "valid BLEU (beam 5)", "valid chrF", "p vs baseline", "best greedy valid BLEU",
              "epochs to best", "epochs trained", "train h"]
    summary, table = [], []
    for row in ROWS:
        if seed not in screen.get(row, {}):
            table.append([row, "(running or not started)", *[""] * 6])
            continue
        run = screen[row][seed]
        p = [] if row == "baseline" else per_seed_p_values(base, {seed: run["validation_predictions"]}, refs[VALID])
        summary.append({"row": row, "validation_bleu": run["validation"]["bleu"], "validation_p": p,
                        "best_epoch": run["best_epoch"], "epochs": run["epochs"], "stop_reason": run["stop_reason"]})
        table.append([row, f"{run['validation']['bleu']:.2f}", f"{run['validation']['chrf']:.2f}",
                      per_seed(p, ".3f"), f"{run['best_greedy_validation_bleu']:.2f}", f"{run['best_epoch']:.0f}",
                      _epochs(run), f"{run['train_time_s'] / 3600:.2f}"])
    return summary, markdown_table(header, table)


def against(scores: dict[int, float], baseline: dict[int, float], p_values: list[float]) -> str:
    """Per seed that the baseline has too (ascending, as :func:`per_seed_p_values` gives ``p_values``): the signed
    difference from the baseline of the same seed and its p, e.g. ``+0.49 (p 0.109) / +1.30 (p 0.005)``."""
    seeds = [seed for seed in sorted(scores) if seed in baseline]
    return " / ".join(f"{scores[s] - baseline[s]:+.2f} (p {p:.3f})" for s, p in zip(seeds, p_values)) or "-"


def confirm_table(confirm: dict[str, dict[int, dict]], tests: dict[str, dict[int, dict]], rows: list[str],
                  refs: dict[str, list[str]]) -> tuple[list[dict], str]:
    """The confirmed rows over the fresh seeds: validation (beam 5, best checkpoint) and, once the test step ran,
    test_2016_flickr; mean ± sd, each seed's difference from the baseline of the same seed with its p, epochs to
    convergence."""
    base, base_test = confirm.get("baseline", {}), tests.get("baseline", {})
    header = ["row", "seeds", "valid BLEU", "vs baseline, valid (per seed)", "test BLEU",
              "vs baseline, test (per seed)", "test chrF", "epochs to best", "epochs trained"]
    summary, table = [], []
    for row in rows:
        runs, test = confirm.get(row, {}), tests.get(row, {})
        seeds = sorted(runs)
        if not seeds:
            table.append([row, 0, "(running or not started)", *[""] * 6])
            continue
        entry = {
            "row": row, "seeds": seeds, "validation_bleu": [runs[s]["validation"]["bleu"] for s in seeds],
            "validation_p": [] if row == "baseline" else per_seed_p_values(
                {s: r["validation_predictions"] for s, r in base.items()},
                {s: r["validation_predictions"] for s, r in runs.items()}, refs[VALID]),
            "test_bleu": [test[s]["bleu"] for s in sorted(test)], "test_chrf": [test[s]["chrf"] for s in sorted(test)],
            "test_p": [] if row == "baseline" or not test else per_seed_p_values(
                {s: r["predictions"] for s, r in base_test.items()}, {s: r["predictions"] for s, r in test.items()},
                refs[TEST]),
            "best_epoch": [runs[s]["best_epoch"] for s in seeds], "epochs": [runs[s]["epochs"] for s in seeds],
            "stop_reason": [runs[s]["stop_reason"] for s in seeds],
        }
        summary.append(entry)
        read = bool(test)
        valid_vs = against({s: r["validation"]["bleu"] for s, r in runs.items()},
                           {s: r["validation"]["bleu"] for s, r in base.items()}, entry["validation_p"])
        test_vs = against({s: r["bleu"] for s, r in test.items()}, {s: r["bleu"] for s, r in base_test.items()},
                          entry["test_p"])
        table.append([row, len(seeds), mean_sd(entry["validation_bleu"]), valid_vs,
                      mean_sd(entry["test_bleu"]) if read else "not read yet", test_vs,
                      mean_sd(entry["test_chrf"]) if read else "-", per_seed(entry["best_epoch"], ".0f"),
                      " / ".join(_epochs(runs[s]) for s in seeds)])
    return summary, markdown_table(header, table)


def curves(stage: str, runs: dict[str, dict[int, dict]]) -> str:
    lines = []
    for row in ROWS:
        for seed, run in sorted(runs.get(row, {}).items()):
            values = ", ".join(f"{point['bleu']:.1f}" for point in run["validation_curve"])
            lines.append(f"- {stage} {row} seed {seed} ({run['stop_reason']}): {values}")
    return "\n".join(lines)


def table(args) -> str:
    screen = load(args.results_dir, "screen")
    path = Path(args.results_dir) / "choice.json"
    choice = json.loads(path.read_text()) if path.is_file() else None
    refs = references(args.multi30k_dir, [VALID, TEST])
    name = DEVICES[args.device]["schedule"]
    any_run = next((run for runs in screen.values() for run in runs.values()), None)
    parts = [f"# The methods at convergence (issue #26): Multi30k En-De, schedule `{name}`",
             "",
             "Written by `python recipes/converged_study.py table"
             f"{' --device cuda' if args.device == 'cuda' else ''}` from the JSON records here.",
             "Each run trains until its greedy validation BLEU has not improved for "
             f"{any_run['patience'] if any_run else args.patience} evaluations (one per epoch), at most "
             f"{any_run['max_epochs'] if any_run else args.max_epochs} epochs and the time cap; its best checkpoint "
             "(by that BLEU) is scored with beam 5. Every choice is made on validation; test_2016_flickr is read once, "
             "after the confirmation, for the confirmed rows only.",
             "", "## Screen (seed 1, validation)", ""]
    _, markdown = screen_table(screen, refs)
    parts.append(markdown)
    if choice:
        parts += ["", f"Chosen on validation: {choice['chosen']} (screen seed 1, beam-5 validation BLEU).", "",
                  f"## Confirmation (fresh seeds {choice['seeds']}; test read once, for these rows)", ""]
        confirm = load(args.results_dir, "confirm", choice["rows"], choice["seeds"])
        tests = {row: {seed: json.loads(test_path(args.results_dir, row, seed).read_text())
                       for seed in choice["seeds"] if test_path(args.results_dir, row, seed).is_file()}
                 for row in choice["rows"]}
        _, markdown = confirm_table(confirm, {row: runs for row, runs in tests.items() if runs}, choice["rows"], refs)
        parts.append(markdown)
    else:
        confirm = {}
    signature = f" ({any_run['validation']['bleu_signature']})" if any_run else ""
    parts += ["", f"BLEU: sacreBLEU{signature}, beam 5, best checkpoint. p: sacreBLEU's paired bootstrap (1000 "
              "resamples, seed 12345) of each seed against the baseline run of the same seed, two-sided; the sign of "
              "the difference gives the direction. Epochs to best: the evaluation whose checkpoint is scored; epochs "
              "trained: until early stopping unless marked (time cap, max epochs). The screen's seed chose the "
              "confirmed rows, so the confirmation reports fresh seeds only.", "",
              "## Validation curves (greedy BLEU at each epoch)", "", curves("screen", screen)]
    if confirm:
        parts.append(curves("confirm", confirm))
    markdown = "\n".join(parts) + "\n"
    Path(args.results_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.results_dir) / "README.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    return markdown


def status(args) -> None:
    path = Path(args.results_dir) / "choice.json"
    choice = json.loads(path.read_text()) if path.is_file() else None
    stages = [("screen", list(ROWS), SCREEN_SEEDS)]
    if choice:
        stages.append(("confirm", choice["rows"], choice["seeds"]))
    for stage, rows, seeds in stages:
        for seed in seeds:
            for row in rows:
                out = record_path(args.results_dir, stage, row, seed)
                if out.is_file():
                    run = json.loads(out.read_text())
                    print(f"{stage} {row} seed {seed}: done, {run['epochs']:.0f} epochs ({run['stop_reason']}), "
                          f"valid BLEU {run['validation']['bleu']:.2f}")
                    continue
                checkpoint = resumable_checkpoint(run_dir(args.output_dir, stage, row, seed))
                if checkpoint is None:
                    print(f"{stage} {row} seed {seed}: not started")
                    continue
                state = json.loads((checkpoint / "trainer_state.json").read_text())
                train_time = json.loads((checkpoint / "train_time.json").read_text())["train_time_s"]
                print(f"{stage} {row} seed {seed}: {state['epoch']:.0f} epochs so far, best greedy valid BLEU "
                      f"{state.get('best_metric') or 0:.2f}, {train_time / 3600:.1f} h; resumes from {checkpoint.name}")
    test_record = Path(args.results_dir) / "test.json"
    read = json.loads(test_record.read_text()).get("finished_at") if test_record.is_file() else None
    print(f"choice: {choice['chosen'] if choice else 'not made (the screen is not complete)'}; test set: "
          f"{('read at ' + read) if read else 'started, unfinished' if test_record.is_file() else 'not read'}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["prepare", "screen", "confirm", "test", "table", "status", "score"])
    parser.add_argument("--device", choices=sorted(DEVICES), default="cpu")
    parser.add_argument("--output_dir", type=Path, help="run folders (checkpoints); default per device")
    parser.add_argument("--results_dir", type=Path, help="the records and tables; default per device")
    parser.add_argument("--multi30k_dir", type=Path, default=HERE.parent.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--tokenizer_dir", type=Path, help="default <output_dir>/tokenizer (made when missing)")
    parser.add_argument("--parses_dir", type=Path, help="default <output_dir>/parses (made when missing, spaCy)")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), help="screen: these rows only (default: all)")
    parser.add_argument("--parallel", type=positive_int, help="runs at a time (default: 2 on the CPU, 10 on a GPU)")
    parser.add_argument("--threads", type=positive_int, default=1, help="CPU threads per run")
    parser.add_argument("--patience", type=positive_int, default=5,
                        help="evaluations (epochs) without a better validation BLEU")
    parser.add_argument("--max_epochs", type=positive_int, help="the most epochs a run trains (default: 60 on the "
                                                                 "CPU, 150 on a GPU)")
    parser.add_argument("--time_cap_minutes", type=positive_float, help="training minutes per run, across sessions "
                                                                        "(default: 600 on the CPU, 180 on a GPU)")
    parser.add_argument("--record", type=existing_file, help=argparse.SUPPRESS)
    parser.add_argument("--split", default=TEST, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    defaults = DEVICES[args.device]
    args.extra = extra
    args.output_dir = args.output_dir or Path(defaults["output_dir"])
    args.results_dir = args.results_dir or Path(defaults["results_dir"])
    args.tokenizer_dir = args.tokenizer_dir or args.output_dir / "tokenizer"
    args.parses_dir = args.parses_dir or args.output_dir / "parses"
    for name in ("parallel", "time_cap_minutes", "max_epochs"):
        if getattr(args, name) is None:  # not "or": an explicit 0 is refused above, never the default
            setattr(args, name, defaults[name])
    if args.command in {"confirm", "test", "table", "status"} and not args.results_dir.is_dir():
        parser.error(f"--results_dir {args.results_dir} is not a folder; expected the study's records (made by "
                     f"screen; the default for --device {args.device} is {defaults['results_dir']})")
    if args.command != "status" and not args.multi30k_dir.is_dir():
        parser.error(f"--multi30k_dir {args.multi30k_dir} is not a folder; expected the Multi30k data")
    if args.command == "score" and not (args.record and args.out):
        parser.error("score needs --record and --out (test runs it for each confirmed run)")
    if args.rows and args.command != "screen":
        parser.error(f"--rows chooses the rows of the screen only; {args.command} runs the rows of choice.json")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.command == "prepare":
        prepare(args, list(ROWS))
    elif args.command == "screen":
        launch(args, "screen", args.rows or list(ROWS), SCREEN_SEEDS)
    elif args.command == "confirm":
        confirm(args)
    elif args.command == "test":
        test(args)
    elif args.command == "table":
        table(args)
    elif args.command == "status":
        status(args)
    else:
        score(args)


if __name__ == "__main__":
    main()
