"""EaDRA's regularizer pass (:func:`hf_headattn.eadra_math.layer_regularizers`) as Triton kernels that never write a
(queries x keys) tensor to memory: the scores and probabilities of R_peak, R_sent and R_dist (Araabi, Niculae &
Monz, Eq. 4, 6, 8) are recomputed tile by tile from the stacked heads, flash-attention style, in the forward and in
the backward.

Same math as :mod:`hf_headattn.eadra_math` (its choices hold here: H_N with n_i the query's support, the mean over
real queries, R_dist as sum_k F_i + F_{i+1} - 2 F_i F_{i+1} over the cumulative sums F). One "row block" n is one
(layer, sentence, head) of the stacked heads (:func:`hf_headattn.eadra_math._stacked`): query (N, T, D), key
(N, S, D), N = L * B * h; the scores are ``scaling * q_i . k_j + bias_ij`` on the support and ``OUTSIDE_SUPPORT``
(-1e9) added elsewhere, read tile by tile from the (broadcast, never expanded) ``support`` and ``bias``.

Kernels (tiles of BLOCK_M queries x BLOCK_N keys, fp32 accumulation; consecutive queries i and i+1 need each other's
cumulative sums, so the query tiles that need neighbours overlap: tile t covers rows ``t (BLOCK_M - 2) - 1 + r``,
r < BLOCK_M, and owns (stores) the rows r in [1, BLOCK_M - 2], whose neighbours are in the tile; a row's
neighbour is read with ``tl.gather`` along the query axis):

forward, two passes over the keys
  1. ``_forward_rows_kernel``, grid (N, query tiles), loops over key blocks: online softmax (running max m_i and
     sum l_i = sum_j exp(s_ij - m_i)), and with them, rescaled whenever the max changes, sum_j exp(s_ij - m_i)
     (s_ij - m_i) (Eq. 4's entropy: sum_j a log a = that / l - log l, without the cancellation of
     sum_j a s - LSE), sum_k C_i(k) and sum_k C_i(k) C_{i+1}(k) with C_i the unnormalised cumulative sums
     (C_i = l_i F_i: Eq. 8's sums of F_i and of F_i F_{i+1} at the end). Writes per row: m, log l, sum_j a log a,
     sum_k F_i(k), sum_k F_i(k) F_{i+1}(k) (each (N, T)).
  2. ``_forward_abar_kernel``, grid (N, key blocks), loops over query blocks: abar_j = sum_i w_i a_ij (Eq. 5), a
     reduction over the queries per key column, with a_ij = exp((s_ij - m_i) - log l_i). Writes abar (N, S).
  The three terms are then O(T + S) reductions in PyTorch (Eq. 4, 6, 8).

Saved for the backward: the log-sum-exp of each row in two parts, m and log l (N, T) each (exp(s - LSE) would lose
|LSE| * 2^-24 of precision in every probability), and log abar (N, S), besides the small mask coefficients and the
heads themselves (which the attention keeps anyway). Nothing of size T x S.

backward, two passes over the (query, key) tiles
  1. ``_backward_rows_kernel``, grid (N, query tiles), loops over key blocks: recomputes s and a from q, k, m and
     log l, the gradient g_ij w.r.t. the probabilities (as ``eadra_math._gradient_wrt_probs``: peak and sentence parts
     elementwise, the distance part g_i(t) = -sum_{k<t} G_i(k), G_i(k) = dR/dF_i(k), an exclusive prefix sum over
     the keys carried across key blocks), and accumulates the row dot D_i = sum_j a_ij g_ij, U_i = sum_j a_ij g_ij
     k_j and V_i = sum_j a_ij k_j, so that grad_query_i = scaling (U_i - D_i V_i) (the softmax backward
     dS_ij = a_ij (g_ij - D_i), folded into the product: no second pass over the keys for the queries; U and V in
     3xTF32 where the other products take TF32, since their difference cancels). Writes
     grad_query, D (N, T) and, with R_dist, the carries at each key block's start (F_i and sum_{k<start} G_i(k),
     each (N, key blocks, T): 1 / BLOCK_N of a map, a temporary of the backward).
  2. ``_backward_keys_kernel``, grid (N, key blocks), loops over query tiles: recomputes s, a, g (the cumulative
     sums from the carries), dS = a (g - D) and grad_key_j = scaling sum_i dS_ij q_i.

Refused with a ``ValueError`` naming what is missing (:func:`supports` is False; there is no silent fallback: choose
"auto", "eager" or "compiled" there): a ``bias`` that requires a gradient (SEA's LPEA bias), float64 heads, CPU
tensors outside the interpreter. A bias without gradient (an additive mask) is supported.

Triton is optional: without it the module imports, :func:`available` is False and the entry points raise. On the
CPU the kernels run only under Triton's interpreter, ``TRITON_INTERPRET=1`` set before Triton is imported (Triton
builds its own library then); this module's kernels are built at their first call, and again if the setting
changed.
"""

