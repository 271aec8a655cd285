"""Rel_Pos's Triton kernels on a GPU (issue #63): their values and gradients against the PyTorch path and float64,
and their time, at a benchmark shape's attention (one layer, every head).

    python benchmarks/rel_pos_check.py --shape transformer-base --device cuda --out outputs/rel-pos-check.json
    bash benchmarks/gpu.sh   # PLAN=1's part rel-pos-check

At the shape's batch, heads, length and head dimension (transformer-base: 32 x 8 x 256 x 64), k = 16, a table per
head and a padding mask (bool, the lengths of ``setups.make_batch``): the kernels
(``hf_headattn.methods.rel_pos.tiled``) and ``relative_attention`` (the PyTorch path), each in float32 and bfloat16,
against ``relative_attention`` in float64. ``errors[dtype][name]``: max |x - float64| / max |float64| of the output
and of each gradient (query, key, value, both tables), for ``triton`` and ``eager``; ``ok``: every kernel error within
twice the PyTorch path's in the same dtype, or ``FLOOR``. ``ms[dtype]``: the median of ``--repeats`` forward and
backward passes of each (after ``--warmup``), and ``triton_over_eager``. On the CPU the kernels run under Triton's
interpreter only (``TRITON_INTERPRET=1``: ``gpu.sh``'s ``SMOKE=1``), in float32 (the interpreter multiplies bfloat16
wrongly). The JSON: ``device``, ``device_name``, ``torch``, ``triton``, ``shape``, ``sizes``, ``ok``, ``status``,
``errors``, ``ms``, ``triton_over_eager``.

``--registers`` (no GPU needed): compiles the three kernels for an H200 (sm_90) on the CPU (``triton.compile``,
bfloat16, the shape's head dimension, ``tiled.BLOCKS`` and ``tiled.LAUNCH``) and prints each kernel's registers and
stack (the registers spilled) a thread, as the wheel's ``cuobjdump -res-usage`` reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import MBartConfig

from hf_headattn.methods.rel_pos.equations import relative_attention, relative_labels
from setups import SHAPES, make_batch

FLOOR = {"float32": 1e-5, "bfloat16": 2e-2}
"""An error within this is met whatever the PyTorch path's (relative to the float64 values' largest)."""
NAMES = ("output", "query", "key", "value", "key_table", "value_table")


def inputs(shape: str, device: torch.device, k: int = 16):
    """query, key, value (B, H, T, D), the tables (H, 2k+1, D) in float64, the padding mask (B, 1, T, T) bool and
    the upstream gradient."""
    shape_kwargs, batch_size, length = SHAPES[shape]
    config = MBartConfig(**shape_kwargs)
    heads, dim = config.encoder_attention_heads, config.d_model // config.encoder_attention_heads
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(size, generator=g, dtype=torch.float64) for size in
               [(batch_size, heads, length, dim)] * 3 + [(heads, 2 * k + 1, dim)] * 2]
    tensors[3:] = [t * 0.5 for t in tensors[3:]]
    real = make_batch(config, batch_size, length, "cpu")["attention_mask"].bool()
    mask = real[:, None, None, :].expand(batch_size, 1, length, length).contiguous()
    upstream = torch.randn(batch_size, heads, length, dim, generator=g, dtype=torch.float64)
    return [t.to(device) for t in tensors], mask.to(device), upstream.to(device), k


def paths(mask, k, scaling):
    from hf_headattn.methods.rel_pos.tiled import tiled_relative_attention

    length = mask.shape[-1]
    labels = relative_labels(length, length, k, device=mask.device)
    return {"triton": lambda *x: tiled_relative_attention(*x, mask, scaling, 0, k),
            "eager": lambda *x: relative_attention(*x, labels, mask, scaling)[0]}


def forward_backward(function, tensors, upstream):
    tensors = [t.detach().requires_grad_() for t in tensors]
    output = function(*tensors)
    return [output.detach(), *torch.autograd.grad(output, tensors, upstream.to(output.dtype))]


def timed(function, tensors, upstream, device, warmup: int, repeats: int) -> float:
    times = []
    for step in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        forward_backward(function, tensors, upstream)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(times), 4)


def check(shape: str, device: torch.device, warmup: int, repeats: int, out: Path | None) -> dict:
    tensors, mask, upstream, k = inputs(shape, device)
    scaling = tensors[0].shape[-1] ** -0.5
    functions = paths(mask, k, scaling)
    result = {"device": str(device), "torch": torch.__version__,
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "shape": shape, "sizes": dict(zip("BHTD", tensors[0].shape), k=k), "ok": None, "status": "running",
              "errors": {}, "ms": {}, "triton_over_eager": {}}
    import triton

    result["triton"] = triton.__version__
    expected = forward_backward(functions["eager"], tensors, upstream)
    dtypes = [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]
    ok = True
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        cast = [t.to(dtype) for t in tensors]
        errors = result["errors"][name] = {}
        for path, function in functions.items():
            found = forward_backward(function, cast, upstream)
            for label, a, b in zip(NAMES, found, expected):
                errors.setdefault(label, {})[path] = float((a.double() - b).abs().max() / b.abs().max())
        ok &= all(e["triton"] <= max(2 * e["eager"], FLOOR[name]) for e in errors.values())
        result["ms"][name] = {path: timed(function, cast, upstream, device, warmup, repeats)
                              for path, function in functions.items()}
        result["triton_over_eager"][name] = round(result["ms"][name]["triton"] / result["ms"][name]["eager"], 4)
        if out is not None:  # (after each dtype: a timeout keeps what was done)
            out.write_text(json.dumps(result, indent=2))
    result.update(ok=ok, status="ran")
    return result


def registers(shape: str, arch: int = 90) -> dict:
    """``{kernel: "REG:.. STACK:.."}`` of the kernels compiled for ``sm_<arch>`` in bfloat16 (``--registers``)."""
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hf_headattn.methods.rel_pos import tiled, tiled_kernels

    shape_kwargs = SHAPES[shape][0]
    config = MBartConfig(**shape_kwargs)
    constants = dict(MASK=1, DOT="tf32x3", BM=tiled.BLOCKS[0], BN=tiled.BLOCKS[1], BL=64,
                     BD=max(16, triton.next_power_of_2(config.d_model // config.encoder_attention_heads)))
    pointers = {"Mask": "*u8", **{name: "*fp32" for name in ("RowMax", "RowSum", "Delta", "DWK", "DWV")}}
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    found = {}
    for kernel in (tiled_kernels._forward_kernel, tiled_kernels._query_kernel, tiled_kernels._key_kernel):
        names = kernel.arg_names
        signature = {name: "constexpr" if name in constants else pointers.get(name, "*bf16") if name[0].isupper()
                     else "fp32" if name == "scaling" else "i32" for name in names}
        constexprs = {(names.index(name),): value for name, value in constants.items()}
        compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32),
                                  options=dict(tiled.LAUNCH))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(compiled.asm["cubin"])
            cubin.flush()
            usage = subprocess.run([str(tool), "-res-usage", cubin.name], capture_output=True, text=True).stdout
        found[kernel.fn.__name__] = " ".join(next((line for line in usage.splitlines() if "REG:" in line),
                                                  "?").split()[:2])
    return found


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="transformer-base", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--registers", action="store_true", help="compile for sm_90 on the CPU: registers, spills")
    args = parser.parse_args(argv)
    if args.registers:
        found = registers(args.shape)
        print(json.dumps(found))
        return found
    device = torch.device(args.device)
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--device cpu: the kernels run on the CPU only under Triton's interpreter (TRITON_INTERPRET=1)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    result = check(args.shape, device, args.warmup, args.repeats, args.out)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("device_name", "ok", "ms", "triton_over_eager")}))
    return result


if __name__ == "__main__":
    main()
