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
calls run them (the `implementation` setting): `hf_headattn.methods.rel_pos.core`. This module needs Triton (the
`triton` extra); on CPU tensors the kernels run under Triton's interpreter (`TRITON_INTERPRET=1`, the tests).
"""

from __future__ import annotations

import re

import torch

try:  # (core.py imports this module only where Triton is installed)
    import triton
    import triton.language as tl
except ImportError as error:
    raise ImportError("hf_headattn.methods.rel_pos.tiled needs Triton (pip install triton; the `triton` extra)") \
        from error

BLOCKS = (64, 64)
"""The default (block_m, block_n): queries and keys per tile."""
LAUNCH = {"num_warps": 8, "num_stages": 2}
"""The kernels' launch options. Compiled for sm_90 (an H200's) on the CPU (`benchmarks/rel_pos_check.py
--registers`: bfloat16, 64 x 64 tiles, head dimension 64), four warps spill 0.6-1.3 KB of registers a thread, eight
0.1-0.3 KB; not yet timed."""
MASKED = tl.constexpr(-3.4028234663852886e38)
"""A masked key's score: float32's `finfo.min`, as the reference's bool mask writes it."""


@triton.jit
def _scores(q, key, per_label, rows, cols, offset, k, length, key_length, mask_base, sm_t, sm_s, scaling,
            MASK: tl.constexpr, DOT: tl.constexpr):
    """The scores of a (query, key) tile, their relative distances j - i - offset and labels (each (BM, BN))."""
    s = tl.dot(q, tl.trans(key), input_precision=DOT) * scaling
    rel = cols[None, :] - rows[:, None] - offset
    labels = tl.minimum(tl.maximum(rel, -k), k) + k
    s += tl.gather(per_label, labels, axis=1)
    inside = cols[None, :] < key_length
    read = inside & (rows[:, None] < length)
    if MASK == 1:  # bool (as uint8): True attends
        allowed = tl.load(mask_base + rows[:, None] * sm_t + cols[None, :] * sm_s, mask=read, other=1)
        s = tl.where(allowed != 0, s, MASKED)
    elif MASK == 2:  # additive float
        s += tl.load(mask_base + rows[:, None] * sm_t + cols[None, :] * sm_s, mask=read, other=0.0).to(tl.float32)
    return tl.where(inside, s, float("-inf")), rel, labels


@triton.jit
def _label_sums(p, rel, rows, start, offset, k, BN: tl.constexpr, BL: tl.constexpr):
    """sum_{j in the tile: label_ij = l} p_ij: (BM, BL) from p (BM, BN); `start` the tile's first key. An inner label
    0 < l < 2k is one key per query (j = i + offset + l - k): a gather; labels 0 and 2k the row sums beside the band."""
    label = tl.arange(0, BL)[None, :]
    column = rows[:, None] + offset + label - k - start  # (BM, BL): the key of each inner label, in the tile
    inner = (label > 0) & (label < 2 * k) & (column >= 0) & (column < BN)
    sums = tl.where(inner, tl.gather(p, tl.minimum(tl.maximum(column, 0), BN - 1), axis=1), 0.0)
    left = tl.sum(tl.where(rel <= -k, p, 0.0), 1)
    right = tl.sum(tl.where(rel >= k, p, 0.0), 1)
    return sums + tl.where(label == 0, left[:, None], 0.0) + tl.where(label == 2 * k, right[:, None], 0.0)


