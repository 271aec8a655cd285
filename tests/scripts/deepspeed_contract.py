"""What ``hf_headattn.hf_compat`` assumes of DeepSpeed through transformers (``tests/test_hf_compat.py``), in one
process: a stock tiny mBART built under ZeRO-3, one Trainer step with a checkpoint, and DeepSpeed's script run on it.

    python tests/scripts/deepspeed_contract.py OUT_DIR

Writes ``OUT_DIR/contract.json``: ``zero3_enabled()`` before the training arguments and while they live; what
``zero3_partitioned`` says of the model ``from_pretrained`` built and whether its parameters hold empty placeholders
(whole inside ``GatheredParameters``), and its ``num_parameters()`` and ``parameter_count``; the checkpoint folder's
files; and what ``python <checkpoint>/zero_to_fp32.py <checkpoint> <folder>`` wrote (``pytorch_model.bin``;
``--safe_serialization`` fails on mBART's tied embeddings), and whether it holds the weights the Trainer saved.
"""

import importlib
import json
import os
import runpy
import socket
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import MBartConfig, MBartForConditionalGeneration, Seq2SeqTrainer, Seq2SeqTrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import TINY, batch
from hf_headattn import hf_compat


def one_process():
    """torchrun's environment for one process (DeepSpeed reads it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def main(out):
    out = Path(out)
    one_process()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # (also where there is a GPU, which DeepSpeed would pick)
    import deepspeed

    # gloo for the collectives (DeepSpeed's shared-memory CPU kernel compiles at its first use; tests/scripts/
    # deepspeed_train.py)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    torch.manual_seed(0)
    MBartForConditionalGeneration(MBartConfig(**TINY)).save_pretrained(out / "stock")
    before = hf_compat.zero3_enabled()
    args = Seq2SeqTrainingArguments(
        str(out / "run"), max_steps=1, save_steps=1, per_device_train_batch_size=2, report_to=[], use_cpu=True,
        disable_tqdm=True, logging_strategy="no", ddp_backend="gloo",
        deepspeed={"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                         "stage3_gather_16bit_weights_on_model_save": True},
                   "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                   "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"})
    enabled = hf_compat.zero3_enabled()
    deepspeed.init_distributed(dist_backend="gloo")  # (what deepspeed.zero.Init counts the processes with)
    model = MBartForConditionalGeneration.from_pretrained(out / "stock")
    parameters = list(model.parameters())
    placeholders = all(p.numel() == 0 and p.ds_numel > 0 for p in parameters)
    counted = [model.num_parameters(), hf_compat.parameter_count(model)]
    with deepspeed.zero.GatheredParameters(parameters):
        whole = all(p.numel() == p.ds_numel for p in parameters)
    inputs = batch()
    rows = [{key: value[i] for key, value in inputs.items()} for i in range(2)]
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    checkpoint = out / "run" / "checkpoint-1"
    files = sorted(path.name + ("/" if path.is_dir() else "") for path in checkpoint.iterdir())
    # DeepSpeed's script, as a user runs it (here in this process): the weights from the partitioned states
    argv, sys.argv = sys.argv, [str(checkpoint / hf_compat.ZERO_TO_FP32), str(checkpoint), str(out / "fp32")]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        sys.argv = argv
    saved, converted = load_file(checkpoint / "model.safetensors"), torch.load(out / "fp32" / "pytorch_model.bin")
    result = {
        "enabled": [before, enabled], "partitioned": hf_compat.zero3_partitioned(model), "first": next(iter(
            dict(model.named_parameters()))), "placeholders": placeholders, "whole": whole, "files": files,
        "counted": counted,
        "converted": sorted(path.name for path in (out / "fp32").iterdir()),
        "converted_equal": set(saved) <= set(converted) and all(torch.equal(converted[k], saved[k]) for k in saved),
    }
    (out / "contract.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
