"""Overhead of the methods: one optimizer step (forward, backward, AdamW) of ours vs the stock HF model.

Both models get the same random weights and batch. After warm-up, each repeat is a round of every row in a new
random order, and each timed step follows an untimed step of the same model (so a step meets the allocator and
caches as its own previous step left them, as in training, not as another row's did). ``time_ratio`` is the median
over the rounds of a row's step time over stock's in the same round (``median_ratio``: the ratio of the medians);
the JSON also holds each row's median step time and peak memory (GPU only), all from the same run.

    python benchmarks/overhead.py --shape tiny --rows off dhicm --out outputs/overhead-tiny.json
    python benchmarks/overhead.py --shape transformer-base --rows off dhicm eadra-scratch --device cuda --dtype bf16
    python benchmarks/overhead.py --shape mbart-large-8x512 --rows off eadra-finetune --device cuda --dtype bf16
    python benchmarks/overhead.py --count --out benchmarks/results/counted.json  # no kernels run: seconds, any shape

``--count`` (``counting.py``, issue #27) counts instead of timing, under ``FakeTensorMode``: FLOPs of forward and
backward and the bytes autograd saves for backward (distinct storages, parameters left out), as ratios to stock SDPA.

Rows name method settings (``ROWS``); ``naive`` rows time the direct port of the public EaDRA code (eager
attention, every probability map materialised, an entropy term over all of them) as a second baseline. Each row
also counts the ATen operators of one step (``operators``): on a GPU each is a kernel launch, and for small models
launches, not arithmetic, set the step time, so the operator ratio predicts the GPU ratio there. ``syncs`` counts the
operators of forward and backward that need a tensor's value on the host (``.item()``, ``bool(t)``, ``nonzero``, ...:
``operator_count.SYNC_OPERATORS``; each a host-device synchronisation on a GPU; the optimizer's CPU step counters
are left out), and ``generate_operators`` the operators of a greedy ``generate`` of ``GENERATE_TOKENS`` tokens (eval
mode, no labels). ``targets`` checks the ratios against issue #18's targets; GPU timing targets are "unmeasured" on
a CPU run. ``page_faults_per_step`` (median minor page faults of a timed step): on the CPU, glibc's malloc returns
freed memory at the top of its heap to the system and the next step faults it back in (about 2 us per 4 KiB page on
a small VM), which moves a row's time by several percent with its allocation pattern;
``MALLOC_TRIM_THRESHOLD_=4000000000 MALLOC_MMAP_THRESHOLD_=1000000000`` (or jemalloc / tcmalloc, as PyTorch's CPU
performance guide advises) removes it for every row alike.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import MBartConfig, MBartForConditionalGeneration

from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.experiment.presets import method_settings
from hf_headattn.registry import active_methods, method_inputs
from operator_count import count_operators, sync_operators

SHAPES = {  # model shape, batch size, sequence length (source = target)
    "tiny": (dict(d_model=128, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, vocab_size=1000), 16, 32),
    "transformer-base": (dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                              decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                              vocab_size=32000), 32, 256),
    # the Multi30k reproduction's model (presets "small", 8000 BPE), at a CPU-sized batch
    "small": (dict(d_model=256, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=8000), 32, 32),
    "mbart-large-16x128": (dict(vocab_size=250027), 16, 128),
    "mbart-large-8x512": (dict(vocab_size=250027), 8, 512),
}

#: Row name -> config fields: a recipe method name's (``--method``), or written out where no name has them.
ROWS = {
    "off": {},
    "dhicm": method_settings("dhicm"),
    # DHICM's fine-tuning variant: the pretrained out_proj kept, scaled per head
    "dhicm-finetune": {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1], "mode": "scaled_out_proj"}},
    "eadra-finetune": {"eadra": {"encoder": {"num_heads": 2}, "decoder": {"num_heads": 2}}},
    # num_heads default: three quarters of the heads, 6 of 8 at transformer-base (3 of 4 at tiny)
    "eadra-scratch": method_settings("eadra_all"),
    "dea-rhe": method_settings("dea_rhe"),
    "lpea-rhe": method_settings("lpea_rhe"),
}


GENERATE_TOKENS = 8
#: Issue #18's targets (ratios to stock SDPA in one run).
TARGETS = {"operators": 1.20, "cpu_time": 1.10, "generate_operators": 1.10, "generate_operators_eadra": 1.0}


def generate_operators(kind, model, batch) -> int:
    """Operators of a greedy ``generate`` of exactly ``GENERATE_TOKENS`` tokens (no labels, eval mode, no grad)."""
    inputs = {k: v for k, v in model_inputs(kind, model, batch).items() if k != "labels"}
    kwargs = dict(max_new_tokens=GENERATE_TOKENS, min_new_tokens=GENERATE_TOKENS, num_beams=1, do_sample=False)
    model.eval()
    try:
        with torch.no_grad():
            model.generate(**inputs, **kwargs)  # warm-up
            return count_operators(lambda: model.generate(**inputs, **kwargs))
    finally:
        model.train()


def model_inputs(kind, model, batch) -> dict:
    """``batch`` without the method inputs that none of the model's methods reads (all of them for a stock model)."""
    read = {name for spec in active_methods(model.config) for name in spec.inputs} if kind == "ours" else set()
    return {k: v for k, v in batch.items() if k not in method_inputs() or k in read}


