"""The test set of a study, read once: for the chosen runs only, after their confirmation, recorded as read in
``<results_dir>/test.json`` (a finished reading is not repeated), each run's best checkpoint scored into its record
``test-<row>-seed<k>.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from hf_headattn.experiment.outputs import write_json_atomic
from hf_headattn.syntax_inputs.provider import uses_syntax

from . import git_commit, score_saved_model
from .jobs import run_jobs
from .runs import Job, now, read_json, record_path


def read_test_once(results_dir: str | Path, plan: dict, jobs: list[Job], parallel: int, threads: int,
                   repo: Path) -> None:
    """Score the test set once for ``plan["rows"]`` x ``plan["seeds"]`` (``jobs`` write each run's record
    ``test-<row>-seed<k>.json``), recording in ``<results_dir>/test.json`` that it started and when it finished: a
    finished reading is not repeated, and an unfinished one is completed for the same runs only."""
    record = Path(results_dir) / "test.json"
    rows, seeds = plan["rows"], plan["seeds"]
    ran = read_json(record)
    if ran and ran.get("finished_at"):
        print(f"the test set was read at {ran['finished_at']} ({record}); it is not read again", flush=True)
        return
    if ran and (ran["rows"], ran["seeds"]) != (rows, seeds):
        raise SystemExit(f"{record} started reading the test set for {ran['rows']} x {ran['seeds']}, not {rows} x "
                         f"{seeds}")
    ran = ran or {**plan, "started_at": now(), "git_commit": git_commit(repo)}
    write_json_atomic(record, ran)
    failed = run_jobs(jobs, parallel, threads)
    if failed:
        raise SystemExit(f"{len(failed)} test scoring(s) failed: {failed}; see test.log in their run folders")
    ran["finished_at"] = now()
    ran["bleu"] = {row: {seed: read_json(record_path(results_dir, "test", row, seed))["bleu"] for seed in seeds}
                   for row in rows}
    write_json_atomic(record, ran)
    print(f"test set read for {rows} x {seeds}; recorded in {record}", flush=True)


def score_run(record_file: str | Path, split: str, out: str | Path, *, multi30k_dir: str | Path,
              parses_dir: str | Path | None, num_beams: int, device: str, repo: Path) -> None:
    """Score the best checkpoint of the run recorded in ``record_file`` on ``split`` (beam search, ``num_beams``) and
    write the scores and predictions to ``out``."""
    record = json.loads(Path(record_file).read_text())
    folder = Path(record["run_dir"])
    scores = score_saved_model(folder, split, multi30k_dir, settings=record["settings"],
                               parses_dir=parses_dir if uses_syntax(record["settings"]) else None,
                               num_beams=num_beams, use_cpu=device == "cpu", bf16=device == "cuda",
                               batch_size=256 if device == "cuda" else 100,
                               output_file=folder / f"predictions_{split}.txt")
    write_json_atomic(out, {
        "study": record["study"], "stage": "test", "row": record["row"], "seed": record["seed"], "split": split,
        "of": Path(record_file).name, "num_beams": num_beams, **scores, "scored_at": now(),
        "git_commit": git_commit(repo),
        "predictions": (folder / f"predictions_{split}.txt").read_text(encoding="utf-8").splitlines(),
    })
