#!/usr/bin/env python
"""The methods at convergence (docs/results/converged-study.md): every run trained to early stopping on validation
BLEU, with a wall-clock cap; a study that accumulates run by run and can be stopped and resumed at will.

Rows (``ROWS``): the baseline; DHICM (last encoder and decoder layer, lambda 0.1) with the KL joined ``per_batch`` and
``per_token``; EaDRA (encoder and decoder self-attention, Table 6's WMT En-De alphas, Eq. 8 per query pair) with
``alpha_scale`` 0.1, 0.3 and 1.0; DEA+RHE and LPEA+RHE (first encoder layer, k = 6). The steps (``STEPS``), every
choice on validation: ``screen`` every row with seed 1; ``confirm`` per method the row with the best validation BLEU
of the screen, and the baseline, with seeds 2 and 3 (after the whole screen; the choice goes to ``choice.json``);
``test``: test_2016_flickr, read once, for the confirmed runs, after their confirmation (``test.json``); ``table``
(stdout and ``<results_dir>/README.md``); ``status``. ``compare`` screens the papers' comparison systems
(``COMPARISON``: Rel_Pos and Localness, each with and without RHE, and fixed attention, all but one encoder head fixed)
with seed 1 beside the screen, against its baseline; they are not candidates of the choice. Each run trains until its
greedy validation BLEU has not improved for ``--patience`` epochs, for at most ``--max_epochs`` epochs and
``--time_cap_minutes`` minutes of training in all; its best checkpoint is scored (beam 5), its record written to
``<results_dir>`` the moment it finishes; a restart resumes the unfinished runs from their last epoch
(:mod:`workshop.launch`); checkpoints go to ``--output_dir``. Stop it with Ctrl-C or ``kill -- -PGID`` (killing its
process alone leaves its runs going).

    # CPU (2 cores): the tiny shape, 2 runs at a time with 1 thread each. The same line starts and resumes the study
    # (each step skips what is done; confirm, test and table wait for the step before). An epoch is 454 steps:
    # 0.52 s a step alone on an idle machine, 0.8-1.2 s with two runs and other jobs: 4-10 min an epoch with the
    # 20-30 s evaluation. At 15-40 epochs a run (early stopping decides) that is 1.5-6 h a run, about 3 h typically;
    # 16 runs two at a time: about 24 h (15-45 h), eight 3-hour sessions.
    python research/converged_study.py screen --parallel 2    # then confirm, test, table likewise; status: how far

    # GPU: the small shape, 10 runs sharing the GPU (start CUDA MPS first: nvidia-cuda-mps-control -d). On one H200
    # the 8 rows of the screen, 8 at a time, stopped early after 24-40 epochs, 5-10 min of training each; the
    # confirmation's 8 runs and the test reading took 9 minutes. The checkpoints stay on that machine: confirm and
    # test there. Make the tokenizer and the parses first where spaCy is installed, then carry them over:
    python research/converged_study.py prepare --device cuda       # -> runs/converged-cuda/{tokenizer,parses}
    python research/converged_study.py screen --device cuda --parallel 10   # then confirm, test, table likewise
    python research/converged_study.py compare --device cuda --parallel 5   # the comparison rows: one GPU loan, with
    # the tokenizer and parses carried (research/gpu_comparison.sh: the whole call, records back in one archive)

Defaults per device (``DEVICES``): CPU: the tiny shape with ``make demo``'s schedule, at most 60 epochs and 600
minutes per run; GPU (``--device cuda``): the small shape with the reproduction's schedule (bf16), at most 150 epochs
and 180 minutes per run. Flags after ``--`` go to every ``hf-headattn train`` run (and join the runs' identity).
"""

from __future__ import annotations

import argparse
import json
import sys
from operator import itemgetter
from pathlib import Path

