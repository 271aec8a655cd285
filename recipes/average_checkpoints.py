#!/usr/bin/env python
"""Average the weights of a run's last N checkpoints into a model that ``from_pretrained`` loads (RHE, Appendix A.1).

    # the last 10 checkpoint-<step> folders of a Trainer run (in step order)
    python recipes/average_checkpoints.py --run_dir outputs/rhe --last 10 --output_dir outputs/rhe/averaged

    # or an explicit list (the config and tokenizer files come from the last one)
    python recipes/average_checkpoints.py --checkpoints outputs/a/checkpoint-900 outputs/a/checkpoint-1000 \
        --output_dir outputs/a/averaged

Train with ``--save_strategy epoch`` (or steps) and no ``--save_total_limit`` below N, so the checkpoints exist.
Writes the averaged model, the last checkpoint's tokenizer files and ``averaged_from.json`` into ``--output_dir``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import HfArgumentParser

import hf_headattn  # noqa: F401  (registers our models with the Auto classes)
from hf_headattn.experiment.averaging import average_checkpoints, last_checkpoints


@dataclass
class AveragingArguments:
    output_dir: str = field(metadata={"help": "Where the averaged model is written"})
    run_dir: str | None = field(default=None, metadata={"help": "A Trainer output_dir with checkpoint-<step> folders"})
    last: int = field(default=10, metadata={"help": "With --run_dir: how many of the last checkpoints (RHE: 10)"})
    checkpoints: list[str] | None = field(default=None, metadata={"help": "Checkpoint folders (instead of --run_dir)"})


def main(argv=None) -> dict:
    (args,) = HfArgumentParser(AveragingArguments).parse_args_into_dataclasses(args=argv)
    if (args.run_dir is None) == (args.checkpoints is None):
        raise ValueError("give either --run_dir (with --last N) or --checkpoints, not both and not neither")
    checkpoints = last_checkpoints(args.run_dir, args.last) if args.run_dir else args.checkpoints
    average_checkpoints(checkpoints, args.output_dir)
    print(f"averaged {len(checkpoints)} checkpoints ({', '.join(map(str, checkpoints))}) into {args.output_dir}")
    return {"checkpoints": [str(path) for path in checkpoints], "output_dir": args.output_dir}


if __name__ == "__main__":
    main()
