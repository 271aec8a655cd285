"""Rel_Pos's Triton kernels (the forward, the queries' and the keys' backward): what
`hf_headattn.methods.rel_pos.tiled` launches, imported there when a kernel is launched (this module needs Triton;
the operators, their fake implementations and the choice of path import without it). The design is in `tiled`'s
docstring.
"""

from __future__ import annotations

try:  # (imported by tiled only to launch a kernel)
    import triton
    import triton.language as tl
except ImportError as error:
    raise ModuleNotFoundError("hf_headattn.methods.rel_pos.tiled_kernels needs Triton (pip install triton; the "
                              "`triton` extra)", name="triton") from error

MASKED = tl.constexpr(-3.4028234663852886e38)
"""A masked key's score: float32's `finfo.min`, as the reference's bool mask writes it."""


@triton.jit
def _block(base, b, h, stride_b, stride_h, stride_i, index, dims, inside):
    """The (index, dims) block of sentence b's head h of a tensor (rows `index` along its stride_i; 0 outside
    `inside`): a query, key, value or output gradient tile, or a head's table (b = 0, stride_b = 0)."""
    return tl.load(base + b * stride_b + h * stride_h + index[:, None] * stride_i + dims[None, :], mask=inside,
                   other=0.0)


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
    q = _block(Q, b, h, sq_b, sq_h, sq_t, rows, dims, row_in & dim_in)
    table_in = (label[:, None] < 2 * k + 1) & dim_in
    w_k = _block(WK, 0, h, 0, swk_h, swk_l, label, dims, table_in)
    per_label = tl.dot(q, tl.trans(w_k), input_precision=DOT) * scaling  # (BM, BL), Eq. 4's term per label
    mask_base = Mask + b * sm_b + h * sm_h
    row_max = tl.full([BM], float("-inf"), tl.float32)
    row_sum = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    sums = tl.zeros([BM, BL], tl.float32)
    for start in range(0, key_length, BN):
        cols = start + tl.arange(0, BN)
        key_in = (cols[:, None] < key_length) & dim_in
        key = _block(K, b, h, sk_b, sk_h, sk_s, cols, dims, key_in)
        s, rel, _ = _scores(q, key, per_label, rows, cols, offset, k, length, key_length, mask_base, sm_t, sm_s,
                            scaling, MASK, DOT)
        new_max = tl.maximum(row_max, tl.max(s, 1))
        rescale = tl.exp(row_max - new_max)
        p = tl.exp(s - new_max[:, None])
        row_sum = row_sum * rescale + tl.sum(p, 1)
        value = _block(V, b, h, sv_b, sv_h, sv_s, cols, dims, key_in)
        acc = acc * rescale[:, None] + tl.dot(p.to(value.dtype), value, input_precision=DOT)
        sums = sums * rescale[:, None] + _label_sums(p, rel, rows, start, offset, k, BN, BL)
        row_max = new_max
    w_v = _block(WV, 0, h, 0, swv_h, swv_l, label, dims, table_in)
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
    q = _block(Q, b, h, sq_b, sq_h, sq_t, rows, dims, row_in & dim_in)
    grad = _block(DO, b, h, sdo_b, sdo_h, sdo_t, rows, dims, row_in & dim_in)
    out = _block(Out, b, h, so_b, so_h, so_t, rows, dims, row_in & dim_in)
    delta = tl.sum(grad.to(tl.float32) * out.to(tl.float32), 1)  # D_i = rowsum(dO * O), O with the value term
    stats = bh * length + rows
    tl.store(Delta + stats, delta, mask=rows < length)
    row_max = tl.load(RowMax + stats, mask=rows < length, other=0.0)
    row_sum = tl.load(RowSum + stats, mask=rows < length, other=1.0)
    table_in = (label[:, None] < 2 * k + 1) & dim_in
    w_k = _block(WK, 0, h, 0, swk_h, swk_l, label, dims, table_in)
    w_v = _block(WV, 0, h, 0, swv_h, swv_l, label, dims, table_in)
    per_label = tl.dot(q, tl.trans(w_k), input_precision=DOT) * scaling
    grad_by_label = tl.dot(grad, tl.trans(w_v), input_precision=DOT)  # dO . w^V_l, (BM, BL)
    mask_base = Mask + b * sm_b + h * sm_h
    grad_q = tl.zeros([BM, BD], tl.float32)
    grad_sums = tl.zeros([BM, BL], tl.float32)  # the per-label sums of dS
    prob_sums = tl.zeros([BM, BL], tl.float32)  # the per-label sums of P
    for start in range(0, key_length, BN):
        cols = start + tl.arange(0, BN)
        key_in = (cols[:, None] < key_length) & dim_in
        key = _block(K, b, h, sk_b, sk_h, sk_s, cols, dims, key_in)
        value = _block(V, b, h, sv_b, sv_h, sv_s, cols, dims, key_in)
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
    key = _block(K, b, h, sk_b, sk_h, sk_s, cols, dims, key_in)
    value = _block(V, b, h, sv_b, sv_h, sv_s, cols, dims, key_in)
    table_in = (label[:, None] < 2 * k + 1) & dim_in
    w_k = _block(WK, 0, h, 0, swk_h, swk_l, label, dims, table_in)
    w_v = _block(WV, 0, h, 0, swv_h, swv_l, label, dims, table_in)
    mask_base = Mask + b * sm_b + h * sm_h
    grad_k = tl.zeros([BN, BD], tl.float32)
    grad_v = tl.zeros([BN, BD], tl.float32)
    for start in range(0, length, BM):
        rows = start + tl.arange(0, BM)
        row_in = rows[:, None] < length
        q = _block(Q, b, h, sq_b, sq_h, sq_t, rows, dims, row_in & dim_in)
        grad = _block(DO, b, h, sdo_b, sdo_h, sdo_t, rows, dims, row_in & dim_in)
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
