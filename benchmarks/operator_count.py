"""Counting the ATen operators a piece of code dispatches, and those of them that read a tensor's value on the host.

On a GPU each operator is a kernel launch and each host read (``SYNC_OPERATORS``) a host-device synchronisation;
both are counted the same way on the CPU. Used by ``benchmarks/overhead.py`` and the tests (``tests/test_overhead.py``,
``tests/methods/eadra/test_eadra_model.py``), which put this folder on ``sys.path``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hf_headattn.methods.sea import core as sea

#: The operators that need a tensor's value on the host (on a GPU each one synchronises the host with the device), by
#: overload packet (every overload of it counts), and why; also indexing with a boolean mask (``BOOL_INDEXING``).
#: Not seen by a dispatch mode, so not counted: ``tolist()`` and ``numpy()``, which read the tensor without
#: dispatching an operator.
SYNC_OPERATORS = {
    "aten._local_scalar_dense": "the value itself: .item(), int(t), float(t), bool(t), `if t:`",
    "aten.is_nonzero": "bool(t) where it reaches the dispatcher whole (in PyTorch 2.x it becomes the above)",
    "aten.equal": "torch.equal returns a Python bool",
    "aten.nonzero": "output size = the number of non-zeros (torch.where(cond), nonzero())",
    "aten.masked_select": "output size = the number of True mask entries",
    "aten._unique": "output size = the number of distinct values (torch.unique)",
    "aten._unique2": "output size = the number of distinct values (torch.unique)",
    "aten.unique_dim": "output size = the number of distinct slices (torch.unique(dim=...))",
    "aten.unique_consecutive": "output size = the number of runs (torch.unique_consecutive)",
    "aten.unique_dim_consecutive": "output size = the number of runs of slices",
    "aten.repeat_interleave": "with tensor repeats, output size = repeats.sum() (counted even with output_size)",
}
#: Indexing operators that read a boolean (or uint8) mask index on the host for the number of selected entries
#: (``t[mask]``, ``t[mask] = v``); with integer indices they do not.
BOOL_INDEXING = ("aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_")


def reads_on_host(func, args=()) -> bool:
    """Whether the ATen operator ``func`` (an ``OpOverload``) called with ``args`` reads a value on the host."""
    name = str(func.overloadpacket)
    if name in BOOL_INDEXING:
        return any(index is not None and index.dtype in (torch.bool, torch.uint8) for index in args[1])
    return name in SYNC_OPERATORS


class OperatorCounter(TorchDispatchMode):
    """While active: ``count``, the ATen operators dispatched; ``syncs``, the names of those that read on the host."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        if reads_on_host(func, args):
            self.syncs.append(str(func))
        return func(*args, **(kwargs or {}))


def count_operators(run: Callable[[], object]) -> int:
    """ATen operators ``run()`` dispatches: on a GPU, kernel launches, which set the cost of small models whose
    kernels are shorter than their launch."""
    with OperatorCounter() as counter:
        run()
    return counter.count


def sync_operators(run: Callable[[], object]) -> list[str]:
    """The operators of ``run()`` that read a tensor's value on the host (``SYNC_OPERATORS``), in order, on the path a
    GPU takes: SEA checks ``phrase_positions`` on the host only on the CPU, where that costs nothing, and with a
    device-side assertion elsewhere, so its host check is switched off here."""
    checks_on_host = sea._checks_on_host
    sea._checks_on_host = lambda tensor: False
    try:
        with OperatorCounter() as counter:
            run()
    finally:
        sea._checks_on_host = checks_on_host
    return counter.syncs
