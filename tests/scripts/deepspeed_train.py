"""A few training steps of a tiny mBART per method through HeadAttnSeq2SeqTrainer, alone or with DeepSpeed ZeRO (CPU).

    python tests/scripts/deepspeed_train.py OUT.json 0                            # one process: the reference
    torchrun --nproc_per_node 2 tests/scripts/deepspeed_train.py OUT.json STAGE   # ZeRO STAGE (2 or 3), gloo

The reference run writes each method's initial checkpoint (seed 0, no dropout; the ``all`` model with heads pruned)
into OUT.json's folder, ``init-<method>``, and the ZeRO runs read them there. Each run then trains each of
:data:`METHODS` in turn from its checkpoint for :data:`STEPS` steps of one global batch (one process:
``2 * PER_DEVICE`` pairs; two: ``PER_DEVICE`` each) and saves the model with ``trainer.save_model`` (ZeRO-3: the
weights gathered, ``stage3_gather_16bit_weights_on_model_save``) into ``<run>-<method>/model``; the ``all`` model
also writes a checkpoint each step. As the recipes do, the training arguments come before the model, so that with
ZeRO-3 ``from_pretrained`` builds it partitioned (``deepspeed.zero.Init``). The reference and the ZeRO-3 run then
call every tool that reads method weights outside the training forward on the trained ``all`` model, on every
process (:func:`tools`). Rank 0 writes the loss curves, the folders and the tools' outcomes to OUT.json.
"""

import importlib
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import Seq2SeqTrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import TINY
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.experiment.trainer import HeadAttnSeq2SeqTrainer
from hf_headattn.syntax_inputs import NOT_IN_PHRASE

#: The methods trained in turn: DHICM, EaDRA (its three components), SEA (DEA+RHE), the papers' comparison methods
#: (Localness's bias, Rel_Pos's key bias and value term by taking over heads, fixed heads taken over), and the three
#: papers' methods together (LPEA+RHE), last: the ZeRO-3 tools run on it.
METHODS = {
    "dhicm": {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1]}},
    "eadra": {"eadra": {"encoder": {}, "decoder": {}, "cross": {}}},
    "sea": {"sea": {"type": "dea", "head_selection": "redundant"}},
    "localness": {"localness": {}},
    "rel_pos": {"rel_pos": {"max_relative_position": 2, "decoder_layers": [-1]}},
    "fixed_attention": {"fixed_attention": {"patterns": ["previous", "next"]}},
    "all": {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1]},
            "eadra": {"encoder": {}, "decoder": {}, "cross": {}}, "sea": {"type": "lpea"}},
}
#: The heads the ``all`` model starts without (so that ZeRO-3 builds a pruned model from a checkpoint).
PRUNED = {"decoder.layers.0.self_attn": [1], "decoder.layers.1.encoder_attn": [0, 2]}
STEPS, PER_DEVICE = 3, 2
#: The logged fields compared (a method logs those of its terms).
LOGGED = ("loss", "grad_norm", "nll_loss", "dhicm_kl", "eadra_loss")


def deepspeed_config(stage: int) -> dict:
    """docs/usage.md's DeepSpeed config ("Launching": the Trainer's optimizer, scheduler, batch and clipping,
    ``auto``), with ZeRO-3 partitioning every parameter: by default it keeps those under 100k elements whole on every
    process (``stage3_param_persistence_threshold``), all of the tiny model's."""
    zero = {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    return {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto", "gradient_clipping": "auto"}


def examples(count: int = STEPS * 2 * PER_DEVICE) -> list[dict]:
    """``count`` pairs of equal length (every process holds as many tokens) with SEA's inputs: random symmetric
    dependency masks and phrase positions (-2..2 or NOT_IN_PHRASE)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (count, 7), generator=g)
    ids[:, -1] = 2
    labels = torch.randint(5, 90, (count, 5), generator=g)
    labels[:, -1] = 2
    related = torch.rand(count, 7, 7, generator=g) < 0.3
    positions = torch.randint(-2, 3, (count, 7, 7), generator=g)
    columns = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
               "dependency_mask": related | related.transpose(1, 2) | torch.eye(7, dtype=torch.bool),
               "phrase_positions": positions.masked_fill(torch.rand(count, 7, 7, generator=g) < 0.4, NOT_IN_PHRASE)}
    return [{key: value[i] for key, value in columns.items()} for i in range(count)]


def method_examples(method: str) -> list[dict]:
    """:func:`examples` with the inputs ``method``'s model takes (SEA's for SEA, phrase positions for LPEA)."""
    sea = METHODS[method].get("sea")
    drop = set() if sea else {"dependency_mask", "phrase_positions"}
    drop |= set() if sea and sea["type"] == "lpea" else {"phrase_positions"}
    return [{key: value for key, value in row.items() if key not in drop} for row in examples()]


def batches(method: str = "all") -> list[dict]:
    """Two batches of two pairs, for the tools."""
    rows = method_examples(method)
    return [{key: torch.stack([row[key] for row in rows[i:i + 2]]) for key in rows[0]} for i in (0, 2)]


def write_initial_checkpoints(folder: Path) -> None:
    """``folder/init-<method>``: a fresh tiny model per method, seed 0, without dropout; the ``all`` one pruned."""
    for method, settings in METHODS.items():
        torch.manual_seed(0)
        model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, dropout=0.0, label_smoothing=0.1,
                                                                           **settings))
        if method == "all":
            model.prune_heads(PRUNED)
        model.save_pretrained(folder / f"init-{method}")


def train(method: str, folder: Path, run: str, per_device: int, ds_config: dict | None = None):
    """Train ``method``'s model from ``folder/init-<method>`` for :data:`STEPS` SGD steps (as fsdp_train.py: Adam's
    steps on the methods' near-zero gradients would magnify float noise between the runs' weights); save it into
    ``folder/<run>-<method>/model``. Returns the trainer."""
    output_dir = folder / f"{run}-{method}"
    if ds_config is not None:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # (also where there is a GPU, which DeepSpeed would pick)
        import deepspeed

        # Every collective through gloo: DeepSpeed's shared-memory kernel for the CPU compiles at its first use on a
        # machine (one to three minutes on two cores), and is no part of what these runs test. (By its full name:
        # ``deepspeed.comm.torch`` is torch, which ``deepspeed.comm`` imports.)
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    checkpoints = method == "all"  # (for checkpoint averaging)
    args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=per_device, max_steps=STEPS, optim="sgd",
        learning_rate=1.0, report_to=[], use_cpu=True, logging_steps=1, save_steps=1,
        save_strategy="steps" if checkpoints else "no", seed=0, disable_tqdm=True,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None, deepspeed=ds_config,
    )
    if ds_config is not None:
        # On the CPU the training arguments set up torch.distributed but not DeepSpeed's communication (on GPUs they
        # do), which deepspeed.zero.Init reads the number of processes from: without this, it counts one
        deepspeed.init_distributed(dist_backend="gloo")
    model = HeadAttnMBartForConditionalGeneration.from_pretrained(folder / f"init-{method}")
    trainer = HeadAttnSeq2SeqTrainer(model=model, args=args, train_dataset=method_examples(method))
    trainer.train()
    trainer.save_model(str(output_dir / "model"))
    return trainer


def curve(trainer) -> list[dict]:
    """Each step's logged loss, grad norm and loss components."""
    return [{key: entry[key] for key in LOGGED if key in entry} for entry in trainer.state.log_history
            if "loss" in entry]


