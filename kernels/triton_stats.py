"""Triton kernels for :func:`headhunt.kernels.attention_stats` (CUDA).

Two passes, nothing quadratic written to memory:

1. ``_row_stats_kernel`` is a FlashAttention-style forward without V: each program
   owns ``BLOCK_M`` query rows of one query head and streams the visible key tiles,
   keeping an online row max, sum of exponentials, argmax and (optionally) the
   entropy accumulator ``sum_j e_j (s_j - m)``. It writes ``lse``, ``max_score``,
   ``argmax`` and ``entropy`` (``O(nq)`` per head).
2. ``_col_stats_kernel`` is key-stationary: each program owns ``BLOCK_N`` keys of one
   query head and streams the query tiles that can see them, recomputing
   ``p = exp(s - lse)`` and summing it per key into registers; it writes ``col_sum``
   (``O(nk)`` per head) and ``col_mean``: the per-key count of visible queries is
   analytic (see :func:`headhunt.kernels.visible_query_count`), so nothing is counted.
   Masks without per-row key intervals or softcaps take a faster specialised kernel,
   :mod:`headhunt.kernels.triton_columns`; this one serves the rest.

Scores are handled in log2 units (``s2 = s * log2 e``) so the kernels use ``exp2``;
results are converted back to natural units before they are stored.

Importing this module imports Triton; :mod:`headhunt.kernels` only does so lazily.
Set ``TRITON_INTERPRET=1`` before importing Triton to run the kernels on CPU tensors.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from .masks import key_visible_counts, row_key_bounds
from .tma import tma_views
from .triton_columns import fast_columns_apply, launch_columns
from .types import AttentionStats

__all__ = ["KernelConfig", "attention_stats_triton", "default_config"]

# Tests set this to True: outputs are then allocated filled with NaN (argmax with a
# sentinel) instead of torch.empty, so any element a kernel forgets to write shows up.
POISON_OUTPUTS = False
ARGMAX_POISON = -7

_LOG2E = 1.0 / math.log(2.0)
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
_LN2 = math.log(2.0)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch parameters of the two kernels.

    Attributes:
        row_block_m: Query rows per program in the row-stats pass.
        row_block_n: Keys per inner-loop tile in the row-stats pass.
        row_warps: Warps per program in the row-stats pass.
        row_stages: Software-pipelining depth of the row-stats key loop.
        col_block_n: Keys per program in the column-stats pass.
        col_block_m: Query rows per inner-loop tile in the column-stats pass.
        col_warps: Warps per program in the column-stats pass.
        col_stages: Software-pipelining depth of the column-stats query loop.
        argmax_mode: How pass 1 finds the argmax: 1 = one max-with-index reduction;
            2 = max, then the first column equal to it; 3 = like 2 but the index search
            runs only for tiles where some row's running max improved.
        row_pipeline: Issue the next key tile's q.k product before the current tile's
            softmax work in pass 1 (lets the tensor cores overlap the exp2 work).
        col_pipeline: The same for the query loop of pass 2 (the general column kernel's;
            set, it also serves the masks the specialised kernel would, see
            :func:`~headhunt.kernels.triton_columns.fast_columns_apply`).
        row_exp: How pass 1 evaluates its exponentials (arguments <= 0, computed in fp32,
            results summed in fp32): 0 ``tl.math.exp2``; 1 rounded to fp16 and two per
            ``ex2.approx.f16x2`` (relative error ~1e-3 per term); 2 ``ex2.approx.ftz.f32``;
            3 half of them as in 2, half by a polynomial on the FMA units (relative error
            7.5e-5 per term). fp32 inputs use 2 instead of 1 or 3.
        col_exp: The same for pass 2's ``p = exp2(s - lse)`` (likewise the general kernel's).
        row_tma: Pass 1 loads q and k tiles by bulk tensor copies (TMA descriptors)
            where the inputs allow it (compiled, contiguous, power-of-two d, Hopper or
            later); else pointer loads.
        col_tma: The same for pass 2 (the specialised column kernel also over the
            [b, n, heads, d] memory of a model's projections).
        fp32_dot: ``tl.dot`` precision for fp32 inputs: "tf32x3" (tensor cores, ~1e-6
            relative error) or "ieee" (exact, FMA units).
    """

    row_block_m: int = 128
    row_block_n: int = 64
    row_warps: int = 4
    row_stages: int = 3
    col_block_n: int = 128
    col_block_m: int = 64
    col_warps: int = 4
    col_stages: int = 3
    argmax_mode: int = 1
    row_pipeline: bool = False
    col_pipeline: bool = False
    row_exp: int = 0
    col_exp: int = 0
    row_tma: bool = False
    col_tma: bool = False
    fp32_dot: str = "tf32x3"


def _exp_mode(mode: int, dtype: torch.dtype) -> int:
    """The exp2 mode a launch uses: fp32 inputs (tolerance 1e-3) never get the fp16 (1)
    or polynomial (3) exponentials, only the exact-enough fp32 ones (0, 2)."""
    if dtype == torch.float32 and mode in (1, 3):
        return 2
    return mode


def default_config(head_dim: int, dtype: torch.dtype = torch.bfloat16) -> KernelConfig:
    """Launch configuration used when none is given.

    Args:
        head_dim: Head dimension ``d`` of q and k.
        dtype: Input dtype; fp32 gets its own (smaller, unpipelined) tiles, since its
            tiles take twice the shared memory and its products three tf32 MMAs.

    Returns:
        The configuration for this head dimension (tiny tiles under the interpreter,
        where every tile element costs Python time).
    """
    if _interpreting():
        return KernelConfig(16, 16, 1, 1, 16, 16, 1, 1)
    if dtype == torch.float32:
        stages = 3 if head_dim <= 64 else 2
        return KernelConfig(
            64, 64, 4, stages, 64, 64, 4, stages, argmax_mode=2, row_tma=True, col_tma=True
        )
    # Fastest variants of benchmarks/bench_kernels.py --sweep / --sweep-exp on an H200 at
    # n = 16k, causal, bf16 (pass 1 ranked on random + attention-sink data; BENCHMARKS.md):
    # q and k tiles by TMA where the inputs allow (row_tma / col_tma); pass 1 with 64-row
    # query tiles, 128-key tiles, max-then-index argmax and a software-pipelined key loop;
    # pass 2 with 64 x 128 tiles for d <= 64 and 128 x 64 for d = 128.
    col = (64, 128, 4, 3) if head_dim <= 64 else (128, 64, 4, 3)
    return KernelConfig(
        64, 128, 4, 3, *col, argmax_mode=2, row_pipeline=True, row_tma=True, col_tma=True
    )


