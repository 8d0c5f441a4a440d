"""Column pass for masks without per-row key bounds (CUDA): ``col_sum`` and ``col_mean``
from q, k and every row's final log-sum-exp.

``col_sum[j] = sum_i p_ij`` with ``p_ij = exp(s_ij - lse_i)`` needs each row's final lse,
so it is one more pass over the scores after the row statistics (or the fused forward).
Each program owns ``BLOCK_N`` keys of one query head and streams the query tiles that see
them. This is :mod:`headhunt.kernels.triton_stats`' general column kernel specialised for
the plain causal / full mask (windows, chunks, padding intervals and softcaps keep the
general kernel), with three changes that made it faster on an H100 (BENCHMARKS.md, "Fused
statistics"):

- scores come as ``[query rows, keys]`` tiles (``q @ k^T``, one 64-row tensor-core
  instruction shape per warp group, k fixed in shared memory) instead of ``[keys, rows]``;
- the probabilities are added elementwise into a register accumulator and reduced over
  the rows once per head, not once per tile; the accumulator is already summed over
  the two rows each thread holds of the tensor-core layout (a free in-register
  reshape), which halves its registers;
- q and k tiles by bulk tensor copies (TMA) also over the ``[b, n, heads, d]`` memory a
  model's projections give (the general kernel uses them only for contiguous tensors).

The sums are the same float32 sums in another order.

Importing this module imports Triton; it needs nothing else from the package at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl
from torch import Tensor

from .tma import tma_views

if TYPE_CHECKING:
    from .triton_stats import KernelConfig, _Launch

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


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
    pid_bh = tl.program_id(1)
    b = pid_bh // hq
    h = pid_bh % hq
    kvh = h // group

    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    # TMA: head h of batch row b starts at row b * rb + h * rh, column h * ch of its
    # tensor's 2-D view (see tma.tma_view).
    q_row0 = b * q_rb + h * q_rh
    if TMA:
        q_base = Q
        k = K.load([b * k_rb + kvh * k_rh + n0, kvh * k_ch])
    else:
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_d[None, :]
        k_ptrs = (
            K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
            + offs_n.to(tl.int64)[:, None] * stride_kn + offs_d[None, :]
        )  # fmt: skip
        k = tl.load(k_ptrs, mask=(offs_n[:, None] < nk) & d_ok[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
    lse_base = LSE + pid_bh * nq

    if CAUSAL:
        # Query i sees key j when j <= i + q_offset: the first row that sees key n0 is
        # n0 - q_offset; rows from n0 + BLOCK_N - 1 - q_offset on see the whole tile.
        m_lo = (tl.minimum(tl.maximum(n0 - q_offset, 0), nq) // BLOCK_M) * BLOCK_M
        all_seen = tl.maximum(n0 + BLOCK_N - 1 - q_offset, 0)
        m_mid = tl.maximum(((all_seen + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, m_lo)
        count = (nq - tl.minimum(tl.maximum(offs_n - q_offset, 0), nq)).to(tl.float32)
    else:
        m_lo = 0
        m_mid = 0
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


def fast_columns_apply(L: _Launch, cfg: KernelConfig) -> bool:
    """Whether :func:`launch_columns` serves this call: no per-row key bounds, no softcap,
    and the configuration asks for none of the general kernel's own options (its
    pipelined loop or approximate exponentials)."""
    return L.lo is None and L.softcap_in == 0 and not cfg.col_pipeline and cfg.col_exp == 0


def launch_columns(L: _Launch, lse: Tensor, col_sum: Tensor, col_mean: Tensor) -> None:
    """col_sum and col_mean by :func:`_col_fast_kernel` (see :func:`fast_columns_apply`),
    with the ``col_*`` tiles of ``L.cfg``."""
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
        L.q.stride(0), L.q.stride(1), L.q.stride(2), L.k.stride(0), L.k.stride(1),
        L.k.stride(2), *q_lay, *k_lay,
        L.nq, L.nk, L.q_offset, L.hq, L.hq // L.hkv, L.qk_scale,
        D=L.d, BLOCK_D=max(16, triton.next_power_of_2(L.d)), BLOCK_N=block_n, BLOCK_M=block_m,
        CAUSAL=L.causal, PRECISION=L.precision, UPCAST=L.upcast, TMA=tma,
        num_warps=cfg.col_warps, num_stages=cfg.col_stages,
    )  # fmt: skip