from hf_headattn.experiment.arguments import existing_file, multi30k_folder
from hf_headattn.experiment.data import TEST_SPLIT as TEST
from hf_headattn.experiment.evaluation import markdown_table, mean_sd, per_seed
from hf_headattn.experiment.presets import model_shape
from hf_headattn.syntax_inputs.provider import uses_syntax
from workshop import DEMO_SCHEDULE, REPRODUCTION_SCHEDULE, command_line, parse_sources, prepare_tokenizer, references
from workshop.arguments import add_run_arguments, apply_device_defaults, split_passthrough
from workshop.launch import ConvergenceRuns, convergence_flags, launch, run_status
from workshop.protocol import StagedStudy
from workshop.rows import dhicm_row, eadra_row, fixed_attention_row, localness_row, rel_pos_row, sea_row
from workshop.runs import Runs, load_records, record_path, run_dir
from workshop.scoring import score_run
from workshop.sessions import StopRules
from workshop.tables import (
    against,
    epochs_trained,
    p_values_vs_baseline,
    protocol_note,
    scores_note,
    validation_curves,
)

HERE = Path(__file__).resolve().parent
STUDY, VALID, TEST_BEAMS = "converged", "validation", 5
#: row -> (method, settings). Every setting written out, so later default changes do not change a row.
ROWS: dict[str, tuple[str, dict]] = {
    "baseline": ("baseline", {}),
    "dhicm_per_batch": ("dhicm", dhicm_row("per_batch", 0.1)),
    "dhicm_per_token": ("dhicm", dhicm_row("per_token", 0.1)),
    "eadra_pair_mean_a0.1": ("eadra", eadra_row("pair_mean", alpha_scale=0.1)),
    "eadra_pair_mean_a0.3": ("eadra", eadra_row("pair_mean", alpha_scale=0.3)),
    "eadra_pair_mean_a1": ("eadra", eadra_row("pair_mean", alpha_scale=1.0)),
    "dea_rhe": ("sea", sea_row("dea")),
    "lpea_rhe": ("sea", sea_row("lpea")),
}
#: The papers' comparison systems (RHE's Tables 1-2: Rel_Pos, Localness, each with and without RHE; EaDRA's Tables
#: 3-4: fixed attention), screened by ``compare`` beside the rows above (seed 1, their table against the same
#: baseline), not confirmed: the choice and the confirmation are the methods' alone.
COMPARISON: dict[str, tuple[str, dict]] = {
    "rel_pos": ("rel_pos", rel_pos_row("all")),
    "rel_pos_rhe": ("rel_pos", rel_pos_row("redundant")),
    "localness": ("localness", localness_row("all")),
    "localness_rhe": ("localness", localness_row("redundant")),
    "fixed_attention": ("fixed_attention", fixed_attention_row(model_shape("small")["encoder_attention_heads"])),
}
ALL_ROWS = {**ROWS, **COMPARISON}
#: The rows each launching command chooses ``--rows`` among.
STAGE_ROWS = {"screen": ROWS, "compare": COMPARISON}
#: The screen with seed 1, the confirmation with the fresh seeds 2 and 3 (seed 1 chose the rows), and the criterion.
STEPS = StagedStudy({row: method for row, (method, _) in ROWS.items()}, (1,), (2, 3),
                    "screen seed 1, validation BLEU (beam 5) of the best checkpoint by greedy validation BLEU")
#: Per device: the schedule (name, flags, vocabulary size) and the defaults of the folders, the time cap per run
#: (minutes), the most epochs and the runs at a time. The CPU's epoch is 454 steps (batches of 64), the GPU's 114.
DEVICES = {
    "cpu": {"schedule": "cpu-tiny-demo", "flags": [*DEMO_SCHEDULE, "--use_cpu", "true"], "vocab_size": 6000,
            "output_dir": "runs/converged", "results_dir": "benchmarks/results/converged", "time_cap_minutes": 600.0,
            "max_epochs": 60, "parallel": 2},
    "cuda": {"schedule": "cuda-small-reproduction", "vocab_size": 8000, "flags": [
                 *REPRODUCTION_SCHEDULE, "--logging_steps", "50", "--report_to", "none",
                 "--dataloader_num_workers", "0", "--bf16", "true"],
             "output_dir": "runs/converged-cuda", "results_dir": "benchmarks/results/converged-cuda",
             "time_cap_minutes": 180.0, "max_epochs": 150, "parallel": 10},
}


