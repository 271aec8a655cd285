"""Which pass computes EaDRA's regularizers: the one reader of the `implementation` setting
(`eadra={"implementation": ...}`).

Three passes give the same R_peak, R_sent and R_dist (Eq. 4, 6, 8) of several layers, with the same arguments
(`layer_regularizers`, their common entry):

* eager: `hf_headattn.methods.eadra.equations.layer_regularizers`, one operation at a time, its map-sized work
  by `lean` (fewer maps written);
* compiled: the same function with its map-sized work under `torch.compile` (`compiled`);
* triton: tiled Triton kernels that never write a (queries x keys) map (`tiled`; CUDA, or the CPU under
  `TRITON_INTERPRET=1`), two custom operators that a compiled model calls as they are. It writes the least
  (counted at transformer-base: `benchmarks/overhead.py --count`, row `eadra-scratch-triton`), but its first
  version took 2.17 times the compiled pass's time on an H200 (bf16: 9.4 against 4.3 ms forward and backward at
  transformer-base; `benchmarks/results/gpu/nvidia-h200-20261127/triton-check.json`), so "auto" does not choose
  it: the GPU run (issue #66, `benchmarks/triton_check.py` in `benchmarks/gpu.sh`) decides. It is imported only
  when chosen.

The setting is checked once, when the settings are resolved (called by
[`hf_headattn.methods.eadra.core.EaDRASettings.resolved`][hf_headattn.methods.eadra.core.EaDRASettings.resolved]); each
pass is chosen by `choose_pass`.
"""

from __future__ import annotations

import torch

from ...triton_support import triton_installed
from .compiled import compile_failed
from .equations import layer_regularizers as fused_layer_regularizers

IMPLEMENTATIONS = ("auto", "eager", "compiled", "triton")
"""The values of the setting (the `Literal` of `EaDRASettings.implementation` lists the same)."""
AUTO_COMPILED_DEVICES = ("cuda",)
"""The devices on which "auto" compiles the pass."""


def check_implementation(implementation, name: str = "implementation") -> str:
    """The setting's value, refused unless one of `IMPLEMENTATIONS` (`ValueError` naming it and the allowed ones).
    ("triton" is checked where it runs: without Triton, on the CPU outside Triton's interpreter, on float64 heads or
    with LPEA's bias the pass raises a `ValueError` naming what it lacks.)"""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{name} must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    return implementation


def choose_pass(implementation: str, device: torch.device) -> str:
    """The pass for heads on `device`: "triton" (`tiled`), or a `compiled` mode ("eager", "compiled", or
    "compiled_or_eager": compiled, eager once a compile has failed in this process).

    "triton" runs the tiled kernels wherever it is chosen, inside a compiled model too (as opaque operators).
    "auto" compiles on `AUTO_COMPILED_DEVICES` where Triton is installed (Inductor's GPU code needs it) and
    no compile has failed. Inside a compiled model (asked first: the look for Triton was a graph break on torch 2.11)
    every other pass is the plain function, "eager", which the model's graph fuses.
    """
    if implementation == "triton":
        return "triton"
    if torch.compiler.is_compiling():
        return "eager"
    if implementation == "auto":
        compiles = device.type in AUTO_COMPILED_DEVICES and triton_installed() and not compile_failed()
        return "compiled_or_eager" if compiles else "eager"
    if implementation in ("eager", "compiled"):
        return implementation
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")


def layer_regularizers(queries, keys, num_heads: int, scaling: float, support: torch.Tensor,
                       query_mask: torch.Tensor, bias: torch.Tensor | None = None, recompute: bool = True,
                       implementation: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R_peak, R_sent and R_dist, each (L, B, h), by the pass `choose_pass` gives: the arguments and results of
    `hf_headattn.methods.eadra.equations.layer_regularizers` (the tiled pass always recomputes, whatever
    `recompute`)."""
    chosen = choose_pass(implementation, queries[0].device)
    if chosen == "triton":
        from .tiled import layer_regularizers as tiled_layer_regularizers  # (imports Triton: only when chosen)

        return tiled_layer_regularizers(queries, keys, num_heads, scaling, support, query_mask, bias)
    return fused_layer_regularizers(queries, keys, num_heads, scaling, support, query_mask, bias, recompute, chosen)

