"""Checkpoint averaging: the element-wise mean of the last N checkpoints' weights (RHE, Zhang et al., Appendix A.1:
"We average the last 10 checkpoint models").

    theta_avg = (1 / N) * sum_{i=1..N} theta_i      for every floating-point tensor

computed in float64 and stored in the checkpoints' dtype; other tensors (integer buffers) come from the last
checkpoint. The checkpoints must share one architecture: their configs (minus `IGNORED_CONFIG_FIELDS`) and
their tensors' names and shapes must agree. The result is written with `save_pretrained` beside the last
checkpoint's tokenizer files, so `from_pretrained` loads it like any checkpoint. The output folder is written whole
(`replacing_dir`): never one of the checkpoints or a folder holding one, and a
folder holding anything (an earlier model) only with `overwrite`, which replaces it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForSeq2SeqLM

from ..hf_compat import TRAINING_STATE_FILES, ZERO_TO_FP32, zero3_enabled
from .outputs import check_output_dir, replacing_dir

IGNORED_CONFIG_FIELDS = ("transformers_version", "headattn_version", "_name_or_path", "dtype", "torch_dtype",
                         "_commit_hash")
"""Config fields that differ between checkpoints of one architecture without meaning anything."""
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def last_checkpoints(run_dir: str | Path, last: int) -> list[Path]:
    """The last `last` `checkpoint-<step>` folders of a Trainer run, in step order (`checkpoint-1000` after
    `checkpoint-200`)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ValueError(f"the number of checkpoints to average must be a positive integer, got {last!r}")
    found = sorted((int(m.group(1)), path) for path in run_dir.iterdir()
                   if path.is_dir() and (m := _CHECKPOINT.fullmatch(path.name)))
    if len(found) < last:
        names = ", ".join(path.name for _, path in found) or "none"
        raise ValueError(f"asked to average the last {last} checkpoints, but {run_dir} has {len(found)}: {names}")
    return [path for _, path in found[-last:]]


def _weight_files(checkpoint: Path) -> list[Path]:
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [checkpoint / shard for shard in shards]
    if (checkpoint / "model.safetensors").is_file():
        return [checkpoint / "model.safetensors"]
    if (checkpoint / ZERO_TO_FP32).is_file():
        raise FileNotFoundError(
            f"{checkpoint} holds DeepSpeed's partitioned states but no model.safetensors: the run did not gather the "
            "weights (ZeRO-3 without stage3_gather_16bit_weights_on_model_save: true in the DeepSpeed config). Write "
            f"them into the checkpoint first with DeepSpeed's script, python {checkpoint / ZERO_TO_FP32} {checkpoint} "
            f"{checkpoint} (pytorch_model.bin), then as safetensors: the model class's "
            f"from_pretrained('{checkpoint}').save_pretrained('{checkpoint}')")
    raise FileNotFoundError(f"{checkpoint} has no model.safetensors (or sharded index); expected a folder written by "
                            "save_pretrained or the Trainer")


def _shapes(checkpoint: Path) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for file in _weight_files(checkpoint):
        with safe_open(file, framework="pt") as weights:
            shapes.update({name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()})
    return shapes


def _config(checkpoint: Path) -> dict:
    path = checkpoint / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint} has no config.json; expected a folder written by save_pretrained")
    config = json.loads(path.read_text())
    return {key: value for key, value in config.items() if key not in IGNORED_CONFIG_FIELDS}


def check_same_architecture(checkpoints: list[Path]) -> None:
    """Raise `ValueError` naming the first config field or tensor in which a checkpoint differs from the first."""
    reference, first = checkpoints[0], _config(checkpoints[0])
    shapes = _shapes(reference)
    for other in checkpoints[1:]:
        config = _config(other)
        for key in sorted(set(first) | set(config)):
            if first.get(key, "<absent>") != config.get(key, "<absent>"):
                raise ValueError(f"checkpoints of different architectures: config field {key!r} is "
                                 f"{first.get(key, '<absent>')!r} in {reference} but {config.get(key, '<absent>')!r} "
                                 f"in {other}")
        other_shapes = _shapes(other)
        for name in sorted(set(shapes) | set(other_shapes)):
            if shapes.get(name) != other_shapes.get(name):
                raise ValueError(f"checkpoints of different architectures: tensor {name!r} has shape "
                                 f"{shapes.get(name, 'absent')} in {reference} but {other_shapes.get(name, 'absent')} "
                                 f"in {other}")


