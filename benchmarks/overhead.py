"""Overhead of the methods: one optimizer step (forward, backward, AdamW) of ours vs the stock HF model.

Both models get the same random weights and batch. After warm-up, each repeat is a round of every row in a new
random order, and each timed step follows an untimed step of the same model (so a step meets the allocator and
caches as its own previous step left them, as in training, not as another row's did). ``time_ratio`` is the median
over the rounds of a row's step time over stock's in the same round (``median_ratio``: the ratio of the medians);
the JSON also holds each row's median step time and peak memory (GPU only), all from the same run.

    python benchmarks/overhead.py --shape tiny --rows off dhicm --out outputs/overhead-tiny.json
    python benchmarks/overhead.py --shape transformer-base --rows off dhicm eadra-scratch --device cuda
    python benchmarks/overhead.py --shape mbart-large-8x512 --rows off eadra-finetune --device cuda --compile
    python benchmarks/overhead.py --count --out benchmarks/results/counted.json  # no kernels run: seconds, any shape
    bash benchmarks/gpu.sh  # the whole GPU table, see that script

``--precision`` (``PRECISIONS``): ``autocast-bf16``, the default on CUDA, trains as ``Seq2SeqTrainer(bf16=True)``
does: fp32 weights, forward and loss under ``torch.autocast(device, torch.bfloat16)``, backward outside it;
``bf16``/``fp16`` cast the whole model (``--dtype``, deprecated, names these); ``fp32`` is the CPU's default. AdamW
is ``fused`` on CUDA and ``foreach`` elsewhere. ``--compile`` compiles every model, stock included
(``torch.compile(model, backend=--compile-backend, mode=--compile-mode)``), so compiled rows are timed against
compiled stock; ``--compile-mode reduce-overhead`` is what ``TrainingArguments(torch_compile_mode="reduce-overhead")``
passes: CUDA graphs with Inductor on CUDA (each step begins with ``torch.compiler.cudagraph_mark_step_begin()``, as
torch advises for training loops), the default elsewhere; the batch has one fixed shape, as batches padded to
fixed shapes (``pad_to_multiple_of`` with a fixed ``max_length``) have. Each row
then records ``compile``: ``graphs`` and ``graph_breaks`` (``torch._dynamo.utils.counters``) of its warm-up,
``recompiles``, the graphs compiled during the timed steps (0: no recompilation across steps; a row that compiles
again after warm-up is timed alone, ``timed_alone``), ``settle_graphs``, those compiled in one more step of every
row after all were warmed up (another model's compile can change a global that graphs guard on), and ``warmup_s``
(compile included), and with the ``inductor`` backend ``inductor``: the kernels Inductor generated for the row's
step, their launches and its library calls (``compile_check.inductor_kernels``; on a GPU a compiled step's host work
without CUDA graphs, issue 63). Every model is built before any compiles. Compiled runs count no operators (a dispatch
mode would recompile them): the eager run of the same rows has them. ``--generate-beams N`` adds ``generate_ms``
and ``generate_ratio`` (eager only): a beam search of exactly ``--generate-tokens`` new tokens from the shape's batch,
timed in rounds like the steps. Peak memory (CUDA) is a row's own: the bytes its parameters and optimizer state
hold plus the batch, plus the most its step allocates above what was allocated before it, so the models of all rows
can stay on the device for the timing rounds. A row that fails (a compile error, out of memory) gets ``error`` and
the others go on. ``gpu_summary.py`` gathers the JSON files of ``gpu.sh``'s parts into ``summary.json`` with issue
GPU targets, each met, not met or not measured.

JSON of a timed run: ``shape``, ``batch_size``, ``length``, ``device``, ``device_name``, ``precision``, ``dtype`` (of
the weights), ``autocast`` (its dtype or null), ``optimizer``, ``attn_implementation``, ``repeats``, ``warmup``,
``compile`` (null, or the backend and dynamo's recompile limits), ``generate`` (null, or beams, new tokens, batch
size and rounds), ``torch``, ``transformers``, ``rows`` (per row: ``settings``, ``attn_implementation`` (the
backend its model ran), ``median_ms``, ``time_ratio``, ``median_ratio``, ``peak_gib``, ``memory_ratio``,
``spread_ms``, ``page_faults_per_step``, ``operators``, ``operator_ratio``, ``syncs``, ``syncs_over_stock``,
``generate_operators``, ``generate_operator_ratio``, ``compile``, and with ``--generate-beams`` ``generate_ms``,
``generate_ratio``; or ``settings`` and ``error``) and ``targets`` (:data:`TARGETS`).

``--attn-implementation`` sets every model's backend, stock's included (the ratios are to stock on that backend);
``--sdpa-baseline`` adds stock on SDPA as the row ``stock-sdpa`` in the same rounds (its ``time_ratio``: SDPA's step
time over the backend's), and ``--no-count`` leaves out the operator, sync and ``generate`` counts (``null``), as
``flex_check.py`` runs flex attention.

``--count`` (``counting.py``) counts instead of timing, under ``FakeTensorMode``: FLOPs of forward and
backward and the bytes autograd saves for backward (distinct storages, parameters left out), as ratios to stock SDPA.

Rows name method settings (``ROWS``); ``naive`` rows time the direct port of the public EaDRA code (eager
attention, every probability map materialised, an entropy term over all of them) as a second baseline. Each row
also counts the ATen operators of one step (``operators``): on a GPU each is a kernel launch, and for small models
launches, not arithmetic, set the step time, so the operator ratio predicts the GPU ratio there. ``syncs`` counts the
operators of forward and backward that need a tensor's value on the host (``.item()``, ``bool(t)``, ``nonzero``, ...:
``operator_count.SYNC_OPERATORS``; each a host-device synchronisation on a GPU; the optimizer's CPU step counters
are left out), and ``generate_operators`` the operators of a greedy ``generate`` of ``GENERATE_TOKENS`` tokens (eval
mode, no labels). ``targets`` checks the ratios against :data:`TARGETS`; GPU timing targets are "unmeasured" on
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
import transformers
from torch._dynamo.utils import counters
from transformers import MBartConfig

from compile_check import break_reasons, dynamo_counts, inductor_kernels, raise_recompile_limits
from hf_headattn.hf_compat import attention_implementation
from operator_count import count_operators, sync_operators
from setups import (
    PRECISIONS,
    ROWS,
    SHAPES,
    add_model_arguments,
    autocast,
    build_on,
    default_precision,
    make_batch,
    model_inputs,
    step_fn,
    timed,
)

GENERATE_TOKENS = 8
#: The targets (ratios to stock SDPA in one run).
TARGETS = {"operators": 1.20, "cpu_time": 1.10, "generate_operators": 1.10, "generate_operators_eadra": 1.0}
#: The row of stock on SDPA with ``--sdpa-baseline`` (beside stock on ``--attn-implementation``, the ratios' baseline).
SDPA_STOCK = "stock-sdpa"
#: torch.compile's modes (``--compile-mode``; TrainingArguments' ``torch_compile_mode``).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
def generate_operators(kind, model, batch, autocast_dtype=None) -> int:
    """Operators of a greedy ``generate`` of exactly ``GENERATE_TOKENS`` tokens (no labels, eval mode, no grad)."""
    inputs = {k: v for k, v in model_inputs(kind, model, batch).items() if k != "labels"}
    kwargs = dict(max_new_tokens=GENERATE_TOKENS, min_new_tokens=GENERATE_TOKENS, num_beams=1, do_sample=False)
    model.eval()
    try:
        with torch.no_grad(), autocast(batch["input_ids"].device.type, autocast_dtype):
            model.generate(**inputs, **kwargs)  # warm-up
            return count_operators(lambda: model.generate(**inputs, **kwargs))
    finally:
        model.train()


def minor_faults() -> int | None:
    """The process's minor page faults so far (None where ``resource`` is missing, e.g. Windows)."""
    if sys.platform == "win32":
        return None
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def resident_bytes(tensors) -> int:
    """Bytes of the CUDA storages behind ``tensors``, each storage once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.is_cuda}
    return sum(storages.values())


def peak_memory(step, batch, device) -> float | None:
    """Take a step; GiB it needs alone on the device (None off CUDA): its parameters, optimizer state and the batch
    (what it holds between steps, gradients set to None), plus the most the step allocates above what was allocated
    before it. Other rows' models may stay on the device meanwhile."""
    if device.type != "cuda":
        step()
        return None
    optimizer = step.optimizer
    own = [p for group in optimizer.param_groups for p in group["params"]]
    own += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (resident_bytes([*own, *batch.values()]) + torch.cuda.max_memory_allocated() - before) / 2**30


