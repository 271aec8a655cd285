#!/usr/bin/env python
"""`make demo`: a baseline and a method-enhanced model on Multi30k En-De, on the CPU, in about ten minutes.

Trains the same tiny Transformer twice with a short schedule (baseline, then DHICM), translates
test_2016_flickr with beam search, prints a sacreBLEU/chrF table and writes the analysis pictures (DHICM head
importance like the paper's Figure 3; per-head attention entropy) as PNG files whose paths it prints.

    python recipes/demo.py [--methods baseline dhicm] [--max_steps 500] [--output_dir outputs/demo]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_translation  # noqa: E402

from hf_headattn.analysis import mean_head_importance, plot_head_importance, sentence_head_importance  # noqa: E402
from hf_headattn.training import write_json  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


def train(method: str, args) -> dict:
    out = Path(args.output_dir) / method
    argv = [
        "--multi30k_dir", str(args.data), "--source_lang", "en", "--target_lang", "de", "--model_shape", "tiny",
        "--method", method, "--output_dir", str(out),
        "--vocab_size", "6000", "--max_steps", str(args.max_steps), "--per_device_train_batch_size", "64",
        "--learning_rate", "2e-3", "--warmup_steps", "100", "--lr_scheduler_type", "inverse_sqrt",
        "--adam_beta2", "0.98", "--weight_decay", "0.0001", "--eval_strategy", "no", "--save_strategy", "no",
        "--logging_steps", "50", "--report_to", "none", "--num_beams", str(args.num_beams),
        "--test_splits", "test_2016_flickr", "--per_device_eval_batch_size", "100", "--seed", "1",
        "--use_cpu", "true",
    ]
    if args.tokenizer:
        argv += ["--tokenizer_name", str(args.tokenizer)]
    print(f"\n=== training {method} ({args.max_steps} steps) -> {out}", flush=True)
    return train_translation.main(argv)


def pictures(args) -> list[Path]:
    """DHICM head importance (Figure 3 of the paper) from the DHICM run."""
    from hf_headattn import HeadAttnMarianMTModel
    from transformers import AutoTokenizer

    run = Path(args.output_dir) / "dhicm"
    if not (run / "config.json").is_file():
        return []
    model, tokenizer = HeadAttnMarianMTModel.from_pretrained(run), AutoTokenizer.from_pretrained(run)
    source, target = "A man in an orange hat starring at something.", "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."
    paths = []
    for module in ("encoder.layers.2.self_attn", "decoder.layers.2.encoder_attn"):
        tokens, importance = sentence_head_importance(model, tokenizer, source, target, module)
        paths.append(plot_head_importance(importance, tokens, Path(args.output_dir) / f"head_importance_{module}.png",
                                          title=f"DHICM head importance, {module}"))
    try:
        from hf_headattn.analysis import entropy  # noqa: F401  (EaDRA's analysis, where installed)
        from hf_headattn.analysis.entropy import encoder_entropy_report

        batches = [tokenizer([source], text_target=[target], return_tensors="pt")]
        report = encoder_entropy_report(model, batches, Path(args.output_dir) / "attention_entropy")
        paths.extend(Path(p) for p in report.get("files", []))
    except ImportError:
        pass
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["baseline", "dhicm"])
    parser.add_argument("--max_steps", type=int, default=500)
    parser.add_argument("--num_beams", type=int, default=5)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--output_dir", default="outputs/demo")
    parser.add_argument("--tokenizer", default=None, help="reuse a saved tokenizer")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        raise SystemExit(f"Multi30k not found at {args.data}: clone the project beside ../shared")
    torch.manual_seed(0)
    start = time.perf_counter()
    results = {}
    for method in args.methods:
        results[method] = train(method, args)
        args.tokenizer = args.tokenizer or Path(args.output_dir) / method / "tokenizer"  # one vocabulary for all
    print("\n| method | BLEU | chrF | train time (s) |\n|---|---|---|---|")
    for method, result in results.items():
        scores = result["scores"]["test_2016_flickr"]
        print(f"| {method} | {scores['bleu']:.2f} | {scores['chrf']:.2f} | {result['train_time_s']:.0f} |")
    print(f"\nsacreBLEU signature: {scores['bleu_signature']}\nchrF signature: {scores['chrf_signature']}")
    print("(test_2016_flickr, 1000 sentences; a short CPU schedule, so scores are far below converged ones)")
    for path in pictures(args):
        print(f"picture: {path}")
    summary = write_json(Path(args.output_dir) / "summary.json", {
        m: {"scores": r["scores"], "train_time_s": r["train_time_s"], "settings": r["settings"]}
        for m, r in results.items()
    })
    print(f"summary: {summary}\ndemo finished in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
