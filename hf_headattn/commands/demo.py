"""`hf-headattn demo` (`make demo`): a baseline and two method-enhanced models on Multi30k En-De, on the CPU, in about
15 minutes (`--quick`, `make demo-quick`: the same with a smoke-run schedule, about 8 minutes on two cores, whose rows
show that everything runs: after 60 steps every model still emits the same few words, so their predictions can be
alike).

Trains the same tiny Transformer three times with a short schedule (baseline, DHICM, EaDRA, each at its default
settings: the readings the fidelity study chose and the converged study kept, docs/results/converged-study.md),
translates test_2016_flickr with beam search, prints a sacreBLEU/chrF table with DHICM's top-head share and writes the
analysis pictures (DHICM head importance like the paper's Figure 3; per-head attention entropy) as PNG files whose
paths it prints.

    hf-headattn demo [--quick] [--methods baseline dhicm eadra] [--max_steps 500] [--output_dir outputs/demo]

Multi30k comes from --multi30k_dir, else is found or downloaded (HF_HEADATTN_DATA, ../shared/data/multi30k, the
cache, the public repository: hf_headattn.experiment.multi30k).
"""

from __future__ import annotations

import argparse
import gzip
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hf_headattn.cli import refuse_python_m
from hf_headattn.commands import train as train_translation
from hf_headattn.experiment.analysis import (
    encoder_attention_entropy,
    plot_head_importance,
    sentence_head_importance,
    write_entropy_report,
)
from hf_headattn.experiment.arguments import existing_dir, multi30k_folder, positive_int
from hf_headattn.experiment.data import TEST_SPLIT
from hf_headattn.experiment.method_modules import add_method_modules_argument, import_or_exit
from hf_headattn.experiment.outputs import check_output_dir, remove_entries
from hf_headattn.experiment.presets import method_settings, split_architecture
from hf_headattn.experiment.recipe_parts import scratch_config, write_json
from hf_headattn.methods.dhicm.core import METHOD as IMPORTANCE_METHOD


@dataclass(frozen=True)
class Schedule:
    """How long the demo trains and how much it translates."""

    max_steps: int
    batch_size: int
    num_beams: int
    vocab_size: int
    warmup_steps: int
    train_samples: int | None  # None: all 29,000 pairs
    test_samples: int  # of test_2016_flickr's 1,000 sentences, also the sentences of the entropy pictures
    label: str


FULL = Schedule(500, 64, 5, 6000, 100, None, 1000, "a short CPU schedule, so scores are far below converged ones")
QUICK = Schedule(60, 32, 1, 2000, 20, 1920, 100, "SMOKE RUN (--quick): 60 steps of 32 pairs, greedy search, 100 test "
                 "sentences; the scores show that everything runs, not what a method does (60 steps teach no model "
                 "more than a few words: the rows' predictions can be alike)")


def train(method: str, args) -> dict:
    out = Path(args.output_dir) / method
    schedule = args.schedule
    argv = [
        "--multi30k_dir", str(args.multi30k_dir), "--source_lang", "en", "--target_lang", "de",
        "--model_shape", "tiny", "--method", method, "--output_dir", str(out),
        "--vocab_size", str(schedule.vocab_size), "--max_steps", str(args.max_steps),
        "--per_device_train_batch_size", str(schedule.batch_size), "--learning_rate", "2e-3",
        "--warmup_steps", str(schedule.warmup_steps),
        "--lr_scheduler_type", "inverse_sqrt", "--adam_beta2", "0.98", "--weight_decay", "0.0001",
        "--eval_strategy", "no", "--save_strategy", "no", "--logging_steps", str(min(50, args.max_steps)),
        "--report_to", "none", "--num_beams", str(args.num_beams), "--test_splits", TEST_SPLIT,
        "--max_predict_samples", str(schedule.test_samples), "--per_device_eval_batch_size", "100", "--seed", "1",
        "--use_cpu", "true",
    ]
    if schedule.train_samples is not None:
        argv += ["--max_train_samples", str(schedule.train_samples)]
    if args.tokenizer:
        argv += ["--tokenizer_name", str(args.tokenizer)]
    if args.method_modules:
        argv += ["--method_modules", *args.method_modules]
    print(f"\n=== training {method} ({args.max_steps} steps) -> {out}", flush=True)
    return train_translation.main(argv)


def top_head_share(result: dict) -> float | None:
    """DHICM's share of tokens whose top head carries > 0.9 of the importance, over the last logging interval
    (1.0: collapsed to one head per token; None without DHICM)."""
    values = [entry["dhicm_stats/top_head_share"] for entry in result["log_history"]
              if "dhicm_stats/top_head_share" in entry]
    return values[-1] if values else None