def prepare(kind, model, batch, device, precision, warmup, backend, mode=None, count=True):
    """Compile a row's model (``backend``), warm it up and measure what is measured once: peak memory; eager, the
    operators, syncs and greedy ``generate`` operators (unless not ``count``); compiled, the warm-up's graphs and
    graph breaks, and whether the step after warm-up compiled anything; ``mode``: torch.compile's. Returns (step,
    measurements)."""
    autocast_dtype = PRECISIONS[precision][1]
    step = step_fn(kind, torch.compile(model, backend=backend, mode=mode) if backend else model, batch, autocast_dtype)
    if backend and mode == "reduce-overhead":
        step = graph_steps(step)
    (graphs, breaks), reasons = dynamo_counts(), dict(counters["graph_break"])
    start, kernels = time.perf_counter(), None
    for i in range(warmup):
        if i == 0 and backend == "inductor":  # the step that compiles: what Inductor generated for it
            kernels = inductor_kernels(step)
        else:
            step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    row = {"compile": None, "operators": None, "syncs": None, "generate_operators": None}
    if backend:
        after_warmup = dynamo_counts()
        row["compile"] = {"graphs": after_warmup[0] - graphs, "graph_breaks": after_warmup[1] - breaks,
                          "break_reasons": break_reasons(since=reasons),
                          "warmup_s": round(time.perf_counter() - start, 1), "inductor": kernels}
    row["peak_gib"] = peak_memory(step, batch, device)
    if backend:  # (a step after warm-up that compiles again would compile on every step: it is timed alone)
        row["compile"]["timed_alone"] = dynamo_counts()[0] > after_warmup[0]
        return step, row
    if not count:
        return step, row
    row["operators"] = count_operators(step)
    row["syncs"] = len(sync_operators(step.forward_backward))
    step.forward_backward = None  # (its gradients are left for the next step's zero_grad)
    if kind != "naive":
        row["generate_operators"] = generate_operators(kind, model, batch, autocast_dtype)
    return step, row


