"""Triton attention forward that also returns the row statistics (CUDA).

``_fused_fwd_kernel`` is a FlashAttention-2 style forward (Dao, 2023,
https://arxiv.org/abs/2307.08691): each program owns ``BLOCK_M`` query rows of one query
head, streams the visible key/value tiles and keeps the output accumulator
``acc = sum_j e_ij v_j`` next to the running max, sum of exponentials, argmax and
entropy accumulator of :mod:`headhunt.kernels.triton_stats`' row pass (the same
per-tile update, :func:`~headhunt.kernels.triton_stats._softmax_tile`). It writes the
attention output and ``lse`` / ``max_score`` / ``argmax`` / ``entropy``, so the row
statistics cost one output-sized forward instead of a forward plus a statistics pass.

Column sums need every row's final ``lse``; they take exactly one more pass over the
keys: the column kernel of :mod:`headhunt.kernels.triton_stats`, fed this lse.

On Hopper the plain causal / full masks in bf16 or fp16 take the Gluon kernel of
:mod:`headhunt.kernels.gluon_fused` instead (``FusedConfig.fast_path``): the same statistics
with the tensor cores kept busy during the softmax.

The output comes back as ``[b, hq, nq, d]`` (SDPA's shape) over memory laid out as
``[b, nq, hq, d]``, so ``out.transpose(1, 2)`` is the contiguous tensor transformers'
attention functions return, with no copy.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from .tma import tma_views
from .triton_stats import (
    KernelConfig,
    _alloc,
    _interpreting,
    _Launch,
    _launch_col,
    _load_rows,
    _prepare,
    _qk,
    _softmax_tile,
    _store_rows,
    _with_bounds,
)
from .types import AttentionStats

__all__ = ["FusedConfig", "attention_forward_triton", "fused_config"]


@dataclasses.dataclass(frozen=True)
class FusedConfig(KernelConfig):
    """:class:`~headhunt.kernels.triton_stats.KernelConfig` plus the fused forward's own
    launch choices (a plain KernelConfig runs with their defaults).

    Attributes:
        fast_path: Plain causal / full masks on Hopper run the Gluon kernel of
            :mod:`headhunt.kernels.gluon_fused` with the ``gluon_*`` choices below.
        gluon_warps: Its warps per program (``16 * gluon_warps`` query rows).
        gluon_block_n: Its keys per tile.
        gluon_stages: Its shared-memory slots for K and V tiles.
        gluon_ws: Its warp-specialised variant (two consumer warpgroups of 64 rows and a
            TMA loader warpgroup; ``gluon_warps`` unused), with ``gluon_regs`` registers per
            thread for the second consumer and the loader (the first gets what is left of
            the 64K: Triton's warp-group allocation).
    """

    fast_path: bool = False
    gluon_warps: int = 8
    gluon_block_n: int = 128
    gluon_stages: int = 2
    gluon_ws: bool = False
    gluon_regs: tuple[int, int] = (240, 32)


def fused_config(head_dim: int, dtype: torch.dtype = torch.bfloat16) -> FusedConfig:
    """Tiles of the fused forward (``row_*`` fields, ``argmax_mode``, the ``gluon_*`` fast
    path) and of the column pass (``col_*``, as
    :func:`~headhunt.kernels.triton_stats.default_config` sets them).

    bf16/fp16: the plain causal / full masks on Hopper take the Gluon kernel (``fast_path``;
    BENCHMARKS.md "Fused statistics" has the variants measured), for d = 128 its
    warp-specialised variant (one 8B-shaped layer on an H100: 61.3 ms at 64k tokens and 253.9 ms
    at 128k, against 70.8 / 292.2 ms for the pipelined one and SDPA's 57.5 / 252-259 ms; d = 64
    keeps the pipelined one, whose speed as warp-specialised was not measured). The general
    kernel, for everything else, with d > 64: the fastest of ``benchmarks/bench_capture.py
    --sweep`` on an H100 (one 8B-shaped layer, 32k tokens, q/k/v laid out as the model gives
    them): 128 x 128 tiles, 8 warps, 2 stages, bulk tensor copies (TMA), and the argmax index
    searched only in tiles where some row's maximum improved (18.1 ms, against 22.1 ms for 128 x
    64 tiles by pointer loads with the search in every tile). Other shapes keep smaller tiles
    (not swept).
    """
    from .triton_stats import default_config

    base = FusedConfig(**dataclasses.asdict(default_config(head_dim, dtype)))
    if _interpreting():
        return base
    if dtype == torch.float32:
        return dataclasses.replace(base, row_block_m=64, row_block_n=32)
    fast = {"fast_path": True}
    if head_dim <= 64:
        return dataclasses.replace(base, row_block_m=128, row_block_n=64, row_warps=4, **fast)
    return dataclasses.replace(
        base, row_block_m=128, row_block_n=128, row_warps=8, row_stages=2, argmax_mode=3,
        row_tma=True, gluon_ws=True, **fast,
    )  # fmt: skip


@triton.jit
def _tile(
    X, base, row0, col0, start, offs, limit, stride, d_ok,
    ROWMASK: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Rows ``start + offs`` of one head's [n, d] matrix: with ``TMA`` one bulk copy of the
    block at ``(row0 + start, col0)`` of the 2-D view the descriptor ``X`` covers (see
    :func:`~headhunt.kernels.tma.tma_view`), else
    :func:`~headhunt.kernels.triton_stats._load_rows`' pointer load from ``base`` (zeros
    past ``limit``)."""
    if TMA:
        t = X.load([row0 + start, col0])
        if UPCAST:
            t = t.to(tl.float32)
    else:
        t = _load_rows(X, base, 0, start, offs, limit, stride, d_ok, ROWMASK, False, UPCAST)
    return t


