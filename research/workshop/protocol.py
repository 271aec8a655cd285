"""A study in steps, every choice on validation: ``screen`` every row; ``confirm``, per method, the row with the best
validation BLEU of the screen, and the baseline, with fresh seeds (the screen's seed chose the rows, so its scores
carry the choice's optimism), the choice written to ``choice.json`` once and never remade; ``test``: the test set read
once, for the confirmed runs only, after their confirmation (:mod:`~workshop.scoring`). Here:
the choice and the checks between the steps (:class:`StagedStudy`) and the best rows per method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hf_headattn.experiment.outputs import write_json_atomic

from . import git_commit
from .launch import ConvergenceRuns, launch, run_status
from .runs import Runs, load_records, missing, now, read_json, record_path
from .scoring import read_test_once


def best_rows(candidates: Mapping[str, Sequence[str]], score: Callable[[str], float],
              top: int = 1) -> dict[str, list[str]]:
    """Per method (the keys of ``candidates``), its ``top`` candidate rows with the highest ``score``, best first;
    ties go to the row listed first. A method without candidates is left out."""
    return {method: sorted(rows, key=lambda row: -score(row))[:top] for method, rows in candidates.items() if rows}


@dataclass(frozen=True)
class StagedStudy:
    """The steps of a study whose ``rows`` (row -> method; the baseline's is ``"baseline"``) are screened with
    ``screen_seeds`` and confirmed with ``confirm_seeds``; the runs' records (``record["validation"]["bleu"]``: the
    score the choice reads) are in a results folder, the methods' first argument. ``criterion``: how the choice is
    made, as ``choice.json`` says it."""

    rows: Mapping[str, str]
    screen_seeds: tuple[int, ...]
    confirm_seeds: tuple[int, ...]
    criterion: str

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods compared, one chosen row each, in the order of ``rows``."""
        return tuple(dict.fromkeys(method for method in self.rows.values() if method != "baseline"))

    def choose(self, screen: Runs) -> dict[str, str]:
        """Per method, the row with the highest validation BLEU of the screen's first seed; ties go to the row listed
        first. Reads nothing but ``record["validation"]``."""
        seed = self.screen_seeds[0]
        candidates = {method: [row for row, of in self.rows.items() if of == method and seed in screen.get(row, {})]
                      for method in self.methods}
        best = best_rows(candidates, lambda row: screen[row][seed]["validation"]["bleu"])
        return {method: rows[0] for method, rows in best.items()}

    def screen(self, results_dir: str | Path) -> Runs:
        """The screen's records."""
        return load_records(results_dir, "screen", self.rows, self.screen_seeds)

    def stored_choice(self, results_dir: str | Path) -> dict | None:
        """The choice of ``choice.json``, or None before it is made."""
        return read_json(Path(results_dir) / "choice.json")

    def chosen_records(self, results_dir: str | Path, stage: str) -> Runs:
        """The records of the chosen rows with the confirmation's seeds at ``stage`` (``confirm``, ``test``); none
        before the choice."""
        choice = self.stored_choice(results_dir)
        return load_records(results_dir, stage, choice["rows"], choice["seeds"]) if choice else {}

    def choice(self, results_dir: str | Path, repo: Path) -> dict:
        """The choice of ``choice.json``, made from the complete screen on its first call and fixed after."""
        screen = self.screen(results_dir)
        lacking = missing(screen, self.rows, self.screen_seeds)
        if lacking:
            raise SystemExit(f"the screen is not complete ({len(lacking)} of {len(self.rows)} runs missing: "
                             f"{lacking}); run the screen step first: the choice is made on all its rows")
        chosen, path = self.choose(screen), Path(results_dir) / "choice.json"
        stored = read_json(path)
        if stored is not None and stored["chosen"] != chosen:
            raise SystemExit(f"{path} holds the choice {stored['chosen']}, but the screen's records now choose "
                             f"{chosen}; a choice is not remade after the confirmation started")
        if stored is None:
            first = self.screen_seeds[0]
            stored = {"chosen": chosen, "rows": ["baseline", *(chosen[m] for m in self.methods if m in chosen)],
                      "seeds": list(self.confirm_seeds), "criterion": self.criterion,
                      "screen_validation_bleu": {row: screen[row][first]["validation"]["bleu"] for row in self.rows},
                      "made_at": now(), "git_commit": git_commit(repo)}
            write_json_atomic(path, stored)
        return stored

    def confirmed(self, results_dir: str | Path) -> dict:
        """The choice, once the confirmation of its rows is complete; refused before (the test set is read after)."""
        choice = self.stored_choice(results_dir)
        if choice is None:
            raise SystemExit("no choice.json: run the screen and confirm steps first; the test set is read only after "
                             "the choice and the confirmation")
        lacking = missing(self.chosen_records(results_dir, "confirm"), choice["rows"], choice["seeds"])
        if lacking:
            raise SystemExit(f"the confirmation is not complete ({lacking} missing); the test set is read after it")
        return choice

    def confirm(self, runs: ConvergenceRuns) -> None:
        """The confirmation: the rows of the choice (made now if not yet) with the fresh seeds."""
        choice = self.choice(runs.results_dir, runs.repo)
        print(f"chosen on validation: {choice['chosen']}; confirming {choice['rows']} with seeds {choice['seeds']}",
              flush=True)
        launch(runs, "confirm", choice["rows"], choice["seeds"])

    def test(self, runs: ConvergenceRuns, command: Callable[[str, int], list[str]], split: str,
             num_beams: int) -> None:
        """Read the test set ``split`` once, for the confirmed runs only, after their confirmation:
        ``command(row, seed)`` scores a confirmed run's best checkpoint with ``num_beams`` beams into its record
        ``test-<row>-seed<k>.json`` (its log: ``test.log`` in the run's folder)."""
        choice = self.confirmed(runs.results_dir)
        rows, seeds = choice["rows"], choice["seeds"]
        jobs = [(f"test {row} seed {seed}", command(row, seed), runs.folder("confirm", row, seed) / "test.log")
                for seed in seeds for row in rows if not record_path(runs.results_dir, "test", row, seed).is_file()]
        plan = {"split": split, "num_beams": num_beams, "rows": rows, "seeds": seeds, "chosen": choice["chosen"]}
        read_test_once(runs.results_dir, plan, jobs, runs.parallel, runs.threads, runs.repo)

    def status(self, runs: ConvergenceRuns) -> list[str]:
        """A line per run of the screen and of the confirmation (done, under way, not started), then whether the
        choice is made and the test set read."""
        choice = self.stored_choice(runs.results_dir)
        steps = [("screen", list(self.rows), self.screen_seeds)]
        steps += [("confirm", choice["rows"], choice["seeds"])] if choice else []
        lines = [run_status(runs, stage, row, seed) for stage, rows, seeds in steps for seed in seeds for row in rows]
        test = read_json(Path(runs.results_dir) / "test.json")
        read = test.get("finished_at") if test else None
        return [*lines, f"choice: {choice['chosen'] if choice else 'not made (the screen is not complete)'}; test set: "
                        f"{('read at ' + read) if read else 'started, unfinished' if test else 'not read'}"]