def graph_steps(step):
    """``step`` that first tells CUDA graph trees a new training step begins (no-op off CUDA graphs)."""

    def marked():
        torch.compiler.cudagraph_mark_step_begin()
        step()

    marked.forward_backward, marked.optimizer = step.forward_backward, step.optimizer
    return marked


def generate_fn(kind, model, batch, beams: int, tokens: int, autocast_dtype):
    """A beam search of exactly ``tokens`` new tokens from the batch's sources (eval mode, no grad)."""
    inputs = {k: v for k, v in model_inputs(kind, model, batch).items() if k != "labels"}
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, num_beams=beams, do_sample=False)

    def generate():
        model.eval()
        try:
            with torch.no_grad(), autocast(batch["input_ids"].device.type, autocast_dtype):
                model.generate(**inputs, **kwargs)
        finally:
            model.train()

    return generate


def rounds(calls: dict, repeats: int, device, counted=None, failures=None, untimed=True) -> dict:
    """Times of ``repeats`` rounds of every call in a new random order (so drifts of the machine hit every row
    alike); each timed call follows an untimed one of the same row (``untimed``: allocator and caches as its own
    last call left them). ``counted``: name -> {"page_faults": [], "recompiles": 0}, filled in; ``failures``:
    name -> error, for the calls that raised (left out of later rounds; stock's error is raised)."""
    times, order, shuffle = {name: [] for name in calls}, list(calls), random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name in list(order):
            try:
                graphs = dynamo_counts()[0]
                if untimed:
                    calls[name]()
                before = minor_faults()
                times[name].append(timed(calls[name], device))
            except Exception as error:
                if failures is None or name == "stock":
                    raise
                failures[name] = f"{type(error).__name__}: {error}"[:2000]
                order.remove(name)
                continue
            if counted is not None:
                counted[name]["page_faults"].append(None if before is None else minor_faults() - before)
                counted[name]["recompiles"] += dynamo_counts()[0] - graphs
    return {name: t for name, t in times.items() if name not in (failures or {})}