@triton.jit
def _exp2_ftz(x, ASM: tl.constexpr):
    """fp32 ``exp2`` as ``ex2.approx.ftz.f32`` (one MUFU op, results below 2**-126 -> 0)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.math.exp2(x)


@triton.jit
def _exp2_poly(x):
    """``exp2(x)`` for ``x <= 0`` on the FMA/integer units, no special-function unit.

    ``x = n + f`` with ``n = rint(x)`` (the 1.5 * 2**23 trick) and ``f`` in [-0.5, 0.5];
    ``2**f`` by a degree-3 polynomial (max relative error 7.5e-5), and ``n`` added to
    the exponent bits. ``x`` is clamped at -125 (so -inf gives 2**-125, not 0).
    """
    x = tl.maximum(x, -125.0)
    t = x + 12582912.0
    n = t - 12582912.0
    f = x - n
    p = ((0.05517162704802579 * f + 0.2426111716750332) * f + 0.6932609977919704) * f
    p = p + 0.999928070831383
    bits = p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _exp2(x, MODE: tl.constexpr, ASM: tl.constexpr):
    """``exp2(x)`` of a [rows, cols] tile, ``x <= 0`` (or -inf) wherever it is used.

    MODE (see KernelConfig.row_exp): 0 ``tl.math.exp2``; 1 through fp16, two per
    ``ex2.approx.f16x2``; 2 ``ex2.approx.ftz.f32``; 3 like 2 for the even columns and
    :func:`_exp2_poly` on the FMA units for the odd ones (splits the work between the
    two kinds of units). Under the interpreter (``ASM`` off) the asm is replaced by
    ``tl.math.exp2`` with the same fp16 roundings.
    """
    if MODE == 1:
        h = x.to(tl.float16)
        if ASM:
            h = tl.inline_asm_elementwise(
                "ex2.approx.f16x2 $0, $1;", "=r,r", [h], dtype=tl.float16, is_pure=True, pack=2
            )
        else:
            h = tl.math.exp2(h.to(tl.float32)).to(tl.float16)
        return h.to(tl.float32)
    elif MODE == 2:
        return _exp2_ftz(x, ASM)
    elif MODE == 3:
        ev, od = tl.split(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))
        e = tl.join(_exp2_ftz(ev, ASM), _exp2_poly(od))
        return tl.reshape(e, [x.shape[0], x.shape[1]])
    else:
        return tl.math.exp2(x)


@triton.jit
def _load_rows(
    X,
    base,
    flat0,
    start,
    offs,
    limit,
    stride,
    d_ok,
    ROWMASK: tl.constexpr,
    TMA: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Rows ``start + offs`` of one head's [n, d] matrix (zeros past ``limit``).

    ``TMA``: one bulk tensor copy from the descriptor ``X`` over the flattened
    [heads * n, d] tensor at row ``flat0 + start`` (rows past this head's end come
    from the next head or are zero-filled; callers mask them). Otherwise a pointer
    load from ``base`` (a [1, BLOCK_D] row of pointers to d), masked on rows only
    when ``ROWMASK``.
    """
    if TMA:
        t = X.load([flat0 + start, 0])
    else:
        rows = start + offs
        ptrs = base + rows.to(tl.int64)[:, None] * stride
        if ROWMASK:
            t = tl.load(ptrs, mask=(rows[:, None] < limit) & d_ok[None, :], other=0.0)
        else:
            t = tl.load(ptrs, mask=d_ok[None, :], other=0.0)
    if UPCAST:
        t = t.to(tl.float32)
    return t


@triton.jit
def _tanh(x):
    """``tanh(x)`` from one ``exp2`` and one division: ``(1 - e) / (1 + e)`` with
    ``e = 2**(-2 |x| log2 e)`` in (0, 1], sign restored; absolute error ~1e-7."""
    e = tl.math.exp2(-2.0 * 1.4426950408889634 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0.0, -t, t)


@triton.jit
def _tanh_small(x):
    """``tanh(x)`` for ``|x| <= 0.5`` on the FMA units: ``x * P(x**2)`` with an odd
    degree-9 least-squares fit (relative error 1.1e-7 in fp32 over [-0.5, 0.5])."""
    x2 = x * x
    p = 0.017125035691564 * x2 - 0.0529810652757724
    p = p * x2 + 0.1332470049404931
    p = p * x2 - 0.3333306541153386
    p = p * x2 + 0.9999999865551432
    return x * p


@triton.jit
def _qk(a, b, sc_in, sc_out, PRECISION: tl.constexpr, SOFTCAP: tl.constexpr):
    """Raw products ``a @ b^T`` of two row tiles; with a softcap, mapped through
    ``sc_out * tanh(sc_in * s)`` (``sc_in = scale / cap``, ``sc_out = cap / scale``), which
    is the capped score ``cap * tanh(scale * s / cap)`` back in raw-product units, so the
    callers' ``qk_scale`` and max bookkeeping apply unchanged (tanh is increasing).

    The exponential in the softmax already keeps the special-function unit busy, so a
    tile whose arguments all lie in [-0.5, 0.5] (scores within half the cap, the usual
    case) takes tanh from a polynomial on the FMA units; other tiles (a block-uniform
    branch) take the exp2-based formula.
    """
    s = tl.dot(a, tl.trans(b), input_precision=PRECISION)
    if SOFTCAP:
        x = sc_in * s
        if tl.max(tl.max(tl.abs(x), axis=1), axis=0) <= 0.5:
            s = sc_out * _tanh_small(x)
        else:
            s = sc_out * _tanh(x)
    return s


@triton.jit
def _row_update(
    s,
    m_i,
    l_i,
    a_i,
    t_i,
    n0,
    valid,
    qk_scale,
    MASKED: tl.constexpr,
    ENTROPY: tl.constexpr,
    ARGMAX: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EXP: tl.constexpr,
    ASM: tl.constexpr,
):
    """Fold one tile of raw products ``s = q . k`` [BLOCK_M, BLOCK_N] into the row state
    (see :func:`_softmax_tile`)."""
    m_i, l_i, a_i, t_i, e, alpha = _softmax_tile(
        s, m_i, l_i, a_i, t_i, n0, valid, qk_scale, MASKED, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM
    )
    return m_i, l_i, a_i, t_i


