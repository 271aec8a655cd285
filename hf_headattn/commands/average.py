"""`hf-headattn average`: average the weights of a run's last N checkpoints into a model that `from_pretrained` loads
(RHE, Appendix A.1; the averaging itself: `hf_headattn.experiment.averaging`).

    # the last 10 checkpoint-<step> folders of a Trainer run (in step order)
    hf-headattn average --run_dir outputs/rhe --last 10 --output_dir outputs/rhe/averaged

    # or an explicit list (the config and tokenizer files come from the last one)
    hf-headattn average --checkpoints outputs/a/checkpoint-900 outputs/a/checkpoint-1000 \\
        --output_dir outputs/a/averaged

Train with `--save_strategy epoch` (or steps) and no `--save_total_limit` below N, so the checkpoints exist.
Writes the averaged model, the last checkpoint's tokenizer files and `averaged_from.json` into `--output_dir`,
whole: into a hidden sibling folder first, renamed when complete, so a failure leaves nothing. Every argument is checked
before a weight is read (a bad one is a usage error, exit 2): `--output_dir` is never the run folder, one of the
averaged checkpoints or a folder holding one, and a folder holding anything else (another checkpoint, an earlier
average) only with `--overwrite`, which replaces that folder.
"""

from __future__ import annotations

import argparse

import hf_headattn  # noqa: F401  (registers our models with the Auto classes)
from hf_headattn.cli import refuse_python_m
from hf_headattn.experiment.arguments import existing_dir, positive_int
from hf_headattn.experiment.averaging import average_checkpoints, check_checkpoints, last_checkpoints
from hf_headattn.experiment.outputs import check_output_dir


def parse_args(argv=None, prog: str | None = None) -> argparse.Namespace:
    """The arguments, all checked (the checkpoints' configs and tensor shapes read, no weights): a bad one is a
    usage error naming it. `args.checkpoints` is then the list to average. `prog`: the name the usage and errors
    give (default the script's, argparse's)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="Where the averaged model is written")
    parser.add_argument("--run_dir", type=existing_dir, help="A Trainer output_dir with checkpoint-<step> folders")
    parser.add_argument("--last", type=positive_int,
                        help="With --run_dir: how many of the last checkpoints (default 10, as RHE)")
    parser.add_argument("--checkpoints", nargs="+", type=existing_dir, help="Checkpoint folders (instead of --run_dir)")
    parser.add_argument("--overwrite", action="store_true",
                        help="Replace an --output_dir that holds files (never the run folder or an input checkpoint)")
    args = parser.parse_args(argv)
    if (args.run_dir is None) == (args.checkpoints is None):
        parser.error("expected either --run_dir (with --last N) or --checkpoints, not both and not neither")
    if args.last is not None and args.run_dir is None:
        parser.error(f"--last {args.last} goes with --run_dir; expected no --last with --checkpoints")
    inputs = {"--checkpoints": args.checkpoints}
    try:
        if args.run_dir is not None:
            inputs = {"--run_dir": args.run_dir}
            args.checkpoints = last_checkpoints(args.run_dir, 10 if args.last is None else args.last)
            inputs["averaged checkpoint"] = args.checkpoints
        check_output_dir(args.output_dir, inputs, overwrite=args.overwrite)
        args.checkpoints = check_checkpoints(args.checkpoints)
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    return args


def main(argv=None, prog: str | None = None) -> dict:
    """Average the checkpoints that `argv` (default `sys.argv[1:]`) names: which ones, and where to."""
    args = parse_args(argv, prog)
    checkpoints = args.checkpoints
    average_checkpoints(checkpoints, args.output_dir, overwrite=args.overwrite)
    print(f"averaged {len(checkpoints)} checkpoints ({', '.join(map(str, checkpoints))}) into {args.output_dir}")
    return {"checkpoints": [str(path) for path in checkpoints], "output_dir": args.output_dir}


if __name__ == "__main__":  # `python -m` of this module: a usage error naming the command to run
    refuse_python_m(__spec__.name)
