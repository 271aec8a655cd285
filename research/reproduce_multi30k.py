#!/usr/bin/env python
"""The reproduction table (docs/results/reproduction-multi30k.md): Multi30k En-De from scratch, one row per method,
several seeds, one set of hyperparameters (``COMMON_FLAGS``), scored on ``test_2016_flickr`` with sacreBLEU and paired
bootstrap.

    # train every row and seed (runs side by side; on one GPU they share it), then print the table
    python research/reproduce_multi30k.py run --output_dir runs/multi30k --seeds 1 2 --parallel 10
    python research/reproduce_multi30k.py table --output_dir runs/multi30k

    # a paper's comparison table (PAPER_TABLES): RHE's Tables 1-2, EaDRA's Tables 3-5
    python research/reproduce_multi30k.py run --table rhe-table-1 --output_dir runs/rhe-table-1 --seeds 1 2

    # the same on a CPU, smaller (flags after "--" go to every hf-headattn train run and win)
    python research/reproduce_multi30k.py run --output_dir runs/cpu --parallel 2 -- --model_shape tiny --use_cpu true

``run`` trains one joint tokenizer for all rows, and, when a row uses SEA, parses the sources once with spaCy
(``hf-headattn parse``; or pass ``--parses_dir`` made elsewhere). Each run writes ``<row>/seed<k>/`` with
``results.json``, ``predictions_test_2016_flickr.txt`` and ``train.log``. ``table`` reads them: the mean and the
sample standard deviation over seeds, and for each seed a paired bootstrap (sacreBLEU's, 1000 resamples) of the row
against the baseline run with the same seed. "Best combination" rows (``a+b``) are chosen on validation BLEU, never
on the test set: ``table`` marks the combination with the highest mean validation BLEU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from hf_headattn.experiment.arguments import existing_dir, multi30k_folder, positive_float, positive_int
from hf_headattn.experiment.data import TEST_SPLIT
from workshop import REPRODUCTION_SCHEDULE, command_line, parse_sources, prepare_tokenizer
from workshop.arguments import split_passthrough
from workshop.runs import load_results, run_dir, training_jobs

ROWS = ["baseline", "dhicm", "eadra", "dea_rhe", "lpea_rhe"]
#: The papers' comparison tables as rows of this reproduction (``run --table NAME``): RHE's Table 1 (Zhang et al.
#: 2021: Rel_Pos and Localness beside DEA/LPEA+RHE, in their published layouts: Rel_Pos's tables per layer and head,
#: Localness's whole-query predictor, the recipe names' defaults), its Table 2 (the bias methods with and without
#: RHE: the RHE rows parse the sources, as SEA's do) and EaDRA's Tables 3-5 (Araabi et al.: Fixed-attention beside
#: EaDRA; mBART fine-tuning's rows are ``hf-headattn finetune``'s).
PAPER_TABLES = {
    "rhe-table-1": ["baseline", "rel_pos", "localness", "dea_rhe", "lpea_rhe"],
    "rhe-table-2": ["baseline", "rel_pos", "rel_pos_rhe", "localness", "localness_rhe"],
    "eadra-tables-3-5": ["baseline", "fixed_attention", "eadra"],
}

#: The hyperparameters every row shares (transformer_iwslt-like optimisation scaled to a 4+4-layer d=256 model).
COMMON_FLAGS = [
    *REPRODUCTION_SCHEDULE, "--num_train_epochs", "40",
    "--eval_strategy", "epoch", "--save_strategy", "epoch", "--save_total_limit", "1",
    "--load_best_model_at_end", "true", "--generation_num_beams", "1", "--num_beams", "5",
    "--test_splits", TEST_SPLIT, "--logging_steps", "50", "--report_to", "none", "--dataloader_num_workers", "0",
]


def prepare(args) -> tuple[Path, Path | None]:
    """The shared tokenizer, and the parses when a row needs them (both reused when already there)."""
    from hf_headattn.experiment.presets import method_settings
    from hf_headattn.syntax_inputs.provider import uses_syntax

    tokenizer_dir = args.tokenizer_dir  # one made earlier, used as given
    if tokenizer_dir is None:  # else trained, or reused when it was trained with these settings and data
        tokenizer_dir = args.output_dir / "tokenizer"
        prepare_tokenizer(tokenizer_dir, args.multi30k_dir, args.vocab_size, args.source_lang, args.target_lang)
    parses_dir = args.parses_dir
    if parses_dir is None and any(uses_syntax(method_settings(row)) for row in args.rows):
        parses_dir = args.output_dir / "parses"
        if not parses_dir.is_dir():
            parse_sources(args.multi30k_dir, parses_dir, args.source_lang, args.target_lang)
    return tokenizer_dir, parses_dir


def launch(args, extra: list[str]) -> None:
    """Train every row and seed, ``--parallel`` at a time, with the shared tokenizer (and parses)."""
    from workshop.jobs import run_jobs

    args.output_dir.mkdir(parents=True, exist_ok=True)
    data_flags = ["--multi30k_dir", str(args.multi30k_dir), "--source_lang", args.source_lang,
                  "--target_lang", args.target_lang]
    tokenizer_dir, parses_dir = prepare(args)
    jobs = training_jobs(args.output_dir, args.rows, args.seeds, lambda row, seed: [
        *command_line("train"), *COMMON_FLAGS, *data_flags,
        "--vocab_size", str(args.vocab_size), "--method", row, "--seed", str(seed),
        "--output_dir", str(run_dir(args.output_dir, row, seed)), "--overwrite_output_dir",  # a failed run: afresh
        "--tokenizer_name", str(tokenizer_dir),
        *(["--syntax_parses_dir", str(parses_dir)] if parses_dir else []), *extra])
    print(f"runs into {args.output_dir}", flush=True)
    failed = run_jobs(jobs, args.parallel, args.threads)
    if failed:
        logs = {name: str(log) for name, _, log in jobs}
        raise RuntimeError(f"{len(failed)} run(s) failed; their logs: {[logs[name] for name in failed]}")


def _validation_bleu(results: dict) -> float:
    """The validation BLEU of the checkpoint kept (the lowest validation loss), from the log history."""
    evals = [entry for entry in results["log_history"] if "eval_loss" in entry]
    return min(evals, key=lambda entry: entry["eval_loss"])["eval_bleu"] if evals else float("nan")


def _validation_bleu_at(results: dict, epoch: float) -> float:
    """The validation BLEU after ``epoch`` epochs (from the log history; nan if the run never got there)."""
    found = [entry["eval_bleu"] for entry in results["log_history"]
             if "eval_bleu" in entry and abs(entry["epoch"] - epoch) < 0.01]
    return found[0] if found else float("nan")


def summarize(output_dir: Path, rows: list[str] | None = None, at_epoch: float | None = None
              ) -> tuple[list[dict], str]:
    """One dict per row (scores per seed, means, bootstrap p-values against the baseline) and a markdown table;
    ``at_epoch`` adds each run's validation BLEU after that many epochs (equal training for every row)."""
    from dataclasses import fields

    from hf_headattn.experiment.evaluation import markdown_table, mean_sd, per_seed
    from hf_headattn.experiment.recipe_parts import ParallelDataArguments, load_recipe_data
    from workshop.tables import p_values_vs_baseline

    runs = load_results(output_dir, rows)
    rows = rows or sorted(runs, key=lambda name: (name != "baseline", "+" in name, name))
    if "baseline" not in runs or not runs["baseline"]:
        raise ValueError(f"no baseline runs under {output_dir}; the bootstrap compares every row with them")
    any_run = next(iter(runs["baseline"].values()))
    data_args = ParallelDataArguments(**{f.name: any_run["args"][f.name] for f in fields(ParallelDataArguments)})
    references = [pair[data_args.target_lang] for pair in load_recipe_data(data_args)[TEST_SPLIT]["translation"]]
    combos = [row for row in rows if "+" in row]
    best_combo = max(combos, key=lambda r: statistics.mean(map(_validation_bleu, runs[r].values())), default=None)
    summary = []
    for row in rows:
        seeds = sorted(runs[row])
        summary.append({
            "row": row, "seeds": seeds, "best_combination": row == best_combo,
            "bleu": [runs[row][s]["scores"][TEST_SPLIT]["bleu"] for s in seeds],
            "chrf": [runs[row][s]["scores"][TEST_SPLIT]["chrf"] for s in seeds],
            "validation_bleu": [_validation_bleu(runs[row][s]) for s in seeds],
            "train_time_s": [runs[row][s]["train_time_s"] for s in seeds],
            "epochs": [runs[row][s]["epochs"] for s in seeds],
            "ms_per_step": [1000 * runs[row][s]["train_time_s"] / max(1, runs[row][s].get("global_step", 0))
                            for s in seeds],
            "stopped_at_time_limit": [runs[row][s].get("stopped_at_time_limit", False) for s in seeds],
            "p_values": p_values_vs_baseline(row, runs["baseline"], runs[row], references,
                                             lambda run: run["predictions"][TEST_SPLIT]),
        })
        if at_epoch is not None:
            summary[-1]["validation_bleu_at_epoch"] = [_validation_bleu_at(runs[row][s], at_epoch) for s in seeds]
    signature = any_run["scores"][TEST_SPLIT]["bleu_signature"]
    at_epoch_column = [] if at_epoch is None else [f"valid BLEU at epoch {at_epoch:g}"]
    header = ["method", "seeds", "BLEU (mean ± sd)", "per seed", "chrF", "valid BLEU", "p vs baseline (per seed)",
              "train min", "ms/step", "epochs", *at_epoch_column]
    table = []
    for entry in summary:
        limit = " (time limit)" if any(entry["stopped_at_time_limit"]) else ""
        table.append([
            entry["row"] + (" (best combination on validation)" if entry["best_combination"] else ""),
            len(entry["seeds"]), mean_sd(entry["bleu"]), per_seed(entry["bleu"]), mean_sd(entry["chrf"]),
            mean_sd(entry["validation_bleu"]), per_seed(entry["p_values"], ".3f"),
            f"{statistics.mean(entry['train_time_s']) / 60:.1f}", f"{statistics.mean(entry['ms_per_step']):.0f}",
            per_seed(entry["epochs"], ".1f") + limit,
            *([mean_sd(entry["validation_bleu_at_epoch"])] if at_epoch is not None else []),
        ])
    footer = f"sacreBLEU {signature}; bootstrap: sacreBLEU paired bootstrap, 1000 resamples, seed 12345."
    return summary, markdown_table(header, table) + "\n\n" + footer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train every row and seed")
    run.add_argument("--output_dir", type=Path, required=True)
    rows = run.add_mutually_exclusive_group()
    rows.add_argument("--rows", nargs="+", default=ROWS,
                      help="method names (see presets.method_settings), '+' combines")
    rows.add_argument("--table", choices=sorted(PAPER_TABLES), help="the rows of a paper's table (PAPER_TABLES)")
    run.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    run.add_argument("--parallel", type=positive_int, default=1, help="runs at a time")
    run.add_argument("--threads", type=positive_int, default=1, help="CPU threads per run")
    run.add_argument("--multi30k_dir", type=Path, help="default: found or downloaded (docs/usage.md, Multi30k)")
    run.add_argument("--source_lang", default="en")
    run.add_argument("--target_lang", default="de")
    run.add_argument("--vocab_size", type=positive_int, default=8000)
    run.add_argument("--tokenizer_dir", type=existing_dir, help="a tokenizer made earlier (default: train one)")
    run.add_argument("--parses_dir", type=existing_dir,
                     help="parses made earlier by hf-headattn parse (default: parse)")
    table = sub.add_parser("table", help="summarise finished runs as a markdown table")
    table.add_argument("--output_dir", type=existing_dir, required=True)
    table.add_argument("--rows", nargs="+", help="rows in this order (default: every row found)")
    table.add_argument("--json", type=Path, help="also write the summary here")
    table.add_argument("--at_epoch", type=positive_float, help="add the validation BLEU after this many epochs")
    argv, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command == "run":
        from hf_headattn.experiment.presets import method_settings

        if args.table:
            args.rows = PAPER_TABLES[args.table]
        args.multi30k_dir = multi30k_folder(parser, args.multi30k_dir, (args.source_lang, args.target_lang))
        for row in args.rows:
            try:
                method_settings(row)
            except ValueError as error:
                parser.error(f"--rows: {error}")
        launch(args, extra)
    else:
        try:
            summary, markdown = summarize(args.output_dir, args.rows, args.at_epoch)
        except ValueError as error:  # e.g. no baseline runs under --output_dir
            parser.error(str(error))
        print(markdown)
        if args.json:
            args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