@triton.jit
def _fwd_tile(
    q,
    acc,
    m_i,
    l_i,
    a_i,
    t_i,
    K,
    k_base,
    k_row0,
    k_col0,
    V,
    v_base,
    v_row0,
    v_col0,
    n0,
    offs_n,
    nk,
    stride_kn,
    stride_vn,
    d_ok,
    lo,
    hi,
    pos,
    qk_scale,
    sc_in,
    sc_out,
    MASK: tl.constexpr,
    BOUNDS: tl.constexpr,
    CAUSAL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr,
    ARGMAX: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    EXP: tl.constexpr,
    ASM: tl.constexpr,
    TMA: tl.constexpr,
):
    """Fold the key/value tile at ``n0`` into the row state and the output accumulator.

    ``MASK``: apply each row's visibility (``[lo, hi]`` with ``BOUNDS``, else the causal
    rule and the end of the keys); off for tiles every row sees whole.
    """
    k = _tile(K, k_base, k_row0, k_col0, n0, offs_n, nk, stride_kn, d_ok, MASK, TMA, UPCAST)
    s = _qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP)
    cols = n0 + offs_n
    if MASK:
        if BOUNDS:
            valid = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
        else:
            valid = cols[None, :] < nk
            if CAUSAL:
                valid = valid & (cols[None, :] <= pos[:, None])
    else:
        valid = s
    m_i, l_i, a_i, t_i, e, alpha = _softmax_tile(
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
    LO, HI, SINK,
    nq, nk, q_offset, hq, group, qk_scale, sc_in, sc_out,
    q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
    ENTROPY: tl.constexpr, ARGMAX: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, EXP: tl.constexpr, ASM: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    # Longest query tiles first (the last tile sees the most keys under the causal mask).
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // hq
    h = pid_bh % hq
    kvh = h // group  # GQA: read the shared kv head, never a repeated copy

    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    # TMA: where each head's rows start in its tensor's 2-D view (row, column); see tma.tma_view.
    q_row0 = b * q_rb + h * q_rh
    k_row0 = b * k_rb + kvh * k_rh
    v_row0 = b * v_rb + kvh * v_rh
    if TMA:
        q_base = Q
        k_base = K
        v_base = V
    else:
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_d[None, :]
        k_base = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh + offs_d[None, :]
        v_base = V + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh + offs_d[None, :]
    q = _tile(
        Q, q_base, q_row0, h * q_ch, m0, tl.arange(0, BLOCK_M), nq, stride_qm, d_ok, True, TMA,
        UPCAST,
    )  # fmt: skip

    # Finite start for the running max (see triton_stats._row_stats_kernel).
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    t_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    a_i = tl.full([BLOCK_M], -1, dtype=tl.int32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    pos = q_offset + offs_m

    # Key tiles in three runs: [k_start, n_lo) masked, [n_lo, n_full) seen whole by every
    # row of the tile (no mask), [n_full, hi_end) masked; bounds as in the row pass.
    if BOUNDS:
        row_ok = offs_m < nq
        lo = tl.load(LO + b * nq + offs_m, mask=row_ok, other=nk)
        hi = tl.load(HI + b * nq + offs_m, mask=row_ok, other=-1)
        k_start = (tl.min(lo, axis=0) // BLOCK_N) * BLOCK_N
        hi_end = tl.max(hi, axis=0) + 1
        n_lo = tl.minimum(
            tl.maximum(((tl.max(lo, axis=0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, k_start),
            tl.maximum(hi_end, k_start),
        )
        n_full = tl.maximum(((tl.min(hi, axis=0) + 1) // BLOCK_N) * BLOCK_N, n_lo)
    else:
        lo = pos
        hi = pos
        k_start = 0
        n_lo = 0
        if CAUSAL:
            first_seen = tl.minimum(tl.maximum(q_offset + m0 + 1, 0), nk)
            n_full = (first_seen // BLOCK_N) * BLOCK_N
            hi_end = tl.minimum(tl.maximum(q_offset + m0 + BLOCK_M, 0), nk)
        else:
            n_full = (nk // BLOCK_N) * BLOCK_N
            hi_end = nk

    for n0 in range(k_start, n_lo, BLOCK_N):
        acc, m_i, l_i, a_i, t_i = _fwd_tile(
            q, acc, m_i, l_i, a_i, t_i, K, k_base, k_row0, kvh * k_ch, V, v_base, v_row0,
            kvh * v_ch, n0, offs_n, nk,
            stride_kn, stride_vn, d_ok, lo, hi, pos, qk_scale, sc_in, sc_out,
            True, BOUNDS, CAUSAL, SOFTCAP, ENTROPY, ARGMAX, BLOCK_N, PRECISION, UPCAST, EXP,
            ASM, TMA,
        )  # fmt: skip
    for n0 in range(n_lo, n_full, BLOCK_N):
        acc, m_i, l_i, a_i, t_i = _fwd_tile(
            q, acc, m_i, l_i, a_i, t_i, K, k_base, k_row0, kvh * k_ch, V, v_base, v_row0,
            kvh * v_ch, n0, offs_n, nk,
            stride_kn, stride_vn, d_ok, lo, hi, pos, qk_scale, sc_in, sc_out,
            False, BOUNDS, CAUSAL, SOFTCAP, ENTROPY, ARGMAX, BLOCK_N, PRECISION, UPCAST, EXP,
            ASM, TMA,
        )  # fmt: skip
    for n0 in range(n_full, hi_end, BLOCK_N):
        acc, m_i, l_i, a_i, t_i = _fwd_tile(
            q, acc, m_i, l_i, a_i, t_i, K, k_base, k_row0, kvh * k_ch, V, v_base, v_row0,
            kvh * v_ch, n0, offs_n, nk,
            stride_kn, stride_vn, d_ok, lo, hi, pos, qk_scale, sc_in, sc_out,
            True, BOUNDS, CAUSAL, SOFTCAP, ENTROPY, ARGMAX, BLOCK_N, PRECISION, UPCAST, EXP,
            ASM, TMA,
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
    _store_rows(
        LSE, MAX, ARG, ENT, pid_bh * nq + offs_m, row_ok, m_i, l_i, a_i, t_i, qk_scale, sink2,
        SINKS, ENTROPY,
    )  # fmt: skip


def _operands(L: _Launch, v: Tensor, use: bool) -> tuple[list, list[int], bool]:
    """q, k, v as the kernel takes them (TMA descriptors when ``use`` and every tensor has a
    view that allows them, else the tensors) and the 9 layout integers of
    :func:`~headhunt.kernels.tma.tma_view`."""
    views = tma_views(L.q, L.k, v) if use and not _interpreting() else None
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


def _gluon_launch(L: _Launch, v: Tensor, out, lse, mx, arg, ent) -> bool:
    """Run the Hopper fast path (:mod:`headhunt.kernels.gluon_fused`) when the launch allows
    it (plain causal or full mask, bf16/fp16, d 64/128, TMA-addressable inputs); False
    otherwise, and the general kernel runs."""
    if _interpreting() or not L.q.is_cuda:
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


def attention_forward_triton(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    v: Float[Tensor, "b hkv nk d"],
    *,
    causal: bool = True,
    scale: float | None = None,
    key_stats: bool = True,
    entropy: bool = False,
    q_offset: int | None = None,
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    key_lo: Tensor | None = None,
    key_hi: Tensor | None = None,
    config: KernelConfig | None = None,
) -> tuple[Float[Tensor, "b hq nq d"], AttentionStats]:
    """Triton implementation of :func:`headhunt.kernels.attention_forward` (validated
    there): the attention output and the row statistics in one pass, then the column
    pass when ``key_stats``.

    Returns:
        ``(out, stats)``: ``out`` in ``v``'s dtype, ``[b, hq, nq, d]`` over ``[b, nq, hq,
        d]`` memory; the statistics as :func:`attention_stats` gives them.
    """
    L = _prepare(
        q, k, causal=causal, scale=scale, q_offset=q_offset,
        config=config or fused_config(q.shape[-1], q.dtype), window=window, chunk=chunk,
        softcap=softcap, sinks=sinks, key_lo=key_lo, key_hi=key_hi,
    )  # fmt: skip
    L = _with_bounds(L)
    if v.dtype != L.q.dtype:
        v = v.to(L.q.dtype)
    if v.stride(-1) != 1:
        v = v.contiguous()
    dev = L.q.device
    shape = (L.b, L.hq, L.nq)
    lse = _alloc(shape, torch.float32, dev)
    mx = _alloc(shape, torch.float32, dev)
    arg = _alloc(shape, torch.int64, dev)
    ent = _alloc(shape, torch.float32, dev) if entropy else None
    out = _alloc((L.b, L.nq, L.hq, L.d), L.q.dtype, dev).transpose(1, 2)
    cfg = L.cfg
    fast = L.nq and getattr(cfg, "fast_path", False) and _gluon_launch(L, v, out, lse, mx, arg, ent)
    if L.nq and not fast:
        (qd, kd, vd), layout, tma = _operands(L, v, cfg.row_tma)
        grid = (triton.cdiv(L.nq, cfg.row_block_m), L.b * L.hq)
        _fused_fwd_kernel[grid](
            qd, kd, vd, out, lse, mx, arg, ent if ent is not None else lse,
            L.q.stride(0), L.q.stride(1), L.q.stride(2), L.k.stride(0), L.k.stride(1),
            L.k.stride(2), v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1),
            out.stride(2),
            L.lo if L.lo is not None else arg, L.hi if L.hi is not None else arg,
            L.sinks if L.sinks is not None else lse,
            L.nq, L.nk, L.q_offset, L.hq, L.hq // L.hkv, L.qk_scale, L.softcap_in,
            L.softcap_out, *layout,
            D=L.d, BLOCK_D=max(16, triton.next_power_of_2(L.d)), BLOCK_M=cfg.row_block_m,
            BLOCK_N=cfg.row_block_n, CAUSAL=L.causal, BOUNDS=L.lo is not None,
            SOFTCAP=L.softcap_in > 0, SINKS=L.sinks is not None, ENTROPY=ent is not None,
            ARGMAX=cfg.argmax_mode, PRECISION=L.precision, UPCAST=L.upcast,
            EXP=0, ASM=not _interpreting(), TMA=tma,
            num_warps=cfg.row_warps, num_stages=cfg.row_stages,
        )  # fmt: skip
    col_sum = col_mean = None
    if key_stats:
        col_sum = _alloc((L.b, L.hq, L.nk), torch.float32, dev)
        col_mean = _alloc((L.b, L.hq, L.nk), torch.float32, dev)
        _launch_col(L, lse, col_sum, col_mean)
    stats = AttentionStats(
        lse=lse, max_score=mx, argmax=arg, entropy=ent, col_sum=col_sum, col_mean=col_mean
    )
    return out, stats
