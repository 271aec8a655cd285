"""The methods' passes, run one operation at a time or fused by `torch.compile`.

A method's work beside the attention can be a pure function of tensors; on a GPU it then costs what its operations
cost to stream through memory, not what they compute. EaDRA's regularizer pass
(`equations.layer_regularizers`) makes some twenty float32 passes over maps of (layers x batch x
heads x T x S); Inductor fuses them into a few kernels: on an H100 (`benchmarks/results/gpu`, transformer-base,
bf16 autocast) the step went from 1.48 to 1.20 times stock's, from 2.13 to 1.59 on a machine whose faster host left
the GPU no idle time to hide it in, and its peak memory from 1.26 to 1.03 times stock's. (DHICM's
`hf_headattn.methods.dhicm.core.mix_heads`, compiled the same way, was not faster: it stays eager.)

How a pass runs, its `mode` (EaDRA's `implementation` setting chooses it, in one place:
`hf_headattn.methods.eadra.passes.choose_pass`):

* `"eager"`: one operation at a time;
* `"compiled"`: under `torch.compile(backend=COMPILE_BACKEND, fullgraph=True)`; a compile that fails raises;
* `"compiled_or_eager"`: compiled, but a compile that fails warns once and leaves every pass of this mode eager for
  the rest of the process (`compile_failed`; what "auto" asks for on CUDA).

A pass is compiled once per process and kind of call; lengths become dynamic after the first change, so a new batch
length does not compile again. Inside a model that is compiled already (`torch.compile(model)`, the Trainer's
`torch_compile=True`) every pass is the plain function: the model's graph fuses it.
"""

from __future__ import annotations

import warnings

import torch

MODES = ("eager", "compiled", "compiled_or_eager")
COMPILE_BACKEND = "inductor"
_compiled: dict = {}
_auto_failed: list[str] = []  # the error that made "compiled_or_eager" eager for this process


def check_mode(mode: str, name: str = "mode") -> None:
    if mode not in MODES:
        raise ValueError(f"{name} must be one of {MODES}, got {mode!r}")


def compile_failed() -> bool:
    """Whether a `"compiled_or_eager"` pass failed to compile in this process (its passes then run eagerly)."""
    return bool(_auto_failed)


def run(function, mode: str, *args):
    """`function(*args)` as `mode` says (see the module docstring), plainly inside a compiled model."""
    if mode == "eager" or torch.compiler.is_compiling() or (mode == "compiled_or_eager" and _auto_failed):
        return function(*args)
    key = (function, COMPILE_BACKEND)
    if key not in _compiled:
        _compiled[key] = torch.compile(function, backend=COMPILE_BACKEND, fullgraph=True)
    try:
        return _compiled[key](*args)
    except Exception as error:  # a backend that cannot compile here (no C++ compiler, an Inductor lowering, ...)
        if mode == "compiled":
            raise
        _auto_failed.append(f"{type(error).__name__}: {error}")
        warnings.warn(f"a compiled pass ({function.__qualname__}) failed ({_auto_failed[0][:300]}); every pass runs "
                      "eagerly for the rest of this process (implementation='eager' skips the attempt)",
                      RuntimeWarning)
        return function(*args)