def identity(args, row: str, seed: int) -> dict:
    """What makes a run the run it is: a run directory or record with another identity is refused, not resumed."""
    name, flags = DEVICES[args.device]["schedule"], DEVICES[args.device]["flags"]
    return {"study": STUDY, "row": row, "seed": seed, "settings": ALL_ROWS[row][1], "schedule": name,
            "schedule_flags": flags, "patience": args.patience, "max_epochs": args.max_epochs,
            "extra_flags": list(args.extra)}


def train_command(args, stage: str, row: str, seed: int) -> list[str]:
    """The ``hf-headattn train`` command of a run, before the per-session flags (resume, time left)."""
    return [
        *command_line("train"), "--multi30k_dir", str(args.multi30k_dir),
        *DEVICES[args.device]["flags"], *convergence_flags(args.patience, args.max_epochs, TEST_BEAMS),
        "--method", "baseline", "--method_settings", json.dumps(ALL_ROWS[row][1]),
        "--tokenizer_name", str(args.tokenizer_dir),
        *(["--syntax_parses_dir", str(args.parses_dir)] if uses_syntax(ALL_ROWS[row][1]) else []),
        "--seed", str(seed), "--output_dir", str(run_dir(args.output_dir / stage, row, seed)), *args.extra,
    ]


def score_command(args, row: str, seed: int) -> list[str]:
    """The command that scores a confirmed run's best checkpoint on the test set (this recipe's ``score``)."""
    record = record_path(args.results_dir, "confirm", row, seed)
    return [sys.executable, str(Path(__file__).resolve()), "score", "--record", str(record), "--split", TEST,
            "--out", str(record_path(args.results_dir, "test", row, seed)), "--device", args.device,
            "--multi30k_dir", str(args.multi30k_dir), "--parses_dir", str(args.parses_dir)]


def study_runs(args) -> ConvergenceRuns:
    """The study's runs, as the kit launches, records and reports them."""
    return ConvergenceRuns(
        args.output_dir, args.results_dir, StopRules(args.patience, args.max_epochs, args.time_cap_minutes),
        command=lambda stage, row, seed: train_command(args, stage, row, seed),
        identity=lambda row, seed: identity(args, row, seed), method_of=lambda row: ALL_ROWS[row][0],
        prepare=lambda rows: prepare(args, rows), repo=HERE.parent, num_beams=TEST_BEAMS, parallel=args.parallel,
        threads=args.threads)


def prepare(args, rows) -> None:
    """The shared tokenizer, and the parses when a row uses SEA (both reused when already there)."""
    if not (Path(args.tokenizer_dir) / "source.spm").is_file():
        print(f"training the shared tokenizer into {args.tokenizer_dir}", flush=True)
    prepare_tokenizer(args.tokenizer_dir, args.multi30k_dir, DEVICES[args.device]["vocab_size"])
    if any(uses_syntax(ALL_ROWS[row][1]) for row in rows) and not (Path(args.parses_dir) / "parser.json").is_file():
        print(f"parsing the sources into {args.parses_dir} (spaCy)", flush=True)
        parse_sources(args.multi30k_dir, args.parses_dir)