@triton.jit
def _softmax_tile(
    s,
    m_i,
    l_i,
    a_i,
    t_i,
    n0,
    valid,
    qk_scale,
    MASKED: tl.constexpr,
    ENTROPY: tl.constexpr,
    ARGMAX: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EXP: tl.constexpr,
    ASM: tl.constexpr,
):
    """Fold one tile of raw products ``s = q . k`` [BLOCK_M, BLOCK_N] into the row state;
    also return the tile's exponentials ``e`` (0 where masked) and the rescale factor
    ``alpha`` of the old state, which an output accumulator needs (``acc * alpha + e @ v``).

    ``m_i`` is the running max of the raw products; since ``qk_scale > 0`` the scaling
    commutes with max, and it is folded into the exponent as one FMA per element,
    ``exp2(s * qk_scale - m * qk_scale)``, instead of a separate multiply.
    ``l_i = sum exp2((s - m) qk_scale)`` and ``t_i = sum e (s - m) qk_scale`` (log2 units).
    """
    if MASKED:
        # Masked scores become the running max's finite start value (-1e30); their
        # exponentials are zeroed explicitly below.
        s = tl.where(valid, s, -1.0e30)
    if ARGMAX == 1:
        # One reduction gives both the tile max and its first index (ties -> lowest).
        m_tile, a_tile = tl.max(s, axis=1, return_indices=True, return_indices_tie_break_left=True)
        # Strict '>' keeps the earlier tile's index on ties across tiles.
        a_i = tl.where(m_tile > m_i, n0 + a_tile, a_i)
    elif ARGMAX == 2:
        # Plain max (one min/max op per element), then the first column holding it:
        # the max is one of the values of s, so the equality is exact.
        m_tile = tl.max(s, axis=1)
        cols = tl.arange(0, BLOCK_N)[None, :]
        a_tile = tl.min(tl.where(s == m_tile[:, None], cols, BLOCK_N), axis=1)
        a_i = tl.where(m_tile > m_i, n0 + a_tile, a_i)
    elif ARGMAX == 3:
        m_tile = tl.max(s, axis=1)
        improved = m_tile > m_i
        # Once the running maxima settle, most tiles improve no row: skip the index
        # search for the whole tile then (a block-uniform branch).
        if tl.max(improved.to(tl.int32), axis=0) > 0:
            cols = tl.arange(0, BLOCK_N)[None, :]
            a_tile = tl.min(tl.where(s == m_tile[:, None], cols, BLOCK_N), axis=1)
            a_i = tl.where(improved, n0 + a_tile, a_i)
    else:  # benchmarking only: measures what the argmax costs
        m_tile = tl.max(s, axis=1)
    m_new = tl.maximum(m_i, m_tile)
    m_scaled = m_new * qk_scale
    # (m_i - m_new) * qk_scale, not m_i * qk_scale - m_scaled: compiled, the latter is
    # contracted to an FMA whose rounding residual of -1e30 * qk_scale (~1e22) turned a
    # row whose first tiles are all masked (windows, padding) into alpha = inf, l = NaN.
    alpha = tl.math.exp2((m_i - m_new) * qk_scale)
    shifted = s * qk_scale - m_scaled[:, None]
    e = _exp2(shifted, EXP, ASM)
    if MASKED:
        e = tl.where(valid, e, 0.0)  # a row that sees no key keeps l = 0
    if ENTROPY:
        # t re-based to the new max (masked entries: e = 0, shifted finite).
        t_i = alpha * (t_i + (m_i - m_new) * qk_scale * l_i) + tl.sum(e * shifted, axis=1)
    l_i = l_i * alpha + tl.sum(e, axis=1)
    return m_new, l_i, a_i, t_i, e, alpha


