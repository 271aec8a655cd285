"""The Trainer recipes under a launcher of several processes (`torchrun`, `accelerate launch --multi_gpu`).

On a machine without an accelerator the Trainer's defaults would train each launched process on its own (accelerate
picks DDP only for devices it knows: `--use_cpu --ddp_backend gloo` are needed for the CPU), every one of them into
the same `--output_dir`: `cpu_launch_defaults` makes those two flags the defaults there, and
`check_launch` refuses a launch whose training arguments still run the processes apart (e.g. `--use_cpu
false`). With DeepSpeed the same holds: its batch arithmetic (`train_batch_size` = micro batch x accumulation x
processes) needs the Trainer to count the processes.
"""

from __future__ import annotations

import os

import torch


def launched_processes() -> int:
    """How many processes the launcher started, this one among them (its `WORLD_SIZE`; 1 without a launcher)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def without_accelerator() -> bool:
    """No device that the Trainer runs one process each on (CUDA, XPU, ...): none, or Apple's MPS, which accelerate
    does not distribute."""
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is None or accelerator.type == "mps"


def cpu_launch_defaults(parser) -> bool:
    """Under a launcher of several processes on a machine without an accelerator, make `--use_cpu true --ddp_backend
    gloo` the defaults of `parser` (an argparse parser with `TrainingArguments`' flags; flags given still win),
    so that the launch trains as DDP over gloo. Returns whether it did."""
    if launched_processes() > 1 and without_accelerator():
        parser.set_defaults(use_cpu=True, ddp_backend="gloo")
        return True
    return False


def check_launch(training_args) -> None:
    """A `ValueError` naming the flags when a launcher started several processes but `training_args` train each on
    its own: not in the Trainer's distributed mode (e.g. `--use_cpu false` on the CPU; with `--ddp_backend` the
    processes even join a group, yet each trains alone), or counting other processes than the launcher's."""
    launched = launched_processes()
    mode = training_args.parallel_mode.value  # transformers' ParallelMode: "distributed" for DDP, FSDP, DeepSpeed
    if launched > 1 and (mode in ("not_parallel", "not_distributed") or training_args.world_size != launched):
        raise ValueError(
            f"the launcher started {launched} processes (WORLD_SIZE={launched}), but the training arguments train each "
            f"on its own (parallel mode {mode!r}, world_size={training_args.world_size}, on {training_args.device}), "
            "every one into the same --output_dir; expected --use_cpu true --ddp_backend gloo on a machine without "
            "GPUs (the defaults there), or one process")


def end_processes() -> None:
    """Leave the process group the Trainer joined under a launcher, once a command is done: wait for every process
    (a barrier), then destroy the group, while the interpreter is alive.

    Why the barrier: a gloo worker thread drops a finished collective's tensors just after the caller's wait returns.
    Those tensors are Python's (e.g. the Trainer's last all-gather), so dropping them takes the GIL. A process with
    nothing left to do (any rank but the one that writes) could reach interpreter shutdown first; the worker
    thread, refused the GIL, was then unwound inside a destructor: "terminate called without an active exception",
    SIGABRT after the work was written, and the launcher failed the run. Seen in about 1 of 100 2-process launches
    on two busy cores (tests/test_distributed.py); a core dump showed the worker in `ProcessGroupGloo::AsyncWork`'s
    destructor and the main thread in `Py_FinalizeEx`. The barrier waits for every earlier collective and for the
    slowest process, which leaves the worker threads that time to finish; destroying the group alone did not."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
