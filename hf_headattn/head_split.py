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
    else they are concatenated and put in head order with an `index_select`. In an eager step with gradients,
    q/k/v are cut in one autograd Function whose backward writes each gradient once in HF's layout (`parts_of`), and
    the join's backward is one `split`. Index tensors are made once per device
    ([`HeadIndex`][hf_headattn.head_split.HeadIndex]), a split once per grouping (`of`)."""

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

    def parts_of(self, tensors: tuple[torch.Tensor, ...], dim: int) -> list[list]:
        """`parts` of each of `tensors` (q, k, v: every head along `dim`). In an eager step with gradients, cut in
        one autograd Function (`_Cut`) whose backward writes each tensor's gradient at once in the tensor's own
        layout (HF's q/k/v are views of (B, T, H, D)): zeros only where a group gave no gradient (a fixed head's
        q/k), and no copy into HF's layout after it, which autograd's own backward of the cut (a `cat` in (B, H,
        T, D)) needs."""
        if (len(self.groups) == 1 or torch.compiler.is_compiling() or not torch.is_grad_enabled()
                or not any(tensor.requires_grad for tensor in tensors)
                or any(tensor.shape[dim] != sum(self.sizes) for tensor in tensors)):
            return [self.parts(tensor, dim) for tensor in tensors]
        cut = _Cut.apply(self.groups, dim, *tensors)
        count = len(self.groups)
        return [list(cut[i * count:(i + 1) * count]) for i in range(len(tensors))]

    def join(self, parts: list[torch.Tensor], dim: int) -> torch.Tensor:
        """The groups' results (in the groups' order, each with its heads along `dim`) as one, in head order."""
        if self.runs:
            if len(parts) == 1:
                return parts[0]
            ordered = [parts[i] for i in self.by_first]
            if torch.is_grad_enabled() and not torch.compiler.is_compiling() and any(p.requires_grad for p in parts):
                return _Join.apply(dim, *ordered)  # (its backward one split, autograd's one narrow a part)
            return torch.cat(ordered, dim)
        joined = parts[0] if len(parts) == 1 else torch.cat(parts, dim)
        return joined.index_select(dim, self.place.on(joined.device))

    def whole_gradient(self, tensor: torch.Tensor, grads, dim: int) -> torch.Tensor | None:
        """The gradient of `tensor` (every head along `dim`) from its groups' gradients `grads` (None: none), in
        `tensor`'s layout: one `cat` into it where every group is a run with a gradient, else zeros and one
        `index_copy_` a group with a gradient."""
        if all(grad is None for grad in grads):
            return None
        if self.runs and all(grad is not None for grad in grads):
            return torch.cat([grads[i] for i in self.by_first], dim, out=torch.empty_like(tensor))
        whole = torch.zeros_like(tensor)
        for i, grad in enumerate(grads):
            if grad is not None:
                whole.index_copy_(dim, self.index(i, grad.device), grad)
        return whole


class _Cut(torch.autograd.Function):
    """The groups' heads of each tensor as views ([`HeadSplit.parts`][hf_headattn.head_split.HeadSplit.parts]),
    each tensor's gradient written in its own layout by `HeadSplit.whole_gradient`. Eager only."""

    @staticmethod
    def forward(ctx, groups, dim, *tensors):
        ctx.set_materialize_grads(False)
        ctx.groups, ctx.dim = groups, dim
        ctx.save_for_backward(*tensors)
        split = HeadSplit.of(groups)
        return tuple(part for tensor in tensors for part in split.parts(tensor, dim))

    @staticmethod
    def backward(ctx, *grads):
        split, count = HeadSplit.of(ctx.groups), len(ctx.groups)
        return None, None, *(
            split.whole_gradient(tensor, grads[i * count:(i + 1) * count], ctx.dim) if needed else None
            for i, (tensor, needed) in enumerate(zip(ctx.saved_tensors, ctx.needs_input_grad[2:])))


class _Join(torch.autograd.Function):
    """`torch.cat` of the parts along `dim`, whose backward is one `split` (autograd's: one `narrow` a part).
    Eager only."""

    @staticmethod
    def forward(ctx, dim, *parts):
        ctx.dim, ctx.sizes = dim, [part.shape[dim] for part in parts]
        return torch.cat(parts, dim)

    @staticmethod
    def backward(ctx, grad):
        return None, *grad.split_with_sizes(ctx.sizes, ctx.dim)
