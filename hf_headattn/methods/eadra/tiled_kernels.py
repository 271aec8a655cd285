"""EaDRA's tiled regularizer kernels (Triton), for `hf_headattn.methods.eadra.tiled` (the design, the saved
statistics and what is refused are in its docstring): R_peak, R_sent and R_dist (Araabi, Niculae & Monz, Eq. 4, 6,
8) recomputed tile by tile from the stacked heads, flash-attention style, without a (queries x keys) map.

Tiles of BLOCK_M queries x BLOCK_N keys, fp32 accumulation. Consecutive queries i and i+1 need each other's
cumulative sums, so the query tiles overlap: tile t covers rows `t (BLOCK_M - 2) - 1 + r`, r < BLOCK_M, and owns
(stores) the rows r in [1, BLOCK_M - 2], whose neighbours are in the tile; a row's neighbour is read with
`tl.gather` along the query axis.

* `forward_rows_kernel`, grid (N, query tiles), loops over key blocks: online softmax (running max m_i and sum
  l_i), and with them, rescaled whenever the max changes, sum_j exp(s_ij - m_i) (s_ij - m_i) (Eq. 4's entropy),
  sum_k C_i(k) and sum_k C_i(k) C_{i+1}(k) with C_i = l_i F_i the unnormalised cumulative sums (Eq. 8).
* `forward_abar_kernel`, grid (N, key blocks), loops over query blocks: abar_j = sum_i w_i a_ij (Eq. 5).
* `backward_rows_kernel`, grid (N, query tiles), loops over key blocks: recomputes s and a, the gradient g_ij
  w.r.t. the probabilities (`equations._gradient_wrt_probs`; R_dist's exclusive prefix sum carried across key
  blocks), D_i = sum_j a_ij g_ij, and grad_query_i = scaling (sum_j a_ij g_ij k_j - D_i sum_j a_ij k_j) (those two
  products in 3xTF32 where the others take TF32: their difference cancels); with R_dist it writes the carries at
  each key block's start ((N, key blocks, T) each: 1 / BLOCK_N of a map). The gradients are written in the
  heads' dtype straight into the layers' (L, B, length, heads, D) layout (`_output_of`; Triton rounds a float32
  -> half-precision conversion to nearest even on a GPU, while its interpreter truncates one to bfloat16).
* `backward_keys_kernel`, grid (N, key blocks), loops over query tiles: grad_key_j = scaling sum_i a_ij (g_ij -
  D_i) q_i.

Triton is optional: without it the module imports and `triton` is None. On the CPU the kernels run only under
Triton's interpreter (`TRITON_INTERPRET=1` set before Triton is imported); they are `triton.jit`-ed at their first
call (`build`), and again if the setting changed.
"""

from __future__ import annotations

import math
import sys

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the module imports without Triton
    triton = tl = None

from .equations import OUTSIDE_SUPPORT

HALF = (torch.float16, torch.bfloat16)


def interpreting() -> bool:
    """Whether Triton runs under its interpreter (TRITON_INTERPRET=1 when it was imported)."""
    return triton is not None and bool(triton.knobs.runtime.interpret)


