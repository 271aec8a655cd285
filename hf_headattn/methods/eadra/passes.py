"""Which pass computes EaDRA's regularizers: the one reader of the `implementation` setting
(`eadra={"implementation": ...}`).

Two passes give the same R_peak, R_sent and R_dist (Eq. 4, 6, 8) of several layers, with the same arguments
(`layer_regularizers`, their common entry):

* eager: `hf_headattn.methods.eadra.equations.layer_regularizers`, one operation at a time, its map-sized work
  by `lean` (fewer maps written);
* compiled: the same function with its map-sized work under `torch.compile` (`compiled`).

Until 0.3.0 there was a third, Triton kernels that never wrote a (queries x keys) map; "auto" never chose it, and on
a GPU it took 2.17 times the compiled pass's time (H200, bf16: 9.4 against 4.3 ms forward and backward at
transformer-base; fp32 21.4 against 5.1 ms; `benchmarks/results/gpu/nvidia-h200-20261127/triton-check.json`), so it
went: a saved config that chooses `"triton"` still loads, warns once and runs "auto" (`check_implementation`).
The setting is checked once, when the settings are resolved (called by
[`hf_headattn.methods.eadra.core.EaDRASettings.resolved`][hf_headattn.methods.eadra.core.EaDRASettings.resolved]); each
pass is chosen by `choose_pass`.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings

import torch

from .compiled import compile_failed
from .equations import layer_regularizers as fused_layer_regularizers

IMPLEMENTATIONS = ("auto", "eager", "compiled")
"""The values of the setting (the `Literal` of `EaDRASettings.implementation` lists the same)."""
REMOVED_IMPLEMENTATIONS = {"triton": "auto"}
"""Values of earlier releases, still read (a saved config keeps loading): value -> what runs instead."""
AUTO_COMPILED_DEVICES = ("cuda",)
"""The devices on which "auto" compiles the pass."""


@functools.cache  # asked at every pass: the answer does not change within a process
def _has_triton() -> bool:
    """Whether Triton is installed: Inductor's GPU code needs it to compile the pass."""
    return importlib.util.find_spec("triton") is not None


def check_implementation(implementation, name: str = "implementation") -> str:
    """The implementation to run for the setting's value: the value itself, or for a value a release removed
    (`REMOVED_IMPLEMENTATIONS`: "triton") its replacement, with a warning once a process. Any other value is
    refused (`ValueError` naming it and the allowed ones)."""
    if implementation in REMOVED_IMPLEMENTATIONS:
        replacement = REMOVED_IMPLEMENTATIONS[implementation]
        message = (f"{name}={implementation!r}: EaDRA's Triton pass was removed (slower than the compiled pass); "
                   f"running {replacement!r}, which gives the same terms")
        if message not in _WARNED:  # once a process: the settings are resolved again at every change of the config
            _WARNED.add(message)
            warnings.warn(message, UserWarning, stacklevel=2)
        return replacement
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{name} must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    return implementation


_WARNED: set[str] = set()


def choose_pass(implementation: str, device: torch.device) -> str:
    """The pass for heads on `device`, a `compiled` mode ("eager", "compiled", or
    "compiled_or_eager": compiled, eager once a compile has failed in this process).

    "auto" compiles on `AUTO_COMPILED_DEVICES` where Triton is installed (Inductor's GPU code needs it) and
    no compile has failed. Inside a compiled model (asked first: the look for Triton was a graph break on torch 2.11)
    every pass is the plain function, "eager", which the model's graph fuses.
    """
    if torch.compiler.is_compiling():
        return "eager"
    if implementation == "auto":
        compiles = device.type in AUTO_COMPILED_DEVICES and _has_triton() and not compile_failed()
        return "compiled_or_eager" if compiles else "eager"
    if implementation in ("eager", "compiled"):
        return implementation
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")


def layer_regularizers(queries, keys, num_heads: int, scaling: float, support: torch.Tensor,
                       query_mask: torch.Tensor, bias: torch.Tensor | None = None, recompute: bool = True,
                       implementation: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R_peak, R_sent and R_dist, each (L, B, h), by the pass `choose_pass` gives: the arguments and results of
    `hf_headattn.methods.eadra.equations.layer_regularizers`."""
    chosen = choose_pass(implementation, queries[0].device)
    return fused_layer_regularizers(queries, keys, num_heads, scaling, support, query_mask, bias, recompute, chosen)

