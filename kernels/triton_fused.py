"""Triton attention forward that also returns the row statistics (CUDA).

``_fused_fwd_kernel`` is a FlashAttention-2 style forward (Dao, 2023,
https://arxiv.org/abs/2307.08691): each program owns ``BLOCK_M`` query rows of one query
head, streams the visible key/value tiles and keeps the output accumulator
``acc = sum_j e_ij v_j`` next to the running max, sum of exponentials, argmax and
entropy accumulator of :mod:`headhunt.kernels.triton_rows`' row pass (the same
per-tile update, :func:`~headhunt.kernels.device.softmax_tile`). It writes the
attention output and ``lse`` / ``max_score`` / ``argmax`` / ``entropy``, so the row
statistics cost one output-sized forward instead of a forward plus a statistics pass.

Column sums need every row's final ``lse``; they take exactly one more pass over the
keys: :mod:`headhunt.kernels.triton_columns`, fed this lse.

On Hopper the plain causal / full masks in bf16 or fp16 take the Gluon kernel of
:mod:`headhunt.kernels.gluon_fused` instead (``FusedConfig.fast_path``): the same statistics
with the tensor cores kept busy during the softmax.

The output comes back as ``[b, hq, nq, d]`` (SDPA's shape) over memory laid out as
``[b, nq, hq, d]``, so ``out.transpose(1, 2)`` is the contiguous tensor transformers'
attention functions return, with no copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl
from torch import Tensor

from .config import interpreting
from .device import (
    alibi_slope,
    causal_tiles,
    head_pointers,
    interval_tiles,
    load_rows,
    program_tile,
    qk,
    row_state,
    softmax_tile,
    store_rows,
    visible,
)
from .tma import tma_views

if TYPE_CHECKING:
    from .launch import Launch

__all__ = ["launch_fused"]


@triton.jit
def _tile(
    X, base, row0, col0, start, offs, limit, stride, d_ok,
    ROWMASK: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Rows ``start + offs`` of one head's [n, d] matrix: with ``TMA`` one bulk copy of the
    block at ``(row0 + start, col0)`` of the 2-D view the descriptor ``X`` covers (see
    :func:`~headhunt.kernels.tma.tma_view`), else
    :func:`~headhunt.kernels.device.load_rows`' pointer load from ``base`` (zeros
    past ``limit``)."""
    if TMA:
        t = X.load([row0 + start, col0])
        if UPCAST:
            t = t.to(tl.float32)
    else:
        t = load_rows(X, base, 0, start, offs, limit, stride, d_ok, ROWMASK, False, UPCAST)
    return t