def pictures(args, methods) -> list[Path]:
    """DHICM head importance (the paper's Figure 3) and per-head encoder attention entropy (EaDRA's Figure 1): the
    PNG files (the entropy numbers go to a JSON file beside each entropy picture)."""
    from transformers import AutoModelForSeq2SeqLM

    from hf_headattn.experiment.tokenization import load_tokenizer

    out, paths = Path(args.output_dir), []
    sources = [line.strip() for line in gzip.open(args.multi30k_dir / f"{TEST_SPLIT}.en.gz", "rt")]
    sources = sources[:min(200, args.schedule.test_samples)]
    for method in methods:
        model = AutoModelForSeq2SeqLM.from_pretrained(out / method).eval()
        tokenizer = load_tokenizer(out / method)
        batches = [tokenizer(sources[i:i + 50], return_tensors="pt", padding=True) for i in range(0, len(sources), 50)]
        result = encoder_attention_entropy(model, batches)
        _, png = write_entropy_report(result, out, f"attention_entropy_{method}",
                                      f"encoder attention entropy, {method}")
        paths.append(png)
        importance = model.config.headattn_settings.get(IMPORTANCE_METHOD.name)  # None: no importances to draw
        if importance is not None and importance.encoder_layers:
            source, target = sources[0], "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."
            last = model.config.encoder_layers - 1
            for module in (f"encoder.layers.{last}.self_attn", f"decoder.layers.{last}.encoder_attn"):
                tokens, importance = sentence_head_importance(model, tokenizer, source, target, module)
                paths.append(plot_head_importance(importance, tokens, out / f"head_importance_{method}_{module}.png",
                                                  title=f"DHICM head importance, {module}"))
    return paths


def main(argv=None, prog: str | None = None) -> None:
    """The demo on `argv` (default `sys.argv[1:]`); `prog`: the name its usage and errors give (default the
    script's, argparse's)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK.label}")
    parser.add_argument("--methods", nargs="+", default=["baseline", "dhicm", "eadra"])
    parser.add_argument("--max_steps", type=positive_int, help=f"default {FULL.max_steps} ({QUICK.max_steps} quick)")
    parser.add_argument("--num_beams", type=positive_int, help=f"default {FULL.num_beams} ({QUICK.num_beams} quick)")
    parser.add_argument("--multi30k_dir", "--data", type=Path,
                        help="Multi30k's folder (default: found or downloaded, see the module docstring)")
    parser.add_argument("--output_dir", default=None, help="default outputs/demo (outputs/demo-quick with --quick)")
    parser.add_argument("--tokenizer", type=existing_dir, default=None, help="reuse a saved tokenizer")
    parser.add_argument("--overwrite_output_dir", action="store_true",
                        help="replace an earlier demo's results in --output_dir (without it, they are refused)")
    add_method_modules_argument(parser)  # --methods may then name their methods
    args = parser.parse_args(argv)
    import_or_exit(parser, args.method_modules)
    args.schedule = QUICK if args.quick else FULL
    args.max_steps = args.max_steps or args.schedule.max_steps
    args.num_beams = args.num_beams or args.schedule.num_beams
    args.output_dir = args.output_dir or ("outputs/demo-quick" if args.quick else "outputs/demo")
    for method in args.methods:
        try:  # the names, and their settings on the demo's tiny shape (two methods that cannot meet: refused)
            scratch_config(*split_architecture("tiny", method_settings(method)), max_length=128,
                           vocab_size=args.schedule.vocab_size)
        except ValueError as error:
            parser.error(f"--methods: {error}")
    # an earlier demo's results are replaced only when asked; the data and tokenizer it reads never
    results = re.compile(rf"{'|'.join(map(re.escape, args.methods))}|summary\.json|attention_entropy_.+"
                         r"|head_importance_.+")
    try:
        check_output_dir(args.output_dir, {"--multi30k_dir": args.multi30k_dir}, results=results, overwrite=True)
        args.multi30k_dir = multi30k_folder(parser, args.multi30k_dir, ("en", "de"))
        inputs = {"the Multi30k folder": args.multi30k_dir, "--tokenizer": args.tokenizer}
        earlier = check_output_dir(args.output_dir, inputs, results=results, overwrite=args.overwrite_output_dir,
                                   overwrite_flag="--overwrite_output_dir",
                                   hint=" (with make: make demo ARGS=--overwrite_output_dir)")
    except ValueError as error:
        parser.error(str(error))
    remove_entries(earlier)
    torch.manual_seed(0)
    start = time.perf_counter()
    results = {}
    for method in args.methods:
        results[method] = train(method, args)
        args.tokenizer = args.tokenizer or Path(args.output_dir) / method / "tokenizer"  # one vocabulary for all
    print("\n| method | BLEU | chrF | train time (s) | DHICM top-head share |\n|---|---|---|---|---|")
    for method, result in results.items():
        scores = result["scores"][TEST_SPLIT]
        share = top_head_share(result)
        print(f"| {method} | {scores['bleu']:.2f} | {scores['chrf']:.2f} | {result['train_time_s']:.0f} | "
              f"{'-' if share is None else f'{share:.2f}'} |")
    print(f"\nsacreBLEU signature: {scores['bleu_signature']}\nchrF signature: {scores['chrf_signature']}")
    print(f"({TEST_SPLIT}, {args.schedule.test_samples} sentences; {args.schedule.label})")
    print("(the methods' defaults are the readings that the study at convergence kept: "
          "docs/results/converged-study.md)")
    for path in pictures(args, list(results)):
        print(f"picture: {path}")
    summary = write_json(Path(args.output_dir) / "summary.json", {
        m: {"scores": r["scores"], "train_time_s": r["train_time_s"], "settings": r["settings"],
            "top_head_share": top_head_share(r)}
        for m, r in results.items()
    })
    print(f"summary: {summary}\ndemo finished in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":  # `python -m` of this module: a usage error naming the command to run
    refuse_python_m(__spec__.name)
