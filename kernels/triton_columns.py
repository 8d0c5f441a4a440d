"""Column statistics (CUDA): ``col_sum`` and ``col_mean`` from q, k and every row's final
log-sum-exp.

``col_sum[j] = sum_i p_ij`` with ``p_ij = exp(s_ij - lse_i)`` needs each row's final lse, so it
is one more pass over the scores after the row statistics (or the fused forward). Each program
owns ``BLOCK_N`` keys of one query head and streams the query tiles that can see them,
recomputing ``p`` and summing it per key in registers; ``col_mean`` divides by the number of
queries that see each key, analytic for the causal rule
(:func:`~headhunt.kernels.reference.visible_query_count`), counted once per batch row otherwise.

Two kernels. ``_col_stats_kernel`` serves every mask (per-row key intervals, softcaps).
``_col_fast_kernel`` is it specialised for the plain causal / full mask, with three changes that
made it faster on an H100 (BENCHMARKS.md, "Fused statistics"):

- scores come as ``[query rows, keys]`` tiles (``q @ k^T``, one 64-row tensor-core
  instruction shape per warp group, k fixed in shared memory) instead of ``[keys, rows]``;
- the probabilities are added elementwise into a register accumulator and reduced over
  the rows once per head, not once per tile; the accumulator is already summed over
  the two rows each thread holds of the tensor-core layout (a free in-register
  reshape), which halves its registers;
- q and k tiles by bulk tensor copies (TMA) also over the ``[b, n, heads, d]`` memory a
  model's projections give (the general kernel uses them only for contiguous tensors).

The sums are the same float32 sums in another order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from .config import KernelConfig, exp_mode, interpreting
from .device import (
    LOG2E,
    alibi_slope,
    causal_query_tiles,
    exp2,
    head_pointers,
    load_rows,
    program_tile,
    qk,
    qk_program,
)
from .masks import key_visible_counts
from .tma import tma_views

if TYPE_CHECKING:
    from .launch import Launch

__all__ = [
    "fast_columns_apply",
    "launch_columns",
    "launch_fast_columns",
    "launch_general_columns",
    "query_ranges",
]


@triton.jit
def _col_tile(
    acc, k, q_base, lse_base, Q, q_flat0, m0, offs_m, offs_n, nq, stride_qm, d_ok,
    lo_base, hi_base, q_offset, qk_scale, sc_in, sc_out, neg_slope,
    MASK: tl.constexpr, BOUNDS: tl.constexpr, SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, EXP: tl.constexpr, ASM: tl.constexpr,
    TMA: tl.constexpr, ALIBI: tl.constexpr,
):  # fmt: skip
    """Add ``sum_i p_ij`` over the query rows ``m0 + offs_m`` to the key tile's ``acc``.

    ``MASK``: apply the visibility of each (key, row) pair: the row's ``[lo, hi]`` with
    ``BOUNDS``, else the causal rule; it also drops rows without keys, whose lse = -inf
    would give ``exp2(+inf)`` (unmasked ``BOUNDS`` tiles drop them through their lse).
    Rows past ``nq`` read lse = +inf, so their terms are 0. ``ALIBI``: the scores carry
    the bias ``-neg_slope * (row position - key)`` (the tile is [keys, rows]).
    """
    rows = m0 + offs_m
    q = load_rows(Q, q_base, q_flat0, m0, offs_m, nq, stride_qm, d_ok, True, TMA, UPCAST)
    lse2 = tl.load(lse_base + rows, mask=rows < nq, other=float("inf")) * LOG2E
    if BOUNDS:
        lo = tl.load(lo_base + rows, mask=rows < nq, other=0)
        hi = tl.load(hi_base + rows, mask=rows < nq, other=-1)
        if not MASK:
            # Rows that see no key can sit in an unmasked tile; their lse (-inf, or the
            # sink logit) must not turn into probabilities.
            lse2 = tl.where(lo <= hi, lse2, float("inf"))
    st = qk(k, q, sc_in, sc_out, PRECISION, SOFTCAP, neg_slope, offs_n, q_offset + rows, ALIBI)
    p = exp2(st * qk_scale - lse2[None, :], EXP, ASM)
    if MASK:
        if BOUNDS:
            ok = (offs_n[:, None] >= lo[None, :]) & (offs_n[:, None] <= hi[None, :])
        else:
            ok = offs_n[:, None] <= q_offset + rows[None, :]
        p = tl.where(ok, p, 0.0)
    return acc + tl.sum(p, axis=1)


@triton.jit
def _col_stats_kernel(
    Q, K, LSE, COL, COL_MEAN,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    LO, HI, MRANGE, COUNT, ALIBI_S,
    nq, nk, q_offset, hq, group, qk_scale, sc_in, sc_out, n_tiles,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, SOFTCAP: tl.constexpr,
    PIPELINE: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    EXP: tl.constexpr, ASM: tl.constexpr, TMA: tl.constexpr, ALIBI: tl.constexpr,
):  # fmt: skip
    # Key tile 0 has the most visible queries under the causal mask and already runs
    # first in launch order, so no reordering is needed here.
    pid_n = tl.program_id(0)
    pid_bh, b, h, n0, offs_n, offs_m, d_ok, q_base, k_base, q_flat0, k_flat0 = qk_program(
        Q, K, pid_n, hq, group, nq, nk, stride_qb, stride_qh, stride_kb, stride_kh,
        BLOCK_N, BLOCK_M, BLOCK_D, D, TMA,
    )  # fmt: skip
    k = load_rows(
        K, k_base, k_flat0, n0, tl.arange(0, BLOCK_N), nk, stride_kn, d_ok, True, TMA, UPCAST
    )
    lse_base = LSE + pid_bh * nq
    neg_slope = -alibi_slope(ALIBI_S, h, ALIBI)  # the tiles are [keys, rows]
    lo_base = LO + b * nq
    hi_base = HI + b * nq
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)

    if BOUNDS:
        # MRANGE[b, tile] = (first, full_lo, full_hi, stop): rows [first, stop) hold every
        # row that sees a key of this tile, rows [full_lo, full_hi) see all of them (or
        # none: those get p = 0 from their lse, see _col_tile); prepared by
        # query_ranges. Query tiles inside the full rows run unmasked, in a loop of
        # their own so that it stays software-pipelined.
        r = MRANGE + (b * n_tiles + pid_n) * 4
        m_stop = tl.load(r + 3)
        m_start = (tl.load(r) // BLOCK_M) * BLOCK_M
        f0 = tl.maximum(((tl.load(r + 1) + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, m_start)
        f1 = tl.maximum((tl.load(r + 2) // BLOCK_M) * BLOCK_M, f0)
        # Three runs of query tiles, unrolled: masked, full rows (unmasked), masked.
        for run in tl.static_range(3):
            if run == 0:
                m_begin, m_end = m_start, tl.minimum(f0, m_stop)
            elif run == 1:
                m_begin, m_end = f0, f1
            else:
                m_begin, m_end = f1, m_stop
            for m0 in range(m_begin, m_end, BLOCK_M):
                acc = _col_tile(
                    acc, k, q_base, lse_base, Q, q_flat0, m0, offs_m, offs_n, nq, stride_qm,
                    d_ok, lo_base, hi_base, q_offset, qk_scale, sc_in, sc_out, neg_slope,
                    run != 1, BOUNDS, SOFTCAP, PRECISION, UPCAST, EXP, ASM, TMA, ALIBI,
                )  # fmt: skip
    else:
        m_lo, m_mid = causal_query_tiles(n0, q_offset, nq, BLOCK_N, BLOCK_M, CAUSAL)
        for m0 in range(m_lo, m_mid, BLOCK_M):
            acc = _col_tile(
                acc, k, q_base, lse_base, Q, q_flat0, m0, offs_m, offs_n, nq, stride_qm,
                d_ok, lo_base, hi_base, q_offset, qk_scale, sc_in, sc_out, neg_slope,
                True, False, SOFTCAP, PRECISION, UPCAST, EXP, ASM, TMA, ALIBI,
            )  # fmt: skip

        if PIPELINE:
            # Software pipeline as in the row kernel: issue tile m0's product, then do
            # the exp2 work of the previous tile.
            if m_mid < nq:
                rows = m_mid + offs_m
                q = load_rows(
                    Q, q_base, q_flat0, m_mid, offs_m, nq, stride_qm, d_ok, True, TMA, UPCAST
                )
                lse2 = tl.load(lse_base + rows, mask=rows < nq, other=float("inf")) * LOG2E
                st = qk(
                    k, q, sc_in, sc_out, PRECISION, SOFTCAP, neg_slope, offs_n, q_offset + rows,
                    ALIBI,
                )  # fmt: skip
                for m0 in range(m_mid + BLOCK_M, nq, BLOCK_M):
                    rows = m0 + offs_m
                    q = load_rows(
                        Q, q_base, q_flat0, m0, offs_m, nq, stride_qm, d_ok, True, TMA, UPCAST
                    )
                    lse2_next = tl.load(lse_base + rows, mask=rows < nq, other=float("inf")) * LOG2E
                    st_next = qk(
                        k, q, sc_in, sc_out, PRECISION, SOFTCAP, neg_slope, offs_n,
                        q_offset + rows, ALIBI,
                    )  # fmt: skip
                    acc += tl.sum(exp2(st * qk_scale - lse2[None, :], EXP, ASM), axis=1)
                    st = st_next
                    lse2 = lse2_next
                acc += tl.sum(exp2(st * qk_scale - lse2[None, :], EXP, ASM), axis=1)
        else:
            for m0 in range(m_mid, nq, BLOCK_M):
                acc = _col_tile(
                    acc, k, q_base, lse_base, Q, q_flat0, m0, offs_m, offs_n, nq, stride_qm,
                    d_ok, lo_base, hi_base, q_offset, qk_scale, sc_in, sc_out, neg_slope,
                    False, False, SOFTCAP, PRECISION, UPCAST, EXP, ASM, TMA, ALIBI,
                )  # fmt: skip

    out = pid_bh * nk + offs_n
    tl.store(COL + out, acc, mask=offs_n < nk)
    # col_mean divides by the number of queries that see key j: analytic under the
    # causal rule (see visible_query_count), else counted once per batch row on the
    # host (key_visible_counts); fused here to spare small torch kernels per call.
    if BOUNDS:
        count = tl.load(COUNT + b * nk + offs_n, mask=offs_n < nk, other=0.0)
    elif CAUSAL:
        count = (nq - tl.minimum(tl.maximum(offs_n - q_offset, 0), nq)).to(tl.float32)
    else:
        count = tl.full([BLOCK_N], nq, dtype=tl.float32)
    mean = tl.where(count > 0, acc / tl.maximum(count, 1.0), 0.0)
    tl.store(COL_MEAN + out, mean, mask=offs_n < nk)


@triton.jit
def _add_tile(acc, k, Q, q_base, q_row0, q_col0, lse_base, m0, offs_m, offs_n, nq, stride_qm,
              d_ok, q_offset, qk_scale, MASK: tl.constexpr, PRECISION: tl.constexpr,
              UPCAST: tl.constexpr, TMA: tl.constexpr):  # fmt: skip
    """``acc`` plus the probabilities of query rows ``m0 + offs_m`` against the key tile.

    ``MASK``: zero where key ``offs_n`` comes after the row's position (the causal rule),
    which also drops rows that see no key (lse = -inf). Rows past ``nq`` read lse = +inf,
    so their terms are 0 whatever their q tile holds (TMA: other rows of the 2-D view or
    zeros; pointer loads: zeros).
    """
    rows = m0 + offs_m
    if TMA:
        q = Q.load([q_row0 + m0, q_col0])
    else:
        ptrs = q_base + rows.to(tl.int64)[:, None] * stride_qm
        q = tl.load(ptrs, mask=(rows[:, None] < nq) & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    lse2 = tl.load(lse_base + rows, mask=rows < nq, other=float("inf")) * LOG2E
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
    p = tl.math.exp2(s * qk_scale - lse2[:, None])
    if MASK:
        p = tl.where(offs_n[None, :] <= q_offset + rows[:, None], p, 0.0)
    # Row 16 w + 8 h + r of a 64-row tensor-core tile sits in warp w, lane group r, and
    # register h of its thread: summing over h needs no data movement.
    bm: tl.constexpr = p.shape[0]
    bn: tl.constexpr = p.shape[1]
    return acc + tl.sum(tl.reshape(p, [bm // 16, 2, 8, bn]), axis=1)


@triton.jit
def _col_fast_kernel(
    Q, K, LSE, COL, COL_MEAN,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    q_rb, q_rh, q_ch, k_rb, k_rh, k_ch,
    nq, nk, q_offset, hq, group, qk_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    # Key tile 0 has the most visible queries under the causal mask and runs first in
    # launch order. (Ordering the whole grid longest-first instead, every head's tile 0
    # before any tile 1, was 10-40% slower on an H100: programs of one head share q.)
    pid_n = tl.program_id(0)
    pid_bh, b, h, kvh, n0, offs_n, offs_m, offs_d, d_ok = program_tile(
        pid_n, hq, group, BLOCK_N, BLOCK_M, BLOCK_D, D
    )

    # TMA: head h of batch row b starts at row b * rb + h * rh, column h * ch of its
    # tensor's 2-D view (see tma.tma_view).
    q_row0 = b * q_rb + h * q_rh
    if TMA:
        q_base = Q
        k = K.load([b * k_rb + kvh * k_rh + n0, kvh * k_ch])
    else:
        q_base = head_pointers(Q, b, h, stride_qb, stride_qh, offs_d)
        k_ptrs = (
            K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
            + offs_n.to(tl.int64)[:, None] * stride_kn + offs_d[None, :]
        )  # fmt: skip
        k = tl.load(k_ptrs, mask=(offs_n[:, None] < nk) & d_ok[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
    lse_base = LSE + pid_bh * nq

    m_lo, m_mid = causal_query_tiles(n0, q_offset, nq, BLOCK_N, BLOCK_M, CAUSAL)
    if CAUSAL:
        count = (nq - tl.minimum(tl.maximum(offs_n - q_offset, 0), nq)).to(tl.float32)
    else:
        count = tl.full([BLOCK_N], nq, dtype=tl.float32)

    acc = tl.zeros([BLOCK_M // 16, 8, BLOCK_N], dtype=tl.float32)
    for m0 in range(m_lo, m_mid, BLOCK_M):
        acc = _add_tile(
            acc, k, Q, q_base, q_row0, h * q_ch, lse_base, m0, offs_m, offs_n, nq, stride_qm,
            d_ok, q_offset, qk_scale, True, PRECISION, UPCAST, TMA,
        )  # fmt: skip
    for m0 in range(m_mid, nq, BLOCK_M):
        acc = _add_tile(
            acc, k, Q, q_base, q_row0, h * q_ch, lse_base, m0, offs_m, offs_n, nq, stride_qm,
            d_ok, q_offset, qk_scale, False, PRECISION, UPCAST, TMA,
        )  # fmt: skip
    col = tl.sum(tl.sum(acc, axis=0), axis=0)

    out = pid_bh * nk + offs_n
    tl.store(COL + out, col, mask=offs_n < nk)
    # col_mean divides by the number of queries that see key j (visible_query_count).
    mean = tl.where(count > 0, col / tl.maximum(count, 1.0), 0.0)
    tl.store(COL_MEAN + out, mean, mask=offs_n < nk)


def fast_columns_apply(L: Launch, cfg: KernelConfig) -> bool:
    """Whether ``_col_fast_kernel`` serves this call: no per-row key bounds, no softcap, no
    ALiBi, and the configuration asks for none of the general kernel's own options (its
    pipelined loop or approximate exponentials)."""
    return (
        L.lo is None
        and L.softcap_in == 0
        and L.alibi is None
        and not cfg.col_pipeline
        and cfg.col_exp == 0
    )


def launch_columns(L: Launch, lse: Tensor, col_sum: Tensor, col_mean: Tensor) -> None:
    """col_sum and col_mean from q, k and the final lse of every row (the plain causal /
    full mask by the specialised kernel, every other mask by the general one)."""
    if L.nk == 0:
        return
    if fast_columns_apply(L, L.cfg):
        launch_fast_columns(L, lse, col_sum, col_mean)
    else:
        launch_general_columns(L, lse, col_sum, col_mean)


def launch_fast_columns(L: Launch, lse: Tensor, col_sum: Tensor, col_mean: Tensor) -> None:
    """col_sum and col_mean by ``_col_fast_kernel``, with the ``col_*`` tiles of ``L.cfg``."""
    cfg = L.cfg
    block_n, block_m = cfg.col_block_n, cfg.col_block_m
    views = tma_views(L.q, L.k) if cfg.col_tma else None
    tma = views is not None
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        (q2, *q_lay), (k2, *k_lay) = views
        q = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [block_m, L.d])
        k = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [block_n, L.d])
    else:
        q, k, q_lay, k_lay = L.q, L.k, [0, 0, 0], [0, 0, 0]
    grid = (triton.cdiv(L.nk, block_n), L.b * L.hq)
    _col_fast_kernel[grid](
        q, k, lse, col_sum, col_mean,
        *L.strides, *q_lay, *k_lay,
        L.nq, L.nk, L.q_offset, L.hq, L.group, L.qk_scale,
        D=L.d, BLOCK_D=L.block_d, BLOCK_N=block_n, BLOCK_M=block_m,
        CAUSAL=L.causal, PRECISION=L.precision, UPCAST=L.upcast, TMA=tma,
        num_warps=cfg.col_warps, num_stages=cfg.col_stages,
    )  # fmt: skip


def launch_general_columns(L: Launch, lse: Tensor, col_sum: Tensor, col_mean: Tensor) -> None:
    """col_sum and col_mean by ``_col_stats_kernel`` (any mask)."""
    cfg = L.cfg
    n_tiles = triton.cdiv(L.nk, cfg.col_block_n)
    grid = (n_tiles, L.b * L.hq)
    q, k = L.operands(cfg.col_block_m, cfg.col_block_n, cfg.col_tma)
    bounds = L.lo is not None
    if bounds:
        mrange = query_ranges(L.lo, L.hi, L.nk, cfg.col_block_n)
        count = key_visible_counts(L.lo.long(), L.hi.long(), L.nk)
    _col_stats_kernel[grid](
        q, k, lse, col_sum, col_mean,
        *L.strides,
        L.lo if bounds else lse,  # unused pointers without BOUNDS
        L.hi if bounds else lse,
        mrange if bounds else lse,
        count if bounds else lse,
        L.alibi if L.alibi is not None else lse,
        *L.sizes_and_scales, n_tiles,
        D=L.d, BLOCK_D=L.block_d, BLOCK_N=cfg.col_block_n, BLOCK_M=cfg.col_block_m,
        CAUSAL=L.causal, BOUNDS=bounds, SOFTCAP=L.softcap_in > 0, PIPELINE=cfg.col_pipeline,
        PRECISION=L.precision, UPCAST=L.upcast, EXP=exp_mode(cfg.col_exp, L.q.dtype),
        ASM=not interpreting(), TMA=cfg.col_tma and L.tma, ALIBI=L.alibi is not None,
        num_warps=cfg.col_warps, num_stages=cfg.col_stages,
    )  # fmt: skip


def query_ranges(lo: Tensor, hi: Tensor, nk: int, block_n: int) -> Tensor:
    """For each batch row and key tile, the query rows the column pass visits:
    int32 ``[b, tiles, 4]`` = ``(first, full_lo, full_hi, stop)``.

    ``[first, stop)`` holds every row that sees a key of the tile: ``first`` is the first
    row with ``hi >= tile start`` (where the running max of ``hi`` reaches it), ``stop``
    one past the last row with ``lo <= tile end`` (where the running min of ``lo`` from
    the end does); exact when ``lo`` and ``hi`` never decrease along the rows (causal,
    window, chunk, padding), a superset otherwise. ``[full_lo, full_hi)`` are rows that
    see every key of the tile or none (``lo <= start`` for all rows before ``full_hi``,
    by the running max of ``lo``; ``hi >= end`` for all rows from ``full_lo``, by the
    running min of ``hi`` from the end; rows without keys count as seeing all): those
    need no mask. Both envelopes are sorted, so each bound is one search.
    """
    b = lo.shape[0]
    starts = torch.arange(0, nk, block_n, device=lo.device, dtype=lo.dtype)
    ends = torch.clamp(starts + block_n, max=nk) - 1
    starts, ends = starts.expand(b, -1).contiguous(), ends.expand(b, -1).contiguous()

    def rising_max(x: Tensor) -> Tensor:
        return x.cummax(dim=1).values.contiguous()

    def falling_min(x: Tensor) -> Tensor:  # min over this row and every later one
        return x.flip(1).cummin(dim=1).values.flip(1).contiguous()

    first = torch.searchsorted(rising_max(hi), starts, side="left")
    stop = torch.searchsorted(falling_min(lo), ends, side="right")
    empty = lo > hi
    full_hi = torch.searchsorted(rising_max(lo.masked_fill(empty, 0)), starts, side="right")
    full_lo = torch.searchsorted(falling_min(hi.masked_fill(empty, nk)), ends, side="left")
    full_lo = torch.maximum(full_lo, first)
    full_hi = torch.minimum(full_hi, stop)
    return torch.stack([first, full_lo, full_hi, stop], dim=-1).to(torch.int32).contiguous()
