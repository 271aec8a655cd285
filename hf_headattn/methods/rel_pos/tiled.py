"""Relative position representations (Shaw et al. 2018, Eq. 3-5) as flash-style Triton kernels: the same values and
gradients as [`relative_attention`][hf_headattn.methods.rel_pos.equations.relative_attention], without a (B, H, T, S)
tensor in memory.

Forward, per tile of queries (`block_m` rows), over tiles of keys (`block_n`) with the online softmax (the running
row maximum m and sum l, the output accumulator rescaled as they change):

- the key term: `per_label = q @ W^K^T * scaling` (block_m, L) once per query tile (L = 2k+1, padded to a power of
  two), each score gets `per_label[i, label_ij]` (a gather in registers), label_ij = clip(j - i - offset, k) + k
  (`offset` = S - T where the queries are the last T of the S positions, as `relative_labels` defines);
- the value term (Eq. 3): z_i = (sum_j p_ij v_j + sum_l (sum_{j: label_ij = l} p_ij) w^V_l) / l_i, the per-label
  sums (block_m, L) kept in registers and rescaled as the output accumulator: an inner label 0 < l < 2k is one key
  per query (j = i + offset + l - k, a gather from the tile's p), labels 0 and 2k the row sums of p left and right
  of the band;
- the mask (None, bool or additive float, broadcastable to (B, H, T, S)) is read tile by tile; a masked key's score
  is float32's `finfo.min`, as the reference writes it, so a row that allows no key is uniform as there.

It writes the output and m, l (B, H, T) only. The backward recomputes p = exp(s - m) / l: one kernel over the key
tiles of each query tile (D_i = rowsum(dO * O), dP = dO V^T + (dO W^V^T)[label], dS = P (dP - D), dQ = scaling (dS K
+ the per-label sums of dS W^K), and each query tile's share of dW^K (the per-label sums of dS)^T Q and of dW^V (the
per-label sums of P)^T dO), one over the query tiles of each key tile (dK = scaling dS^T Q, dV = P^T dO). As the
reference, a row that allows no key gives the key term no gradient. The tables' shares (float32, one per sentence,
head and query tile) are summed over the tiles in the operator, over the sentences (and the heads of a shared table)
by torch.

Both are `torch.library` custom operators (`mutates_args=()`, fake implementations of the true output shapes):
opaque to `torch.compile` (no graph break) and counted under `FakeTensorMode` as the bytes the kernels write. Which
calls run them (the `implementation` setting): `hf_headattn.methods.rel_pos.core`. The kernels themselves
(`tiled_kernels`, imported where one is launched) need Triton (the `triton` extra); on CPU tensors they run under
Triton's interpreter (`TRITON_INTERPRET=1`, the tests).
"""

from __future__ import annotations

import re

import torch

BLOCKS = (64, 64)
"""The default (block_m, block_n): queries and keys per tile."""
LAUNCH = {"num_warps": 8, "num_stages": 2}
"""The kernels' launch options. Compiled for sm_90 (an H200's) on the CPU (`benchmarks/rel_pos_check.py
--registers`: bfloat16, 64 x 64 tiles, head dimension 64), four warps spill 0.6-1.3 KB of registers a thread, eight
0.1-0.3 KB; not yet timed."""


