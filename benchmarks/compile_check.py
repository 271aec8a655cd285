"""torch.compile of every method row and their combination on one device (the CUDA half of
``tests/test_compile.py``, which checks the same on the CPU with ``aot_eager``).

For each row of ``SETTINGS`` the tiny model is compiled whole (``torch.compile(model)``, as the Trainer's
``torch_compile=True``) and stepped three times beside an eager copy, each step on a fresh batch (new tensors, rows
padded to different lengths, as a data loader gives) followed by an SGD step on both copies (dropout off):

    python benchmarks/compile_check.py --device cuda --out outputs/compile_check.json   # inductor, autocast-bf16
    python benchmarks/compile_check.py --device cpu --backend aot_eager --rows off all  # seconds on a CPU

JSON: ``device``, ``device_name``, ``torch``, ``transformers``, ``backend``, ``precision``, ``steps``, ``tolerance``
(by precision), ``ok`` (every row ok) and ``rows``: per row ``settings``; ``crashed`` (``null`` or
"ErrorType: message", with ``traceback``); ``graphs``, the graphs compiled after each step (``[after step 1, ...]``);
``recompiled`` (graphs grew after step 1); ``graph_breaks`` and ``break_reasons``; ``loss_max_diff`` and
``grad_max_diff``, the largest |compiled - eager| over the steps, relative to the largest |eager| of that loss or
gradient tensor (at least ``GRAD_FLOOR`` of the largest gradient entry); ``equal`` (both within ``tolerance``);
``ok`` (no crash, no recompilation, no graph break, equal); ``seconds``. The JSON is rewritten after each row, so a
timeout keeps the rows done.

``dynamo_counts`` and ``raise_recompile_limits`` are shared with ``benchmarks/overhead.py --compile``, and so is
``inductor_kernels``, which counts the kernels Inductor generates for the graphs compiled while a step runs (issue 63:
the compiled step's host time on a GPU is its launches).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
import traceback
from pathlib import Path
from unittest import mock

import torch
import torch._dynamo
import transformers
from torch._dynamo.utils import counters

from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from setups import default_precision

TINY = dict(vocab_size=99, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
            pad_token_id=1, eos_token_id=2, bos_token_id=0, decoder_start_token_id=0, forced_eos_token_id=None)
NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)  # compiled randomness differs
SEA = {"sea": {"type": "lpea", "encoder_layers": [0]}}
#: The rows of ``tests/test_compile.py``: every method, DHICM's fine-tuning mode, and all of them at once.
SETTINGS = {
    "off": {},
    "dhicm": {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1], "dropout": 0.0}},
    "dhicm-scaled": {"dhicm": {"encoder_layers": [0], "decoder_layers": [0], "dropout": 0.0,
                               "mode": "scaled_out_proj"}},
    "eadra": {"eadra": {"encoder": {}, "decoder": {}, "cross": {"heads": [1, 3]}, "warmup_steps": 4}},
    "dea-rhe": {"sea": {"type": "dea", "encoder_layers": [0, 1]}},
    "lpea-rhe": {"sea": {"type": "lpea", "encoder_layers": [0, 1]}},
    "fixed-attention": {"fixed_attention": {"patterns": ["next", "left", "right"]}},
    "all": {**SEA, "dhicm": {"encoder_layers": [0, -1], "decoder_layers": [-1], "dropout": 0.0},
            "eadra": {"encoder": {}, "decoder": {}, "cross": {}, "warmup_steps": 4}},
}
PRECISIONS = {"fp32": None, "autocast-bf16": torch.bfloat16}
#: Largest |compiled - eager| relative to the largest |eager| of the tensor, by precision. A gradient whose largest
#: entry is under GRAD_FLOOR of the model's largest is measured against that floor: some are zero but for rounding
#: (a key bias's, under softmax), and eager bf16 differs from eager fp32 there by more than the gradient itself.
TOLERANCE = {"fp32": 1e-3, "autocast-bf16": 5e-2}
GRAD_FLOOR = 1e-2


def dynamo_counts() -> tuple[int, int]:
    """Graphs dynamo has compiled in this process and graph breaks it has met (``torch._dynamo.utils.counters``)."""
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def break_reasons(since: dict | None = None, limit: int = 5) -> list[str]:
    """The reasons of the graph breaks met (since ``since``, a copy of ``counters["graph_break"]``), shortened."""
    since = since or {}
    return [reason[:300] for reason, n in counters["graph_break"].items() if n > since.get(reason, 0)][:limit]


def raise_recompile_limits(models: int) -> dict:
    """Several compiled models in one process compile their own entries for shared code (transformers'
    ``deprecate_kwarg`` wrapper): dynamo's per-code and accumulated recompile limits (8 and 256) grow with ``models``,
    so none of them falls back to eager. Recompilation is still counted (``dynamo_counts``)."""
    config, limits = torch._dynamo.config, {}
    for name, per_model in (("recompile_limit", 8), ("accumulated_recompile_limit", 256)):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), per_model * models))
            limits[name] = getattr(config, name)
    return limits


def inductor_kernels(run) -> dict:
    """Run ``run()`` and count what Inductor generated for the graphs compiled meanwhile (forward and backward of a
    training step; FX graph cache hits count too): ``kernels``, the kernels it generated
    (``torch._inductor.metrics.generated_kernel_count``: C++ on the CPU, Triton on a GPU); ``launches``, the calls of
    them in the graphs' wrappers (a kernel may run more than once); ``extern_calls``, the calls of library kernels and
    ATen fallbacks there (matmuls, SDPA, ...); ``graphs``, the wrappers. One step of a graph launches its wrapper's
    kernels once each, so ``launches + extern_calls`` is the number of kernel launches of a step: on a GPU, its host
    work (without CUDA graphs)."""
    from torch._inductor import metrics
    from torch._inductor.graph import GraphLowering

    codes = []
    before = metrics.generated_kernel_count
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        run()
    counts = {"kernels": metrics.generated_kernel_count - before, "launches": 0, "extern_calls": 0,
              "graphs": len(codes)}
    for code in codes:
        launches, extern = wrapper_calls(code)
        counts["launches"] += len(launches)
        counts["extern_calls"] += len(extern)
    return counts


def wrapper_calls(code: str) -> tuple[list[str], list[str]]:
    """The generated kernels an Inductor wrapper's ``call`` launches (``kernel(...)`` on the CPU, ``kernel.run(...)``
    Triton's), one entry a launch, and the library calls and ATen fallbacks it makes (``extern_kernels.mm(...)``,
    ``torch.ops.aten.<op>.<overload>(...)``)."""
    names = set(re.findall(r"^(\w+) = async_compile\.\w+\(", code, re.M))
    body = code[code.find("def call("):]
    launches = [name for name in re.findall(r"^\s+(\w+)(?:\.run)?\(", body, re.M) if name in names]
    extern = re.findall(r"^\s+(?:\w+ = )?((?:extern_kernels|torch\.ops\.\w+|aten)\.\w+(?:\.\w+)?)\(", body, re.M)
    return launches, extern


def fresh_batch(seed: int, config, device, sea: bool, size=(4, 8, 7)) -> dict:
    """A new batch of one shape: rows padded to random lengths (pad id in the source, -100 in the labels), and SEA's
    inputs (a dependency mask with a random head per token, phrase positions in [-2, 2]) where ``sea``."""
    generator = torch.Generator().manual_seed(seed)
    rows, source, target = size
    ids = torch.randint(3, config.vocab_size, (rows, source), generator=generator)
    labels = torch.randint(3, config.vocab_size, (rows, target), generator=generator)
    ids[torch.arange(source) >= torch.randint(source // 2, source + 1, (rows,), generator=generator)[:, None]] = \
        config.pad_token_id
    labels[torch.arange(target) >= torch.randint(2, target + 1, (rows,), generator=generator)[:, None]] = -100
    ids[0], labels[0, -1] = ids[0].clamp_min(3), 5  # one full row each: the padded shape stays the batch's shape
    batch = {"input_ids": ids, "attention_mask": ids.ne(config.pad_token_id).long(), "labels": labels}
    if sea:
        heads = torch.randint(0, source, (rows, source), generator=generator)
        dep = torch.zeros(rows, source, source, dtype=torch.bool).scatter_(2, heads[..., None], True)
        batch["dependency_mask"] = dep | dep.transpose(1, 2) | torch.eye(source, dtype=torch.bool)
        batch["phrase_positions"] = torch.randint(-2, 3, (rows, source, source), generator=generator)
    return {key: value.to(device) for key, value in batch.items()}


def train_step(module, run, optimizer, batch, autocast_dtype) -> tuple[torch.Tensor, dict]:
    """Loss and gradients of one step of ``run`` (``module`` or its compiled wrapper), then the optimizer step."""
    with torch.autocast(batch["input_ids"].device.type, dtype=autocast_dtype or torch.bfloat16,
                        enabled=autocast_dtype is not None):
        loss = run(**batch).loss
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None}
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float(), grads


def relative_diff(value: torch.Tensor, reference: torch.Tensor, floor: float = 1e-12) -> float:
    """max |value - reference| over max |reference|, that scale at least ``floor``."""
    scale = reference.detach().abs().max().float().clamp_min(floor)
    return float((value.float() - reference.float()).abs().max() / scale)


def check_row(name: str, device="cpu", backend="inductor", precision="fp32", steps=3) -> dict:
    """Compile ``SETTINGS[name]``'s tiny model, step it beside an eager copy, and report (see the module doc)."""
    settings, autocast_dtype = SETTINGS[name], PRECISIONS[precision]
    row = {"settings": settings, "crashed": None}
    start = time.perf_counter()
    torch.compiler.reset()
    counters.clear()
    try:
        torch.manual_seed(0)
        config = HeadAttnMBartConfig(**TINY, **NO_DROPOUT, **settings)
        eager = HeadAttnMBartForConditionalGeneration(config).to(device).train()
        module = copy.deepcopy(eager)
        run = torch.compile(module, backend=backend)
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (eager, module)]
        row.update(graphs=[], loss_max_diff=0.0, grad_max_diff=0.0)
        for seed in range(steps):
            batch = fresh_batch(seed, config, device, sea="sea" in settings)
            eager_loss, eager_grads = train_step(eager, eager, optimizers[0], batch, autocast_dtype)
            loss, grads = train_step(module, run, optimizers[1], {k: v.clone() for k, v in batch.items()},
                                     autocast_dtype)
            row["graphs"].append(dynamo_counts()[0])
            if grads.keys() != eager_grads.keys():
                raise AssertionError(f"compiled gradients for {sorted(grads.keys() ^ eager_grads.keys())} differ")
            row["loss_max_diff"] = max(row["loss_max_diff"], relative_diff(loss, eager_loss))
            floor = GRAD_FLOOR * max(float(g.abs().max()) for g in eager_grads.values())
            row["grad_max_diff"] = max([row["grad_max_diff"], *(relative_diff(grads[k], eager_grads[k], floor)
                                                                 for k in grads)])
    except Exception as error:  # a crash is a result
        row["crashed"] = f"{type(error).__name__}: {error}"[:2000]
        row["traceback"] = traceback.format_exc(limit=-6)[-3000:]
    finally:
        row["graph_breaks"], row["break_reasons"] = dynamo_counts()[1], break_reasons()
        torch.compiler.reset()
    graphs = row.get("graphs") or [0]
    row["recompiled"] = graphs[-1] != graphs[0]
    tolerance = TOLERANCE[precision]
    row["equal"] = row["crashed"] is None and max(row["loss_max_diff"], row["grad_max_diff"]) <= tolerance
    row["ok"] = row["equal"] and not row["recompiled"] and row["graph_breaks"] == 0
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: fast, no codegen)")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default=None,
                        help="default: autocast-bf16 on CUDA (as Seq2SeqTrainer(bf16=True)), fp32 elsewhere")
    parser.add_argument("--rows", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.backend not in torch.compiler.list_backends(exclude_tags=()):
        parser.error(f"--backend {args.backend!r}: not one of {torch.compiler.list_backends(exclude_tags=())}")
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: at least 2 (recompilation shows from the second step)")
    precision = args.precision or default_precision(args.device)
    device = torch.device(args.device)
    result = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
              else "cpu", "torch": torch.__version__, "transformers": transformers.__version__,
              "backend": args.backend, "precision": precision, "steps": args.steps,
              "tolerance": TOLERANCE[precision], "ok": None, "rows": {}}
    for name in args.rows:
        result["rows"][name] = check_row(name, device, args.backend, precision, args.steps)
        result["ok"] = all(row["ok"] for row in result["rows"].values())
        row = result["rows"][name]
        print(f"{name}: ok={row['ok']} crashed={row['crashed'] and row['crashed'][:120]} graphs={row.get('graphs')} "
              f"breaks={row['graph_breaks']} loss/grad diff={row.get('loss_max_diff', 0):.2e}/"
              f"{row.get('grad_max_diff', 0):.2e} ({row['seconds']} s)", file=sys.stderr, flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] is not None else 1)
