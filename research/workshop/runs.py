"""A study's runs on disk, as the study scripts lay them out: a run trains in ``<root>/<row>/seed<k>`` (``root``: the
study's output folder, or a stage's folder in it), where ``hf-headattn train`` writes ``results.json`` and
``predictions_<split>.txt``; a study that keeps records writes one JSON file per finished run,
``<results_dir>/<stage>-<row>-seed<k>.json``. Here: those paths, the jobs that train rows x seeds, and loading what
the runs and the records hold.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path

#: A :func:`~workshop.jobs.run_jobs` job: name, command, log file.
Job = tuple[str, list[str], Path]
#: Runs by row and seed, ``{row: {seed: results or record}}``.
Runs = dict[str, dict[int, dict]]


def run_dir(root: str | Path, row: str, seed: int) -> Path:
    """The folder of a run: ``<root>/<row>/seed<seed>``."""
    return Path(root) / row / f"seed{seed}"


def record_path(results_dir: str | Path, stage: str, row: str, seed: int) -> Path:
    """The record of a finished run: ``<results_dir>/<stage>-<row>-seed<seed>.json``."""
    return Path(results_dir) / f"{stage}-{row}-seed{seed}.json"


def now() -> str:
    """The time in UTC to the second (ISO 8601), as the records write it."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_json(path: str | Path):
    """The JSON in ``path``, or None where there is no such file."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def training_jobs(root: str | Path, rows: Sequence[str], seeds: Iterable[int],
                  command: Callable[[str, int], list[str]], *, skip_finished: bool = False) -> list[Job]:
    """The jobs that train ``rows`` x ``seeds``, seed by seed: ``"<row> seed <k>"``, ``command(row, seed)`` and
    ``train.log`` in the run's folder; with ``skip_finished``, not the runs whose ``results.json`` is there."""
    return [(f"{row} seed {seed}", command(row, seed), run_dir(root, row, seed) / "train.log")
            for seed in seeds for row in rows
            if not (skip_finished and (run_dir(root, row, seed) / "results.json").is_file())]


def load_results(root: str | Path, rows: Sequence[str] | None = None) -> Runs:
    """What the finished runs under ``root`` wrote: each ``results.json``, with the predictions of every scored split
    under ``"predictions"`` (``{split: lines}``). ``rows``: these rows, in this order (a row without a finished run
    maps to ``{}``); by default every row with one."""
    root = Path(root)
    paths = (sorted(root.glob("*/seed*/results.json")) if rows is None
             else [path for row in rows for path in sorted((root / row).glob("seed*/results.json"))])
    runs: Runs = {row: {} for row in rows or ()}
    for path in paths:
        results = json.loads(path.read_text())
        results["predictions"] = {split: (path.parent / f"predictions_{split}.txt").read_text(
            encoding="utf-8").splitlines() for split in results["scores"]}
        runs.setdefault(path.parent.parent.name, {})[int(path.parent.name.removeprefix("seed"))] = results
    return runs


def load_records(results_dir: str | Path, stage: str, rows: Iterable[str], seeds: Iterable[int]) -> Runs:
    """The records of a stage's finished runs among ``rows`` x ``seeds`` (a row without one is left out)."""
    runs: Runs = {}
    seeds = list(seeds)
    for row in rows:
        for seed in seeds:
            record = read_json(record_path(results_dir, stage, row, seed))
            if record is not None:
                runs.setdefault(row, {})[seed] = record
    return runs


def missing(runs: Runs, rows: Iterable[str], seeds: Iterable[int]) -> list[str]:
    """The runs of ``rows`` x ``seeds`` (row by row) that ``runs`` lacks, as ``"<row> seed <k>"``."""
    seeds = list(seeds)
    return [f"{row} seed {seed}" for row in rows for seed in seeds if seed not in runs.get(row, {})]