@triton.jit
def _forward_kernel(Q, K, V, WK, WV, Mask, Out, RowMax, RowSum,
                    sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_t,
                    swk_h, swk_l, swv_h, swv_l, sm_b, sm_h, sm_t, sm_s,
                    heads, length, key_length, dim, scaling, offset, k,
                    MASK: tl.constexpr, DOT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                    BL: tl.constexpr):
    tile, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    rows = tile * BM + tl.arange(0, BM)
    dims = tl.arange(0, BD)
    label = tl.arange(0, BL)
    row_in, dim_in = rows[:, None] < length, dims[None, :] < dim
    q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :], mask=row_in & dim_in, other=0.0)
    table_in = (label[:, None] < 2 * k + 1) & dim_in
    w_k = tl.load(WK + h * swk_h + label[:, None] * swk_l + dims[None, :], mask=table_in, other=0.0)
    per_label = tl.dot(q, tl.trans(w_k), input_precision=DOT) * scaling  # (BM, BL), Eq. 4's term per label
    mask_base = Mask + b * sm_b + h * sm_h
    row_max = tl.full([BM], float("-inf"), tl.float32)
    row_sum = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    sums = tl.zeros([BM, BL], tl.float32)
    for start in range(0, key_length, BN):
        cols = start + tl.arange(0, BN)
        key_in = (cols[:, None] < key_length) & dim_in
        key = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_s + dims[None, :], mask=key_in, other=0.0)
        s, rel, _ = _scores(q, key, per_label, rows, cols, offset, k, length, key_length, mask_base, sm_t, sm_s,
                            scaling, MASK, DOT)
        new_max = tl.maximum(row_max, tl.max(s, 1))
        rescale = tl.exp(row_max - new_max)
        p = tl.exp(s - new_max[:, None])
        row_sum = row_sum * rescale + tl.sum(p, 1)
        value = tl.load(V + b * sv_b + h * sv_h + cols[:, None] * sv_s + dims[None, :], mask=key_in, other=0.0)
        acc = acc * rescale[:, None] + tl.dot(p.to(value.dtype), value, input_precision=DOT)
        sums = sums * rescale[:, None] + _label_sums(p, rel, rows, start, offset, k, BN, BL)
        row_max = new_max
    w_v = tl.load(WV + h * swv_h + label[:, None] * swv_l + dims[None, :], mask=table_in, other=0.0)
    out = (acc + tl.dot(sums.to(w_v.dtype), w_v, input_precision=DOT)) / row_sum[:, None]
    tl.store(Out + b * so_b + h * so_h + rows[:, None] * so_t + dims[None, :], out.to(Out.dtype.element_ty),
             mask=row_in & dim_in)
    stats = bh * length + rows
    tl.store(RowMax + stats, row_max, mask=rows < length)
    tl.store(RowSum + stats, row_sum, mask=rows < length)