def run(shape: str, rows: list[str], device: str, precision: str, repeats: int, warmup: int, naive: bool,
        attn_implementation: str, compile_backend: str | None = None, generate_beams: int = 0,
        generate_tokens: int = 64, generate_repeats: int = 3, compile_mode: str | None = None,
        sdpa_baseline: bool = False, count: bool = True) -> dict:
    device = torch.device(device)
    shape_kwargs, batch_size, length = SHAPES[shape]
    shape_kwargs = {"max_position_embeddings": max(1024, length), **shape_kwargs}
    batch = make_batch(MBartConfig(**shape_kwargs), batch_size, length, device)
    runs = {"stock": ("stock", {})}
    if sdpa_baseline:  # stock on SDPA beside stock on attn_implementation (the ratios' baseline)
        runs[SDPA_STOCK] = ("stock", {})
    runs.update({row: ("ours", ROWS[row]) for row in rows})
    if naive:
        runs["naive"] = ("naive", {})
    limits = raise_recompile_limits(len(runs)) if compile_backend else None
    models, steps, measured, errors = {}, {}, {}, {}

    def failed(name, error):  # a row that fails (compile error, out of memory) is recorded; stock's failure is fatal
        if name == "stock":
            raise error
        errors[name] = f"{type(error).__name__}: {error}"[:2000]
        print(f"{name}: {errors[name][:300]}", file=sys.stderr)
        models.pop(name, None)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # Every model is built before any is compiled: each new model class adds to transformers' _CAN_RECORD_REGISTRY,
    # a global the compiled graphs guard on, which would recompile the models compiled before it.
    dtype = PRECISIONS[precision][0]
    for name, (kind, settings) in runs.items():
        try:
            models[name] = build_on(device, kind, settings, shape_kwargs, device, dtype,
                                    "sdpa" if name == SDPA_STOCK else attn_implementation)
        except Exception as error:
            failed(name, error)
    for name in list(models):
        try:
            steps[name], measured[name] = prepare(runs[name][0], models[name], batch, device, precision, warmup,
                                                  compile_backend, compile_mode, count)
        except Exception as error:
            failed(name, error)
    for name in steps if compile_backend else ():  # one more step each: what another model's compile changed
        graphs = dynamo_counts()[0]  # (the naive port's output-capturing hooks recompile stock once, e.g.)
        steps[name]()
        measured[name]["compile"]["settle_graphs"] = dynamo_counts()[0] - graphs
    alone = [name for name in steps if (measured[name]["compile"] or {}).get("timed_alone")]
    counted, failures = {name: {"page_faults": [], "recompiles": 0} for name in steps}, {}
    times = rounds({name: steps[name] for name in steps if name not in alone}, repeats, device, counted, failures)
    for name in alone:  # each of its steps compiles: a few steps, on its own
        times.update(rounds({name: steps[name]}, min(repeats, 2), device, counted, failures))
    errors.update({name: f"timed steps: {error}" for name, error in failures.items()})
    for name in times:
        if measured[name]["compile"] is not None:
            measured[name]["compile"]["recompiles"] = counted[name]["recompiles"]
    generated, generate_failures = {}, {}
    if generate_beams and not compile_backend:  # a compiled model's generate runs its eager forward: not timed
        calls = {name: generate_fn(runs[name][0], models[name], batch, generate_beams, generate_tokens,
                                   PRECISIONS[precision][1]) for name in times if runs[name][0] != "naive"}
        generated = rounds(calls, 1, device, None, generate_failures, untimed=False)  # warm-up
        generated = rounds({name: calls[name] for name in generated}, generate_repeats, device, None,
                           generate_failures, untimed=False)
    dtype, autocast_dtype = PRECISIONS[precision]
    result = {
        "shape": shape, "batch_size": batch_size, "length": length, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": precision, "dtype": str(dtype), "autocast": autocast_dtype and str(autocast_dtype),
        "optimizer": "AdamW(fused=True)" if device.type == "cuda" else "AdamW(foreach=True)",
        "attn_implementation": attn_implementation, "repeats": repeats, "warmup": warmup,
        "compile": None if not compile_backend else {"call": "torch.compile(model)", "backend": compile_backend,
                                                     "mode": compile_mode or "default", **limits},
        "generate": None if not generated else {"num_beams": generate_beams, "new_tokens": generate_tokens,
                                                "batch_size": batch_size, "repeats": generate_repeats},
        "torch": torch.__version__, "transformers": transformers.__version__, "rows": {},
    }
    median = {name: statistics.median(t) for name, t in times.items()}
    for name, (kind, settings) in runs.items():
        if name in errors:
            result["rows"][name] = {"settings": settings, "error": errors[name]}
            continue
        row, faults = measured[name], counted[name]["page_faults"]
        paired = name not in alone and "stock" not in alone
        result["rows"][name] = {
            "settings": settings, "attn_implementation": attention_implementation(models[name].config),
            "median_ms": round(median[name], 3),
            "time_ratio": round(statistics.median(a / b for a, b in zip(times[name], times["stock"])) if paired
                                else median[name] / median["stock"], 4),
            "median_ratio": round(median[name] / median["stock"], 4),
            "peak_gib": None if row["peak_gib"] is None else round(row["peak_gib"], 3),
            "memory_ratio": ratio(row["peak_gib"], measured["stock"]["peak_gib"]),
            "spread_ms": [round(min(times[name]), 3), round(max(times[name]), 3)],
            "page_faults_per_step": None if None in faults else statistics.median(faults),
            "operators": row["operators"], "operator_ratio": ratio(row["operators"], measured["stock"]["operators"]),
            "syncs": row["syncs"],
            "syncs_over_stock": None if row["syncs"] is None else row["syncs"] - measured["stock"]["syncs"],
            "generate_operators": row["generate_operators"],
            "generate_operator_ratio": ratio(row["generate_operators"], measured["stock"]["generate_operators"]),
            "compile": row["compile"],
        }
        if name in generate_failures:
            result["rows"][name]["generate_error"] = generate_failures[name]
        if name in generated:
            result["rows"][name]["generate_ms"] = round(statistics.median(generated[name]), 3)
            result["rows"][name]["generate_ratio"] = round(statistics.median(
                a / b for a, b in zip(generated[name], generated["stock"])), 4)
    result["targets"] = check_targets(result)
    return result