def average_state_dict(checkpoints: list[Path]) -> dict[str, torch.Tensor]:
    """The mean of the floating-point tensors (float64 sums, cast back), other tensors from the last checkpoint."""
    sums, dtypes, last = {}, {}, {}
    for checkpoint in checkpoints:
        for file in _weight_files(checkpoint):
            with safe_open(file, framework="pt") as weights:
                for name in weights.keys():
                    tensor = weights.get_tensor(name)
                    dtypes[name] = tensor.dtype
                    if tensor.is_floating_point():
                        sums[name] = sums[name] + tensor.double() if name in sums else tensor.double()
                    else:
                        last[name] = tensor
    return {**{name: (total / len(checkpoints)).to(dtypes[name]) for name, total in sums.items()}, **last}


def check_checkpoints(checkpoints: list[str | Path]) -> list[Path]:
    """`checkpoints` as paths, if they are folders of one architecture (configs and tensor headers read, no
    weights); else a `FileNotFoundError` or `ValueError` naming the one at fault."""
    checkpoints = [Path(path) for path in checkpoints]
    if not checkpoints:
        raise ValueError("no checkpoints to average; expected at least one checkpoint folder")
    for path in checkpoints:
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
    check_same_architecture(checkpoints)
    return checkpoints


def average_checkpoints(checkpoints: list[str | Path], output_dir: str | Path, model_class=AutoModelForSeq2SeqLM,
                        overwrite: bool = False):
    """Average `checkpoints` into `output_dir` (`save_pretrained`, plus the last one's tokenizer files),
    written whole: nothing of it remains if this fails.

    Returns the averaged model. Raises `ValueError` for an empty list, checkpoints of different architectures, an
    `output_dir` that is or holds one of them, or (unless `overwrite`, which replaces it) one that holds anything,
    and in a process where a DeepSpeed ZeRO-3 config is alive (`from_pretrained` would partition the model).
    Checkpoints of a DeepSpeed run hold the weights when it gathered them (`stage3_gather_16bit_weights_on_model_save`
    with ZeRO-3); DeepSpeed's own files (`global_step<N>`, `latest`, its scripts) are not copied.
    """
    checkpoints = list(checkpoints)
    check_output_dir(output_dir, {"checkpoint": checkpoints}, overwrite=overwrite, overwrite_flag="overwrite=True",
                     option="output_dir")
    checkpoints = check_checkpoints(checkpoints)
    if zero3_enabled():
        raise ValueError("average_checkpoints: a DeepSpeed ZeRO-3 config is alive in this process (training arguments "
                         "with one), so from_pretrained would build the averaged model partitioned over the processes "
                         "(in a call every process must make) and it could not be saved whole; average in a process "
                         "without one, e.g. hf-headattn average")
    averaged = average_state_dict(checkpoints)
    model = model_class.from_pretrained(checkpoints[-1])
    # the file's tensors only: what it leaves out (tied or recomputed weights) from_pretrained has already set up
    unexpected = model.load_state_dict(averaged, strict=False).unexpected_keys
    if unexpected:
        raise ValueError(f"{type(model).__name__} has no tensors {unexpected} of the checkpoints; expected the class "
                         "that wrote them (model_class)")
    with replacing_dir(output_dir) as folder:
        model.save_pretrained(folder)
        for file in checkpoints[-1].iterdir():  # tokenizer files and the rest that is not weights or training state
            target = folder / file.name
            if file.is_file() and not target.exists() and not TRAINING_STATE_FILES.fullmatch(file.name) \
                    and not file.name.startswith("model.safetensors"):
                shutil.copy2(file, target)
        (folder / "averaged_from.json").write_text(
            json.dumps({"checkpoints": [str(path) for path in checkpoints]}, indent=2) + "\n", encoding="utf-8"
        )
    return model
