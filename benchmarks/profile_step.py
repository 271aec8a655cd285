"""Where a method's extra step time goes: a ``torch.profiler`` profile of training steps, per row, against stock.

Each row's model, and stock HF's, is built with ``overhead.py``'s weights, batch and step (forward and loss under
``--precision``'s autocast, backward, AdamW fused on CUDA), one row at a time; after ``--warmup`` steps, ``--steps``
steps are profiled (``torch.profiler``, CPU and CUDA activities). Times are per step, in ms. ``--compile``
profiles ``torch.compile(model)`` (stock's too; the warm-up compiles).

    python benchmarks/profile_step.py --shape tiny --rows off dhicm --device cpu --out outputs/profile-tiny.json
    python benchmarks/profile_step.py --device cuda --out outputs/profile-tb.json  # transformer-base, 5 rows
    bash benchmarks/gpu.sh  # part tb-profile, see that script

JSON: ``shape``, ``batch_size``, ``length``, ``device``, ``device_name``, ``precision``, ``dtype``, ``autocast``,
``optimizer``, ``warmup``, ``steps``, ``compile`` (the backend or null), ``top``, ``total`` (what ``total_ms``
sums), ``torch``, ``transformers`` and ``rows`` (stock first, the reference; per row: ``settings``, ``total_ms``: on
CUDA the self device time of every kernel, memcpy and memset, on the CPU the self CPU time of every operator;
``host_ms``: self CPU time, profiler overhead included; ``top``: the ``--top`` operators by self time (on CUDA the
device time of the kernels each launched itself, not through another operator), each ``name`` (at most 120
characters), ``ms`` and ``count`` per step; on CUDA ``top_kernels``, the same of the kernels; and for rows other
than stock ``over_stock_ms`` and ``ratio`` of ``total_ms``, and ``extra`` (on CUDA also ``extra_kernels``): the
``--top`` names, matched by name, with the most self time over stock's (``ms_over_stock``, ``ms``, ``stock_ms``,
``count``, ``stock_count``; only those above stock); or ``settings`` and ``error``). The printed table shows each
row's total and its five largest extras.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from transformers import MBartConfig

from setups import PRECISIONS, ROWS, SHAPES, add_model_arguments, build_on, default_precision, make_batch, step_fn

NAME_CHARS = 120
DEFAULT_ROWS = ["off", "dhicm", "eadra-scratch", "dea-rhe", "lpea-rhe"]


def self_device_us(event) -> float:
    """An event's self device time in us (``self_device_time_total``; ``self_cuda_time_total`` in older torch)."""
    value = getattr(event, "self_device_time_total", None)
    return value if value is not None else event.self_cuda_time_total


def activities(device) -> list:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


def profile_steps(step, steps: int, device) -> dict:
    """Profile ``steps`` calls of ``step``: {"operators": {name: (us, count)}, "kernels": ... (CUDA), "host_us"}.
    Operators are the host-side events (ATen operators, autograd nodes, annotations), timed by the device time of
    the kernels each launched itself on CUDA and by their self CPU time elsewhere."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities(device)) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    operators, kernels, host_us = {}, {}, 0.0
    for event in prof.key_averages():
        host_us += event.self_cpu_time_total
        if event.device_type == DeviceType.CPU:
            operators[event.key] = (self_device_us(event) if cuda else event.self_cpu_time_total, event.count)
        elif not getattr(event, "is_user_annotation", False):  # kernels, memcpy, memset (not gpu_user_annotation)
            kernels[event.key] = (self_device_us(event), event.count)
    return {"operators": operators, "kernels": kernels if cuda else None, "host_us": host_us}


def top(entries: dict, k: int, steps: int) -> list[dict]:
    ranked = sorted(entries.items(), key=lambda item: -item[1][0])[:k]
    return [{"name": name[:NAME_CHARS], "ms": round(us / 1000 / steps, 4), "count": round(count / steps, 2)}
            for name, (us, count) in ranked]


def extra(entries: dict, stock: dict, k: int, steps: int) -> list[dict]:
    """The ``k`` names with the most self time over stock's (matched by name; those above stock only)."""
    over = {name: us - stock.get(name, (0.0, 0))[0] for name, (us, _) in entries.items()}
    ranked = [name for name in sorted(over, key=lambda name: -over[name]) if over[name] > 0][:k]
    ms = lambda us: round(us / 1000 / steps, 4)  # noqa: E731
    return [{"name": name[:NAME_CHARS], "ms_over_stock": ms(over[name]), "ms": ms(entries[name][0]),
             "stock_ms": ms(stock.get(name, (0.0, 0))[0]), "count": round(entries[name][1] / steps, 2),
             "stock_count": round(stock.get(name, (0.0, 0))[1] / steps, 2)} for name in ranked]