def naive_entropy_loss(outputs) -> torch.Tensor:
    """The public EaDRA code's pattern: an entropy term over every materialised attention map."""
    maps = [*outputs.encoder_attentions, *outputs.decoder_attentions, *outputs.cross_attentions]
    return sum(-(a * a.clamp_min(1e-9).log()).sum(-1).mean() for a in maps)


def make_batch(config, batch_size, length, device):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, config.vocab_size, (batch_size, length), generator=generator)
    labels = torch.randint(4, config.vocab_size, (batch_size, length), generator=generator)
    lengths = torch.randint(length // 2, length + 1, (batch_size,), generator=generator)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    ids[~mask] = config.pad_token_id
    batch = {"input_ids": ids, "attention_mask": mask.long(), "labels": labels}
    # SEA's inputs (its forward arguments, MethodSpec.inputs), random as parses are, not its neutral_inputs (which
    # select no redundant head): a dependency mask with a random head per token, phrase positions within +-2
    heads = torch.randint(0, length, (batch_size, length), generator=generator)
    dep = torch.zeros(batch_size, length, length, dtype=torch.bool)
    dep.scatter_(2, heads[..., None], True)
    dep |= dep.transpose(1, 2) | torch.eye(length, dtype=torch.bool)
    batch["dependency_mask"] = dep
    batch["phrase_positions"] = torch.randint(-2, 3, (batch_size, length, length), generator=generator)
    return {k: v.to(device) for k, v in batch.items()}


def build(kind, settings, shape_kwargs, device, dtype, attn_implementation):
    torch.manual_seed(0)
    if kind == "stock" or kind == "naive":
        model = MBartForConditionalGeneration(MBartConfig(**shape_kwargs, dropout=0.1))
    else:
        model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**shape_kwargs, dropout=0.1, **settings))
    model.set_attn_implementation("eager" if kind == "naive" else attn_implementation)
    if device is not None:  # (None: leave it where it was built, e.g. fake tensors, which ``to`` cannot swap)
        model = model.to(device=device, dtype=dtype)
    return model.train()


def step_fn(kind, model, batch):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    inputs = model_inputs(kind, model, batch)

    def forward_backward():
        outputs = model(**inputs, output_attentions=kind == "naive")
        loss = outputs.loss + (naive_entropy_loss(outputs) if kind == "naive" else 0)
        loss.backward()

    def step():
        forward_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step.forward_backward = forward_backward
    return step


