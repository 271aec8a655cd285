#!/usr/bin/env python
"""A long run stays flat: 2,000 training steps of the tiny shape with every method on; resident memory
and step time per block of steps, and whether they grew from the first block to the last.

    python benchmarks/long_run.py --steps 2000 --out benchmarks/results/long_run_cpu_tiny.json

(``tests/test_long_run.py`` is the fast check: no tensor is left behind per step.)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.experiment.presets import method_settings
from hf_headattn.registry import readout_flags
from setups import SHAPES, make_batch

#: Every built-in method on (recipe method names; EaDRA on all three components).
EVERY_METHOD = method_settings("dhicm+eadra_all+lpea_rhe")


def rss_mib() -> float:
    """The current resident set size (Linux /proc), in MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--block", type=int, default=100, help="steps per reported block")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    shape, batch_size, length = SHAPES["tiny"]
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**shape, **EVERY_METHOD, dropout=0.1)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(model.config, batch_size, length, "cpu")
    blocks = []
    for start in range(0, args.steps, args.block):
        times = []
        for _ in range(min(args.block, args.steps - start)):
            begin = time.perf_counter()
            out = model(**batch, **dict.fromkeys(readout_flags(), True))  # every read-out, too
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - begin)
        blocks.append({"steps": start + len(times), "rss_mib": round(rss_mib(), 1),
                       "median_step_ms": round(1000 * statistics.median(times), 2)})
        print(blocks[-1], flush=True)
    first, last = blocks[1] if len(blocks) > 1 else blocks[0], blocks[-1]  # the first block warms up
    result = {"steps": args.steps, "blocks": blocks, "rss_growth_mib": round(last["rss_mib"] - first["rss_mib"], 1),
              "step_time_ratio_last_to_second_block": round(last["median_step_ms"] / first["median_step_ms"], 3),
              "torch": torch.__version__}
    print(json.dumps({k: v for k, v in result.items() if k != "blocks"}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
