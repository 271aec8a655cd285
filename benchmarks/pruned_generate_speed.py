"""``generate`` throughput of pruned models against the unpruned one, at every step of a pruning run.

For each step that ``hf-headattn prune`` recorded for ``--criterion`` (its ``pruning.json``), the trained model is
pruned as at that step and timed against the unpruned model on the same sources, alternately ``--repeats`` times in one
run (``hf_headattn.experiment.analysis.head_pruning.throughput_ratio``: the median of the per-repeat ratios). A model
pruned without its fine-tuning translates worse, and its translations have other lengths, which would time the lengths
rather than the heads: every translation is therefore exactly ``--forced_length`` tokens (``min_length`` =
``max_length``), so both models decode the same number of steps (``--forced_length 0``: real translations, up to 128
tokens). Run it on an idle machine: the JSON holds the ratio, the heads pruned per attention kind, and the parameters.

    python benchmarks/pruned_generate_speed.py --model_dir runs/converged/screen/baseline/seed1 \\
        --pruning_json outputs/prune_heads/pruning.json --criterion confidence --out outputs/pruned-speed.json
"""

from __future__ import annotations

import argparse
import copy
import json
from collections import Counter
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import hf_headattn  # noqa: F401  (registers the models)
from hf_headattn.experiment.analysis.head_pruning import throughput_ratio
from hf_headattn.experiment.data import load_parallel_dataset
from hf_headattn.experiment.multi30k import find_multi30k
from hf_headattn.head_masks import routed_modules
from hf_headattn.sites import component_of


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--pruning_json", type=Path, required=True)
    parser.add_argument("--criterion", required=True)
    parser.add_argument("--multi30k_dir", type=Path, help="default: found or downloaded (docs/usage.md, Multi30k)")
    parser.add_argument("--samples", type=int, default=300, help="validation sources translated per timing")
    parser.add_argument("--num_beams", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--forced_length", type=int, default=24, help="tokens per translation (0: real lengths)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    records = json.loads(args.pruning_json.read_text())["criteria"].get(args.criterion)
    if records is None:
        raise ValueError(f"{args.pruning_json} has no criterion {args.criterion!r}")
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    unpruned = AutoModelForSeq2SeqLM.from_pretrained(args.model_dir).eval()
    raw = load_parallel_dataset("en", "de", multi30k_dir=find_multi30k(args.multi30k_dir, languages=("en", "de")),
                                max_train_samples=1, max_eval_samples=args.samples)
    sources = [row["en"] for row in raw["validation"]["translation"]]
    modules, rows = routed_modules(unpruned), []
    forced = args.forced_length + 1  # the decoder start token counts in the length
    lengths = {"min_length": forced, "max_length": forced} if args.forced_length else {"max_length": 128}
    for record in records[1:]:
        model = copy.deepcopy(unpruned)
        model.prune_heads(record["pruned"])
        timing = throughput_ratio(model, unpruned, tokenizer, sources, args.repeats, **lengths,
                                  num_beams=args.num_beams, batch_size=args.batch_size)
        by_kind = Counter()
        for name, heads in record["pruned"].items():
            by_kind[component_of(modules[name])] += len(heads)
        rows.append({"share": record["share"], "heads_pruned": record["heads_pruned"], "by_kind": dict(by_kind),
                     "parameters": sum(p.numel() for p in model.parameters()), "throughput_ratio": timing["ratio"],
                     "sentences_per_second": timing["sentences_per_second"]})
        print(f"{record['heads_pruned']:3d} heads ({100 * record['share']:.0f}%) {dict(by_kind)}: "
              f"generate {timing['ratio']:.3f}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                                       indent=1))
    return rows


if __name__ == "__main__":
    main()
