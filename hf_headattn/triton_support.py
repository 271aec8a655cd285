"""Where the package's Triton kernels can run (EaDRA's tiled pass, Rel_Pos's kernels), answered without importing
Triton: they run on CUDA tensors, or on CPU tensors under Triton's interpreter (`TRITON_INTERPRET=1`, set before the
process starts: the tests). Read at call time from this module's globals, which the benchmarks' counting sets to
count the accelerator's path on fake CPU tensors."""

from __future__ import annotations

import importlib.util
import os

import torch

INSTALLED = importlib.util.find_spec("triton") is not None
"""Whether Triton is installed (looked up once: inside a compiled model the look-up would be traced)."""
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Whether Triton interprets its kernels in this process (then they run on CPU tensors)."""


def triton_installed() -> bool:
    """Whether Triton is installed (`INSTALLED`, read when asked)."""
    return INSTALLED


def triton_kernel_device(device: torch.device) -> bool:
    """Whether Triton kernels run on `device`: CUDA, or the CPU under Triton's interpreter."""
    return device.type == "cuda" or (device.type == "cpu" and INTERPRETED)
