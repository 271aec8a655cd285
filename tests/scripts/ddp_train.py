"""One optimizer step of a tiny DHICM model with HeadAttnSeq2SeqTrainer; run alone or under torchrun.

    python tests/scripts/ddp_train.py OUT.json PER_DEVICE_BATCH
    torchrun --nproc_per_node 2 tests/scripts/ddp_train.py OUT.json PER_DEVICE_BATCH
Rank 0 writes the logged loss, components and grad norm, and the gradient of every parameter, to OUT.json.
"""

import json
import os
import sys

import torch
from datasets import Dataset
from transformers import Seq2SeqTrainingArguments, TrainerCallback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import TINY
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.experiment.launch import end_processes
from hf_headattn.experiment.trainer import HeadAttnSeq2SeqTrainer


class Grads(TrainerCallback):
    grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {n: p.grad.detach().tolist() for n, p in model.named_parameters() if p.grad is not None}


def data():
    """8 pairs of equal length, so that every rank holds the same number of tokens."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (8, 7), generator=g)
    ids[:, -1] = 2
    labels = torch.randint(5, 90, (8, 5), generator=g)
    labels[:, -1] = 2
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist(),
                              "labels": labels.tolist()}).with_format("torch")


def main(out, per_device):
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, dropout=0.0, dhicm={"encoder_layers": [-1], "decoder_layers": [-1]},
                                 label_smoothing=0.1)
    model = HeadAttnMBartForConditionalGeneration(config)
    args = Seq2SeqTrainingArguments(
        output_dir=os.path.join(os.path.dirname(out), "run"), per_device_train_batch_size=int(per_device),
        max_steps=1, learning_rate=1e-3, report_to=[], use_cpu=True, logging_steps=1,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        save_strategy="no", seed=0, dataloader_drop_last=False,
    )
    grads = Grads()
    trainer = HeadAttnSeq2SeqTrainer(model=model, args=args, train_dataset=data(), callbacks=[grads])
    trainer.train()
    if trainer.is_world_process_zero():
        logged = [e for e in trainer.state.log_history if "loss" in e][0]
        with open(out, "w") as f:
            json.dump({"logged": logged, "grads": grads.grads, "world_size": args.world_size}, f)
    end_processes()


if __name__ == "__main__":
    main(*sys.argv[1:])