def ratio(value, stock) -> float | None:
    return None if value is None or not stock else round(value / stock, 4)


def check_targets(result: dict) -> dict:
    """The targets per row: ``True``/``False``, or a string saying why it was not measured."""
    on_gpu = result["device"].startswith("cuda")
    cpu_shape = result["shape"] in ("tiny", "small")
    checks = {}
    for name, row in result["rows"].items():
        if name in ("stock", "naive", SDPA_STOCK):
            continue
        if "error" in row or row["operators"] is None:
            checks[name] = {"operators": row.get("error", "not counted: compiled or --no-count (the eager run "
                                                          "counts them)")}
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
    add_model_arguments(parser, "tiny", None,
                        "rows to time (default: off), or to count (default: counting.COUNT_PLAN's rows)")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default=None,
                        help="deprecated: --precision of the same name")
    parser.add_argument("--compile", action="store_true", help="time every model, stock too, under torch.compile")
    parser.add_argument("--compile-backend", default="inductor", help="with --compile (aot_eager: fast, no codegen)")
    parser.add_argument("--compile-mode", default=None, choices=COMPILE_MODES,
                        help="with --compile: torch.compile's mode (TrainingArguments' torch_compile_mode; "
                             "reduce-overhead: CUDA graphs on CUDA with inductor)")
    parser.add_argument("--generate-beams", type=int, default=0,
                        help="also time generate: a beam search of this many beams (0: not timed)")
    parser.add_argument("--generate-tokens", type=int, default=64, help="new tokens of the timed generate")
    parser.add_argument("--generate-repeats", type=int, default=3, help="rounds of the timed generate")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--naive", action="store_true", help="add the naive EaDRA port as a second baseline")
    parser.add_argument("--sdpa-baseline", action="store_true",
                        help=f"also time stock on SDPA, as the row {SDPA_STOCK!r} (with another "
                             "--attn-implementation: its time_ratio is SDPA's step time over that backend's)")
    parser.add_argument("--no-count", action="store_true",
                        help="count no operators, syncs or generate operators (eager rows; e.g. on flex attention, "
                             "where generate's decoding shapes would compile its kernel again within the part)")
    parser.add_argument("--count", action="store_true",
                        help="count FLOPs and bytes saved for backward under FakeTensorMode instead of timing "
                             "(benchmarks/counting.py; the naive port is always a row, unless --no-naive)")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=None,
                        help="--count: shapes to count (default: counting.COUNT_PLAN's, "
                             "transformer-base and mbart-large-8x512)")
    parser.add_argument("--no-naive", action="store_true", help="--count: leave out the naive port")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.dtype is not None:
        print(f"--dtype is deprecated: use --precision {args.dtype}", file=sys.stderr)
        if args.precision not in (None, args.dtype):
            parser.error(f"--dtype {args.dtype} contradicts --precision {args.precision}")
        args.precision = args.dtype
    args.precision = args.precision or default_precision(args.device)
    if args.compile_mode and not args.compile:
        parser.error(f"--compile-mode {args.compile_mode}: only with --compile")
    if args.compile and args.compile_backend not in torch.compiler.list_backends(exclude_tags=()):
        parser.error(f"--compile-backend {args.compile_backend!r}: not one of "
                     f"{torch.compiler.list_backends(exclude_tags=())}")
    for name in ("repeats", "generate_tokens", "generate_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: at least 1")
    if args.generate_beams < 0:
        parser.error(f"--generate-beams {args.generate_beams}: at least 0")
    if args.warmup < (1 if args.compile else 0):
        parser.error(f"--warmup {args.warmup}: at least {'1 with --compile (it compiles)' if args.compile else 0}")
    if args.count:
        import counting

        plan = {shape: args.rows or counting.COUNT_PLAN.get(shape, sorted(ROWS))
                for shape in args.shapes or counting.COUNT_PLAN}
        result = counting.run_counted(plan, naive=not args.no_naive, attn_implementation=args.attn_implementation)
        print(counting.table(result), file=sys.stderr)
    else:
        result = run(args.shape, args.rows or ["off"], args.device, args.precision, args.repeats, args.warmup,
                     args.naive, args.attn_implementation, args.compile_backend if args.compile else None,
                     args.generate_beams, args.generate_tokens, args.generate_repeats, args.compile_mode,
                     args.sdpa_baseline, not args.no_count)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