@triton.jit
def _query_kernel(Q, K, V, WK, WV, Mask, Out, DO, RowMax, RowSum, Delta, DQ, DWK, DWV,
                  sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_t, sdo_b, sdo_h, sdo_t,
                  sdq_b, sdq_h, sdq_t, swk_h, swk_l, swv_h, swv_l, sm_b, sm_h, sm_t, sm_s,
                  heads, length, key_length, dim, scaling, offset, k,
                  MASK: tl.constexpr, DOT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                  BL: tl.constexpr):
    """dQ, D and this query tile's shares of dW^K and dW^V (each (BL, BD), float32, at [b, tile, h])."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    rows = tile * BM + tl.arange(0, BM)
    dims = tl.arange(0, BD)
    label = tl.arange(0, BL)
    row_in, dim_in = rows[:, None] < length, dims[None, :] < dim
    q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :], mask=row_in & dim_in, other=0.0)
    grad = tl.load(DO + b * sdo_b + h * sdo_h + rows[:, None] * sdo_t + dims[None, :], mask=row_in & dim_in,
                   other=0.0)
    out = tl.load(Out + b * so_b + h * so_h + rows[:, None] * so_t + dims[None, :], mask=row_in & dim_in, other=0.0)
    delta = tl.sum(grad.to(tl.float32) * out.to(tl.float32), 1)  # D_i = rowsum(dO * O), O with the value term
    stats = bh * length + rows
    tl.store(Delta + stats, delta, mask=rows < length)
    row_max = tl.load(RowMax + stats, mask=rows < length, other=0.0)
    row_sum = tl.load(RowSum + stats, mask=rows < length, other=1.0)
    table_in = (label[:, None] < 2 * k + 1) & dim_in
    w_k = tl.load(WK + h * swk_h + label[:, None] * swk_l + dims[None, :], mask=table_in, other=0.0)
    w_v = tl.load(WV + h * swv_h + label[:, None] * swv_l + dims[None, :], mask=table_in, other=0.0)
    per_label = tl.dot(q, tl.trans(w_k), input_precision=DOT) * scaling
    grad_by_label = tl.dot(grad, tl.trans(w_v), input_precision=DOT)  # dO . w^V_l, (BM, BL)
    mask_base = Mask + b * sm_b + h * sm_h
    grad_q = tl.zeros([BM, BD], tl.float32)
    grad_sums = tl.zeros([BM, BL], tl.float32)  # the per-label sums of dS
    prob_sums = tl.zeros([BM, BL], tl.float32)  # the per-label sums of P
    for start in range(0, key_length, BN):
        cols = start + tl.arange(0, BN)
        key_in = (cols[:, None] < key_length) & dim_in
        key = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_s + dims[None, :], mask=key_in, other=0.0)
        value = tl.load(V + b * sv_b + h * sv_h + cols[:, None] * sv_s + dims[None, :], mask=key_in, other=0.0)
        s, rel, labels = _scores(q, key, per_label, rows, cols, offset, k, length, key_length, mask_base, sm_t, sm_s,
                                 scaling, MASK, DOT)
        p = tl.where(row_in, tl.exp(s - row_max[:, None]) / row_sum[:, None], 0.0)
        grad_p = tl.dot(grad, tl.trans(value), input_precision=DOT) + tl.gather(grad_by_label, labels, axis=1)
        grad_s = p * (grad_p - delta[:, None])
        grad_q += tl.dot(grad_s.to(key.dtype), key, input_precision=DOT)
        grad_sums += _label_sums(grad_s, rel, rows, start, offset, k, BN, BL)
        prob_sums += _label_sums(p, rel, rows, start, offset, k, BN, BL)
    # the key term's gradient per label (none on a row that allows no key: its maximum is the masked score)
    grad_sums = tl.where((row_max > MASKED / 2)[:, None], grad_sums * scaling, 0.0)
    grad_q = grad_q * scaling + tl.dot(grad_sums.to(w_k.dtype), w_k, input_precision=DOT)
    tl.store(DQ + b * sdq_b + h * sdq_h + rows[:, None] * sdq_t + dims[None, :], grad_q.to(DQ.dtype.element_ty),
             mask=row_in & dim_in)
    share = ((b * tl.num_programs(0) + tile) * heads + h) * BL * BD + label[:, None] * BD + dims[None, :]
    tl.store(DWK + share, tl.dot(tl.trans(grad_sums.to(q.dtype)), q, input_precision=DOT))
    tl.store(DWV + share, tl.dot(tl.trans(prob_sums.to(grad.dtype)), grad, input_precision=DOT))


@triton.jit
def _key_kernel(Q, K, V, WK, WV, Mask, DO, RowMax, RowSum, Delta, DK, DV,
                sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sdo_b, sdo_h, sdo_t,
                sdk_b, sdk_h, sdk_s, sdv_b, sdv_h, sdv_s, swk_h, swk_l, swv_h, swv_l, sm_b, sm_h, sm_t, sm_s,
                heads, length, key_length, dim, scaling, offset, k,
                MASK: tl.constexpr, DOT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                BL: tl.constexpr):
    """dK = scaling dS^T Q and dV = P^T dO of a key tile, over the query tiles."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    cols = tile * BN + tl.arange(0, BN)
    dims = tl.arange(0, BD)
    label = tl.arange(0, BL)
    dim_in = dims[None, :] < dim
    key_in = (cols[:, None] < key_length) & dim_in
    key = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_s + dims[None, :], mask=key_in, other=0.0)
    value = tl.load(V + b * sv_b + h * sv_h + cols[:, None] * sv_s + dims[None, :], mask=key_in, other=0.0)
    table_in = (label[:, None] < 2 * k + 1) & dim_in
    w_k = tl.load(WK + h * swk_h + label[:, None] * swk_l + dims[None, :], mask=table_in, other=0.0)
    w_v = tl.load(WV + h * swv_h + label[:, None] * swv_l + dims[None, :], mask=table_in, other=0.0)
    mask_base = Mask + b * sm_b + h * sm_h
    grad_k = tl.zeros([BN, BD], tl.float32)
    grad_v = tl.zeros([BN, BD], tl.float32)
    for start in range(0, length, BM):
        rows = start + tl.arange(0, BM)
        row_in = rows[:, None] < length
        q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :], mask=row_in & dim_in, other=0.0)
        grad = tl.load(DO + b * sdo_b + h * sdo_h + rows[:, None] * sdo_t + dims[None, :], mask=row_in & dim_in,
                       other=0.0)
        stats = bh * length + rows
        row_max = tl.load(RowMax + stats, mask=rows < length, other=0.0)
        row_sum = tl.load(RowSum + stats, mask=rows < length, other=1.0)
        delta = tl.load(Delta + stats, mask=rows < length, other=0.0)
        per_label = tl.dot(q, tl.trans(w_k), input_precision=DOT) * scaling
        s, _, labels = _scores(q, key, per_label, rows, cols, offset, k, length, key_length, mask_base, sm_t, sm_s,
                               scaling, MASK, DOT)
        p = tl.where(row_in, tl.exp(s - row_max[:, None]) / row_sum[:, None], 0.0)
        grad_v += tl.dot(tl.trans(p.to(grad.dtype)), grad, input_precision=DOT)
        grad_by_label = tl.dot(grad, tl.trans(w_v), input_precision=DOT)
        grad_p = tl.dot(grad, tl.trans(value), input_precision=DOT) + tl.gather(grad_by_label, labels, axis=1)
        grad_s = p * (grad_p - delta[:, None])
        grad_k += tl.dot(tl.trans(grad_s.to(q.dtype)), q, input_precision=DOT)
    tl.store(DK + b * sdk_b + h * sdk_h + cols[:, None] * sdk_s + dims[None, :],
             (grad_k * scaling).to(DK.dtype.element_ty), mask=key_in)
    tl.store(DV + b * sdv_b + h * sdv_h + cols[:, None] * sdv_s + dims[None, :], grad_v.to(DV.dtype.element_ty),
             mask=key_in)


# --- launching ------------------------------------------------------------------------------------------------------


def _power_of_two(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


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
    batch, heads, length, dim = query.shape
    key_length = key.shape[2]
    output, row_max, row_sum = _forward_fake(query, key, value, key_table, value_table, mask, scaling, offset,
                                             max_distance, block_m, block_n)
    query, key, value, tables, mask, kind, strides, table_strides, mask_strides, blocks, dot = _launch_arguments(
        query, key, value, key_table, value_table, mask, max_distance)
    grid = (triton.cdiv(length, block_m), batch * heads)
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
    padded_k = shares_k.new_empty(batch, triton.cdiv(length, block_m), heads, blocks["BL"], blocks["BD"])
    padded_v = torch.empty_like(padded_k)
    _query_kernel[(padded_k.shape[1], batch * heads)](
        query, key, value, *tables, mask, output, grad_output, row_max, row_sum, delta, grad_query, padded_k,
        padded_v, *strides, *output.stride()[:3], *grad_output.stride()[:3], *grad_query.stride()[:3],
        *table_strides, *mask_strides, *sizes, **options)
    _key_kernel[(triton.cdiv(key_length, block_n), batch * heads)](
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