def timed(step, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000


def minor_faults() -> int | None:
    """The process's minor page faults so far (None where ``resource`` is missing, e.g. Windows)."""
    if sys.platform == "win32":
        return None
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def peak_memory(step, device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def run(shape: str, rows: list[str], device: str, dtype: str, repeats: int, warmup: int, naive: bool,
        attn_implementation: str) -> dict:
    device = torch.device(device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    shape_kwargs, batch_size, length = SHAPES[shape]
    shape_kwargs = {"max_position_embeddings": max(1024, length), **shape_kwargs}
    batch = make_batch(MBartConfig(**shape_kwargs), batch_size, length, device)
    runs = {"stock": ("stock", {})}
    runs.update({row: ("ours", ROWS[row]) for row in rows})
    if naive:
        runs["naive"] = ("naive", {})
    steps, times, memory, operators = {}, {name: [] for name in runs}, {}, {}
    faults = {name: [] for name in runs}
    syncs, generated = {}, {}
    for name, (kind, settings) in runs.items():  # one model on the device at a time for the memory numbers
        model = build(kind, settings, shape_kwargs, device, dtype, attn_implementation)
        steps[name] = step_fn(kind, model, batch)
        for _ in range(warmup):
            steps[name]()
        memory[name] = peak_memory(steps[name], device)
        operators[name] = count_operators(steps[name])
        syncs[name] = len(sync_operators(steps[name].forward_backward))
        steps[name].forward_backward = None  # (its gradients are left for the next step's zero_grad)
        generated[name] = generate_operators(kind, model, batch) if kind != "naive" else None
        if device.type == "cuda":
            del model, steps[name]
            torch.cuda.empty_cache()
    if device.type == "cuda":  # rebuild for the timing loop (memory was measured alone)
        for name, (kind, settings) in runs.items():
            steps[name] = step_fn(kind, build(kind, settings, shape_kwargs, device, dtype, attn_implementation), batch)
            for _ in range(warmup):
                steps[name]()
    order, shuffle = list(runs), random.Random(0).shuffle
    for _ in range(repeats):  # rounds of every row in a new order, so drifts of the machine hit every row alike
        shuffle(order)
        for name in order:
            steps[name]()  # untimed: the timed step follows one of its own model (allocator, caches), as in training
            before = minor_faults()
            times[name].append(timed(steps[name], device))
            faults[name].append(None if before is None else minor_faults() - before)
    median = {name: statistics.median(t) for name, t in times.items()}
    ratio = {name: statistics.median(a / b for a, b in zip(t, times["stock"])) for name, t in times.items()}
    result = {
        "shape": shape, "batch_size": batch_size, "length": length, "device": str(device), "dtype": str(dtype),
        "attn_implementation": attn_implementation, "repeats": repeats, "torch": torch.__version__,
        "rows": {},
    }
    for name, (kind, settings) in runs.items():
        result["rows"][name] = {
            "settings": settings, "median_ms": round(median[name], 3),
            "time_ratio": round(ratio[name], 4), "median_ratio": round(median[name] / median["stock"], 4),
            "peak_gib": None if memory[name] is None else round(memory[name], 3),
            "memory_ratio": None if memory[name] is None else round(memory[name] / memory["stock"], 4),
            "spread_ms": [round(min(times[name]), 3), round(max(times[name]), 3)],
            "page_faults_per_step": None if faults[name][0] is None else statistics.median(faults[name]),
            "operators": operators[name], "operator_ratio": round(operators[name] / operators["stock"], 4),
            "syncs": syncs[name], "syncs_over_stock": syncs[name] - syncs["stock"],
            "generate_operators": generated[name],
            "generate_operator_ratio": None if generated[name] is None else round(
                generated[name] / generated["stock"], 4),
        }
    result["targets"] = check_targets(result)
    return result


def check_targets(result: dict) -> dict:
    """Issue #18's targets per row: ``True``/``False``, or a string saying why it was not measured."""
    on_gpu = result["device"].startswith("cuda")
    cpu_shape = result["shape"] in ("tiny", "small")
    checks = {}
    for name, row in result["rows"].items():
        if name in ("stock", "naive"):
            continue
        if name.startswith("eadra"):  # a training regularizer: no operator over the same model with methods off
            off = result["rows"].get("off", result["rows"]["stock"])["generate_operators"]
            generate_ok = row["generate_operators"] <= off * TARGETS["generate_operators_eadra"]
        else:
            generate_ok = row["generate_operator_ratio"] <= TARGETS["generate_operators"]
        checks[name] = {
            "operators": row["operator_ratio"] <= TARGETS["operators"],
            "cpu_time": (row["time_ratio"] <= TARGETS["cpu_time"]) if not on_gpu and cpu_shape else "not a CPU run",
            "gpu_time": "measured" if on_gpu else "unmeasured: no GPU lent",
            "generate_operators": generate_ok,
            "no_sync": row["syncs_over_stock"] <= 0,
        }
    return checks


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--rows", nargs="+", choices=sorted(ROWS), default=None,
                        help="rows to time (default: off), or to count (default: counting.COUNT_PLAN's rows)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--attn-implementation", default="sdpa")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--naive", action="store_true", help="add the naive EaDRA port as a second baseline")
    parser.add_argument("--count", action="store_true",
                        help="count FLOPs and bytes saved for backward under FakeTensorMode instead of timing "
                             "(benchmarks/counting.py; the naive port is always a row, unless --no-naive)")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=None,
                        help="--count: shapes to count (default: counting.COUNT_PLAN's, "
                             "transformer-base and mbart-large-8x512)")
    parser.add_argument("--no-naive", action="store_true", help="--count: leave out the naive port")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.count:
        import counting

        plan = {shape: args.rows or counting.COUNT_PLAN.get(shape, sorted(ROWS))
                for shape in args.shapes or counting.COUNT_PLAN}
        result = counting.run_counted(plan, naive=not args.no_naive, attn_implementation=args.attn_implementation)
        print(counting.table(result), file=sys.stderr)
    else:
        result = run(args.shape, args.rows or ["off"], args.device, args.dtype, args.repeats, args.warmup,
                     args.naive, args.attn_implementation)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
