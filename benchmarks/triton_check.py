"""EaDRA's tiled Triton pass (`eadra={"implementation": "triton"}`, `hf_headattn.methods.eadra.tiled`) on one device:
its terms and query/key gradients against the eager pass and float64, and the pass alone (forward + backward) timed
against the eager and the compiled pass, at one stacked shape:

    python benchmarks/triton_check.py --device cuda --out outputs/triton_check.json   # transformer-base-like
    TRITON_INTERPRET=1 python benchmarks/triton_check.py --device cpu --layers 2 --batch 2 --heads 2 --length 40 \\
        --repeats 1                                                                  # the CPU, under the interpreter

The shape: `layers` stacked layers of `batch` sentences, `heads` regularized heads of 64 dimensions, `length`
queries and keys, the second half of the sentences padded by a quarter, causal on every other layer (as the encoder
and decoder self-attention of EaDRA from scratch); heads in float32 and in bfloat16 (autocast's). JSON: `device`,
`device_name`, `torch`, `triton`, `shape`, `errors` (per heads dtype: the largest |Triton - reference| over
the terms and over the gradients, relative to the largest |reference|, against the eager pass and against float64),
`ms` (per heads dtype and pass: median forward + backward), `tiles` (with `--tiles`: per tile shape
"BLOCK_MxBLOCK_N" the Triton pass on bfloat16 heads, median ms, or the error that stopped it; the default tiles are
`ms`'s "triton"), `ok` (float32 errors within `TOLERANCE`; null in the JSON written after each dtype and tile
shape, until the end).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from hf_headattn.methods.eadra import passes as eadra_passes
from hf_headattn.methods.eadra import tiled
from setups import timed

#: The largest error relative to the reference's largest entry that counts as equal (float32 heads).
TOLERANCE = 1e-4
WEIGHTS = (0.7, -1.3, 0.9)  # R_peak, R_sent, R_dist in the objective


def stacked_inputs(layers, batch, heads, length, dim, device, dtype, seed=0):
    """Queries and keys (B, H, T, D) per layer, the support (L, B, 1, T, T) and the real queries (L, B, 1, T)."""
    generator = torch.Generator().manual_seed(seed)
    queries = [torch.randn(batch, heads, length, dim, generator=generator).to(device, dtype) for _ in range(layers)]
    keys = [torch.randn(batch, heads, length, dim, generator=generator).to(device, dtype) for _ in range(layers)]
    lengths = torch.tensor([length if b < (batch + 1) // 2 else length - length // 4 for b in range(batch)])
    real = torch.arange(length)[None] < lengths[:, None]  # (B, T)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    support = torch.stack([real[:, None, :].expand(-1, length, -1) & (causal if layer % 2 else True)
                           for layer in range(layers)])
    query_mask = real[None].expand(layers, -1, -1) & support.any(-1)
    return queries, keys, support[:, :, None].to(device), query_mask[:, :, None].to(device)


def run(implementation, queries, keys, support, query_mask, dtype=None, blocks=None):
    """The terms and the query/key gradients of one pass (`dtype`: the heads cast first, e.g. float64; `blocks`:
    the Triton pass's (block_m, block_n), default its own)."""
    inputs = [(x if dtype is None else x.to(dtype)).detach().requires_grad_() for x in (*queries, *keys)]
    qs, ks = inputs[:len(queries)], inputs[len(queries):]
    heads = qs[0].shape[1]
    if implementation == "triton":
        tiles = {} if blocks is None else dict(block_m=blocks[0], block_n=blocks[1])
        terms = tiled.layer_regularizers(qs, ks, heads, 0.125, support, query_mask, **tiles)
    else:
        terms = eadra_passes.layer_regularizers(qs, ks, heads, 0.125, support, query_mask,
                                                implementation=implementation)
    objective = sum(w * t.sum() for w, t in zip(WEIGHTS, terms))
    return [t.detach() for t in terms], torch.autograd.grad(objective, inputs)


def relative_error(got, expected) -> float:
    """max |got - expected| / max |expected| over a list of tensors."""
    error = max((g.double() - e.double()).abs().max().item() for g, e in zip(got, expected))
    return error / max(max(e.double().abs().max().item() for e in expected), 1e-30)


def median_ms(function, device, repeats) -> float:
    function()  # warm-up (and compiles)
    return round(statistics.median(timed(function, device) for _ in range(repeats)), 3)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tiles", nargs="*", default=[], metavar="MxN",
                        help="more tile shapes (block_m x block_n) to time the Triton pass with, on bfloat16 heads")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    tiles = {}
    for text in args.tiles:
        sizes = text.lower().split("x")
        if len(sizes) != 2 or not all(size.isdigit() and int(size) >= 16 for size in sizes):
            parser.error(f"--tiles {text!r}: expected BLOCK_MxBLOCK_N, each at least 16, e.g. 64x32")
        tiles[text] = (int(sizes[0]), int(sizes[1]))
    device = torch.device(args.device)
    passes = ("triton", "eager") + (("compiled",) if device.type == "cuda" else ())
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"device": str(device), "device_name": device_name, "torch": torch.__version__,
              "triton": getattr(tiled.kernels.triton, "__version__", None),
              "shape": {k: getattr(args, k) for k in ("layers", "batch", "heads", "length")}, "errors": {}, "ms": {}}
    for dtype in (torch.float32, torch.bfloat16):
        inputs = stacked_inputs(args.layers, args.batch, args.heads, args.length, 64, device, dtype)
        fast, eager = run("triton", *inputs), run("eager", *inputs)
        reference = run("eager", *inputs, dtype=torch.float64)
        name = str(dtype).removeprefix("torch.")
        result["errors"][name] = {
            "terms_vs_eager": relative_error(fast[0], eager[0]), "grads_vs_eager": relative_error(fast[1], eager[1]),
            "terms_vs_float64": relative_error(fast[0], reference[0]),
            "grads_vs_float64": relative_error(fast[1], reference[1])}
        result["ms"][name] = {impl: median_ms(lambda: run(impl, *inputs), device, args.repeats) for impl in passes}
        print(name, json.dumps(result["errors"][name]), json.dumps(result["ms"][name]), flush=True)
        write(result, args.out)
    if tiles:
        inputs = stacked_inputs(args.layers, args.batch, args.heads, args.length, 64, device, torch.bfloat16)
        result["tiles"] = {}
        for text, blocks in tiles.items():
            try:
                result["tiles"][text] = median_ms(lambda: run("triton", *inputs, blocks=blocks), device, args.repeats)
            except Exception as error:  # e.g. out of shared memory: a result
                result["tiles"][text] = f"{type(error).__name__}: {error}"[:300]
            write(result, args.out)
        print("tiles", json.dumps(result["tiles"]), flush=True)
    result["ok"] = all(v <= TOLERANCE for v in result["errors"]["float32"].values())
    write(result, args.out)
    return result


def write(result: dict, out: Path | None) -> None:
    """The JSON as it stands (after each heads dtype and tile shape: a time limit keeps what was done; `ok` is
    null until the end)."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"ok": None, **result}, indent=1) + "\n")


if __name__ == "__main__":
    main()
