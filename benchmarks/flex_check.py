"""Flex attention on a GPU (issue #47, item 6): the methods' step time on ``attn_implementation="flex_attention"``
beside stock on flex and on SDPA, and LPEA's bias gradient through flex's ``score_mod`` against SDPA's.

    python benchmarks/flex_check.py --shape transformer-base --device cuda --out outputs/flex.json
    bash benchmarks/gpu.sh   # PLAN=3's part tb-flex

Timing (``overhead.run``): every model eager on flex attention (the benchmark models have attention dropout 0, which
transformers' flex requires), the step of ``overhead.py`` (autocast-bf16 by default on CUDA), ``time_ratio`` to stock
on flex in the same rounds, and stock on SDPA as the row ``stock-sdpa``; no operators counted (``--no-count``).
``flex_over_sdpa``: stock's median step on flex over stock's on SDPA (below 1: flex is the faster backend);
``over_sdpa``: each row's median step over stock SDPA's.

Gradient check (``lpea_gradient``): SEA's LPEA bias (Eq. 6-8) reaches flex as a ``score_mod`` that indexes captured
tensors (:mod:`hf_headattn.scores`), and only recent torch releases differentiate captured tensors. One
forward and backward of the ``lpea-rhe`` model at ``--shape`` (dropout 0, one model switched between the backends, so
the same weights and batch) on SDPA and on flex: ``loss_diff`` and, per ``lpea_*`` parameter, ``grad_max_diff``,
max |flex - SDPA| over max |SDPA| (that scale at least ``compile_check.GRAD_FLOOR`` of the largest SDPA gradient);
``ok``: every gradient present and finite on flex and every difference within ``compile_check.TOLERANCE`` of the
precision (bfloat16 rounding under autocast); ``ok`` is false too where SDPA gives the bias no gradient (nothing
compared). torch runs no flex backward on the CPU (it refuses inputs that need gradients), so there neither the
timing nor the check runs: ``ok`` null, ``status`` "not run: no flex backward on cpu" (``tests/test_flex.py``
compares flex's forward with SDPA's on the CPU). The check runs first; the JSON is written after each half.

JSON: ``device``, ``device_name``, ``torch``, ``transformers``, ``shape``, ``precision``, ``lpea_gradient`` (``row``,
``backend``, ``ok``, ``status``, ``tolerance``, ``loss_diff``, ``grad_max_diff``, ``crashed``, ``seconds``),
``timing`` ("ran" or "not run: why"), then ``overhead.py``'s keys with ``rows`` (empty where the timing did not run),
``flex_over_sdpa`` and ``over_sdpa``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import transformers
from transformers import MBartConfig

import overhead
from compile_check import GRAD_FLOOR, TOLERANCE, raise_recompile_limits, relative_diff
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.flex import FLEX
from setups import PRECISIONS, ROWS, SHAPES, autocast, default_precision, make_batch, model_inputs

#: The rows timed on flex by default: the target rows of issue #47 at transformer-base.
DEFAULT_ROWS = ["dhicm", "eadra-scratch", "dea-rhe", "lpea-rhe"]
#: The row whose LPEA bias gradient is checked.
CHECKED_ROW = "lpea-rhe"


def no_backward(device: torch.device, implementation: str = FLEX) -> str | None:
    """Why ``implementation`` cannot train on ``device`` ("not run: ..."), or None where it can: torch raises
    ``NotImplementedError: FlexAttention does not support backward on CPU`` for inputs that need gradients."""
    return "not run: no flex backward on cpu" if implementation == FLEX and device.type == "cpu" else None


def lpea_gradient(shape: str, device: torch.device, precision: str, backend: str = FLEX) -> dict:
    """The LPEA bias gradient check (see the module doc) of ``backend`` against SDPA; not run (``ok`` None) where
    ``backend`` has no backward. ``ok`` False also when SDPA gives the bias no gradient (nothing compared)."""
    start, reason = time.perf_counter(), no_backward(device, backend)
    check = {"row": CHECKED_ROW, "backend": backend, "ok": None, "status": reason or "ran",
             "tolerance": TOLERANCE[precision], "loss_diff": None, "grad_max_diff": {}, "crashed": None}
    if reason:
        return {**check, "seconds": 0.0}
    try:
        shape_kwargs, batch_size, length = SHAPES[shape]
        shape_kwargs = {"max_position_embeddings": max(1024, length), **shape_kwargs}
        batch = make_batch(MBartConfig(**shape_kwargs), batch_size, length, device)
        torch.manual_seed(0)
        config = HeadAttnMBartConfig(**shape_kwargs, dropout=0.0, attention_dropout=0.0, **ROWS[CHECKED_ROW])
        model = HeadAttnMBartForConditionalGeneration(config).to(device).train()
        inputs = model_inputs("ours", model, batch)
        biases = {name: p for name, p in model.named_parameters() if name.rsplit(".", 1)[-1].startswith("lpea_")}
        losses, grads = {}, {}
        for implementation in ("sdpa", backend):
            model.set_attn_implementation(implementation)
            model.zero_grad(set_to_none=True)
            with autocast(device.type, PRECISIONS[precision][1]):
                loss = model(**inputs).loss
            loss.backward()
            losses[implementation] = loss.detach().float()
            grads[implementation] = {name: p.grad for name, p in biases.items()}
        reference = [float(g.abs().max()) for g in grads["sdpa"].values() if g is not None]
        if not reference or max(reference) == 0:
            raise AssertionError(f"SDPA gives the LPEA parameters {sorted(biases)} no gradient: nothing to compare")
        check["loss_diff"] = relative_diff(losses[backend], losses["sdpa"])
        for name, grad in grads[backend].items():
            check["grad_max_diff"][name] = (
                f"no gradient on {backend}" if grad is None else f"not finite on {backend}"
                if not grad.isfinite().all() else relative_diff(grad, grads["sdpa"][name], GRAD_FLOOR * max(reference)))
        diffs = [check["loss_diff"], *check["grad_max_diff"].values()]
        check["ok"] = all(not isinstance(d, str) and d <= check["tolerance"] for d in diffs)
    except Exception as error:  # a crash is a result
        check.update(ok=False, crashed=f"{type(error).__name__}: {error}"[:2000],
                     traceback=traceback.format_exc(limit=-6)[-3000:])
    check["seconds"] = round(time.perf_counter() - start, 1)
    return check


def timing(shape: str, rows: list[str], device: torch.device, precision: str, repeats: int, warmup: int) -> dict:
    """``overhead.run`` on flex attention with stock SDPA beside, and the ratios to stock SDPA; ``{"timing": why}``
    where flex cannot train or stock failed (a failed row is in ``rows``, as ``overhead.py`` records it)."""
    reason = no_backward(device)
    if reason:
        return {"timing": reason, "rows": {}}
    try:
        result = overhead.run(shape, rows, str(device), precision, repeats, warmup, False, FLEX, sdpa_baseline=True,
                              count=False)
    except Exception as error:  # stock's failure (the others' are rows)
        return {"timing": f"failed: {type(error).__name__}: {error}"[:1000], "rows": {}}
    timed = {name: row["median_ms"] for name, row in result["rows"].items() if "median_ms" in row}
    sdpa = timed.get(overhead.SDPA_STOCK)
    result["over_sdpa"] = {name: round(ms / sdpa, 4) for name, ms in timed.items()} if sdpa else {}
    result["flex_over_sdpa"] = result["over_sdpa"].get("stock")
    return {"timing": "ran", **result}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="transformer-base")
    parser.add_argument("--rows", nargs="+", choices=sorted(ROWS), default=DEFAULT_ROWS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=sorted(TOLERANCE), default=None,
                        help="default: autocast-bf16 on CUDA (Seq2SeqTrainer(bf16=True)), fp32 elsewhere")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 1:
        parser.error(f"--repeats {args.repeats} --warmup {args.warmup}: at least 1 each (the first step compiles "
                     "flex attention)")
    device, precision = torch.device(args.device), args.precision or default_precision(args.device)
    if no_backward(device) is None:  # flex's compiled kernel: an entry per score_mod, shape and mode
        raise_recompile_limits(len(args.rows) + 2)
    result = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
              else "cpu", "torch": torch.__version__, "transformers": transformers.__version__, "shape": args.shape,
              "precision": precision}

    def write():
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")

    result["lpea_gradient"] = lpea_gradient(args.shape, device, precision)
    print(f"lpea_gradient: {json.dumps({k: v for k, v in result['lpea_gradient'].items() if k != 'traceback'})}",
          file=sys.stderr, flush=True)
    write()
    result.update(timing(args.shape, args.rows, device, precision, args.repeats, args.warmup))
    print(f"timing: {result['timing']}; flex over SDPA {result.get('flex_over_sdpa')}; over stock SDPA "
          f"{result.get('over_sdpa')}", file=sys.stderr, flush=True)
    write()
    return result


if __name__ == "__main__":
    main()  # (exit 0: a failed check or row is a result, in the JSON)
