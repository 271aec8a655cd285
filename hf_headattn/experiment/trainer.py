"""`Seq2SeqTrainer` that keeps the methods' terms: it logs every loss component beside `loss`.

Identical to `Seq2SeqTrainer` except:
* `label_smoothing_factor > 0` is moved into the model's `config.label_smoothing` (the stock Trainer would
  recompute the loss from logits and silently drop the methods' terms);
* each training step's loss components (`nll_loss`, `dhicm_kl`, `eadra_loss`, the EaDRA terms, ...) are
  averaged over the logging interval and over processes, and logged with `loss`;
* with several processes, evaluation and prediction return exactly the dataset's examples, in order:
  `Seq2SeqTrainer.evaluate`/`predict` gather with `accelerator.gather`, which keeps the examples the sampler
  repeats to fill the processes' last batch (4 examples, batch 8, 2 processes: 16 predictions); here they gather with
  `gather_for_metrics`, which drops them, as `Trainer` does.
"""

from __future__ import annotations

import functools
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import Seq2SeqTrainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

from ..hf_compat import TRAINER_STATE_FILE, checkpoint_world_size, nested_gather
from ..registry import logged_fields

logger = logging.get_logger(__name__)

def loss_components(outputs) -> dict[str, torch.Tensor]:
    """The scalar loss components of a model output (`nll_loss` and the registered methods' `logged` fields),
    detached, flattened into one dict (dict fields as `<field>/<key>`)."""
    components = {}
    for name in ("nll_loss", *logged_fields()):
        value = outputs.get(name) if hasattr(outputs, "get") else None
        if isinstance(value, dict):
            components.update({f"{name}/{key}": term.detach() for key, term in value.items()})
        elif value is not None:
            components[name] = value.detach()
    return components


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The latest `checkpoint-N` folder in `output_dir` (None if there is none, or no such folder)."""
    return get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None


def resume_checkpoint(value: str | bool | None, output_dir: str | Path) -> str | bool | None:
    """What `Trainer.train(resume_from_checkpoint=...)` gets for `--resume_from_checkpoint` (as in HF's
    `run_translation.py`): None (start afresh) for None, "" or "false"; True (the latest `checkpoint-N` in
    `output_dir`) for "true"; else the checkpoint folder, which must exist. Raises `ValueError` otherwise."""
    if value is None or value is False or str(value).strip().lower() in ("", "false"):
        return None
    if value is True or str(value).strip().lower() == "true":
        if last_checkpoint(output_dir) is None:
            raise ValueError(f"resume_from_checkpoint=true but {output_dir} holds no checkpoint-N folder; expected the "
                             "output_dir of the interrupted run, or a checkpoint folder")
        return True
    if not Path(value).is_dir():
        raise ValueError(f"resume_from_checkpoint={value!r} is not a folder; expected a checkpoint folder (e.g. "
                         f"{Path(output_dir) / 'checkpoint-500'}) or 'true' for the latest in output_dir")
    return str(value)


def check_resume_world_size(checkpoint, args) -> None:
    """Refuse to resume a checkpoint written by a different number of processes.

    The Trainer saves one RNG state per process (`rng_state.pth` alone, `rng_state_<rank>.pth` with several); a
    different world size changes the global batch and the data order, so the resumed run is not the run it continues.
    """
    if checkpoint is True:
        checkpoint = get_last_checkpoint(args.output_dir)
        if checkpoint is None:
            return  # the Trainer raises its own error for that
    folder = Path(checkpoint)
    saved = checkpoint_world_size(folder)
    if saved is not None and saved != args.world_size:
        raise ValueError(
            f"{folder} was written by {saved} process(es) but this run has world_size={args.world_size}; resume "
            f"with {saved} process(es), or start a new run from the weights (model_name_or_path={folder})"
        )


TRAIN_TIME_FILE = "train_time.json"
"""The file of a checkpoint folder that holds the training time that led to it (`TrainingClock`)."""


class TrainingClock(TrainerCallback):
    """Training time across resumed runs: at every checkpoint it writes `train_time.json` into the checkpoint
    folder, `{"train_time_s": ...}`: `previous_s` (the time of the runs before, read from the resumed checkpoint
    by `resumed_from`) plus this run's time so far."""

    def __init__(self, previous_s: float = 0.0):
        self.previous_s, self.start = previous_s, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            seconds = self.previous_s + time.monotonic() - self.start
            (folder / TRAIN_TIME_FILE).write_text(json.dumps({"train_time_s": round(seconds, 1)}) + "\n")