@triton.jit
def _fwd_tile(
    q, acc, m_i, l_i, a_i, t_i,
    K, k_base, k_row0, k_col0, V, v_base, v_row0, v_col0,
    n0, offs_n, nk, stride_kn, stride_vn, d_ok, lo, hi, pos, qk_scale, sc_in, sc_out, slope,
    MASK: tl.constexpr, BOUNDS: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr, ARGMAX: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, EXP: tl.constexpr, ASM: tl.constexpr,
    TMA: tl.constexpr, ALIBI: tl.constexpr,
):  # fmt: skip
    """Fold the key/value tile at ``n0`` into the row state and the output accumulator.

    ``MASK``: apply each row's visibility (``[lo, hi]`` with ``BOUNDS``, else the causal
    rule and the end of the keys); off for tiles every row sees whole.
    """
    k = _tile(K, k_base, k_row0, k_col0, n0, offs_n, nk, stride_kn, d_ok, MASK, TMA, UPCAST)
    s = qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP, slope, pos, n0 + offs_n, ALIBI)
    # Unmasked tiles pass s as an unused placeholder.
    valid = visible(n0 + offs_n, lo, hi, pos, nk, BOUNDS, CAUSAL) if MASK else s
    m_i, l_i, a_i, t_i, e, alpha = softmax_tile(
        s, m_i, l_i, a_i, t_i, n0, valid, qk_scale, MASK, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM
    )
    # Value rows past this head's end (zeros, or a neighbour's rows under TMA) carry e = 0.
    v = _tile(V, v_base, v_row0, v_col0, n0, offs_n, nk, stride_vn, d_ok, MASK, TMA, UPCAST)
    # The rescaled accumulator goes into the product itself (one MMA chain, no extra add).
    acc = tl.dot(e.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return acc, m_i, l_i, a_i, t_i


@triton.jit
def _fused_fwd_kernel(
    Q, K, V, OUT, LSE, MAX, ARG, ENT,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
    LO, HI, SINK, ALIBI_S,
    nq, nk, q_offset, hq, group, qk_scale, sc_in, sc_out,
    q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
    ENTROPY: tl.constexpr, ARGMAX: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, EXP: tl.constexpr, ASM: tl.constexpr, TMA: tl.constexpr,
    ALIBI: tl.constexpr,
):  # fmt: skip
    # Longest query tiles first (the last tile sees the most keys under the causal mask).
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh, b, h, kvh, m0, offs_m, offs_n, offs_d, d_ok = program_tile(
        pid_m, hq, group, BLOCK_M, BLOCK_N, BLOCK_D, D
    )

    # TMA: where each head's rows start in its tensor's 2-D view (row, column); see tma.tma_view.
    q_row0 = b * q_rb + h * q_rh
    k_row0 = b * k_rb + kvh * k_rh
    v_row0 = b * v_rb + kvh * v_rh
    if TMA:
        q_base = Q
        k_base = K
        v_base = V
    else:
        q_base = head_pointers(Q, b, h, stride_qb, stride_qh, offs_d)
        k_base = head_pointers(K, b, kvh, stride_kb, stride_kh, offs_d)
        v_base = head_pointers(V, b, kvh, stride_vb, stride_vh, offs_d)
    q = _tile(
        Q, q_base, q_row0, h * q_ch, m0, tl.arange(0, BLOCK_M), nq, stride_qm, d_ok, True, TMA,
        UPCAST,
    )  # fmt: skip

    m_i, l_i, t_i, a_i = row_state(BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    pos = q_offset + offs_m
    slope = alibi_slope(ALIBI_S, h, ALIBI)

    # Key tiles in three runs: [k_start, n_lo) masked, [n_lo, n_full) seen whole by every
    # row of the tile (no mask), [n_full, hi_end) masked; bounds as in the row pass.
    if BOUNDS:
        lo, hi, k_start, n_lo, n_full, hi_end = interval_tiles(LO, HI, b, nq, nk, offs_m, BLOCK_N)
    else:
        lo = pos
        hi = pos
        k_start = 0
        n_lo = 0
        n_full, hi_end = causal_tiles(q_offset, m0, nk, BLOCK_M, BLOCK_N, CAUSAL)

    for run in tl.static_range(3):  # the three runs, unrolled; only the middle one unmasked
        if run == 0:
            n_begin, n_end = k_start, n_lo
        elif run == 1:
            n_begin, n_end = n_lo, n_full
        else:
            n_begin, n_end = n_full, hi_end
        for n0 in range(n_begin, n_end, BLOCK_N):
            acc, m_i, l_i, a_i, t_i = _fwd_tile(
                q, acc, m_i, l_i, a_i, t_i, K, k_base, k_row0, kvh * k_ch, V, v_base, v_row0,
                kvh * v_ch, n0, offs_n, nk,
                stride_kn, stride_vn, d_ok, lo, hi, pos, qk_scale, sc_in, sc_out, slope,
                run != 1, BOUNDS, CAUSAL, SOFTCAP, ENTROPY, ARGMAX, BLOCK_N, PRECISION, UPCAST,
                EXP, ASM, TMA, ALIBI,
            )  # fmt: skip

    # Output: acc / (sum of the row's exponentials, plus the sink's term with sinks); a
    # row that sees no key gets 0 (SDPA's output for a fully masked row).
    seen = l_i > 0.0
    sink2 = 0.0
    if SINKS:
        sink2 = tl.load(SINK + h) * 1.4426950408889634
        m2 = m_i * qk_scale
        top = tl.where(seen, tl.maximum(m2, sink2), sink2)
        keep = tl.where(seen, tl.math.exp2(m2 - top), 0.0)
        o_scale = keep / (keep * l_i + tl.math.exp2(sink2 - top))
    else:
        o_scale = tl.where(seen, 1.0 / tl.where(seen, l_i, 1.0), 0.0)
    out = acc * o_scale[:, None]
    row_ok = offs_m < nq
    o_ptrs = (
        OUT + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
        + offs_m.to(tl.int64)[:, None] * stride_om + offs_d[None, :]
    )  # fmt: skip
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    store_rows(
        LSE, MAX, ARG, ENT, pid_bh * nq + offs_m, row_ok, m_i, l_i, a_i, t_i, qk_scale, sink2,
        SINKS, ENTROPY,
    )  # fmt: skip


def _operands(L: Launch, v: Tensor, use: bool) -> tuple[list, list[int], bool]:
    """q, k, v as the kernel takes them (TMA descriptors when ``use`` and every tensor has a
    view that allows them, else the tensors) and the 9 layout integers of
    :func:`~headhunt.kernels.tma.tma_view`."""
    views = tma_views(L.q, L.k, v) if use and not interpreting() else None
    if views is None:
        return [L.q, L.k, v], [0] * 9, False
    from triton.tools.tensor_descriptor import TensorDescriptor

    cfg = L.cfg
    blocks = (cfg.row_block_m, cfg.row_block_n, cfg.row_block_n)
    descs = [
        TensorDescriptor(x[0], list(x[0].shape), list(x[0].stride()), [rows, L.d])
        for x, rows in zip(views, blocks, strict=True)
    ]
    return descs, [i for x in views for i in x[1:]], True


def _gluon_launch(L: Launch, v: Tensor, out, lse, mx, arg, ent) -> bool:
    """Run the Hopper fast path (:mod:`headhunt.kernels.gluon_fused`) when the launch allows
    it (plain causal or full mask, bf16/fp16, d 64/128, TMA-addressable inputs); False
    otherwise, and the general kernel runs."""
    if interpreting() or not L.q.is_cuda:
        return False
    try:  # Gluon's Hopper API (Triton 3.5+); older Tritons keep the general kernel
        from .gluon_fused import gluon_forward, gluon_supported
    except ImportError:
        return False

    views = tma_views(L.q, L.k, v)
    if not gluon_supported(L) or views is None:
        return False
    gluon_forward(L, views, out, lse, mx, arg, ent)
    return True


def launch_fused(L: Launch, v: Tensor, out: Tensor, lse, mx, arg, ent) -> None:
    """The output and row statistics of ``L`` (with its row bounds, see
    :meth:`~headhunt.kernels.launch.Launch.with_bounds`) by the Gluon fast path where
    ``L.cfg.fast_path`` and the call allow it, else by ``_fused_fwd_kernel``."""
    cfg = L.cfg
    if getattr(cfg, "fast_path", False) and _gluon_launch(L, v, out, lse, mx, arg, ent):
        return
    (qd, kd, vd), layout, tma = _operands(L, v, cfg.row_tma)
    grid = (triton.cdiv(L.nq, cfg.row_block_m), L.b * L.hq)
    _fused_fwd_kernel[grid](
        qd, kd, vd, out, lse, mx, arg, ent if ent is not None else lse,
        *L.strides, *v.stride()[:3], *out.stride()[:3],
        L.lo if L.lo is not None else arg, L.hi if L.hi is not None else arg,
        L.sinks if L.sinks is not None else lse, L.alibi if L.alibi is not None else lse,
        *L.sizes_and_scales, *layout,
        D=L.d, BLOCK_D=L.block_d, BLOCK_M=cfg.row_block_m,
        BLOCK_N=cfg.row_block_n, CAUSAL=L.causal, BOUNDS=L.lo is not None,
        SOFTCAP=L.softcap_in > 0, SINKS=L.sinks is not None, ENTROPY=ent is not None,
        ARGMAX=cfg.argmax_mode, PRECISION=L.precision, UPCAST=L.upcast,
        EXP=0, ASM=not interpreting(), TMA=tma, ALIBI=L.alibi is not None,
        num_warps=cfg.row_warps, num_stages=cfg.row_stages,
    )  # fmt: skip
