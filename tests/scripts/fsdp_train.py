"""One training step of a tiny mBART with every method on (DHICM, EaDRA, LPEA+RHE), sharded with FSDP2 on the CPU.

    python tests/scripts/fsdp_train.py OUT.json                              # one process, no sharding
    torchrun --nproc_per_node 2 tests/scripts/fsdp_train.py OUT.json         # FSDP2 (fully_shard), gloo

The Trainer cannot do this: accelerate (1.15) turns FSDP on for multi-GPU set-ups only, and on the CPU silently trains
with DDP. So the step is written out: each encoder and decoder layer and then the whole model are ``fully_shard``-ed,
each process takes its half of the batch, and the gradients (averaged over processes by FSDP) are gathered back
from their shards. Rank 0 writes the loss, its components, the gradient of every parameter and the parameters after
one SGD step to OUT.json.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import TINY
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.experiment.launch import end_processes
from hf_headattn.syntax_inputs import NOT_IN_PHRASE

EVERY_METHOD = {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1]},
                "eadra": {"encoder": {}, "decoder": {}, "cross": {}}, "sea": {"type": "lpea"}}


def batch():
    """8 pairs of equal length (every rank holds as many tokens), with random symmetric dependency masks and
    phrase positions (-2..2 or NOT_IN_PHRASE)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (8, 7), generator=g)
    ids[:, -1] = 2
    labels = torch.randint(5, 90, (8, 5), generator=g)
    labels[:, -1] = 2
    related = torch.rand(8, 7, 7, generator=g) < 0.3
    positions = torch.randint(-2, 3, (8, 7, 7), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
            "dependency_mask": related | related.transpose(1, 2) | torch.eye(7, dtype=torch.bool),
            "phrase_positions": positions.masked_fill(torch.rand(8, 7, 7, generator=g) < 0.4, NOT_IN_PHRASE)}


def full(tensor):
    """The whole tensor of an FSDP2 shard (a DTensor; a collective, so every rank calls it), else the tensor."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def main(out):
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, dropout=0.0, label_smoothing=0.1,
                                                                       **EVERY_METHOD))
    inputs, rank, world = batch(), 0, 1
    if "WORLD_SIZE" in os.environ:
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        for layer in (*model.model.encoder.layers, *model.model.decoder.layers):
            fully_shard(layer)
        fully_shard(model)
        share = len(inputs["input_ids"]) // world
        inputs = {key: value[rank * share:(rank + 1) * share] for key, value in inputs.items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # (Adam's first step is lr * sign(grad): too coarse)
    output = model(**inputs)
    output.loss.backward()
    logged = {key: getattr(output, key).detach() for key in ("loss", "nll_loss", "dhicm_kl", "eadra_loss")}
    if world > 1:  # the mean over processes (equal shares) is the mean over the batch
        for value in logged.values():
            dist.all_reduce(value, op=dist.ReduceOp.AVG)
    grads = {name: full(p.grad).tolist() for name, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    params = {name: full(p.detach()).tolist() for name, p in model.named_parameters()}
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world_size": world, "logged": {k: float(v) for k, v in logged.items()}, "grads": grads,
                       "params": params, "sharded": type(model).__name__}, f)
    end_processes()


if __name__ == "__main__":
    main(*sys.argv[1:])