def _power_of_two(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def _tiles(n: int, block: int) -> int:
    return -(-n // block)


def _rows(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` with unit stride along its last dimension (the kernels' rows)."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _launch_arguments(query, key, value, key_table, value_table, mask, max_distance):
    """The tensors as the kernels read them, their strides, the mask's kind and the block sizes of the labels and
    the head dimension."""
    batch, heads, length, dim = query.shape
    num_labels = 2 * max_distance + 1
    query, key, value = (_rows(t) for t in (query, key, value))
    tables = [_rows(t if t.dim() == 3 else t.expand(heads, *t.shape)) for t in (key_table, value_table)]
    if mask is None:
        kind, mask = 0, query.new_zeros((1, 1, 1, 1))
    else:
        kind = 1 if mask.dtype == torch.bool else 2
        mask = mask.expand(batch, heads, length, key.shape[2])
        mask = mask.view(torch.uint8) if kind == 1 else mask
    strides = (*query.stride()[:3], *key.stride()[:3], *value.stride()[:3])
    table_strides = (*tables[0].stride()[:2], *tables[1].stride()[:2])
    mask_strides = (0, 0, 0, 0) if kind == 0 else tuple(mask.stride())
    blocks = dict(BD=_power_of_two(dim), BL=_power_of_two(num_labels))
    dot = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "tf32x3"  # (float32 blocks; 3xTF32 ~ float32)
    return query, key, value, tables, mask, kind, strides, table_strides, mask_strides, blocks, dot


def _forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_table: torch.Tensor,
             value_table: torch.Tensor, mask: torch.Tensor | None, scaling: float, offset: int, max_distance: int,
             block_m: int, block_n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from .tiled_kernels import _forward_kernel  # (Triton: only where a kernel is launched)

    batch, heads, length, dim = query.shape
    key_length = key.shape[2]
    output, row_max, row_sum = _forward_fake(query, key, value, key_table, value_table, mask, scaling, offset,
                                             max_distance, block_m, block_n)
    query, key, value, tables, mask, kind, strides, table_strides, mask_strides, blocks, dot = _launch_arguments(
        query, key, value, key_table, value_table, mask, max_distance)
    grid = (_tiles(length, block_m), batch * heads)
    _forward_kernel[grid](query, key, value, *tables, mask, output, row_max, row_sum, *strides,
                          *output.stride()[:3], *table_strides, *mask_strides, heads, length, key_length, dim,
                          scaling, offset, max_distance, MASK=kind, DOT=dot, BM=block_m, BN=block_n, **blocks,
                          **LAUNCH)
    return output, row_max, row_sum


def _forward_fake(query, key, value, key_table, value_table, mask, scaling, offset, max_distance, block_m, block_n):
    """The output in the query's layout, and m, l (B, H, T) float32."""
    stats = query.new_empty(query.shape[:3], dtype=torch.float32)
    return torch.empty_like(query), stats, torch.empty_like(stats)


def _backward(grad_output: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              key_table: torch.Tensor, value_table: torch.Tensor, mask: torch.Tensor | None, output: torch.Tensor,
              row_max: torch.Tensor, row_sum: torch.Tensor, scaling: float, offset: int, max_distance: int,
              block_m: int, block_n: int) -> tuple[torch.Tensor, ...]:
    from .tiled_kernels import _key_kernel, _query_kernel  # (Triton: only where a kernel is launched)

    batch, heads, length, dim = query.shape
    key_length = key.shape[2]
    grad_query, grad_key, grad_value, shares_k, shares_v, delta = _backward_fake(
        grad_output, query, key, value, key_table, value_table, mask, output, row_max, row_sum, scaling, offset,
        max_distance, block_m, block_n)
    grad_output, output = _rows(grad_output), _rows(output)
    query, key, value, tables, mask, kind, strides, table_strides, mask_strides, blocks, dot = _launch_arguments(
        query, key, value, key_table, value_table, mask, max_distance)
    sizes = (heads, length, key_length, dim, scaling, offset, max_distance)
    options = dict(MASK=kind, DOT=dot, BM=block_m, BN=block_n, **blocks, **LAUNCH)
    # the tables' shares at the padded block sizes: (B, query tiles, H, BL, BD)
    padded_k = shares_k.new_empty(batch, _tiles(length, block_m), heads, blocks["BL"], blocks["BD"])
    padded_v = torch.empty_like(padded_k)
    _query_kernel[(padded_k.shape[1], batch * heads)](
        query, key, value, *tables, mask, output, grad_output, row_max, row_sum, delta, grad_query, padded_k,
        padded_v, *strides, *output.stride()[:3], *grad_output.stride()[:3], *grad_query.stride()[:3],
        *table_strides, *mask_strides, *sizes, **options)
    _key_kernel[(_tiles(key_length, block_n), batch * heads)](
        query, key, value, *tables, mask, grad_output, row_max, row_sum, delta, grad_key, grad_value, *strides,
        *grad_output.stride()[:3], *grad_key.stride()[:3], *grad_value.stride()[:3], *table_strides,
        *mask_strides, *sizes, **options)
    num_labels = 2 * max_distance + 1
    shares_k.copy_(padded_k[..., :num_labels, :dim].sum(1))
    shares_v.copy_(padded_v[..., :num_labels, :dim].sum(1))
    return grad_query, grad_key, grad_value, shares_k, shares_v, delta


def _backward_fake(grad_output, query, key, value, key_table, value_table, mask, output, row_max, row_sum, scaling,
                   offset, max_distance, block_m, block_n):
    """dQ, dK, dV in their inputs' layouts; the tables' gradients summed over the query tiles, (B, H, L, D) float32;
    D (B, H, T) float32."""
    batch, heads, length, dim = query.shape
    shares = query.new_empty(batch, heads, 2 * max_distance + 1, dim, dtype=torch.float32)
    return (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), shares, torch.empty_like(shares),
            torch.empty_like(row_max))


_MODULE = re.sub(r"\W", "_", __name__)
_NAMES = ("rel_pos_attention", "rel_pos_attention_backward")


def _custom_op(name: str, function, schema: str, fake):
    """`function` as the operator `hf_headattn::<name>_<this module's name>` (unique to this copy of the code, as
    `hf_headattn.losses`' operators)."""
    op = torch.library.custom_op(f"hf_headattn::{name}_{_MODULE}", function, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


_INPUTS = ("Tensor query, Tensor key, Tensor value, Tensor key_table, Tensor value_table, Tensor? mask, "
           "float scaling, int offset, int max_distance, int block_m, int block_n")
FORWARD_OP = _custom_op(_NAMES[0], _forward, f"({_INPUTS}) -> (Tensor, Tensor, Tensor)", _forward_fake)
_SAVED = "Tensor? mask, Tensor output, Tensor row_max, Tensor row_sum, "
BACKWARD_OP = _custom_op(
    _NAMES[1], _backward,
    f"(Tensor grad_output, {_INPUTS.replace('Tensor? mask, ', _SAVED)}) -> (Tensor, Tensor, Tensor, Tensor, Tensor, "
    "Tensor)", _backward_fake)


def _setup_context(ctx, inputs, output):
    query, key, value, key_table, value_table, mask, *settings = inputs
    ctx.save_for_backward(query, key, value, key_table, value_table, mask, *output)
    ctx.settings = settings


def _gradients(ctx, grad_output, *unused):
    query, key, value, key_table, value_table, mask, output, row_max, row_sum = ctx.saved_tensors
    grad_query, grad_key, grad_value, shares_k, shares_v, _ = BACKWARD_OP(
        grad_output, query, key, value, key_table, value_table, mask, output, row_max, row_sum, *ctx.settings)
    grad_tables = [(shares.sum(0) if table.dim() == 3 else shares.sum((0, 1))).to(table.dtype)
                   for shares, table in ((shares_k, key_table), (shares_v, value_table))]
    return grad_query, grad_key, grad_value, *grad_tables, None, None, None, None, None, None


FORWARD_OP.register_autograd(_gradients, setup_context=_setup_context)


def operators() -> tuple:
    """The forward and the backward operator as `torch.ops` packets (a flop counter's keys)."""
    return tuple(getattr(torch.ops.hf_headattn, f"{name}_{_MODULE}") for name in _NAMES)


def tiled_relative_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_table: torch.Tensor,
                             value_table: torch.Tensor, mask: torch.Tensor | None, scaling: float, offset: int,
                             max_distance: int, blocks: tuple[int, int] = BLOCKS) -> torch.Tensor:
    """Eq. 3-4 by the kernels: the output (B, H, T, D) of
    [`relative_attention`][hf_headattn.methods.rel_pos.equations.relative_attention] (not the weights, which are
    never formed), differentiable in the query, key, value and both tables.

    Parameters
    ----------
    query
        (B, H, T, D); key, value : (B, H, S, D)
    key_table, value_table
        (L, D) or (H, L, D), w^K and w^V, L = 2 `max_distance` + 1
    mask
        None, bool (True = attend) or additive float without a gradient, broadcastable to (B, H, T, S)
    offset
        the label of (i, j) is clip(j - i - offset, k) + k (`relative_labels`: offset = S - T)
    max_distance
        k, the clipping distance
    blocks
        (queries, keys) per tile: powers of two >= 16
    """
    if any(size < 16 or size & (size - 1) for size in blocks):
        raise ValueError(f"blocks must be powers of two >= 16, got {blocks!r}")
    key_table, value_table = key_table.to(query.dtype), value_table.to(query.dtype)  # (the kernels' products)
    output, _, _ = FORWARD_OP(query, key, value, key_table, value_table, mask, float(scaling), int(offset),
                            int(max_distance), *blocks)
    return output
