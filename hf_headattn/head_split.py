"""Head numbers on a device, and how an attention call's heads are cut into groups and put back in order.

[`HeadIndex`][hf_headattn.head_split.HeadIndex] keeps head numbers with their index tensor made once per device
([`constant`][hf_headattn.head_split.constant]); `HeadSplit` plans how q/k/v are cut among the backend and the methods
that take heads over ([`take_over`][hf_headattn.attention_call.AttentionCall.take_over]) and how their per-head results
are joined.
"""

from __future__ import annotations

import torch

_CONSTANTS: dict[tuple, torch.Tensor] = {}


def constant(values: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """`values` (host numbers or flags) as a 1-D tensor on `device`, made once per (values, dtype, device): one
    made at every call would be a copy to the device each time. Under torch.compile a constant of the graph (filling
    the cache would change what the compiled graph guards on, and recompile it)."""
    if torch.compiler.is_compiling():
        return torch.tensor(values, dtype=dtype, device=device)
    key = (values, dtype, torch.device(device))
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.tensor(values, dtype=dtype, device=device)
    return _CONSTANTS[key]


class HeadIndex:
    """Head numbers kept as a tuple, with their index tensor made once per device
    ([`constant`][hf_headattn.head_split.constant]).

    Not a buffer: `from_pretrained` builds the modules on the meta device and leaves a non-persistent buffer made
    in `__init__` uninitialised."""

    def __init__(self, numbers):
        self.numbers = tuple(int(number) for number in numbers)

    def on(self, device: torch.device) -> torch.Tensor:
        """The numbers as a LongTensor on `device` ([`constant`][hf_headattn.head_split.constant])."""
        return constant(self.numbers, torch.long, device)

    def __len__(self) -> int:
        return len(self.numbers)

    def __repr__(self) -> str:
        return repr(list(self.numbers))



class HeadSplit:
    """How a call's heads are cut into groups (the backend's heads, each method's taken-over heads: tuples of head
    numbers that together hold every head once) and their per-head results put back in head order.

    A group of consecutive ascending heads is cut as a view (`narrow`), another one with `index_select`. Where
    every group is such a run, q/k/v are cut in one `split` (its backward: one `cat`) and the groups' results,
    concatenated in the order of their first heads, are in head order: one `cat`, or none for a single group;
    else they are concatenated and put in head order with an `index_select`. Index tensors are made once per
    device ([`HeadIndex`][hf_headattn.head_split.HeadIndex]), a split once per grouping (`of`)."""

    _made: dict[tuple[tuple[int, ...], ...], HeadSplit] = {}

    def __init__(self, groups: tuple[tuple[int, ...], ...]):
        self.groups = groups
        self.run = [group == tuple(range(group[0], group[0] + len(group))) for group in groups]
        self.runs = all(self.run)
        self.by_first = sorted(range(len(groups)), key=lambda i: groups[i][0])
        self.sizes = [len(groups[i]) for i in self.by_first]
        self.indexes = [HeadIndex(group) for group in groups]
        order = [head for group in groups for head in group]
        self.place = None if self.runs else HeadIndex(sorted(range(len(order)), key=order.__getitem__))

    @classmethod
    def of(cls, groups: tuple[tuple[int, ...], ...]) -> HeadSplit:
        """The split of `groups`, made once (and afresh while torch.compile traces: a constant of the graph)."""
        if torch.compiler.is_compiling():
            return cls(groups)
        made = cls._made.get(groups)
        if made is None:
            if len(cls._made) >= 1024:  # (groupings chosen per call, e.g. by the data, must not grow it forever)
                cls._made.clear()
            made = cls._made[groups] = cls(groups)
        return made

    def index(self, i: int, device: torch.device) -> torch.Tensor:
        """Group `i`'s head numbers as a LongTensor on `device`."""
        return self.indexes[i].on(device)

    def part(self, tensor: torch.Tensor | None, dim: int, i: int) -> torch.Tensor | None:
        """Group `i`'s heads of `tensor` along `dim` (`tensor` itself where it is None or has size 1 there:
        it broadcasts)."""
        group = self.groups[i]
        if tensor is None or tensor.shape[dim] == 1:
            return tensor
        if not self.run[i]:
            return tensor.index_select(dim, self.index(i, tensor.device))
        return tensor if len(group) == tensor.shape[dim] else tensor.narrow(dim, group[0], len(group))

    def parts(self, tensor: torch.Tensor | None, dim: int) -> list:
        """Every group's heads of `tensor` along `dim`, in the groups' order (`tensor` itself for each where it
        is None or has size 1 there)."""
        if tensor is None or tensor.shape[dim] == 1:
            return [tensor] * len(self.groups)
        if not self.runs or len(self.groups) == 1:
            return [self.part(tensor, dim, i) for i in range(len(self.groups))]
        parts = [None] * len(self.groups)
        for i, part in zip(self.by_first, tensor.split_with_sizes(self.sizes, dim)):
            parts[i] = part
        return parts

    def join(self, parts: list[torch.Tensor], dim: int) -> torch.Tensor:
        """The groups' results (in the groups' order, each with its heads along `dim`) as one, in head order."""
        if self.runs:
            return parts[0] if len(parts) == 1 else torch.cat([parts[i] for i in self.by_first], dim)
        joined = parts[0] if len(parts) == 1 else torch.cat(parts, dim)
        return joined.index_select(dim, self.place.on(joined.device))
