"""The methods' passes, run one operation at a time or fused by ``torch.compile``.

A method's work beside the attention can be a pure function of tensors; on a GPU it then costs what its operations
cost to stream through memory, not what they compute. EaDRA's regularizer pass
(:func:`hf_headattn.eadra_math.layer_regularizers`) makes some twenty float32 passes over maps of (layers x batch x
heads x T x S); Inductor fuses them into a few kernels: on an H100 (``benchmarks/results/gpu``, transformer-base,
bf16 autocast) the step went from 1.48 to 1.20 times stock's, from 2.13 to 1.59 on a machine whose faster host left
the GPU no idle time to hide it in, and its peak memory from 1.26 to 1.03 times stock's. (DHICM's
:func:`hf_headattn.dhicm.mix_heads`, compiled the same way, was not faster: it stays eager.)

``implementation`` (EaDRA's setting, ``eadra["implementation"]``) says how a pass runs:

* ``"auto"`` (the default): compiled for CUDA tensors where Triton is installed, eager elsewhere (on a CPU the eager
  pass is as fast, and compiling costs seconds per kind of call);
* ``"eager"``: one operation at a time;
* ``"compiled"``: under ``torch.compile(backend=COMPILE_BACKEND, fullgraph=True)`` on any device.

A pass is compiled once per process and kind of call; lengths become dynamic after the first change, so a new batch
length does not compile again. Inside a model that is compiled already (``torch.compile(model)``, the Trainer's
``torch_compile=True``) every pass is the plain function: the model's graph fuses it. A compile that fails under
"auto" warns once and leaves every pass eager for the rest of the process; under "compiled" the error is raised.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings

import torch

IMPLEMENTATIONS = ("auto", "eager", "compiled")
#: The devices on which "auto" compiles.
AUTO_COMPILED_DEVICES = ("cuda",)
COMPILE_BACKEND = "inductor"
_compiled: dict = {}
_auto_failed: list[str] = []  # the error that made "auto" eager for this process


@functools.cache  # asked at every pass: the answer does not change within a process
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def check_implementation(implementation: str, name: str = "implementation") -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{name} must be one of {IMPLEMENTATIONS}, got {implementation!r}")


def wants_compiled(implementation: str, device: torch.device) -> bool:
    """Whether a pass on ``device`` runs compiled (outside a compiled model)."""
    if implementation == "auto":
        return device.type in AUTO_COMPILED_DEVICES and _has_triton() and not _auto_failed
    return implementation == "compiled"


def run(function, implementation: str, device: torch.device, *args):
    """``function(*args)``, compiled where :func:`wants_compiled` says so and no outer compile runs (asked first:
    inside a compiled model, :func:`wants_compiled`'s look for Triton, ``importlib.util.find_spec``, is a graph
    break)."""
    if torch.compiler.is_compiling() or not wants_compiled(implementation, device):
        return function(*args)
    key = (function, COMPILE_BACKEND)
    if key not in _compiled:
        _compiled[key] = torch.compile(function, backend=COMPILE_BACKEND, fullgraph=True)
    try:
        return _compiled[key](*args)
    except Exception as error:  # a backend that cannot compile here (no C++ compiler, an Inductor lowering, ...)
        if implementation == "compiled":
            raise
        _auto_failed.append(f"{type(error).__name__}: {error}")
        warnings.warn(f"a compiled pass ({function.__qualname__}) failed ({_auto_failed[0][:300]}); every pass runs "
                      "eagerly for the rest of this process (implementation='eager' skips the attempt)",
                      RuntimeWarning)
        return function(*args)
