"""Row statistics (CUDA): each query's log-sum-exp, max score, argmax and entropy.

``_row_stats_kernel`` is a FlashAttention-style forward without V: each program owns
``BLOCK_M`` query rows of one query head and streams the visible key tiles, keeping an online
row max, sum of exponentials, argmax and (optionally) the entropy accumulator
``sum_j e_j (s_j - m)`` (:func:`~headhunt.kernels.device.softmax_tile`). It writes ``lse``,
``max_score``, ``argmax`` and ``entropy`` (``O(nq)`` per head). For a few queries over a long
cache the split-K kernels of :mod:`~headhunt.kernels.triton_decode` serve the same statistics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl
from torch import Tensor

from .config import exp_mode, interpreting
from .device import (
    LOG2E,
    alibi_slope,
    causal_tiles,
    interval_tiles,
    load_rows,
    qk,
    qk_program,
    row_state,
    softmax_tile,
    store_rows,
    visible,
)

if TYPE_CHECKING:
    from .launch import Launch

__all__ = ["launch_rows"]


@triton.jit
def _row_stats_kernel(
    Q, K, LSE, MAX, ARG, ENT,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    LO, HI, SINK, ALIBI_S,
    nq, nk, q_offset, hq, group, qk_scale, sc_in, sc_out,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
    ENTROPY: tl.constexpr, ARGMAX: tl.constexpr, PIPELINE: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, EXP: tl.constexpr, ASM: tl.constexpr,
    TMA: tl.constexpr, ALIBI: tl.constexpr,
):  # fmt: skip
    # Query tiles run longest-first (the last tile sees the most keys under the causal
    # mask), so the long programs start in the first wave and the tail stays short.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh, b, h, m0, offs_m, offs_n, d_ok, q_base, k_base, q_flat0, k_flat0 = qk_program(
        Q, K, pid_m, hq, group, nq, nk, stride_qb, stride_qh, stride_kb, stride_kh,
        BLOCK_M, BLOCK_N, BLOCK_D, D, TMA,
    )  # fmt: skip
    q = load_rows(
        Q, q_base, q_flat0, m0, tl.arange(0, BLOCK_M), nq, stride_qm, d_ok, True, TMA, UPCAST
    )

    m_i, l_i, t_i, a_i = row_state(BLOCK_M)
    pos = q_offset + offs_m  # absolute position of each query row
    slope = alibi_slope(ALIBI_S, h, ALIBI)

    if BOUNDS:
        # Per-row key intervals [lo, hi] (window, chunk, padding, ...): see interval_tiles.
        lo, hi, k_start, n_lo, n_full, hi_end = interval_tiles(LO, HI, b, nq, nk, offs_m, BLOCK_N)
        for n0 in range(k_start, n_lo, BLOCK_N):
            cols = n0 + offs_n
            k = load_rows(K, k_base, k_flat0, n0, offs_n, nk, stride_kn, d_ok, True, TMA, UPCAST)
            s = qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP, slope, pos, cols, ALIBI)
            valid = visible(cols, lo, hi, pos, nk, True, CAUSAL)
            m_i, l_i, a_i, t_i, _, _ = softmax_tile(
                s, m_i, l_i, a_i, t_i, n0, valid, qk_scale,
                True, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM,
            )  # fmt: skip
    else:
        # Key tiles entirely visible to every row of this tile need no mask; the
        # tiles from n_full up to hi_end straddle the diagonal (or the end of k).
        lo = pos  # unused: the causal rule needs no intervals
        hi = pos
        n_lo = 0
        n_full, hi_end = causal_tiles(q_offset, m0, nk, BLOCK_M, BLOCK_N, CAUSAL)

    if PIPELINE:
        # Software pipeline: the product for tile n0 is issued before the softmax work
        # on tile n0 - BLOCK_N, so the tensor cores and the exp2 units can overlap.
        if n_full > n_lo:
            k = load_rows(K, k_base, k_flat0, n_lo, offs_n, nk, stride_kn, d_ok, False, TMA, UPCAST)
            s = qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP, slope, pos, n_lo + offs_n, ALIBI)
            for n0 in range(n_lo + BLOCK_N, n_full, BLOCK_N):
                k = load_rows(
                    K, k_base, k_flat0, n0, offs_n, nk, stride_kn, d_ok, False, TMA, UPCAST
                )
                s_next = qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP, slope, pos, n0 + offs_n, ALIBI)
                m_i, l_i, a_i, t_i, _, _ = softmax_tile(
                    s, m_i, l_i, a_i, t_i, n0 - BLOCK_N, s, qk_scale,
                    False, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM,
                )  # fmt: skip
                s = s_next
            m_i, l_i, a_i, t_i, _, _ = softmax_tile(
                s, m_i, l_i, a_i, t_i, n_full - BLOCK_N, s, qk_scale,
                False, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM,
            )  # fmt: skip
    else:
        for n0 in range(n_lo, n_full, BLOCK_N):
            k = load_rows(K, k_base, k_flat0, n0, offs_n, nk, stride_kn, d_ok, False, TMA, UPCAST)
            s = qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP, slope, pos, n0 + offs_n, ALIBI)
            m_i, l_i, a_i, t_i, _, _ = softmax_tile(
                s, m_i, l_i, a_i, t_i, n0, s, qk_scale,
                False, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM,
            )  # fmt: skip

    for n0 in range(n_full, hi_end, BLOCK_N):
        cols = n0 + offs_n
        k = load_rows(K, k_base, k_flat0, n0, offs_n, nk, stride_kn, d_ok, True, TMA, UPCAST)
        s = qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP, slope, pos, cols, ALIBI)
        valid = visible(cols, lo, hi, pos, nk, BOUNDS, CAUSAL)
        m_i, l_i, a_i, t_i, _, _ = softmax_tile(
            s, m_i, l_i, a_i, t_i, n0, valid, qk_scale,
            True, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM,
        )  # fmt: skip

    sink2 = 0.0
    if SINKS:
        sink2 = tl.load(SINK + h) * LOG2E
    out = pid_bh * nq + offs_m
    store_rows(
        LSE, MAX, ARG, ENT, out, offs_m < nq, m_i, l_i, a_i, t_i, qk_scale, sink2, SINKS,
        ENTROPY,
    )  # fmt: skip


def launch_rows(
    L: Launch, lse: Tensor, mx: Tensor, arg: Tensor, ent: Tensor | None, argmax: bool = True
) -> None:
    """lse, max_score, argmax (and entropy when ``ent`` is given) by the row kernel."""
    if L.nq == 0:
        return
    cfg = L.cfg
    grid = (triton.cdiv(L.nq, cfg.row_block_m), L.b * L.hq)
    q, k = L.operands(cfg.row_block_m, cfg.row_block_n, cfg.row_tma)
    _row_stats_kernel[grid](
        q, k, lse, mx, arg,
        ent if ent is not None else lse,  # unused pointer when ENTROPY is off
        *L.strides,
        L.lo if L.lo is not None else arg,  # unused pointers without BOUNDS / SINKS
        L.hi if L.hi is not None else arg,
        L.sinks if L.sinks is not None else lse,
        L.alibi if L.alibi is not None else lse,
        *L.sizes_and_scales,
        D=L.d, BLOCK_D=L.block_d, BLOCK_M=cfg.row_block_m, BLOCK_N=cfg.row_block_n,
        CAUSAL=L.causal, BOUNDS=L.lo is not None, SOFTCAP=L.softcap_in > 0,
        SINKS=L.sinks is not None, ENTROPY=ent is not None,
        ARGMAX=cfg.argmax_mode if argmax else 0, PIPELINE=cfg.row_pipeline,
        PRECISION=L.precision, UPCAST=L.upcast, EXP=exp_mode(cfg.row_exp, L.q.dtype),
        ASM=not interpreting(), TMA=cfg.row_tma and L.tma, ALIBI=L.alibi is not None,
        num_warps=cfg.row_warps, num_stages=cfg.row_stages,
    )  # fmt: skip