def run(shape: str, rows: list[str], device: str, precision: str, warmup: int, steps: int, k: int,
        attn_implementation: str = "sdpa", compile_backend: str | None = None) -> dict:
    device = torch.device(device)
    shape_kwargs, batch_size, length = SHAPES[shape]
    shape_kwargs = {"max_position_embeddings": max(1024, length), **shape_kwargs}
    batch = make_batch(MBartConfig(**shape_kwargs), batch_size, length, device)
    dtype, autocast_dtype = PRECISIONS[precision]
    cuda = device.type == "cuda"
    result = {
        "shape": shape, "batch_size": batch_size, "length": length, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu", "precision": precision,
        "dtype": str(dtype), "autocast": autocast_dtype and str(autocast_dtype),
        "optimizer": "AdamW(fused=True)" if cuda else "AdamW(foreach=True)", "warmup": warmup, "steps": steps,
        "compile": compile_backend, "top": k,
        "total": "self device time of the kernels" if cuda else "self CPU time of the operators",
        "torch": torch.__version__, "transformers": transformers.__version__, "rows": {},
    }
    runs = {"stock": ("stock", {}), **{row: ("ours", ROWS[row]) for row in rows}}
    with profile(activities=activities(device)):  # the profiler's first start (CUPTI's set-up) before any row's
        torch.ones(8, device=device).sum().item()
    profiles = {}
    for name, (kind, settings) in runs.items():  # one model at a time on the device
        try:
            model = build_on(device, kind, settings, shape_kwargs, device, dtype, attn_implementation)
            run_model = model
            if compile_backend:  # each model compiled afresh
                torch.compiler.reset()
                run_model = torch.compile(model, backend=compile_backend)
            step = step_fn(kind, run_model, batch, autocast_dtype)
            for _ in range(warmup):
                step()
            profiles[name] = found = profile_steps(step, steps, device)
        except Exception as error:
            if name == "stock":
                raise
            result["rows"][name] = {"settings": settings, "error": f"{type(error).__name__}: {error}"[:2000]}
            print(f"{name}: {result['rows'][name]['error'][:300]}", file=sys.stderr)
            continue
        finally:
            model = run_model = step = None
            if cuda:
                torch.cuda.empty_cache()
        levels = {"": "operators", "_kernels": "kernels"} if cuda else {"": "operators"}
        total_us = sum(us for us, _ in found["kernels" if cuda else "operators"].values())
        row = result["rows"][name] = {"settings": settings, "total_ms": round(total_us / 1000 / steps, 4),
                                      "host_ms": round(found["host_us"] / 1000 / steps, 4)}
        row.update({f"top{suffix}": top(found[level], k, steps) for suffix, level in levels.items()})
        if name != "stock":
            stock_ms = result["rows"]["stock"]["total_ms"]
            row["over_stock_ms"] = round(row["total_ms"] - stock_ms, 4)
            row["ratio"] = round(row["total_ms"] / stock_ms, 4) if stock_ms else None
            row.update({f"extra{suffix}": extra(found[level], profiles["stock"][level], k, steps)
                        for suffix, level in levels.items()})
    return result


def table(result: dict, extras: int = 5) -> str:
    compiled = f", compiled ({result['compile']})" if result.get("compile") else ""
    lines = [f"profile: {result['shape']} on {result['device_name']}, {result['precision']}{compiled}, ms per step "
             f"({result['total']}; {result['steps']} steps after {result['warmup']})",
             f"{'row':<15} {'total ms':>10} {'over stock':>11} {'ratio':>7} {'host ms':>9}"]
    for name, row in result["rows"].items():
        if "error" in row:
            lines.append(f"{name:<15} ERROR {row['error'][:80]}")
            continue
        over = f"{row['over_stock_ms']:+11.3f} {row['ratio']:7.3f}" if name != "stock" else f"{'-':>11} {'-':>7}"
        lines.append(f"{name:<15} {row['total_ms']:10.3f} {over} {row['host_ms']:9.2f}")
        lines += [f"    {e['ms_over_stock']:+9.3f}  {e['name'][:70]} (x{e['count']:g} vs x{e['stock_count']:g})"
                  for e in row.get("extra", [])[:extras]]
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, "transformer-base", DEFAULT_ROWS,
                        "rows to profile (stock is always profiled, first, as the reference)")
    parser.add_argument("--warmup", type=int, default=3, help="unprofiled steps first")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps")
    parser.add_argument("--top", type=int, default=15, help="entries of each top and extra list")
    parser.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                        help="profile torch.compile(model) (backend: inductor unless named), stock too")
    parser.add_argument("--out", type=Path, default=None, help="the JSON (printed when not given)")
    args = parser.parse_args(argv)
    for name, least in (("warmup", 0), ("steps", 1), ("top", 1)):
        if getattr(args, name) < least:
            parser.error(f"--{name} {getattr(args, name)}: at least {least}")
    args.precision = args.precision or default_precision(args.device)
    rows = list(dict.fromkeys(args.rows))
    result = run(args.shape, rows, args.device, args.precision, args.warmup, args.steps, args.top,
                 args.attn_implementation, args.compile)
    print(table(result))
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    else:
        print(text)
    return result


if __name__ == "__main__":
    main()