@triton.jit
def _row_stats_kernel(
    Q,
    K,
    LSE,
    MAX,
    ARG,
    ENT,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    LO,
    HI,
    SINK,
    nq,
    nk,
    q_offset,
    hq,
    group,
    qk_scale,
    sc_in,
    sc_out,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    BOUNDS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
    ENTROPY: tl.constexpr,
    ARGMAX: tl.constexpr,
    PIPELINE: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    EXP: tl.constexpr,
    ASM: tl.constexpr,
    TMA: tl.constexpr,
):
    # Query tiles run longest-first (the last tile sees the most keys under the causal
    # mask), so the long programs start in the first wave and the tail stays short.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // hq
    h = pid_bh % hq
    kvh = h // group  # GQA: read the shared kv head, never a repeated copy of k

    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    # 64-bit offsets: a [b, n, h, d] view has row stride h * d, so n * stride can pass
    # 2**31 at long contexts; these are per-row/per-tile, not per-element, costs.
    # With TMA, Q and K are descriptors over contiguous [b * heads * n, d] tensors.
    q_flat0 = pid_bh * nq
    k_flat0 = (b * (hq // group) + kvh) * nk
    if TMA:
        q_base = Q
        k_base = K
    else:
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_d[None, :]
        k_base = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh + offs_d[None, :]
    q = _load_rows(
        Q, q_base, q_flat0, m0, tl.arange(0, BLOCK_M), nq, stride_qm, d_ok, True, TMA, UPCAST
    )

    # The running max (of raw q . k) starts at a finite -1e30 rather than -inf so that
    # the first rescale (m_old - m_new) * l_old is 0 * finite, not NaN, for every row.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    t_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    a_i = tl.full([BLOCK_M], -1, dtype=tl.int32)
    pos = q_offset + offs_m  # absolute position of each query row

    if BOUNDS:
        # Per-row key intervals [lo, hi] (window, chunk, padding, ...): score the key
        # tiles from the lowest lo to the highest hi of this tile's rows; the tiles
        # inside [max lo, min hi] are visible to every row and need no mask. Rows past
        # nq read an empty interval (lo = nk, hi = -1), which also leaves no full tile.
        row_ok = offs_m < nq
        lo = tl.load(LO + b * nq + offs_m, mask=row_ok, other=nk)
        hi = tl.load(HI + b * nq + offs_m, mask=row_ok, other=-1)
        k_start = (tl.min(lo, axis=0) // BLOCK_N) * BLOCK_N
        k_end = tl.max(hi, axis=0) + 1
        n_lo = tl.minimum(
            tl.maximum(((tl.max(lo, axis=0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, k_start),
            tl.maximum(k_end, k_start),
        )
        n_full = tl.maximum(((tl.min(hi, axis=0) + 1) // BLOCK_N) * BLOCK_N, n_lo)
        for n0 in range(k_start, n_lo, BLOCK_N):
            cols = n0 + offs_n
            k = _load_rows(K, k_base, k_flat0, n0, offs_n, nk, stride_kn, d_ok, True, TMA, UPCAST)
            s = _qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP)
            valid = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
            m_i, l_i, a_i, t_i = _row_update(
                s, m_i, l_i, a_i, t_i, n0, valid, qk_scale,
                True, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM,
            )  # fmt: skip
        hi_end = k_end
    elif CAUSAL:
        # Key tiles entirely visible to every row of this tile need no mask; the
        # tiles from n_full up to hi straddle the diagonal (or the end of k).
        n_lo = 0
        first_seen = tl.minimum(tl.maximum(q_offset + m0 + 1, 0), nk)
        n_full = (first_seen // BLOCK_N) * BLOCK_N
        hi_end = tl.minimum(tl.maximum(q_offset + m0 + BLOCK_M, 0), nk)
    else:
        n_lo = 0
        n_full = (nk // BLOCK_N) * BLOCK_N
        hi_end = nk

    if PIPELINE:
        # Software pipeline: the product for tile n0 is issued before the softmax work
        # on tile n0 - BLOCK_N, so the tensor cores and the exp2 units can overlap.
        if n_full > n_lo:
            k = _load_rows(
                K, k_base, k_flat0, n_lo, offs_n, nk, stride_kn, d_ok, False, TMA, UPCAST
            )
            s = _qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP)
            for n0 in range(n_lo + BLOCK_N, n_full, BLOCK_N):
                k = _load_rows(
                    K, k_base, k_flat0, n0, offs_n, nk, stride_kn, d_ok, False, TMA, UPCAST
                )
                s_next = _qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP)
                m_i, l_i, a_i, t_i = _row_update(
                    s, m_i, l_i, a_i, t_i, n0 - BLOCK_N, s, qk_scale,
                    False, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM,
                )  # fmt: skip
                s = s_next
            m_i, l_i, a_i, t_i = _row_update(
                s, m_i, l_i, a_i, t_i, n_full - BLOCK_N, s, qk_scale,
                False, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM,
            )  # fmt: skip
    else:
        for n0 in range(n_lo, n_full, BLOCK_N):
            k = _load_rows(K, k_base, k_flat0, n0, offs_n, nk, stride_kn, d_ok, False, TMA, UPCAST)
            s = _qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP)
            m_i, l_i, a_i, t_i = _row_update(
                s, m_i, l_i, a_i, t_i, n0, s, qk_scale,
                False, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM,
            )  # fmt: skip

    for n0 in range(n_full, hi_end, BLOCK_N):
        cols = n0 + offs_n
        k = _load_rows(K, k_base, k_flat0, n0, offs_n, nk, stride_kn, d_ok, True, TMA, UPCAST)
        s = _qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP)
        if BOUNDS:
            valid = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
        else:
            valid = cols[None, :] < nk
            if CAUSAL:
                valid = valid & (cols[None, :] <= pos[:, None])
        m_i, l_i, a_i, t_i = _row_update(
            s, m_i, l_i, a_i, t_i, n0, valid, qk_scale,
            True, ENTROPY, ARGMAX, BLOCK_N, EXP, ASM,
        )  # fmt: skip

    sink2 = 0.0
    if SINKS:
        sink2 = tl.load(SINK + h) * LOG2E
    out = pid_bh * nq + offs_m
    _store_rows(
        LSE, MAX, ARG, ENT, out, offs_m < nq, m_i, l_i, a_i, t_i, qk_scale, sink2, SINKS,
        ENTROPY,
    )  # fmt: skip


@triton.jit
def _store_rows(
    LSE, MAX, ARG, ENT, out, row_ok, m_i, l_i, a_i, t_i, qk_scale, sink2,
    SINKS: tl.constexpr, ENTROPY: tl.constexpr,
):  # fmt: skip
    """Turn a row state (raw max ``m``, ``l``, argmax, ``t``; see _row_update) into the
    stored statistics, adding the sink logit ``sink2`` (log2 units) when ``SINKS``."""
    # A row that saw no key keeps l = 0: lse = -inf, max = -inf, argmax = -1, H = 0.
    seen = l_i > 0.0
    m2 = m_i * qk_scale  # row max in log2 units
    mx = tl.where(seen, m2 * 0.6931471805599453, float("-inf"))
    if SINKS:
        # One more logit per row (gpt-oss): rebase (m, l, t) to M = max(m, sink) and add
        # the sink's term 2**(sink - M). A row without keys gets lse = sink and H = 0;
        # its (m, l, t) are left out explicitly rather than trusted to vanish.
        top = tl.where(seen, tl.maximum(m2, sink2), sink2)
        alpha = tl.where(seen, tl.math.exp2(m2 - top), 0.0)
        e_sink = tl.math.exp2(sink2 - top)
        t_keys = tl.where(seen, alpha * (t_i + (m2 - top) * l_i), 0.0)
        t_i = t_keys + e_sink * (sink2 - top)
        l_i = tl.where(seen, alpha * l_i, 0.0) + e_sink
        lse = (top + tl.math.log2(l_i)) * 0.6931471805599453
    else:
        lse = tl.where(seen, (m2 + tl.math.log2(l_i)) * 0.6931471805599453, float("-inf"))
    tl.store(LSE + out, lse, mask=row_ok)
    tl.store(MAX + out, mx, mask=row_ok)
    tl.store(ARG + out, tl.where(seen, a_i, -1).to(tl.int64), mask=row_ok)
    if ENTROPY:
        # H = ln l - ln2 * t / l with t in log2 units (see _row_update).
        ent = tl.math.log(l_i) - 0.6931471805599453 * t_i / l_i
        tl.store(ENT + out, tl.where(seen, ent, 0.0), mask=row_ok)


@triton.jit
def _decode_split_kernel(
    Q, K, PM, PL, PA, PT, KLO, KHI,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    nq, nk, q_offset, hkv, group, qk_scale, sc_in, sc_out, window, chunk, split_len,
    n_splits,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, EXP: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    """Split-K pass for few queries over many keys: one program per (key split, batch,
    kv head) scores every query of the kv head's GQA group (``group * nq`` rows, one
    tile) against its split of the keys, so each key is read once per kv head and the
    whole cache is spread over the GPU. It writes the row state (raw max, l, argmax, t)
    of its split; _decode_combine_kernel merges the splits. Visible keys are derived
    here (causal, window, chunk, key_lo / key_hi), so no host-side bounds are needed.
    """
    pid_s = tl.program_id(0)
    pid_bk = tl.program_id(1)
    b = pid_bk // hkv
    kvh = pid_bk % hkv
    r = tl.arange(0, BLOCK_R)
    row_ok = r < group * nq
    h = kvh * group + r // nq
    i = r % nq
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D
    q_ptr = (
        Q + b.to(tl.int64) * stride_qb + h.to(tl.int64)[:, None] * stride_qh
        + i.to(tl.int64)[:, None] * stride_qm + offs_d[None, :]
    )  # fmt: skip
    q = tl.load(q_ptr, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    # Visible keys [lo, hi] of each row, as in headhunt.kernels.masks.row_key_bounds.
    pos = q_offset + i
    lo = tl.zeros([BLOCK_R], dtype=tl.int32)
    hi = tl.full([BLOCK_R], nk - 1, dtype=tl.int32)
    if CAUSAL:
        hi = tl.minimum(hi, pos)
        if window > 0:
            lo = tl.maximum(lo, pos - window + 1)
        if chunk > 0:
            # Rows with pos < 0 see nothing (causal), so C division of them is harmless.
            lo = tl.maximum(lo, (pos // chunk) * chunk)
    if HAS_LO:
        lo = tl.maximum(lo, tl.load(KLO + b * nq + i, mask=row_ok, other=0).to(tl.int32))
    if HAS_HI:
        hi = tl.minimum(hi, tl.load(KHI + b * nq + i, mask=row_ok, other=0).to(tl.int32))
    lo = tl.where(row_ok, lo, nk)
    hi = tl.where(row_ok, hi, -1)

    s0 = pid_s * split_len
    s1 = tl.minimum(s0 + split_len, nk)
    k0 = s0 + (tl.maximum(tl.min(lo, axis=0) - s0, 0) // BLOCK_N) * BLOCK_N
    k1 = tl.minimum(s1, tl.max(hi, axis=0) + 1)
    k_base = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh + offs_d[None, :]
    m_i = tl.full([BLOCK_R], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    t_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    a_i = tl.full([BLOCK_R], -1, dtype=tl.int32)
    for n0 in range(k0, k1, BLOCK_N):
        cols = n0 + offs_n
        k = tl.load(
            k_base + cols.to(tl.int64)[:, None] * stride_kn,
            mask=(cols[:, None] < k1) & d_ok[None, :],
            other=0.0,
        )
        if UPCAST:
            k = k.to(tl.float32)
        s = _qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP)
        valid = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
        valid = valid & (cols[None, :] < k1)
        m_i, l_i, a_i, t_i = _row_update(
            s, m_i, l_i, a_i, t_i, n0, valid, qk_scale, True, ENTROPY, 2, BLOCK_N, EXP, ASM
        )
    out = (pid_bk * n_splits + pid_s) * BLOCK_R + r
    tl.store(PM + out, m_i)
    tl.store(PL + out, l_i)
    tl.store(PA + out, a_i)
    if ENTROPY:
        tl.store(PT + out, t_i)


@triton.jit
def _decode_combine_kernel(
    PM, PL, PA, PT, SINK, LSE, MAX, ARG, ENT,
    nq, hkv, group, n_splits, qk_scale,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, SINKS: tl.constexpr, ENTROPY: tl.constexpr,
):  # fmt: skip
    """Merge the per-split row states of _decode_split_kernel (one program per batch
    row and kv head): the max over splits, l and t rebased to it, and the argmax of the
    first split that reaches it (splits are in key order, so ties keep the lowest key)."""
    pid_bk = tl.program_id(0)
    b = pid_bk // hkv
    kvh = pid_bk % hkv
    r = tl.arange(0, BLOCK_R)
    sp = tl.arange(0, BLOCK_S)
    idx = (pid_bk * n_splits + sp[:, None]) * BLOCK_R + r[None, :]
    ok = sp[:, None] < n_splits
    m = tl.load(PM + idx, mask=ok, other=-1.0e30)
    l_s = tl.load(PL + idx, mask=ok, other=0.0)
    m_top = tl.max(m, axis=0)
    # (m - M) * qk_scale as a product of a difference: exact 0 for the top split.
    w = tl.math.exp2((m - m_top[None, :]) * qk_scale)
    l_i = tl.sum(l_s * w, axis=0)
    a_s = tl.load(PA + idx, mask=ok, other=-1)
    best = (m == m_top[None, :]) & (l_s > 0.0)
    a_i = tl.min(tl.where(best, a_s, 2147483647), axis=0)
    t_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    if ENTROPY:
        t_s = tl.load(PT + idx, mask=ok, other=0.0)
        t_i = tl.sum(w * (t_s + (m - m_top[None, :]) * qk_scale * l_s), axis=0)
    row_ok = r < group * nq
    h = kvh * group + r // nq
    out = (b * (hkv * group) + h) * nq + r % nq
    sink2 = 0.0
    if SINKS:
        sink2 = tl.load(SINK + h, mask=row_ok, other=0.0) * LOG2E
    _store_rows(
        LSE, MAX, ARG, ENT, out, row_ok, m_top, l_i, a_i, t_i, qk_scale, sink2, SINKS, ENTROPY
    )


@triton.jit
def _col_tile(
    acc,
    k,
    q_base,
    lse_base,
    Q,
    q_flat0,
    m0,
    offs_m,
    offs_n,
    nq,
    stride_qm,
    d_ok,
    lo_base,
    hi_base,
    q_offset,
    qk_scale,
    sc_in,
    sc_out,
    MASK: tl.constexpr,
    BOUNDS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    EXP: tl.constexpr,
    ASM: tl.constexpr,
    TMA: tl.constexpr,
):
    """Add ``sum_i p_ij`` over the query rows ``m0 + offs_m`` to the key tile's ``acc``.

    ``MASK``: apply the visibility of each (key, row) pair: the row's ``[lo, hi]`` with
    ``BOUNDS``, else the causal rule; it also drops rows without keys, whose lse = -inf
    would give ``exp2(+inf)`` (unmasked ``BOUNDS`` tiles drop them through their lse).
    Rows past ``nq`` read lse = +inf, so their terms are 0.
    """
    rows = m0 + offs_m
    q = _load_rows(Q, q_base, q_flat0, m0, offs_m, nq, stride_qm, d_ok, True, TMA, UPCAST)
    lse2 = tl.load(lse_base + rows, mask=rows < nq, other=float("inf")) * LOG2E
    if BOUNDS:
        lo = tl.load(lo_base + rows, mask=rows < nq, other=0)
        hi = tl.load(hi_base + rows, mask=rows < nq, other=-1)
        if not MASK:
            # Rows that see no key can sit in an unmasked tile; their lse (-inf, or the
            # sink logit) must not turn into probabilities.
            lse2 = tl.where(lo <= hi, lse2, float("inf"))
    st = _qk(k, q, sc_in, sc_out, PRECISION, SOFTCAP)  # [BLOCK_N, BLOCK_M]
    p = _exp2(st * qk_scale - lse2[None, :], EXP, ASM)
    if MASK:
        if BOUNDS:
            ok = (offs_n[:, None] >= lo[None, :]) & (offs_n[:, None] <= hi[None, :])
        else:
            ok = offs_n[:, None] <= q_offset + rows[None, :]
        p = tl.where(ok, p, 0.0)
    return acc + tl.sum(p, axis=1)


@triton.jit
def _col_stats_kernel(
    Q,
    K,
    LSE,
    COL,
    COL_MEAN,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    LO,
    HI,
    MRANGE,
    COUNT,
    nq,
    nk,
    q_offset,
    hq,
    group,
    qk_scale,
    sc_in,
    sc_out,
    n_tiles,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CAUSAL: tl.constexpr,
    BOUNDS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PIPELINE: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    EXP: tl.constexpr,
    ASM: tl.constexpr,
    TMA: tl.constexpr,
):
    # Key tile 0 has the most visible queries under the causal mask and already runs
    # first in launch order, so no reordering is needed here.
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

    q_flat0 = pid_bh * nq
    k_flat0 = (b * (hq // group) + kvh) * nk
    if TMA:
        q_base = Q
        k_base = K
    else:
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_d[None, :]
        k_base = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh + offs_d[None, :]
    k = _load_rows(
        K, k_base, k_flat0, n0, tl.arange(0, BLOCK_N), nk, stride_kn, d_ok, True, TMA, UPCAST
    )
    lse_base = LSE + pid_bh * nq
    lo_base = LO + b * nq
    hi_base = HI + b * nq
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)

    if BOUNDS:
        # MRANGE[b, tile] = (first, full_lo, full_hi, stop): rows [first, stop) hold every
        # row that sees a key of this tile, rows [full_lo, full_hi) see all of them (or
        # none: those get p = 0 from their lse, see _col_tile); prepared by
        # _query_ranges. Query tiles inside the full rows run unmasked, in a loop of
        # their own so that it stays software-pipelined.
        r = MRANGE + (b * n_tiles + pid_n) * 4
        m_stop = tl.load(r + 3)
        m_start = (tl.load(r) // BLOCK_M) * BLOCK_M
        f0 = tl.maximum(((tl.load(r + 1) + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, m_start)
        f1 = tl.maximum((tl.load(r + 2) // BLOCK_M) * BLOCK_M, f0)
        for m0 in range(m_start, tl.minimum(f0, m_stop), BLOCK_M):
            acc = _col_tile(
                acc, k, q_base, lse_base, Q, q_flat0, m0, offs_m, offs_n, nq, stride_qm,
                d_ok, lo_base, hi_base, q_offset, qk_scale, sc_in, sc_out,
                True, BOUNDS, SOFTCAP, PRECISION, UPCAST, EXP, ASM, TMA,
            )  # fmt: skip
        for m0 in range(f0, f1, BLOCK_M):
            acc = _col_tile(
                acc, k, q_base, lse_base, Q, q_flat0, m0, offs_m, offs_n, nq, stride_qm,
                d_ok, lo_base, hi_base, q_offset, qk_scale, sc_in, sc_out,
                False, BOUNDS, SOFTCAP, PRECISION, UPCAST, EXP, ASM, TMA,
            )  # fmt: skip
        for m0 in range(f1, m_stop, BLOCK_M):
            acc = _col_tile(
                acc, k, q_base, lse_base, Q, q_flat0, m0, offs_m, offs_n, nq, stride_qm,
                d_ok, lo_base, hi_base, q_offset, qk_scale, sc_in, sc_out,
                True, BOUNDS, SOFTCAP, PRECISION, UPCAST, EXP, ASM, TMA,
            )  # fmt: skip
    else:
        if CAUSAL:
            # First query that sees key n0 is i = n0 - q_offset; queries from
            # n0 + BLOCK_N - 1 - q_offset on see every key of the tile (no mask needed).
            m_lo = (tl.minimum(tl.maximum(n0 - q_offset, 0), nq) // BLOCK_M) * BLOCK_M
            all_seen = tl.maximum(n0 + BLOCK_N - 1 - q_offset, 0)
            m_mid = tl.maximum(((all_seen + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, m_lo)
        else:
            m_lo = 0
            m_mid = 0

        for m0 in range(m_lo, m_mid, BLOCK_M):
            acc = _col_tile(
                acc, k, q_base, lse_base, Q, q_flat0, m0, offs_m, offs_n, nq, stride_qm,
                d_ok, lo_base, hi_base, q_offset, qk_scale, sc_in, sc_out,
                True, False, SOFTCAP, PRECISION, UPCAST, EXP, ASM, TMA,
            )  # fmt: skip

        if PIPELINE:
            # Software pipeline as in the row kernel: issue tile m0's product, then do
            # the exp2 work of the previous tile.
            if m_mid < nq:
                rows = m_mid + offs_m
                q = _load_rows(
                    Q, q_base, q_flat0, m_mid, offs_m, nq, stride_qm, d_ok, True, TMA, UPCAST
                )
                lse2 = tl.load(lse_base + rows, mask=rows < nq, other=float("inf")) * LOG2E
                st = _qk(k, q, sc_in, sc_out, PRECISION, SOFTCAP)
                for m0 in range(m_mid + BLOCK_M, nq, BLOCK_M):
                    rows = m0 + offs_m
                    q = _load_rows(
                        Q, q_base, q_flat0, m0, offs_m, nq, stride_qm, d_ok, True, TMA, UPCAST
                    )
                    lse2_next = tl.load(lse_base + rows, mask=rows < nq, other=float("inf")) * LOG2E
                    st_next = _qk(k, q, sc_in, sc_out, PRECISION, SOFTCAP)
                    acc += tl.sum(_exp2(st * qk_scale - lse2[None, :], EXP, ASM), axis=1)
                    st = st_next
                    lse2 = lse2_next
                acc += tl.sum(_exp2(st * qk_scale - lse2[None, :], EXP, ASM), axis=1)
        else:
            for m0 in range(m_mid, nq, BLOCK_M):
                acc = _col_tile(
                    acc, k, q_base, lse_base, Q, q_flat0, m0, offs_m, offs_n, nq, stride_qm,
                    d_ok, lo_base, hi_base, q_offset, qk_scale, sc_in, sc_out,
                    False, False, SOFTCAP, PRECISION, UPCAST, EXP, ASM, TMA,
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


def _alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    if not POISON_OUTPUTS:
        return torch.empty(shape, dtype=dtype, device=device)
    fill = ARGMAX_POISON if dtype == torch.int64 else float("nan")
    return torch.full(shape, fill, dtype=dtype, device=device)


@dataclass(frozen=True)
class _Launch:
    """Arguments shared by both kernel launches (prepared once by _prepare).

    ``lo`` / ``hi`` (int32 ``[b, nq]``) are the per-row key intervals when a window, a
    chunk or ``key_lo`` / ``key_hi`` is given (the kernels then skip tiles by them);
    None for the plain causal / full masks, which the kernels derive from ``q_offset``.
    """

    q: Tensor
    k: Tensor
    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int
    causal: bool
    q_offset: int
    qk_scale: float
    precision: str
    upcast: bool
    tma: bool
    cfg: KernelConfig
    lo: Tensor | None = None
    hi: Tensor | None = None
    softcap_in: float = 0.0  # scale / softcap (0: no softcap)
    softcap_out: float = 0.0  # softcap / scale
    sinks: Tensor | None = None  # float32 [hq]
    window: int | None = None  # the mask options, kept for the decode path, which
    chunk: int | None = None  # derives the intervals itself (see _with_bounds)
    key_lo: Tensor | None = None
    key_hi: Tensor | None = None


def _prepare(
    q: Tensor,
    k: Tensor,
    *,
    causal: bool,
    scale: float | None,
    q_offset: int | None,
    config: KernelConfig | None,
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    key_lo: Tensor | None = None,
    key_hi: Tensor | None = None,
) -> _Launch:
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    if q.device.type != "cuda" and not _interpreting():
        raise RuntimeError("the Triton backend needs CUDA tensors (or TRITON_INTERPRET=1)")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if q_offset is None:
        q_offset = nk - nq
    if k.dtype != q.dtype:
        k = k.to(q.dtype)
    # The kernels assume unit stride along d (16-byte vector loads); other strides are
    # free to be anything, so [b, n, h, d] tensors viewed as [b, h, n, d] need no copy.
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    cfg = config or default_config(d, q.dtype)
    # fp32 inputs: plain tf32 would cost ~1e-3 relative error on p; "tf32x3" (three tf32
    # MMAs on hi/lo splits) is accurate to ~1e-6 on the tensor cores; "ieee" is exact
    # fp32 on the FMA units (slow). The interpreter always computes exact fp32.
    if q.dtype == torch.float32:
        precision = "ieee" if _interpreting() else cfg.fp32_dot
    else:
        precision = "tf32"
    # The interpreter stores bf16 as uint16 and its tl.dot multiplies those integers
    # (triton 3.9 interpreter.create_dot); exact fp32 products of the same bf16 values
    # are what the tensor cores compute, so upcast the tiles there.
    upcast = _interpreting() and q.dtype == torch.bfloat16
    # These kernels' bulk tensor copies (TMA) take contiguous [b, heads, n, d] tensors
    # flattened to [b * heads * n, d] (tma_view's view of them), when TMA can take them.
    tma = (
        not _interpreting()
        and q.is_contiguous()
        and k.is_contiguous()
        and tma_views(q, k) is not None
    )
    return _Launch(
        q=q,
        k=k,
        b=b,
        hq=hq,
        hkv=hkv,
        nq=nq,
        nk=nk,
        d=d,
        causal=causal,
        q_offset=int(q_offset),
        qk_scale=float(scale) * _LOG2E,
        precision=precision,
        upcast=upcast,
        tma=tma,
        cfg=cfg,
        window=window,
        chunk=chunk,
        key_lo=None if key_lo is None else key_lo.contiguous(),
        key_hi=None if key_hi is None else key_hi.contiguous(),
        softcap_in=float(scale) / softcap if softcap is not None else 0.0,
        softcap_out=softcap / float(scale) if softcap is not None else 0.0,
        sinks=None if sinks is None else sinks.to(device=q.device, dtype=torch.float32),
    )


def _with_bounds(L: _Launch) -> _Launch:
    """``L`` with the per-row key intervals the row and column passes use, when a
    window, chunk or key_lo / key_hi is set (computed once, on q's device)."""
    if L.lo is not None or (L.window, L.chunk, L.key_lo, L.key_hi) == (None,) * 4:
        return L
    lo, hi = row_key_bounds(
        L.b, L.nq, L.nk, causal=L.causal, q_offset=L.q_offset, window=L.window,
        chunk=L.chunk, key_lo=L.key_lo, key_hi=L.key_hi, device=L.q.device,
    )  # fmt: skip
    return dataclasses.replace(L, lo=lo.to(torch.int32), hi=hi.to(torch.int32))


# The decode path serves up to this many rows per kv head (GQA group x queries) ...
DECODE_MAX_ROWS = 64
# ... over at least this many keys (below, the row kernel's parallelism suffices).
DECODE_MIN_KEYS = 2048


def _sm_count(device: torch.device) -> int:
    if _interpreting():
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def _launch_decode(L: _Launch, lse: Tensor, mx: Tensor, arg: Tensor, ent: Tensor | None) -> None:
    """Row statistics of few queries over many keys: split-K pass + combine."""
    if L.nq == 0:
        return
    group = L.hq // L.hkv
    rows = group * L.nq
    block_r = max(16, triton.next_power_of_2(rows))
    block_n = 16 if _interpreting() else 64
    # About four programs per SM over all (batch, kv head) pairs, whole key tiles each.
    splits = max(
        1, min(triton.cdiv(L.nk, block_n), triton.cdiv(4 * _sm_count(L.q.device), L.b * L.hkv))
    )
    split_len = triton.cdiv(triton.cdiv(L.nk, splits), block_n) * block_n
    splits = triton.cdiv(L.nk, split_len)
    dev = L.q.device
    n_part = L.b * L.hkv * splits * block_r
    pm = torch.empty(n_part, dtype=torch.float32, device=dev)
    pl = torch.empty_like(pm)
    pt = torch.empty_like(pm) if ent is not None else pm
    pa = torch.empty(n_part, dtype=torch.int32, device=dev)
    _decode_split_kernel[(splits, L.b * L.hkv)](
        L.q, L.k, pm, pl, pa, pt,
        L.key_lo if L.key_lo is not None else pa, L.key_hi if L.key_hi is not None else pa,
        L.q.stride(0), L.q.stride(1), L.q.stride(2), L.k.stride(0), L.k.stride(1), L.k.stride(2),
        L.nq, L.nk, L.q_offset, L.hkv, group, L.qk_scale, L.softcap_in, L.softcap_out,
        L.window or 0, L.chunk or 0, split_len, splits,
        D=L.d, BLOCK_D=max(16, triton.next_power_of_2(L.d)), BLOCK_R=block_r, BLOCK_N=block_n,
        CAUSAL=L.causal, HAS_LO=L.key_lo is not None, HAS_HI=L.key_hi is not None,
        SOFTCAP=L.softcap_in > 0, ENTROPY=ent is not None, PRECISION=L.precision,
        UPCAST=L.upcast, EXP=_exp_mode(L.cfg.row_exp, L.q.dtype), ASM=not _interpreting(),
        num_warps=4, num_stages=3,
    )  # fmt: skip
    _decode_combine_kernel[(L.b * L.hkv,)](
        pm, pl, pa, pt, L.sinks if L.sinks is not None else pm, lse, mx, arg,
        ent if ent is not None else lse, L.nq, L.hkv, group, splits, L.qk_scale,
        BLOCK_R=block_r, BLOCK_S=max(2, triton.next_power_of_2(splits)),
        SINKS=L.sinks is not None, ENTROPY=ent is not None, num_warps=4,
    )  # fmt: skip


def _operands(L: _Launch, q_rows: int, k_rows: int, use: bool):
    """q and k as the kernels take them: tensors, or TMA descriptors over the flattened
    [b * heads * n, d] tensors with [rows, d] blocks."""
    if not (use and L.tma):
        return L.q, L.k
    from triton.tools.tensor_descriptor import TensorDescriptor

    q2, k2 = L.q.view(-1, L.d), L.k.view(-1, L.d)
    return (
        TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [q_rows, L.d]),
        TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [k_rows, L.d]),
    )


def _query_ranges(lo: Tensor, hi: Tensor, nk: int, block_n: int) -> Tensor:
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


def _launch_row(
    L: _Launch, lse: Tensor, mx: Tensor, arg: Tensor, ent: Tensor | None, argmax: bool = True
) -> None:
    """Pass 1: lse, max_score, argmax (and entropy when ``ent`` is given)."""
    if L.nq == 0:
        return
    cfg = L.cfg
    grid = (triton.cdiv(L.nq, cfg.row_block_m), L.b * L.hq)
    q, k = _operands(L, cfg.row_block_m, cfg.row_block_n, cfg.row_tma)
    _row_stats_kernel[grid](
        q,
        k,
        lse,
        mx,
        arg,
        ent if ent is not None else lse,  # unused pointer when ENTROPY is off
        L.q.stride(0),
        L.q.stride(1),
        L.q.stride(2),
        L.k.stride(0),
        L.k.stride(1),
        L.k.stride(2),
        L.lo if L.lo is not None else arg,  # unused pointers without BOUNDS / SINKS
        L.hi if L.hi is not None else arg,
        L.sinks if L.sinks is not None else lse,
        L.nq,
        L.nk,
        L.q_offset,
        L.hq,
        L.hq // L.hkv,
        L.qk_scale,
        L.softcap_in,
        L.softcap_out,
        D=L.d,
        BLOCK_D=max(16, triton.next_power_of_2(L.d)),
        BLOCK_M=cfg.row_block_m,
        BLOCK_N=cfg.row_block_n,
        CAUSAL=L.causal,
        BOUNDS=L.lo is not None,
        SOFTCAP=L.softcap_in > 0,
        SINKS=L.sinks is not None,
        ENTROPY=ent is not None,
        ARGMAX=cfg.argmax_mode if argmax else 0,
        PIPELINE=cfg.row_pipeline,
        PRECISION=L.precision,
        UPCAST=L.upcast,
        EXP=_exp_mode(cfg.row_exp, L.q.dtype),
        ASM=not _interpreting(),
        TMA=cfg.row_tma and L.tma,
        num_warps=cfg.row_warps,
        num_stages=cfg.row_stages,
    )


def _launch_col(L: _Launch, lse: Tensor, col_sum: Tensor, col_mean: Tensor) -> None:
    """Pass 2: col_sum and col_mean from q, k and the lse of pass 1 (the plain causal /
    full mask by :mod:`headhunt.kernels.triton_columns`, every other mask here)."""
    if L.nk == 0:
        return
    if fast_columns_apply(L, L.cfg):
        launch_columns(L, lse, col_sum, col_mean)
    else:
        _launch_col_general(L, lse, col_sum, col_mean)


def _launch_col_general(L: _Launch, lse: Tensor, col_sum: Tensor, col_mean: Tensor) -> None:
    """Pass 2 by :func:`_col_stats_kernel` (any mask)."""
    cfg = L.cfg
    n_tiles = triton.cdiv(L.nk, cfg.col_block_n)
    grid = (n_tiles, L.b * L.hq)
    q, k = _operands(L, cfg.col_block_m, cfg.col_block_n, cfg.col_tma)
    bounds = L.lo is not None
    if bounds:
        mrange = _query_ranges(L.lo, L.hi, L.nk, cfg.col_block_n)
        count = key_visible_counts(L.lo.long(), L.hi.long(), L.nk)
    _col_stats_kernel[grid](
        q,
        k,
        lse,
        col_sum,
        col_mean,
        L.q.stride(0),
        L.q.stride(1),
        L.q.stride(2),
        L.k.stride(0),
        L.k.stride(1),
        L.k.stride(2),
        L.lo if bounds else lse,  # unused pointers without BOUNDS
        L.hi if bounds else lse,
        mrange if bounds else lse,
        count if bounds else lse,
        L.nq,
        L.nk,
        L.q_offset,
        L.hq,
        L.hq // L.hkv,
        L.qk_scale,
        L.softcap_in,
        L.softcap_out,
        n_tiles,
        D=L.d,
        BLOCK_D=max(16, triton.next_power_of_2(L.d)),
        BLOCK_N=cfg.col_block_n,
        BLOCK_M=cfg.col_block_m,
        CAUSAL=L.causal,
        BOUNDS=bounds,
        SOFTCAP=L.softcap_in > 0,
        PIPELINE=cfg.col_pipeline,
        PRECISION=L.precision,
        UPCAST=L.upcast,
        EXP=_exp_mode(cfg.col_exp, L.q.dtype),
        ASM=not _interpreting(),
        TMA=cfg.col_tma and L.tma,
        num_warps=cfg.col_warps,
        num_stages=cfg.col_stages,
    )


def attention_stats_triton(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
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
    decode: bool | None = None,
) -> AttentionStats:
    """Triton implementation of :func:`headhunt.kernels.attention_stats`.

    Args:
        q: Queries ``[batch, query heads, queries, head dim]`` on CUDA (or on CPU with
            ``TRITON_INTERPRET=1``).
        k: Keys ``[batch, kv heads, keys, head dim]`` on the same device.
        causal: Apply the bottom-right aligned causal mask.
        scale: Score scale; defaults to ``1 / sqrt(head dim)``.
        key_stats: Run the second (column) pass for ``col_sum`` / ``col_mean``.
        entropy: Accumulate per-query entropy in the first pass.
        q_offset: Absolute position of query 0; defaults to ``nk - nq``.
        window, chunk, softcap, sinks, key_lo, key_hi: As in
            :func:`headhunt.kernels.attention_stats` (validated there).
        config: Tile sizes / warps / stages; defaults to :func:`default_config`.
        decode: Row statistics by the split-K decode kernels (one program per key split
            and kv head, all of its query heads' rows in one tile, then a combine) rather
            than the row kernel (one program per query tile and head, which leaves most
            of the GPU idle for a handful of queries). None: when there are at most
            ``DECODE_MAX_ROWS`` rows per kv head and ``DECODE_MIN_KEYS`` keys.

    Returns:
        The statistics (float32, int64 argmax) on ``q``'s device.
    """
    L = _prepare(
        q, k, causal=causal, scale=scale, q_offset=q_offset, config=config, window=window,
        chunk=chunk, softcap=softcap, sinks=sinks, key_lo=key_lo, key_hi=key_hi,
    )  # fmt: skip
    dev = L.q.device
    shape = (L.b, L.hq, L.nq)
    lse = _alloc(shape, torch.float32, dev)
    mx = _alloc(shape, torch.float32, dev)
    arg = _alloc(shape, torch.int64, dev)
    ent = _alloc(shape, torch.float32, dev) if entropy else None
    if decode is None:
        decode = L.nq * (L.hq // L.hkv) <= DECODE_MAX_ROWS and L.nk >= DECODE_MIN_KEYS
    if decode:
        _launch_decode(L, lse, mx, arg, ent)
    else:
        L = _with_bounds(L)
        _launch_row(L, lse, mx, arg, ent)

    col_sum = col_mean = None
    if key_stats:
        L = _with_bounds(L)
        col_sum = _alloc((L.b, L.hq, L.nk), torch.float32, dev)
        col_mean = _alloc((L.b, L.hq, L.nk), torch.float32, dev)
        _launch_col(L, lse, col_sum, col_mean)

    return AttentionStats(
        lse=lse, max_score=mx, argmax=arg, entropy=ent, col_sum=col_sum, col_mean=col_mean
    )