def outcome(call) -> dict:
    """``{"ok": result}`` or ``{"error": "<type>: <message>"}`` of ``call()``."""
    try:
        return {"ok": call()}
    except Exception as error:  # (recorded for the test to judge)
        return {"error": f"{type(error).__name__}: {error}"}


def tools(model, run_dir: Path, folder: Path) -> dict:
    """Every tool that reads method weights outside the training forward, on the trained ``model`` (with ZeRO-3: its
    weights partitioned over the processes; called on every process), and checkpoint averaging of its run's
    ``run_dir``, as :func:`outcome` records them, writing into ``folder``; the one that changes the model last."""
    from hf_headattn import hf_compat
    from hf_headattn.experiment.analysis import (
        encoder_attention_entropy,
        mean_head_importance,
        redundancy_report,
        sentence_head_importance,
    )
    from hf_headattn.experiment.analysis.head_ranking import criteria, score_heads
    from hf_headattn.experiment.averaging import average_checkpoints, last_checkpoints
    from hf_headattn.pruning import prune_heads

    inputs = batches()
    source = {key: value for key, value in inputs[0].items() if key != "labels"}
    tokenizer = SimpleNamespace(pad_token_id=TINY["pad_token_id"],
                                convert_ids_to_tokens=lambda ids: [str(i) for i in ids.tolist()])
    calls = {
        "partitioned": lambda: hf_compat.zero3_partitioned(model),
        "save_pretrained": lambda: model.save_pretrained(folder / "save_pretrained") or str(folder /
                                                                                            "save_pretrained"),
        "mean_head_importance": lambda: mean_head_importance(model, inputs),
        "sentence_head_importance": lambda: sentence_head_importance(
            model, tokenizer, None, None, "decoder.layers.1.encoder_attn", inputs=inputs[1])[1].tolist(),
        "encoder_attention_entropy": lambda: encoder_attention_entropy(model, inputs)["entropy"],
        "redundancy_report": lambda: redundancy_report(model, inputs)["modules"],
        "score_heads": lambda: {name: {component: table.tolist() for component, table in tables.items()}
                                for name, tables in score_heads(model, inputs, criteria()).items()},
        "generate": lambda: model.generate(**source, max_new_tokens=4, num_beams=2, do_sample=False).tolist(),
        "average_checkpoints": lambda: average_checkpoints(last_checkpoints(run_dir, 2), folder / "averaged")
        and str(folder / "averaged"),
        "prune_heads": lambda: prune_heads(model, {"encoder.layers.1.self_attn": [0]}),
    }
    return {name: outcome(call) for name, call in calls.items()}


def main(out, stage):
    out, stage = Path(out), int(stage)
    folder, run = out.parent, f"zero{stage}" if stage else "single"
    if not stage:
        write_initial_checkpoints(folder)
    results = {"world_size": int(os.environ.get("WORLD_SIZE", 1)), "stage": stage, "methods": {}, "seconds": {}}
    for method in METHODS:
        start = time.perf_counter()
        trainer = train(method, folder, run, PER_DEVICE if stage else 2 * PER_DEVICE,
                        deepspeed_config(stage) if stage else None)
        results["methods"][method] = {"curve": curve(trainer), "output_dir": str(folder / f"{run}-{method}")}
        results["seconds"][method] = round(time.perf_counter() - start, 2)
    if stage in (0, 3):
        start = time.perf_counter()
        results["tools"] = tools(trainer.model, folder / f"{run}-all", folder / f"{run}-tools")
        results["seconds"]["tools"] = round(time.perf_counter() - start, 2)
    if trainer.is_world_process_zero():
        out.write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