def screen_table(screen: Runs, refs: dict[str, list[str]], rows=ROWS) -> str:
    """Seed 1 of each of ``rows`` on validation: the best checkpoint's beam-5 BLEU and chrF, its p against the
    baseline, the best greedy BLEU of the curve, epochs to the best and trained, training hours."""
    seed, table = STEPS.screen_seeds[0], []
    for row in rows:
        if seed not in screen.get(row, {}):
            table.append([row, "(running or not started)", *[""] * 6])
            continue
        run = screen[row][seed]
        p = p_values_vs_baseline(row, screen.get("baseline", {}), {seed: run}, refs[VALID],
                                 itemgetter("validation_predictions"))
        table.append([row, f"{run['validation']['bleu']:.2f}", f"{run['validation']['chrf']:.2f}",
                      per_seed(p, ".3f"), f"{run['best_greedy_validation_bleu']:.2f}", f"{run['best_epoch']:.0f}",
                      epochs_trained(run), f"{run['train_time_s'] / 3600:.2f}"])
    return markdown_table(["row", "valid BLEU (beam 5)", "valid chrF", "p vs baseline", "best greedy valid BLEU",
                           "epochs to best", "epochs trained", "train h"], table)


def confirm_table(confirm: Runs, tests: Runs, rows: list[str], refs: dict[str, list[str]]) -> str:
    """The confirmed rows over the fresh seeds: validation (beam 5, best checkpoint) and, once the test step ran,
    test_2016_flickr; mean ± sd, each seed's difference from the baseline of the same seed with its p, epochs to
    convergence."""
    base, base_test, table = confirm.get("baseline", {}), tests.get("baseline", {}), []
    for row in rows:
        runs, test = confirm.get(row, {}), tests.get(row, {})
        seeds = sorted(runs)
        if not seeds:
            table.append([row, 0, "(running or not started)", *[""] * 6])
            continue
        valid_vs = against({s: r["validation"]["bleu"] for s, r in runs.items()},
                           {s: r["validation"]["bleu"] for s, r in base.items()},
                           p_values_vs_baseline(row, base, runs, refs[VALID], itemgetter("validation_predictions")))
        test_vs = against({s: r["bleu"] for s, r in test.items()}, {s: r["bleu"] for s, r in base_test.items()},
                          p_values_vs_baseline(row, base_test, test, refs[TEST], itemgetter("predictions")))
        table.append([row, len(seeds), mean_sd(runs[s]["validation"]["bleu"] for s in seeds), valid_vs,
                      mean_sd(test[s]["bleu"] for s in sorted(test)) if test else "not read yet", test_vs,
                      mean_sd(test[s]["chrf"] for s in sorted(test)) if test else "-",
                      per_seed([runs[s]["best_epoch"] for s in seeds], ".0f"),
                      " / ".join(epochs_trained(runs[s]) for s in seeds)])
    return markdown_table(["row", "seeds", "valid BLEU", "vs baseline, valid (per seed)", "test BLEU",
                           "vs baseline, test (per seed)", "test chrF", "epochs to best", "epochs trained"], table)


