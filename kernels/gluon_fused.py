"""Hopper fast path of the fused forward (Gluon, CUDA only): output + row statistics.

The plain causal or full mask (no windows, chunks, padding bounds, softcaps or sinks), bf16 or
fp16 inputs with d = 64 or 128 that bulk tensor copies (TMA) can address, on compute
capability 9.x. Same statistics and the same float32 arithmetic as
:func:`headhunt.kernels.triton_fused._fused_fwd_kernel`; what differs is the schedule, which
Triton's compiler does not give the general kernel: the product of key tile j + 1 and
the value product of tile j are issued to the tensor cores asynchronously, and tile j + 1's
softmax runs while the value product is in flight (the intra-warpgroup pipelining of
FlashAttention-3, Shah et al., 2024, https://arxiv.org/abs/2407.08608). K and V tiles come
by TMA into a ring of ``STAGES`` shared-memory slots, each with its own completion barrier.

The warp-specialised variant (``_gluon_ws_kernel``, the d = 128 default) splits a program
of 128 query rows among three warpgroups: a loader that only issues the TMA copies of K and V
into the ring, and two consumers of 64 rows each running the schedule above, each releasing a
slot (an "empty" barrier counting both consumers) once its products have read it. The
consumers are not bound to each other's pace, so one's softmax overlaps the other's products
(the producer/consumer split of FlashAttention-3). With one program-wide schedule instead,
Triton's CTA barriers around every barrier wait kept both warpgroups in lockstep.

Each program of the pipelined kernel owns ``BLOCK_M = 16 * num_warps`` query rows of one
query head (one warpgroup per 64 rows). Rows see at least one key (the dispatcher checks
``q_offset >= 0`` under the causal mask), so masked scores can be set to -1e30 and need no
second mask on their exponentials.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

__all__ = ["gluon_forward", "gluon_supported"]


@gluon.jit
def _softmax_update(
    s, m_i, l_i, a_i, t_i, n0, qk_scale, masked, pos, nk,
    s_layout: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
    ENTROPY: gl.constexpr,
):  # fmt: skip
    """One key tile's scores ``s`` folded into the row state (device.softmax_tile's
    update, in log2 units); returns the state, the tile's exponentials and the rescale."""
    cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    if masked:
        valid = gl.expand_dims(cols, 0) < nk
        if CAUSAL:
            valid = valid & (gl.expand_dims(cols, 0) <= gl.expand_dims(pos, 1))
        s = gl.where(valid, s, -1.0e30)
    m_tile = gl.max(s, axis=1)
    # The first column holding the tile's maximum, in every tile: this search runs while
    # the previous tile's value product occupies the tensor cores, and measured free
    # (BENCHMARKS.md), where skipping tiles that improve no row costs a CTA-wide reduction.
    idx = gl.where(s == gl.expand_dims(m_tile, 1), gl.expand_dims(cols, 0), 2147483647)
    a_i = gl.where(m_tile > m_i, gl.min(idx, axis=1), a_i)
    m_new = gl.maximum(m_i, m_tile)
    alpha = gl.exp2((m_i - m_new) * qk_scale)
    shifted = s * qk_scale - gl.expand_dims(m_new * qk_scale, 1)
    e = gl.exp2(shifted)
    if ENTROPY:
        t_i = alpha * (t_i + (m_i - m_new) * qk_scale * l_i) + gl.sum(e * shifted, axis=1)
    l_i = l_i * alpha + gl.sum(e, axis=1)
    return m_new, l_i, a_i, t_i, e, alpha