def resumed_from(checkpoint: str | bool | None, output_dir: str | Path) -> dict | None:
    """The checkpoint a run resumes (`checkpoint` as `resume_checkpoint` returns it; None: none), as
    `results.json` records it: `{"checkpoint": folder, "step": its global step, "train_time_s": the training time
    that led to it, across the runs before}` (`train_time_s` None for a checkpoint without `train_time.json`,
    written before `TrainingClock`)."""
    if not checkpoint:
        return None
    folder = Path(last_checkpoint(output_dir) if checkpoint is True else checkpoint)
    state, clock = folder / TRAINER_STATE_FILE, folder / TRAIN_TIME_FILE
    return {"checkpoint": str(folder),
            "step": json.loads(state.read_text())["global_step"] if state.is_file() else None,
            "train_time_s": json.loads(clock.read_text())["train_time_s"] if clock.is_file() else None}


class TrainingTimeLimit(TrainerCallback):
    """Stop training after `minutes` of wall time, like a cluster job limit, without losing the last stretch.

    At the first step past the limit it stops the Trainer, which still ends the epoch (evaluating and saving with
    the "epoch" strategies); with the "steps" strategies it asks for an evaluation and a save first. Either way the
    stretch since the last evaluation counts for `load_best_model_at_end`. `stopped` says whether the limit was
    hit.
    """

    def __init__(self, minutes: float):
        if not minutes > 0:
            raise ValueError(f"max_train_minutes must be a positive number of minutes, got {minutes}")
        self.seconds, self.start, self.stopped = 60.0 * minutes, None, False

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.start > self.seconds:
            self.stopped = control.should_training_stop = True
            control.should_evaluate = control.should_evaluate or args.eval_strategy == "steps"
            control.should_save = control.should_save or args.save_strategy == "steps"
        return control


class HeadAttnSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` for hf-headattn models; see the module docstring for what differs."""

    def __init__(self, model=None, args=None, *pargs, **kwargs):
        if args is not None and args.label_smoothing_factor > 0 and hasattr(model.config, "label_smoothing"):
            logger.warning(
                f"label_smoothing_factor={args.label_smoothing_factor} moved into model.config.label_smoothing so "
                "that the model computes it and keeps the methods' loss terms"
            )
            model.config.label_smoothing = args.label_smoothing_factor
            args.label_smoothing_factor = 0.0
        super().__init__(model, args, *pargs, **kwargs)
        self._component_sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=self.args.device))
        self._component_steps = 0

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint:
            check_resume_world_size(resume_from_checkpoint, self.args)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def evaluation_loop(self, *args, **kwargs):
        # Seq2SeqTrainer.evaluate/predict set gather_function to accelerator.gather ("we don't want to drop samples"),
        # which keeps the sampler's padding; gather_for_metrics drops exactly that (Trainer's own choice)
        self.gather_function = functools.partial(self.accelerator.gather_for_metrics,
                                                 use_gather_object=self.args.eval_use_gather_object)
        return super().evaluation_loop(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training:
            for name, value in loss_components(outputs).items():
                self._component_sums[name] += value.float().to(self.args.device)
            self._component_steps += 1
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._component_steps:
            for name, total in self._component_sums.items():
                mean = nested_gather(total / self._component_steps, self.args.parallel_mode).float().mean()
                logs[name] = round(mean.item(), 4)
            self._component_sums.clear()
            self._component_steps = 0
        super().log(logs, start_time)