from __future__ import annotations

import math

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the module imports without Triton: available() is False
    triton = tl = None

from .eadra_math import OUTSIDE_SUPPORT, _coefficients, _safe_log, _stack_heads, _unstack_heads

__all__ = ["available", "supports", "forward", "backward", "layer_regularizers"]

#: Tile sizes on a GPU (queries x keys); the head dimension is one tile (padded to a power of two, at least 16).
BLOCK_M, BLOCK_N = 64, 64
_HALF = (torch.float16, torch.bfloat16)


def _interpreting() -> bool:
    return triton is not None and bool(triton.knobs.runtime.interpret)


def available() -> bool:
    """Whether Triton is importable (the kernels run on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1)."""
    return triton is not None


def supports(query: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether these stacked heads (and bias) can run here: Triton present, CUDA tensors (any device under the
    interpreter), float32/float16/bfloat16 heads, and no bias gradient."""
    if triton is None or query.dtype not in (torch.float32, *_HALF):
        return False
    if query.device.type != "cuda" and not _interpreting():
        return False
    return bias is None or not bias.requires_grad


def _check(query: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Raise ``ValueError`` naming what the Triton pass cannot run (``eadra={"implementation": "triton"}``)."""
    if triton is None:
        raise ValueError("eadra implementation='triton' needs Triton (pip install triton); expected 'auto', 'eager' "
                         "or 'compiled' without it")
    if bias is not None and bias.requires_grad:
        raise ValueError("eadra implementation='triton' gives no bias gradient (SEA's LPEA bias on a regularized "
                         "layer); expected 'auto', 'eager' or 'compiled' with LPEA")
    if not supports(query, bias):
        raise ValueError(f"eadra implementation='triton' runs float32/float16/bfloat16 heads on CUDA (or on the CPU "
                         f"under TRITON_INTERPRET=1), got {query.dtype} heads on {query.device}")

if triton is not None:
    _OUTSIDE = tl.constexpr(OUTSIDE_SUPPORT)
    _LOG_TINY = tl.constexpr(math.log(torch.finfo(torch.float32).tiny))  # log of eadra_math._safe_log's floor
    _NEG = tl.constexpr(-1e30)  # the running max before any key: finite, so that 0 * (m_old - m_new) = 0

    def _masks_of(n, SUP, BIAS, stride_sl, stride_sb, stride_sh, stride_bl, stride_bb, stride_bh, B, H):
        """Where row block n's (layer, sentence, head) support and bias start (their broadcast strides)."""
        l_, b_, h_ = n // (B * H), (n // H) % B, n % H
        return (SUP + l_ * stride_sl + b_ * stride_sb + h_ * stride_sh,
                BIAS + l_ * stride_bl + b_ * stride_bb + h_ * stride_bh)

    def _query_tile(Q, n, start, stride_qn, stride_qt, stride_qd, T, D, BM: tl.constexpr, BD: tl.constexpr):
        """The overlapping query tile from row ``start - 1`` (module docstring): its rows, which exist, which it
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
        """One (BLOCK_M, BLOCK_N) tile of float32 scores (``eadra_math._masked_scores``) and the keys (BLOCK_D,
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
        """Query i + step's row of a (BM, BLOCK_N) tile at query i (``tl.gather`` along the query axis)."""
        return tl.gather(x, tl.broadcast_to(_neighbour_index(step, BM)[:, None], x.shape), 0)

    def _neighbour_value(x, step: tl.constexpr, BM: tl.constexpr):
        """Query i + step's value of a (BM,) vector at query i."""
        return tl.gather(x, _neighbour_index(step, BM), 0)

    def _probs_gradient(log_a, a, col_ok, peak_c, sent_c, log_abar, f_carry, g_carry, pair_next, pair_prev,
                        HAS_PEAK: tl.constexpr, HAS_SENT: tl.constexpr, HAS_DIST: tl.constexpr, BM: tl.constexpr):
        """d(objective) / d a_ij on a tile (``eadra_math._gradient_wrt_probs``, up to a constant per row), and the
        tile's G_i(k) = d R_dist / d F_i(k) (to carry its sum to the next key block). ``f_carry`` is F_i before the
        tile, ``g_carry`` sum_{k before the tile} G_i(k); ``pair_next`` = g_dist pairs_i, ``pair_prev`` =
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

    def _forward_rows_kernel(
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

    def _forward_abar_kernel(
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

    def _backward_rows_kernel(
        Q, K, SUP, BIAS, ROW_MAX, LOG_SUM, LOG_ABAR, PEAK_C, SENT_C, PAIR_C, DQ, DROW, F_CARRY, G_CARRY,
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
        tl.store(DQ + n * T * D + rows[:, None] * D + offs_d[None, :], dq,
                 mask=owned[:, None] & (offs_d[None, :] < D))
        tl.store(DROW + row, dot, mask=owned)

    def _backward_keys_kernel(
        Q, K, SUP, BIAS, ROW_MAX, LOG_SUM, LOG_ABAR, PEAK_C, SENT_C, PAIR_C, DROW, F_CARRY, G_CARRY, DK,
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
        tl.store(DK + n * S * D + cols[:, None] * D + offs_d[None, :], dk * scaling,
                 mask=col_ok[:, None] & (offs_d[None, :] < D))

    _JIT = ("_masks_of", "_query_tile", "_scores", "_neighbour_index", "_neighbour", "_neighbour_value",
            "_probs_gradient",
            "_forward_rows_kernel", "_forward_abar_kernel",
            "_backward_rows_kernel", "_backward_keys_kernel")
    _PYTHON = {name: globals()[name] for name in _JIT}  # the functions before triton.jit
    _built: list[bool] = []  # the TRITON_INTERPRET setting the kernels were built for


def _build() -> None:
    """``triton.jit`` the kernels at their first use, and again if TRITON_INTERPRET changed since (``triton.jit``
    chooses the interpreter or the compiler when it is applied)."""
    mode = _interpreting()
    if _built != [mode]:
        names = globals()
        for name in _JIT:
            names[name] = triton.jit(_PYTHON[name])
        _built[:] = [mode]


def _precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: TF32 for half-precision heads (their products are exact in it, as
    ``eadra_math._matmul_precision`` uses it), else the user's float32 setting ("highest": IEEE float32)."""
    if dtype in _HALF or torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "ieee"


def _strided(x: torch.Tensor, shape) -> tuple[torch.Tensor, tuple[int, ...]]:
    """A view of ``x`` broadcast to ``shape`` (stride 0 on broadcast dimensions, nothing copied) and its strides;
    bool as uint8 (same bytes)."""
    x = torch.broadcast_to(x, shape)
    if x.dtype == torch.bool:
        x = x.view(torch.uint8)
    return x, tuple(x.stride())


def _rows(x: torch.Tensor, shape) -> torch.Tensor:
    """A small (..., n) per-row tensor broadcast to shape (L, B, h, n), as a contiguous float32 (N, n)."""
    return torch.broadcast_to(x, shape).reshape(-1, shape[-1]).to(torch.float32).contiguous()


def _launch_args(query, key, support, bias, shape):
    L, B, h, T, S = shape
    sup, sup_strides = _strided(support, shape)
    if bias is None:
        bias_t, bias_strides = sup, (0,) * 5
    else:
        bias_t, bias_strides = _strided(bias.detach(), shape)
    tensors = (query, key, sup, bias_t)
    strides = (*query.stride(), *key.stride(), *sup_strides, *bias_strides)
    return tensors, strides, (B, h, T, S, query.shape[-1])


def forward(query, key, scaling: float, shape, support, bias, coefficients, *, block_m: int = BLOCK_M,
            block_n: int = BLOCK_N):
    """The forward's map-sized work (``eadra_math._forward_maps``) without maps: R_peak, R_sent, R_dist (Eq. 4, 6,
    8), each (L, B, h), and what the backward needs besides the coefficients and heads.

    Parameters
    ----------
    query, key : (N, T, D) and (N, S, D) stacked heads (``eadra_math._stacked``, or the same in float16/bfloat16),
        N = L * B * h.
    scaling : the attention's scaling of q k^T.
    shape : (L, B, h, T, S).
    support : bool, broadcastable to ``shape`` (read through its strides, never expanded).
    bias : None, or an additive float bias broadcastable to ``shape`` without gradient.
    coefficients : ``eadra_math._coefficients(support, query_mask, torch.float32)``: peak_coef, weights, pairs,
        bar_norm.

    Returns
    -------
    ``(peak, sent, dist), (row_max, log_sum, log_a_bar)``: the terms, and saved for the backward each row's
    log-sum-exp in two parts, max_j s_ij and log sum_j exp(s_ij - max) (L, B, h, T), and log abar (L, B, h, S)
    (Eq. 5-6). O(T + S) per row block: nothing of size T x S.
    """
    _check(query, bias)
    _build()
    L, B, h, T, S = shape
    N, f32 = L * B * h, dict(dtype=torch.float32, device=query.device)
    peak_coef, weights, pairs, bar_norm = coefficients
    tensors, strides, sizes = _launch_args(query, key, support, bias, shape)
    block_d = max(16, triton.next_power_of_2(query.shape[-1]))
    meta = dict(HAS_BIAS=bias is not None, PRECISION=_precision(query.dtype), BM=block_m, BN=block_n, BD=block_d)
    row_max, log_sum, a_log_a, cdf_sum, cross = (torch.empty(N, T, **f32) for _ in range(5))
    _forward_rows_kernel[(N, triton.cdiv(T, block_m - 2))](
        *tensors, row_max, log_sum, a_log_a, cdf_sum, cross, *strides, *sizes, float(scaling), **meta,
        num_warps=8)
    a_bar = torch.empty(N, S, **f32)
    _forward_abar_kernel[(N, triton.cdiv(S, block_n))](
        *tensors, row_max, log_sum, _rows(weights, (L, B, h, T)), a_bar, *strides, *sizes, float(scaling), **meta,
        num_warps=4)
    row_max, log_sum, a_log_a, cdf_sum, cross = (
        x.view(L, B, h, T) for x in (row_max, log_sum, a_log_a, cdf_sum, cross))
    a_bar = a_bar.view(L, B, h, S)
    peak = torch.linalg.vecdot(a_log_a, peak_coef)  # Eq. 4
    log_a_bar = _safe_log(a_bar)
    sent = torch.linalg.vecdot(a_bar, log_a_bar) * bar_norm  # Eq. 6
    pair_distance = cdf_sum[..., :-1] + cdf_sum[..., 1:] - 2 * cross[..., :-1]  # sum_k F_i + F_i+1 - 2 F_i F_i+1
    dist = (pair_distance * pairs).sum(-1)  # Eq. 8
    return (peak, sent, dist), (row_max, log_sum, log_a_bar)


def backward(query, key, scaling: float, shape, support, bias, coefficients, saved, grads, *,
             block_m: int = BLOCK_M, block_n: int = BLOCK_N):
    """The backward's map-sized work (``eadra_math._backward_maps`` and the products after it) without maps.

    ``saved``: :func:`forward`'s ``(row_max, log_sum, log_a_bar)``; ``grads``: g_peak, g_sent, g_dist, each (L, B, h) or
    ``None`` for a term outside the objective (skipped). Returns ``(grad_query, grad_key)`` of the stacked heads,
    float32 (N, T, D) and (N, S, D), or ``None`` when no term is in the objective.
    """
    g_peak, g_sent, g_dist = grads
    if g_peak is None and g_sent is None and g_dist is None:
        return None
    _check(query, bias)
    _build()
    L, B, h, T, S = shape
    N, D, f32 = L * B * h, query.shape[-1], dict(dtype=torch.float32, device=query.device)
    peak_coef, weights, pairs, bar_norm = coefficients
    row_max, log_sum, log_a_bar = (x.reshape(N, -1).float().contiguous() for x in saved)
    rows, dummy = (L, B, h, T), row_max
    peak_c = dummy if g_peak is None else _rows(g_peak.unsqueeze(-1) * peak_coef, rows)
    sent_c = dummy if g_sent is None else _rows((g_sent * bar_norm).unsqueeze(-1) * weights, rows)
    pair_c = dummy if g_dist is None else _rows(
        torch.nn.functional.pad(torch.broadcast_to(g_dist.unsqueeze(-1) * pairs, (L, B, h, T - 1)), (0, 1)), rows)
    key_blocks = triton.cdiv(S, block_n)
    carries = (torch.empty(N, key_blocks, T, **f32), torch.empty(N, key_blocks, T, **f32)) if g_dist is not None \
        else (dummy, dummy)
    tensors, strides, sizes = _launch_args(query, key, support, bias, shape)
    block_d = max(16, triton.next_power_of_2(D))
    precision = _precision(query.dtype)
    meta = dict(HAS_BIAS=bias is not None, HAS_PEAK=g_peak is not None, HAS_SENT=g_sent is not None,
                HAS_DIST=g_dist is not None, PRECISION=precision, BM=block_m, BN=block_n, BD=block_d)
    grad_query, row_dot = torch.empty(N, T, D, **f32), torch.empty(N, T, **f32)
    _backward_rows_kernel[(N, triton.cdiv(T, block_m - 2))](
        *tensors, row_max, log_sum, log_a_bar, peak_c, sent_c, pair_c, grad_query, row_dot, *carries, *strides, *sizes,
        float(scaling), key_blocks, **meta, DIFFERENCE_PRECISION="ieee" if precision == "ieee" else "tf32x3",
        num_warps=8)
    grad_key = torch.empty(N, S, D, **f32)
    _backward_keys_kernel[(N, key_blocks)](
        *tensors, row_max, log_sum, log_a_bar, peak_c, sent_c, pair_c, row_dot, *carries, grad_key, *strides, *sizes,
        float(scaling), key_blocks, **meta, num_warps=8)
    return grad_query, grad_key


def _stacked_heads(queries, keys, num_heads: int):
    """``eadra_math._stacked`` in the heads' own dtype where it is half precision (half the bytes to copy and read;
    the kernels convert each tile to float32 on loading, and their TF32 products of such values are exact), float32
    otherwise."""
    dtype = queries[0].dtype if queries[0].dtype in _HALF else torch.float32
    length, key_length = max(q.shape[2] for q in queries), max(k.shape[2] for k in keys)
    query = _stack_heads(queries, num_heads, dtype, length)
    key = _stack_heads(keys, num_heads, dtype, key_length)
    return query, key, (len(queries), queries[0].shape[0], num_heads, length, key_length)


class _TritonLayerRegularizers(torch.autograd.Function):
    """:func:`layer_regularizers`: keeps the layers' queries and keys (which the attention keeps anyway), the mask
    coefficients, each row's max and log-sum of the scores and log abar per row block; recomputes the rest in the
    backward."""

    @staticmethod
    def forward(ctx, num_heads, scaling, support, query_mask, bias, block_m, block_n, *queries_and_keys):
        ctx.set_materialize_grads(False)
        layers, first = len(queries_and_keys) // 2, queries_and_keys[0]
        queries, keys = queries_and_keys[:layers], queries_and_keys[layers:]
        ctx.num_heads, ctx.scaling, ctx.layers, ctx.blocks = num_heads, scaling, layers, (block_m, block_n)
        with torch.autocast(first.device.type, enabled=False):
            query, key, shape = _stacked_heads(queries, keys, num_heads)
            coefficients = _coefficients(support, query_mask, torch.float32)
            terms, saved = forward(query, key, scaling, shape, support, bias, coefficients, block_m=block_m,
                                   block_n=block_n)
        ctx.save_for_backward(support, bias, *coefficients, *saved, *queries_and_keys)
        return terms

    @staticmethod
    def backward(ctx, g_peak, g_sent, g_dist):
        support, bias, *rest = ctx.saved_tensors
        coefficients, saved, inputs = rest[:4], rest[4:7], rest[7:]
        queries, keys = inputs[:ctx.layers], inputs[ctx.layers:]
        block_m, block_n = ctx.blocks
        with torch.autocast(queries[0].device.type, enabled=False):
            query, key, shape = _stacked_heads(queries, keys, ctx.num_heads)
            grads = backward(query, key, ctx.scaling, shape, support, bias, coefficients, saved,
                             (g_peak, g_sent, g_dist), block_m=block_m, block_n=block_n)
            if grads is None:
                return (None,) * (7 + 2 * ctx.layers)
            grad_query = _unstack_heads(grads[0], shape, queries)
            grad_key = _unstack_heads(grads[1], shape, keys)
        return (None,) * 7 + (*grad_query, *grad_key)


def layer_regularizers(queries, keys, num_heads: int, scaling: float, support: torch.Tensor,
                       query_mask: torch.Tensor, bias: torch.Tensor | None = None, *, block_m: int = BLOCK_M,
                       block_n: int = BLOCK_N) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R_peak, R_sent and R_dist (Eq. 4, 6, 8) of the first ``num_heads`` heads of several layers, as
    :func:`hf_headattn.eadra_math.layer_regularizers` (same arguments and results, always recomputing), with the
    Triton kernels: nothing of size (L, B, h, T, S) is written, in the forward or the backward. Float32, float16
    or bfloat16 heads; ``bias`` without gradient."""
    _check(queries[0], bias)
    return _TritonLayerRegularizers.apply(num_heads, scaling, support, query_mask, bias, block_m, block_n, *queries,
                                          *keys)