@gluon.jit
def _initial_state(
    row_layout: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
):  # fmt: skip
    """A row block's state before its first key tile: running max (in raw score units), sum
    of exponentials, entropy term, argmax; a zero score tile and output accumulator."""
    m_i = gl.full([BLOCK_M], -1.0e30, gl.float32, layout=row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    t_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    a_i = gl.full([BLOCK_M], -1, gl.int32, layout=row_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
    return m_i, l_i, t_i, a_i, s_zero, acc


@gluon.jit
def _store_results(
    acc, m_i, l_i, a_i, t_i, OUT, o_off, stride_om, LSE, MAX, ARG, ENT, stat0, r0, nq,
    qk_scale, o_layout: gl.constexpr, row_layout: gl.constexpr, BLOCK_M: gl.constexpr,
    D: gl.constexpr, ENTROPY: gl.constexpr,
):  # fmt: skip
    """Rows ``r0 .. r0 + BLOCK_M`` of one head: the output ``acc / l`` (every row saw a key, so
    l > 0) at ``OUT + o_off`` and the row statistics at ``stat0 + row`` (log2 units back to
    natural ones)."""
    inv = gl.convert_layout(1.0 / l_i, gl.SliceLayout(1, o_layout))
    out = (acc * gl.expand_dims(inv, 1)).to(OUT.dtype.element_ty)
    offs_m = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = (
        OUT + o_off + gl.expand_dims(offs_m.to(gl.int64) * stride_om, 1)
        + gl.expand_dims(offs_d, 0)
    )  # fmt: skip
    gl.store(o_ptrs, out, mask=gl.expand_dims(offs_m < nq, 1))
    rows = r0 + gl.arange(0, BLOCK_M, layout=row_layout)
    row_ok = rows < nq
    at = stat0 + rows
    m2 = m_i * qk_scale
    gl.store(LSE + at, (m2 + gl.log2(l_i)) * 0.6931471805599453, mask=row_ok)
    gl.store(MAX + at, m2 * 0.6931471805599453, mask=row_ok)
    gl.store(ARG + at, a_i.to(gl.int64), mask=row_ok)
    if ENTROPY:
        gl.store(ENT + at, gl.log(l_i) - 0.6931471805599453 * t_i / l_i, mask=row_ok)


@gluon.jit
def _refill(desc, row0, col, bars, smem, t, STAGES: gl.constexpr, n_tiles, BLOCK_N: gl.constexpr,
            nbytes: gl.constexpr):  # fmt: skip
    """Tile t's slot is consumed (every warp has waited for its product; the caller's
    barrier): load tile t + STAGES into it, if there is one."""
    nxt = t + STAGES
    ok = nxt < n_tiles
    slot = t % STAGES
    mbarrier.expect(bars.index(slot), nbytes, pred=ok)
    tma.async_copy_global_to_shared(
        desc, [row0 + nxt * BLOCK_N, col], bars.index(slot), smem.index(slot), pred=ok
    )


@gluon.jit
def _gluon_fwd_kernel(
    q_desc, k_desc, v_desc, OUT, LSE, MAX, ARG, ENT,
    stride_ob, stride_oh, stride_om,
    nq, nk, q_offset, hq, group, qk_scale,
    q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,
    D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, ENTROPY: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    # Longest query tiles first (the last tile sees the most keys under the causal mask).
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // hq
    h = pid_bh % hq
    kvh = h // group
    m0 = pid_m * BLOCK_M
    q_row = b * q_rb + h * q_rh + m0
    k_row = b * k_rb + kvh * k_rh
    v_row = b * v_rb + kvh * v_rh
    k_col = kvh * k_ch
    v_col = kvh * v_ch

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)

    # Key tiles [0, n_full) are seen whole by every row; [n_full, hi_end) are masked.
    if CAUSAL:
        n_full = (gl.minimum(q_offset + m0 + 1, nk) // BLOCK_N) * BLOCK_N
        hi_end = gl.minimum(q_offset + m0 + BLOCK_M, nk)
    else:
        n_full = (nk // BLOCK_N) * BLOCK_N
        hi_end = nk
    n_tiles = gl.cdiv(hi_end, BLOCK_N)
    kv_bytes: gl.constexpr = BLOCK_N * D * 2

    mbarrier.expect(q_bar, BLOCK_M * D * 2)
    tma.async_copy_global_to_shared(q_desc, [q_row, h * q_ch], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        ok = i < n_tiles
        mbarrier.expect(k_bar.index(i), kv_bytes, pred=ok)
        tma.async_copy_global_to_shared(
            k_desc, [k_row + i * BLOCK_N, k_col], k_bar.index(i), k_smem.index(i), pred=ok
        )
        mbarrier.expect(v_bar.index(i), kv_bytes, pred=ok)
        tma.async_copy_global_to_shared(
            v_desc, [v_row + i * BLOCK_N, v_col], v_bar.index(i), v_smem.index(i), pred=ok
        )

    pos = q_offset + m0 + gl.arange(0, BLOCK_M, layout=row_layout)
    m_i, l_i, t_i, a_i, s_zero, acc = _initial_state(
        row_layout, s_layout, o_layout, BLOCK_M, BLOCK_N, D
    )

    # Tile 0.
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bar.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)  # fmt: skip
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    m_i, l_i, a_i, t_i, e, alpha = _softmax_update(
        s, m_i, l_i, a_i, t_i, 0, qk_scale, n_full == 0, pos, nk, s_layout, BLOCK_N, CAUSAL,
        ENTROPY,
    )  # fmt: skip
    p = gl.convert_layout(e.to(q_desc.dtype), p_layout)
    gl.thread_barrier()
    _refill(k_desc, k_row, k_col, k_bar, k_smem, 0, STAGES, n_tiles, BLOCK_N, kv_bytes)

    for t in range(1, n_tiles):
        slot = t % STAGES
        prev = (t - 1) % STAGES
        n0 = t * BLOCK_N
        mbarrier.wait(k_bar.index(slot), (t // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)  # fmt: skip
        mbarrier.wait(v_bar.index(prev), ((t - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
        # The product q.k of tile t is the older group: done once at most one is pending.
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        m_i, l_i, a_i, t_i, e, alpha = _softmax_update(
            s, m_i, l_i, a_i, t_i, n0, qk_scale, n0 >= n_full, pos, nk, s_layout, BLOCK_N,
            CAUSAL, ENTROPY,
        )  # fmt: skip
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        # Every warp is done with K tile t and V tile t - 1: their slots take the tiles
        # STAGES further on (one barrier for both).
        gl.thread_barrier()
        _refill(k_desc, k_row, k_col, k_bar, k_smem, t, STAGES, n_tiles, BLOCK_N, kv_bytes)
        _refill(v_desc, v_row, v_col, v_bar, v_smem, t - 1, STAGES, n_tiles, BLOCK_N, kv_bytes)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p = gl.convert_layout(e.to(q_desc.dtype), p_layout)

    last = n_tiles - 1
    mbarrier.wait(v_bar.index(last % STAGES), (last // STAGES) & 1)
    o_tok = warpgroup_mma(p, v_smem.index(last % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(o_tok,))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bar.index(i))
        mbarrier.invalidate(v_bar.index(i))

    o_off = b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
    _store_results(
        acc, m_i, l_i, a_i, t_i, OUT, o_off, stride_om, LSE, MAX, ARG, ENT, pid_bh * nq, m0, nq,
        qk_scale, o_layout, row_layout, BLOCK_M, D, ENTROPY,
    )  # fmt: skip


# Gluon is experimental and its API moves between Triton releases: the kernel runs only on
# the Triton versions its CUDA test passed on (others take the general kernel, which gives
# the same statistics).
TESTED_TRITON = frozenset({(3, 6)})


def triton_tested() -> bool:
    """Whether the installed Triton is one this kernel was tested on."""
    return tuple(int(x) for x in triton.__version__.split(".")[:2]) in TESTED_TRITON


@gluon.jit
def _ws_load(
    k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
    k_row, k_col, v_row, v_col, n_tiles,
    STAGES: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
):  # fmt: skip
    """Loader partition: K and V tiles into the ring, each slot once both consumers have
    released it (a fresh barrier passes the parity-1 wait)."""
    kv_bytes: gl.constexpr = BLOCK_N * D * 2
    for t in range(n_tiles):
        slot = t % STAGES
        free = ((t // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(slot), free)
        mbarrier.expect(k_ready.index(slot), kv_bytes)
        tma.async_copy_global_to_shared(
            k_desc, [k_row + t * BLOCK_N, k_col], k_ready.index(slot), k_smem.index(slot)
        )
        mbarrier.wait(v_empty.index(slot), free)
        mbarrier.expect(v_ready.index(slot), kv_bytes)
        tma.async_copy_global_to_shared(
            v_desc, [v_row + t * BLOCK_N, v_col], v_ready.index(slot), v_smem.index(slot)
        )


@gluon.jit
def _ws_compute(
    q_smem, q_bar, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
    OUT, LSE, MAX, ARG, ENT, o_off, stride_om, stat0, r0, n_tiles, n_full, q_offset, nq, nk,
    qk_scale,
    D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, ENTROPY: gl.constexpr,
):  # fmt: skip
    """Consumer partition (one warpgroup): rows r0 .. r0 + BLOCK_M of the program's tile,
    the same schedule as _gluon_fwd_kernel, releasing each slot to the loader."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    dtype: gl.constexpr = q_smem.dtype

    pos = q_offset + r0 + gl.arange(0, BLOCK_M, layout=row_layout)
    m_i, l_i, t_i, a_i, s_zero, acc = _initial_state(
        row_layout, s_layout, o_layout, BLOCK_M, BLOCK_N, D
    )

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)  # fmt: skip
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    mbarrier.arrive(k_empty.index(0))
    m_i, l_i, a_i, t_i, e, alpha = _softmax_update(
        s, m_i, l_i, a_i, t_i, 0, qk_scale, n_full == 0, pos, nk, s_layout, BLOCK_N, CAUSAL,
        ENTROPY,
    )  # fmt: skip
    p = gl.convert_layout(e.to(dtype), p_layout)
    for t in range(1, n_tiles):
        slot = t % STAGES
        prev = (t - 1) % STAGES
        n0 = t * BLOCK_N
        mbarrier.wait(k_ready.index(slot), (t // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)  # fmt: skip
        mbarrier.wait(v_ready.index(prev), ((t - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(slot))
        m_i, l_i, a_i, t_i, e, alpha = _softmax_update(
            s, m_i, l_i, a_i, t_i, n0, qk_scale, n0 >= n_full, pos, nk, s_layout, BLOCK_N,
            CAUSAL, ENTROPY,
        )  # fmt: skip
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        mbarrier.arrive(v_empty.index(prev))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p = gl.convert_layout(e.to(dtype), p_layout)
    last = n_tiles - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    o_tok = warpgroup_mma(p, v_smem.index(last % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(o_tok,))

    _store_results(acc, m_i, l_i, a_i, t_i, OUT, o_off, stride_om, LSE, MAX, ARG, ENT, stat0,
                   r0, nq, qk_scale, o_layout, row_layout, BLOCK_M, D, ENTROPY)  # fmt: skip


@gluon.jit
def _gluon_ws_kernel(
    q_desc, k_desc, v_desc, OUT, LSE, MAX, ARG, ENT,
    stride_ob, stride_oh, stride_om,
    nq, nk, q_offset, hq, group, qk_scale,
    q_rb, q_rh, q_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,
    D: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, ENTROPY: gl.constexpr, REGS0: gl.constexpr, REGS1: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    """Warp-specialised variant: 128 query rows per program, two consumer warpgroups of
    64 rows each (the default partition and a worker) and a loader warpgroup."""
    HALF: gl.constexpr = 64
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // hq
    h = pid_bh % hq
    kvh = h // group
    m0 = pid_m * 2 * HALF
    q_row = b * q_rb + h * q_rh + m0

    q0 = gl.allocate_shared_memory(q_desc.dtype, [HALF, D], q_desc.layout)
    q1 = gl.allocate_shared_memory(q_desc.dtype, [HALF, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar.index(0), count=1)
    mbarrier.init(q_bar.index(1), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)

    if CAUSAL:
        n_full = (gl.minimum(q_offset + m0 + 1, nk) // BLOCK_N) * BLOCK_N
        hi_end = gl.minimum(q_offset + m0 + 2 * HALF, nk)
    else:
        n_full = (nk // BLOCK_N) * BLOCK_N
        hi_end = nk
    n_tiles = gl.cdiv(hi_end, BLOCK_N)
    mbarrier.expect(q_bar.index(0), HALF * D * 2)
    tma.async_copy_global_to_shared(q_desc, [q_row, h * q_ch], q_bar.index(0), q0)
    mbarrier.expect(q_bar.index(1), HALF * D * 2)
    tma.async_copy_global_to_shared(q_desc, [q_row + HALF, h * q_ch], q_bar.index(1), q1)

    o_off = b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
    stat0 = pid_bh * nq
    gl.warp_specialize(
        [
            (_ws_compute, (q0, q_bar.index(0), k_smem, v_smem, k_ready, v_ready, k_empty,
                           v_empty, OUT, LSE, MAX, ARG, ENT, o_off, stride_om, stat0, m0,
                           n_tiles, n_full, q_offset, nq, nk, qk_scale, D, HALF, BLOCK_N,
                           STAGES, CAUSAL, ENTROPY)),
            (_ws_compute, (q1, q_bar.index(1), k_smem, v_smem, k_ready, v_ready, k_empty,
                           v_empty, OUT, LSE, MAX, ARG, ENT, o_off, stride_om, stat0,
                           m0 + HALF, n_tiles, n_full, q_offset, nq, nk, qk_scale, D, HALF,
                           BLOCK_N, STAGES, CAUSAL, ENTROPY)),
            (_ws_load, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                        b * k_rb + kvh * k_rh, kvh * k_ch, b * v_rb + kvh * v_rh, kvh * v_ch,
                        n_tiles, STAGES, BLOCK_N, D)),
        ],
        [4, 4],
        [REGS0, REGS1],
    )  # fmt: skip


def gluon_supported(L) -> bool:
    """Whether the launch ``L`` (see launch.prepare) takes the Gluon fast path."""
    return (
        L.q.is_cuda
        and triton_tested()
        and torch.cuda.get_device_capability(L.q.device)[0] == 9
        and L.q.dtype in (torch.bfloat16, torch.float16)
        and L.d in (64, 128)
        and L.lo is None
        and L.softcap_in == 0.0
        and L.sinks is None
        and L.alibi is None
        and (not L.causal or L.q_offset >= 0)
        and L.nk > 0
    )


def gluon_forward(L, views, out: Tensor, lse: Tensor, mx: Tensor, arg: Tensor, ent) -> None:
    """Launch the Gluon kernel (tiles from ``L.cfg``, a FusedConfig) over the 2-D TMA views
    ``views`` of q, k, v (see tma.tma_view), writing the output and statistics."""
    cfg = L.cfg
    ws = cfg.gluon_ws
    bm = 64 if ws else 16 * cfg.gluon_warps
    bn = cfg.gluon_block_n
    dt = gl.bfloat16 if L.q.dtype == torch.bfloat16 else gl.float16
    descs = []
    for x, rows in zip(views, (bm, bn, bn), strict=True):
        layout = gl.NVMMASharedLayout.get_default_for([rows, L.d], dt)
        descs.append(TensorDescriptor(x[0], list(x[0].shape), list(x[0].stride()), [rows, L.d],
                                      layout))  # fmt: skip
    if ws:
        _gluon_ws_kernel[(triton.cdiv(L.nq, 128), L.b * L.hq)](
            *descs, out, lse, mx, arg, ent if ent is not None else lse,
            out.stride(0), out.stride(1), out.stride(2),
            L.nq, L.nk, L.q_offset, L.hq, L.hq // L.hkv, L.qk_scale,
            *[i for x in views for i in x[1:]],
            D=L.d, BLOCK_N=bn, STAGES=cfg.gluon_stages, CAUSAL=L.causal,
            ENTROPY=ent is not None, REGS0=cfg.gluon_regs[0], REGS1=cfg.gluon_regs[1],
            num_warps=4,
        )  # fmt: skip
        return
    grid = (triton.cdiv(L.nq, bm), L.b * L.hq)
    _gluon_fwd_kernel[grid](
        *descs, out, lse, mx, arg, ent if ent is not None else lse,
        out.stride(0), out.stride(1), out.stride(2),
        L.nq, L.nk, L.q_offset, L.hq, L.hq // L.hkv, L.qk_scale, *[i for x in views for i in x[1:]],
        D=L.d, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg.gluon_stages, CAUSAL=L.causal,
        ENTROPY=ent is not None, num_warps=cfg.gluon_warps,
    )  # fmt: skip