def table(args) -> str:
    """The markdown tables, printed and written to ``<results_dir>/README.md``."""
    screen, choice = load_records(args.results_dir, "screen", ALL_ROWS, STEPS.screen_seeds), STEPS.stored_choice(
        args.results_dir)
    refs = references(args.multi30k_dir, [VALID, TEST])
    any_run = next((run for runs in screen.values() for run in runs.values()), None)
    parts = [f"# The methods at convergence (issue #26): Multi30k En-De, schedule `{DEVICES[args.device]['schedule']}`",
             "", "Written by `python research/converged_study.py table"
             f"{' --device cuda' if args.device == 'cuda' else ''}` from the JSON records here.",
             protocol_note(any_run["patience"] if any_run else args.patience,
                           any_run["max_epochs"] if any_run else args.max_epochs, TEST_BEAMS, TEST),
             "", "## Screen (seed 1, validation)", "", screen_table(screen, refs)]
    if any(row in screen for row in COMPARISON):
        parts += ["", "## The papers' comparison systems (screen, seed 1, validation)", "",
                  "Screened by `compare` against the same baseline run; not candidates of the choice, not confirmed.",
                  "", screen_table(screen, refs, COMPARISON)]
    confirm, tests = STEPS.chosen_records(args.results_dir, "confirm"), STEPS.chosen_records(args.results_dir, "test")
    if choice:
        parts += ["", f"Chosen on validation: {choice['chosen']} (screen seed 1, beam-5 validation BLEU).", "",
                  f"## Confirmation (fresh seeds {choice['seeds']}; test read once, for these rows)", "",
                  confirm_table(confirm, tests, choice["rows"], refs)]
    parts += ["", scores_note(any_run, TEST_BEAMS), "",
              "## Validation curves (greedy BLEU at each epoch)", "", validation_curves("screen", screen, ALL_ROWS),
              *([validation_curves("confirm", confirm, ROWS)] if confirm else [])]
    markdown = "\n".join(parts) + "\n"
    (Path(args.results_dir) / "README.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    return markdown


def status(runs: ConvergenceRuns) -> list[str]:
    """The study's status lines (:meth:`StagedStudy.status`), the comparison rows' screen runs before the last."""
    lines = STEPS.status(runs)
    return [*lines[:-1], *[run_status(runs, "screen", row, seed) for seed in STEPS.screen_seeds for row in COMPARISON],
            lines[-1]]


def parse_args(argv=None) -> argparse.Namespace:
    """The command line; the folders, runs at a time, time cap and most epochs left out take ``--device``'s."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["prepare", "screen", "compare", "confirm", "test", "table", "status",
                                            "score"])
    add_run_arguments(parser, DEVICES)
    parser.add_argument("--rows", nargs="+", choices=list(ALL_ROWS),
                        help="screen, compare: these of its rows only (default: all of them)")
    parser.add_argument("--record", type=existing_file, help=argparse.SUPPRESS)
    parser.add_argument("--split", default=TEST, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    argv, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.extra = extra
    apply_device_defaults(args, DEVICES[args.device])
    if args.command in {"confirm", "test", "table", "status"} and not args.results_dir.is_dir():
        parser.error(f"--results_dir {args.results_dir} is not a folder; expected the study's records (made by "
                     f"screen; the default for --device {args.device} is {DEVICES[args.device]['results_dir']})")
    if args.command != "status":
        args.multi30k_dir = multi30k_folder(parser, args.multi30k_dir, ("en", "de"))
    if args.command == "score" and not (args.record and args.out):
        parser.error("score needs --record and --out (test runs it for each confirmed run)")
    if args.rows and args.command not in STAGE_ROWS:
        parser.error(f"--rows chooses the rows of screen and compare only; {args.command} runs the rows of "
                     "choice.json")
    if args.rows and not set(args.rows) <= set(STAGE_ROWS[args.command]):
        parser.error(f"--rows {' '.join(row for row in args.rows if row not in STAGE_ROWS[args.command])}: not rows "
                     f"of {args.command}; expected some of {list(STAGE_ROWS[args.command])}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    runs = study_runs(args)
    {"prepare": lambda: prepare(args, list(ALL_ROWS)),
     "screen": lambda: launch(runs, "screen", args.rows or list(ROWS), STEPS.screen_seeds),
     "compare": lambda: launch(runs, "screen", args.rows or list(COMPARISON), STEPS.screen_seeds),
     "confirm": lambda: STEPS.confirm(runs),
     "test": lambda: STEPS.test(runs, lambda row, seed: score_command(args, row, seed), TEST, TEST_BEAMS),
     "table": lambda: table(args),
     "status": lambda: print("\n".join(status(runs))),
     "score": lambda: score_run(args.record, args.split, args.out, multi30k_dir=args.multi30k_dir,
                                parses_dir=args.parses_dir, num_beams=TEST_BEAMS, device=args.device, repo=HERE.parent),
     }[args.command]()


if __name__ == "__main__":
    main()