if triton is not None:
    _OUTSIDE = tl.constexpr(OUTSIDE_SUPPORT)
    _LOG_TINY = tl.constexpr(math.log(torch.finfo(torch.float32).tiny))  # log of equations._safe_log's floor
    _NEG = tl.constexpr(-1e30)  # the running max before any key: finite, so that 0 * (m_old - m_new) = 0

    def _masks_of(n, SUP, BIAS, stride_sl, stride_sb, stride_sh, stride_bl, stride_bb, stride_bh, B, H):
        """Where row block n's (layer, sentence, head) support and bias start (their broadcast strides)."""
        l_, b_, h_ = n // (B * H), (n // H) % B, n % H
        return (SUP + l_ * stride_sl + b_ * stride_sb + h_ * stride_sh,
                BIAS + l_ * stride_bl + b_ * stride_bb + h_ * stride_bh)

    def _output_of(n, OUT, stride_ol, stride_ob, stride_oh, B, H):
        """Where row block n's (layer, sentence, head) gradient starts in a (L, B, length, all heads, D) output."""
        return OUT + (n // (B * H)) * stride_ol + ((n // H) % B) * stride_ob + (n % H) * stride_oh

    def _query_tile(Q, n, start, stride_qn, stride_qt, stride_qd, T, D, BM: tl.constexpr, BD: tl.constexpr):
        """The overlapping query tile from row `start - 1` (module docstring): its rows, which exist, which it
        owns, and their queries in float32 (BM, BD)."""
        r = tl.arange(0, BM)
        rows = start - 1 + r
        row_ok = (rows >= 0) & (rows < T)
        owned = (r >= 1) & (r <= BM - 2) & row_ok
        offs_d = tl.arange(0, BD)
        q = tl.load(Q + n * stride_qn + rows[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                    mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0).to(tl.float32)
        return rows, row_ok, owned, q

    def _scores(q, k_base, stride_ks, stride_kd, sup_base, stride_st, stride_ss, bias_base, stride_bt, stride_bs,
                rows, cols, row_ok, col_ok, offs_d, D, scaling,
                HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr):
        """One (BLOCK_M, BLOCK_N) tile of float32 scores (`equations._masked_scores`) and the keys (BLOCK_D,
        BLOCK_N) it read; keys past S get _NEG (probability exactly 0)."""
        kt = tl.load(k_base + cols[None, :] * stride_ks + offs_d[:, None] * stride_kd,
                     mask=col_ok[None, :] & (offs_d[:, None] < D), other=0.0).to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * scaling
        inside = row_ok[:, None] & col_ok[None, :]
        on_support = tl.load(sup_base + rows[:, None] * stride_st + cols[None, :] * stride_ss, mask=inside,
                             other=0) != 0
        if HAS_BIAS:
            bias = tl.load(bias_base + rows[:, None] * stride_bt + cols[None, :] * stride_bs, mask=inside,
                           other=0.0).to(tl.float32)
            s += tl.where(on_support, bias, _OUTSIDE)
        else:
            s += tl.where(on_support, 0.0, _OUTSIDE)
        return tl.where(col_ok[None, :], s, _NEG), kt

    def _neighbour_index(step: tl.constexpr, BM: tl.constexpr):
        """Tile row r + step at row r, clamped at the tile's edges (rows the tile does not own)."""
        r = tl.arange(0, BM)
        if step > 0:
            return tl.minimum(r + 1, BM - 1)
        return tl.maximum(r - 1, 0)

    def _neighbour(x, step: tl.constexpr, BM: tl.constexpr):
        """Query i + step's row of a (BM, BLOCK_N) tile at query i (`tl.gather` along the query axis)."""
        return tl.gather(x, tl.broadcast_to(_neighbour_index(step, BM)[:, None], x.shape), 0)

    def _neighbour_value(x, step: tl.constexpr, BM: tl.constexpr):
        """Query i + step's value of a (BM,) vector at query i."""
        return tl.gather(x, _neighbour_index(step, BM), 0)

    def _probs_gradient(log_a, a, col_ok, peak_c, sent_c, log_abar, f_carry, g_carry, pair_next, pair_prev,
                        HAS_PEAK: tl.constexpr, HAS_SENT: tl.constexpr, HAS_DIST: tl.constexpr, BM: tl.constexpr):
        """d(objective) / d a_ij on a tile (`equations._gradient_wrt_probs`, up to a constant per row), and the
        tile's G_i(k) = d R_dist / d F_i(k) (to carry its sum to the next key block). `f_carry` is F_i before the
        tile, `g_carry` sum_{k before the tile} G_i(k); `pair_next` = g_dist pairs_i, `pair_prev` =
        g_dist pairs_{i-1}."""
        g = tl.zeros_like(a)
        big_g = tl.zeros_like(a)
        if HAS_PEAK:  # d R_peak / d a_ij = -w_i (log a_ij + 1) / log n_i (the +1 is a row constant)
            g += peak_c[:, None] * tl.maximum(log_a, _LOG_TINY)
        if HAS_SENT:  # d R_sent / d a_ij = w_i (log abar_j + 1) / log n_bar
            g += sent_c[:, None] * log_abar[None, :]
        if HAS_DIST:  # d R_dist / d F_i(k) = pair_i (1 - 2 F_{i+1}(k)) + pair_{i-1} (1 - 2 F_{i-1}(k))
            cdf = f_carry[:, None] + tl.cumsum(a, 1)
            big_g = (pair_next[:, None] * (1.0 - 2.0 * _neighbour(cdf, 1, BM))
                     + pair_prev[:, None] * (1.0 - 2.0 * _neighbour(cdf, -1, BM)))
            big_g = tl.where(col_ok[None, :], big_g, 0.0)
            g -= g_carry[:, None] + tl.cumsum(big_g, 1) - big_g  # d / d a_i(t) = const - sum_{k<t} G_i(k)
        return g, big_g

    def forward_rows_kernel(
        Q, K, SUP, BIAS, ROW_MAX, LOG_SUM, ALOGA, SUMF, CROSS,
        stride_qn, stride_qt, stride_qd, stride_kn, stride_ks, stride_kd,
        stride_sl, stride_sb, stride_sh, stride_st, stride_ss,
        stride_bl, stride_bb, stride_bh, stride_bt, stride_bs,
        B, H, T, S, D, scaling,
        HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
    ):
        """Forward pass 1 (module docstring): per row max_j s_ij, log sum_j exp(s_ij - max), sum_j a log a
        (Eq. 4), sum_k F_i(k) and sum_k F_i(k) F_{i+1}(k) (Eq. 8), by an online softmax over the key blocks."""
        n = tl.program_id(0).to(tl.int64)
        offs_d = tl.arange(0, BD)
        sup_base, bias_base = _masks_of(n, SUP, BIAS, stride_sl, stride_sb, stride_sh, stride_bl, stride_bb,
                                        stride_bh, B, H)
        k_base = K + n * stride_kn
        rows, row_ok, owned, q = _query_tile(Q, n, tl.program_id(1) * (BM - 2), stride_qn, stride_qt, stride_qd, T,
                                             D, BM, BD)
        m = tl.full((BM,), _NEG, tl.float32)
        total = tl.zeros((BM,), tl.float32)  # l_i = sum_j exp(s_ij - m_i)
        entropy = tl.zeros((BM,), tl.float32)  # sum_j exp(s_ij - m_i) (s_ij - m_i)
        cdf_sum = tl.zeros((BM,), tl.float32)  # sum_k C_i(k), C_i = l_i F_i
        cross = tl.zeros((BM,), tl.float32)  # sum_k C_i(k) C_{i+1}(k)
        for start in range(0, S, BN):
            cols = start + tl.arange(0, BN)
            col_ok = cols < S
            s, _ = _scores(q, k_base, stride_ks, stride_kd, sup_base, stride_st, stride_ss, bias_base, stride_bt,
                           stride_bs, rows, cols, row_ok, col_ok, offs_d, D, scaling, HAS_BIAS, PRECISION)
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])  # 0 past S
            cdf = alpha[:, None] * total[:, None] + tl.cumsum(p, 1)
            cdf = tl.where(col_ok[None, :], cdf, 0.0)
            entropy = alpha * (entropy + (m - m_new) * total) + tl.sum(
                tl.where(col_ok[None, :], p * (s - m_new[:, None]), 0.0), 1)
            total = alpha * total + tl.sum(p, 1)
            cdf_sum = alpha * cdf_sum + tl.sum(cdf, 1)
            cross = alpha * _neighbour_value(alpha, 1, BM) * cross + tl.sum(cdf * _neighbour(cdf, 1, BM), 1)
            m = m_new
        log_total = tl.log(total)
        out = n * T + rows
        tl.store(ROW_MAX + out, m, mask=owned)
        tl.store(LOG_SUM + out, log_total, mask=owned)
        tl.store(ALOGA + out, entropy / total - log_total, mask=owned)
        tl.store(SUMF + out, cdf_sum / total, mask=owned)
        tl.store(CROSS + out, cross / (total * _neighbour_value(total, 1, BM)), mask=owned)

    def forward_abar_kernel(
        Q, K, SUP, BIAS, ROW_MAX, LOG_SUM, W, ABAR,
        stride_qn, stride_qt, stride_qd, stride_kn, stride_ks, stride_kd,
        stride_sl, stride_sb, stride_sh, stride_st, stride_ss,
        stride_bl, stride_bb, stride_bh, stride_bt, stride_bs,
        B, H, T, S, D, scaling,
        HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
    ):
        """Forward pass 2: abar_j = sum_i w_i a_ij (Eq. 5) for one key block, looping over the query blocks."""
        n = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        col_ok = cols < S
        offs_d = tl.arange(0, BD)
        sup_base, bias_base = _masks_of(n, SUP, BIAS, stride_sl, stride_sb, stride_sh, stride_bl, stride_bb,
                                        stride_bh, B, H)
        abar = tl.zeros((BN,), tl.float32)
        for start in range(0, T, BM):
            rows = start + tl.arange(0, BM)
            row_ok = rows < T
            q = tl.load(Q + n * stride_qn + rows[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                        mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0).to(tl.float32)
            s, _ = _scores(q, K + n * stride_kn, stride_ks, stride_kd, sup_base, stride_st, stride_ss, bias_base,
                           stride_bt, stride_bs, rows, cols, row_ok, col_ok, offs_d, D, scaling, HAS_BIAS, PRECISION)
            m = tl.load(ROW_MAX + n * T + rows, mask=row_ok, other=0.0)
            log_sum = tl.load(LOG_SUM + n * T + rows, mask=row_ok, other=0.0)
            w = tl.load(W + n * T + rows, mask=row_ok, other=0.0)
            abar += tl.sum(w[:, None] * tl.exp((s - m[:, None]) - log_sum[:, None]), 0)
        tl.store(ABAR + n * S + cols, abar, mask=col_ok)

    def backward_rows_kernel(
        Q, K, SUP, BIAS, ROW_MAX, LOG_SUM, LOG_ABAR, PEAK_C, SENT_C, PAIR_C, DQ, DROW, F_CARRY, G_CARRY,
        stride_ol, stride_ob, stride_oh, stride_ot,
        stride_qn, stride_qt, stride_qd, stride_kn, stride_ks, stride_kd,
        stride_sl, stride_sb, stride_sh, stride_st, stride_ss,
        stride_bl, stride_bb, stride_bh, stride_bt, stride_bs,
        B, H, T, S, D, scaling, KEY_BLOCKS,
        HAS_BIAS: tl.constexpr, HAS_PEAK: tl.constexpr, HAS_SENT: tl.constexpr, HAS_DIST: tl.constexpr,
        PRECISION: tl.constexpr, DIFFERENCE_PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
        BD: tl.constexpr,
    ):
        """Backward pass 1: per row D_i = sum_j a_ij g_ij and grad_query_i = scaling (sum_j a_ij g_ij k_j -
        D_i sum_j a_ij k_j), and with R_dist the carries F_i and sum G_i at each key block's start. The two
        products whose difference is taken run in DIFFERENCE_PRECISION (3xTF32 where TF32 is allowed: a TF32
        rounding of a_ij g_ij, not of a_ij (g_ij - D_i), would not cancel in the difference)."""
        n = tl.program_id(0).to(tl.int64)
        offs_d = tl.arange(0, BD)
        sup_base, bias_base = _masks_of(n, SUP, BIAS, stride_sl, stride_sb, stride_sh, stride_bl, stride_bb,
                                        stride_bh, B, H)
        k_base = K + n * stride_kn
        rows, row_ok, owned, q = _query_tile(Q, n, tl.program_id(1) * (BM - 2), stride_qn, stride_qt, stride_qd, T,
                                             D, BM, BD)
        row = n * T + rows
        m = tl.load(ROW_MAX + row, mask=row_ok, other=0.0)
        log_sum = tl.load(LOG_SUM + row, mask=row_ok, other=0.0)
        peak_c = tl.load(PEAK_C + row, mask=row_ok, other=0.0) if HAS_PEAK else m
        sent_c = tl.load(SENT_C + row, mask=row_ok, other=0.0) if HAS_SENT else m
        pair_next = tl.load(PAIR_C + row, mask=row_ok, other=0.0) if HAS_DIST else m
        pair_prev = tl.load(PAIR_C + row - 1, mask=row_ok & (rows >= 1), other=0.0) if HAS_DIST else m
        f_carry = tl.zeros((BM,), tl.float32)
        g_carry = tl.zeros((BM,), tl.float32)
        dot = tl.zeros((BM,), tl.float32)
        weighted = tl.zeros((BM, BD), tl.float32)  # sum_j a_ij g_ij k_j
        mean = tl.zeros((BM, BD), tl.float32)  # sum_j a_ij k_j
        for block in range(0, KEY_BLOCKS):
            cols = block * BN + tl.arange(0, BN)
            col_ok = cols < S
            s, kt = _scores(q, k_base, stride_ks, stride_kd, sup_base, stride_st, stride_ss, bias_base, stride_bt,
                            stride_bs, rows, cols, row_ok, col_ok, offs_d, D, scaling, HAS_BIAS, PRECISION)
            log_a = (s - m[:, None]) - log_sum[:, None]
            a = tl.where(row_ok[:, None], tl.exp(log_a), 0.0)
            log_abar = tl.load(LOG_ABAR + n * S + cols, mask=col_ok, other=0.0) if HAS_SENT else m
            g, big_g = _probs_gradient(log_a, a, col_ok, peak_c, sent_c, log_abar, f_carry, g_carry, pair_next,
                                       pair_prev, HAS_PEAK, HAS_SENT, HAS_DIST, BM)
            if HAS_DIST:
                carry = (n * KEY_BLOCKS + block) * T + rows
                tl.store(F_CARRY + carry, f_carry, mask=owned)
                tl.store(G_CARRY + carry, g_carry, mask=owned)
                f_carry += tl.sum(a, 1)
                g_carry += tl.sum(big_g, 1)
            ag = a * g
            dot += tl.sum(ag, 1)
            k = tl.trans(kt)
            weighted += tl.dot(ag, k, input_precision=DIFFERENCE_PRECISION)
            mean += tl.dot(a, k, input_precision=DIFFERENCE_PRECISION)
        dq = (weighted - dot[:, None] * mean) * scaling
        dq_base = _output_of(n, DQ, stride_ol, stride_ob, stride_oh, B, H)
        tl.store(dq_base + rows[:, None] * stride_ot + offs_d[None, :], dq.to(DQ.dtype.element_ty),
                 mask=owned[:, None] & (offs_d[None, :] < D))
        tl.store(DROW + row, dot, mask=owned)

    def backward_keys_kernel(
        Q, K, SUP, BIAS, ROW_MAX, LOG_SUM, LOG_ABAR, PEAK_C, SENT_C, PAIR_C, DROW, F_CARRY, G_CARRY, DK,
        stride_ol, stride_ob, stride_oh, stride_ot,
        stride_qn, stride_qt, stride_qd, stride_kn, stride_ks, stride_kd,
        stride_sl, stride_sb, stride_sh, stride_st, stride_ss,
        stride_bl, stride_bb, stride_bh, stride_bt, stride_bs,
        B, H, T, S, D, scaling, KEY_BLOCKS,
        HAS_BIAS: tl.constexpr, HAS_PEAK: tl.constexpr, HAS_SENT: tl.constexpr, HAS_DIST: tl.constexpr,
        PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
    ):
        """Backward pass 2: grad_key_j = scaling sum_i a_ij (g_ij - D_i) q_i for one key block, looping over the
        (overlapping) query tiles."""
        n = tl.program_id(0).to(tl.int64)
        block = tl.program_id(1)
        cols = block * BN + tl.arange(0, BN)
        col_ok = cols < S
        offs_d = tl.arange(0, BD)
        sup_base, bias_base = _masks_of(n, SUP, BIAS, stride_sl, stride_sb, stride_sh, stride_bl, stride_bb,
                                        stride_bh, B, H)
        k_base = K + n * stride_kn
        log_abar = tl.load(LOG_ABAR + n * S + cols, mask=col_ok, other=0.0) if HAS_SENT else cols.to(tl.float32)
        dk = tl.zeros((BN, BD), tl.float32)
        for start in range(0, T, BM - 2):
            rows, row_ok, owned, q = _query_tile(Q, n, start, stride_qn, stride_qt, stride_qd, T, D, BM, BD)
            s, _ = _scores(q, k_base, stride_ks, stride_kd, sup_base, stride_st, stride_ss, bias_base, stride_bt,
                           stride_bs, rows, cols, row_ok, col_ok, offs_d, D, scaling, HAS_BIAS, PRECISION)
            row = n * T + rows
            m = tl.load(ROW_MAX + row, mask=row_ok, other=0.0)
            log_sum = tl.load(LOG_SUM + row, mask=row_ok, other=0.0)
            log_a = (s - m[:, None]) - log_sum[:, None]
            a = tl.where(row_ok[:, None], tl.exp(log_a), 0.0)
            peak_c = tl.load(PEAK_C + row, mask=row_ok, other=0.0) if HAS_PEAK else m
            sent_c = tl.load(SENT_C + row, mask=row_ok, other=0.0) if HAS_SENT else m
            if HAS_DIST:
                pair_next = tl.load(PAIR_C + row, mask=row_ok, other=0.0)
                pair_prev = tl.load(PAIR_C + row - 1, mask=row_ok & (rows >= 1), other=0.0)
                carry = (n * KEY_BLOCKS + block) * T + rows
                f_carry = tl.load(F_CARRY + carry, mask=row_ok, other=0.0)
                g_carry = tl.load(G_CARRY + carry, mask=row_ok, other=0.0)
            else:
                pair_next = m
                pair_prev = m
                f_carry = m
                g_carry = m
            g, _ = _probs_gradient(log_a, a, col_ok, peak_c, sent_c, log_abar, f_carry, g_carry, pair_next,
                                   pair_prev, HAS_PEAK, HAS_SENT, HAS_DIST, BM)
            dot = tl.load(DROW + row, mask=row_ok, other=0.0)
            ds = tl.where(owned[:, None] & col_ok[None, :], a * (g - dot[:, None]), 0.0)
            dk += tl.dot(tl.trans(ds), q, input_precision=PRECISION)
        dk_base = _output_of(n, DK, stride_ol, stride_ob, stride_oh, B, H)
        tl.store(dk_base + cols[:, None] * stride_ot + offs_d[None, :], (dk * scaling).to(DK.dtype.element_ty),
                 mask=col_ok[:, None] & (offs_d[None, :] < D))

    _JIT = ("_masks_of", "_output_of", "_query_tile", "_scores", "_neighbour_index", "_neighbour",
            "_neighbour_value", "_probs_gradient",
            "forward_rows_kernel", "forward_abar_kernel",
            "backward_rows_kernel", "backward_keys_kernel")
    _PYTHON = {name: globals()[name] for name in _JIT}  # the functions before triton.jit
    _built: list[bool] = []  # the TRITON_INTERPRET setting the kernels were built for


def build() -> None:
    """`triton.jit` the kernels at their first use, and again if TRITON_INTERPRET changed since (`triton.jit`
    chooses the interpreter or the compiler when it is applied)."""
    mode = interpreting()
    if _built != [mode]:
        names = globals()
        for name in _JIT:
            names[name] = triton.jit(_PYTHON[name])
        _built[:] = [mode]


def precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input precision: TF32 for half-precision heads (their products are exact in it, as
    `equations._matmul_precision` uses it), else the user's float32 setting ("highest": IEEE float32)."""
    if dtype in HALF or torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "ieee"




KERNELS = sys.modules[__name__]
"""This module, whose kernels `build` binds: what `tiled` imports (`from .tiled_kernels import KERNELS`: a
checkpoint's flat remote code has no `from . import`)."""
