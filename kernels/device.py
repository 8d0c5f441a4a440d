"""Device helpers shared by the Triton kernels: exponentials, tile loads, scores, the online
softmax update of a row block and its epilogue.

Every kernel family (:mod:`~headhunt.kernels.triton_rows`, :mod:`~headhunt.kernels.triton_columns`,
:mod:`~headhunt.kernels.triton_decode`, :mod:`~headhunt.kernels.triton_fused`) builds on these,
as flash-attention's ``flash_attn/cute`` kernels build on its ``softmax`` and ``utils`` modules
(Dao-AILab/flash-attention). All of them are ``@triton.jit`` functions, inlined into the kernels
that call them.

Scores are handled in log2 units (``s2 = s * log2 e``) so the kernels use ``exp2``; results are
converted back to natural units before they are stored.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "LOG2E",
    "alibi_slope",
    "causal_query_tiles",
    "causal_tiles",
    "exp2",
    "head_pointers",
    "interval_tiles",
    "load_rows",
    "program_head",
    "program_tile",
    "qk",
    "qk_bases",
    "qk_program",
    "row_state",
    "softmax_tile",
    "store_rows",
    "visible",
]

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


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
def exp2(x, MODE: tl.constexpr, ASM: tl.constexpr):
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
def program_head(hq, group):
    """The batch row and query head a program owns (grid axis 1 runs over ``b * hq``):
    ``(pid_bh, b, h, kvh)``, with ``kvh`` the kv head it reads (GQA: the shared kv head,
    never a repeated copy of k)."""
    pid_bh = tl.program_id(1)
    b = pid_bh // hq
    h = pid_bh % hq
    return pid_bh, b, h, h // group


@triton.jit
def program_tile(pid, hq, group, BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr,
                 BLOCK_D: tl.constexpr, D: tl.constexpr):  # fmt: skip
    """What a program of a tiled kernel owns: its head (:func:`program_head`) and the
    ``BLOCK_OWN`` rows of its own operand from ``start = pid * BLOCK_OWN`` (query rows in a
    row kernel, keys in a column kernel), with the offsets of a tile of the other operand
    (from 0) and of the head dimension. Returns
    ``(pid_bh, b, h, kvh, start, offs_own, offs_other, offs_d, d_ok)``."""
    pid_bh, b, h, kvh = program_head(hq, group)
    start = pid * BLOCK_OWN
    offs_own = start + tl.arange(0, BLOCK_OWN)
    offs_other = tl.arange(0, BLOCK_OTHER)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    return pid_bh, b, h, kvh, start, offs_own, offs_other, offs_d, d_ok


@triton.jit
def row_state(BLOCK_M: tl.constexpr):
    """The empty online-softmax state of ``BLOCK_M`` rows, ``(m_i, l_i, t_i, a_i)`` (see
    :func:`softmax_tile`). The running max (of raw q . k) starts at a finite -1e30 rather
    than -inf so that the first rescale (m_old - m_new) * l_old is 0 * finite, not NaN, for
    every row."""
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    t_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    a_i = tl.full([BLOCK_M], -1, dtype=tl.int32)
    return m_i, l_i, t_i, a_i


@triton.jit
def alibi_slope(ALIBI_S, h, ALIBI: tl.constexpr):
    """Head ``h``'s ALiBi slope over the scale (raw-product units, see :func:`qk`); 0.0,
    unused, without ``ALIBI``."""
    slope = 0.0
    if ALIBI:
        slope = tl.load(ALIBI_S + h)
    return slope


@triton.jit
def visible(cols, lo, hi, pos, nk, BOUNDS: tl.constexpr, CAUSAL: tl.constexpr):
    """Which keys ``cols`` [BLOCK_N] each query row sees, [rows, BLOCK_N]: those in the
    row's ``[lo, hi]`` with ``BOUNDS``; else those before the end of k and, when ``CAUSAL``,
    not after the row's position ``pos``."""
    if BOUNDS:
        valid = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
    else:
        valid = cols[None, :] < nk
        if CAUSAL:
            valid = valid & (cols[None, :] <= pos[:, None])
    return valid


@triton.jit
def head_pointers(X, b, h, stride_b, stride_h, offs_d):
    """[1, BLOCK_D] pointers to row 0 of head ``h`` of batch row ``b`` of ``X``. 64-bit
    offsets: a [b, n, h, d] view has row stride h * d, so n * stride can pass 2**31 at long
    contexts; these are per-row/per-tile, not per-element, costs."""
    return X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + offs_d[None, :]


@triton.jit
def qk_bases(Q, K, pid_bh, b, h, kvh, hq, group, nq, nk, stride_qb, stride_qh, stride_kb,
             stride_kh, offs_d, TMA: tl.constexpr):  # fmt: skip
    """Where :func:`load_rows` reads q's head ``h`` and k's head ``kvh``:
    ``(q_base, k_base, q_flat0, k_flat0)``. With ``TMA`` the bases are the descriptors
    themselves, over contiguous [b * heads * n, d] tensors whose heads start at rows
    ``q_flat0`` / ``k_flat0``; else :func:`head_pointers`."""
    q_flat0 = pid_bh * nq
    k_flat0 = (b * (hq // group) + kvh) * nk
    if TMA:
        q_base = Q
        k_base = K
    else:
        q_base = head_pointers(Q, b, h, stride_qb, stride_qh, offs_d)
        k_base = head_pointers(K, b, kvh, stride_kb, stride_kh, offs_d)
    return q_base, k_base, q_flat0, k_flat0


@triton.jit
def qk_program(Q, K, pid, hq, group, nq, nk, stride_qb, stride_qh, stride_kb, stride_kh,
               BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr,
               D: tl.constexpr, TMA: tl.constexpr):  # fmt: skip
    """The prologue of a kernel that streams tiles of one of q, k past a tile of the other
    (the row and column passes): :func:`program_tile`, then :func:`qk_bases`. Returns
    ``(pid_bh, b, h, start, offs_own, offs_other, d_ok, q_base, k_base, q_flat0, k_flat0)``."""
    pid_bh, b, h, kvh, start, offs_own, offs_other, offs_d, d_ok = program_tile(
        pid, hq, group, BLOCK_OWN, BLOCK_OTHER, BLOCK_D, D
    )
    q_base, k_base, q_flat0, k_flat0 = qk_bases(
        Q, K, pid_bh, b, h, kvh, hq, group, nq, nk, stride_qb, stride_qh, stride_kb, stride_kh,
        offs_d, TMA,
    )  # fmt: skip
    return pid_bh, b, h, start, offs_own, offs_other, d_ok, q_base, k_base, q_flat0, k_flat0


@triton.jit
def interval_tiles(LO, HI, b, nq, nk, offs_m, BLOCK_N: tl.constexpr):
    """The per-row key intervals ``[lo, hi]`` of query rows ``offs_m`` (window, chunk,
    padding, ...) and the key tiles a row block scores, in three runs:
    ``[k_start, n_lo)`` masked, ``[n_lo, n_full)`` visible to every row (inside
    ``[max lo, min hi]``: no mask), ``[n_full, k_end)`` masked; from the lowest lo to the
    highest hi. Rows past nq read an empty interval (lo = nk, hi = -1), which also leaves no
    full tile. Returns ``(lo, hi, k_start, n_lo, n_full, k_end)``."""
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
    return lo, hi, k_start, n_lo, n_full, k_end


@triton.jit
def causal_tiles(q_offset, m0, nk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr):  # fmt: skip
    """The key tiles of query rows ``m0 .. m0 + BLOCK_M`` under the plain causal / full
    mask: ``[0, n_full)`` visible to every row (no mask), ``[n_full, k_end)`` straddling
    the diagonal or the end of k (masked). Returns ``(n_full, k_end)``."""
    if CAUSAL:
        first_seen = tl.minimum(tl.maximum(q_offset + m0 + 1, 0), nk)
        n_full = (first_seen // BLOCK_N) * BLOCK_N
        k_end = tl.minimum(tl.maximum(q_offset + m0 + BLOCK_M, 0), nk)
    else:
        n_full = (nk // BLOCK_N) * BLOCK_N
        k_end = nk
    return n_full, k_end


@triton.jit
def causal_query_tiles(n0, q_offset, nq, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                       CAUSAL: tl.constexpr):  # fmt: skip
    """The query tiles that see key tile ``n0 .. n0 + BLOCK_N`` under the plain causal /
    full mask: ``[m_lo, m_mid)`` see part of it (masked), ``[m_mid, nq)`` all of it. Query
    ``i`` sees key ``j`` when ``j <= i + q_offset``: the first row that sees key n0 is
    ``n0 - q_offset``; rows from ``n0 + BLOCK_N - 1 - q_offset`` on see the whole tile."""
    if CAUSAL:
        m_lo = (tl.minimum(tl.maximum(n0 - q_offset, 0), nq) // BLOCK_M) * BLOCK_M
        all_seen = tl.maximum(n0 + BLOCK_N - 1 - q_offset, 0)
        m_mid = tl.maximum(((all_seen + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, m_lo)
    else:
        m_lo = 0
        m_mid = 0
    return m_lo, m_mid


@triton.jit
def load_rows(
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
def qk(
    a, b, sc_in, sc_out, PRECISION: tl.constexpr, SOFTCAP: tl.constexpr, slope=0.0, a_pos=0,
    b_pos=0, ALIBI: tl.constexpr = False,
):  # fmt: skip
    """Raw products ``a @ b^T`` of two row tiles; with ``ALIBI`` plus the linear bias
    ``slope * (b_pos - a_pos)`` (``slope`` a scalar or an [a rows, 1] column, in raw-product
    units: the ALiBi slope divided by the scale; ``a_pos`` / ``b_pos`` the positions of the
    rows); with a softcap, then mapped through
    ``sc_out * tanh(sc_in * s)`` (``sc_in = scale / cap``, ``sc_out = cap / scale``), which
    is the capped score ``cap * tanh(scale * s / cap)`` back in raw-product units, so the
    callers' ``qk_scale`` and max bookkeeping apply unchanged (tanh is increasing).

    The exponential in the softmax already keeps the special-function unit busy, so a
    tile whose arguments all lie in [-0.5, 0.5] (scores within half the cap, the usual
    case) takes tanh from a polynomial on the FMA units; other tiles (a block-uniform
    branch) take the exp2-based formula.
    """
    s = tl.dot(a, tl.trans(b), input_precision=PRECISION)
    if ALIBI:
        s = s + slope * (b_pos[None, :] - a_pos[:, None]).to(tl.float32)
    if SOFTCAP:
        x = sc_in * s
        if tl.max(tl.max(tl.abs(x), axis=1), axis=0) <= 0.5:
            s = sc_out * _tanh_small(x)
        else:
            s = sc_out * _tanh(x)
    return s


@triton.jit
def softmax_tile(
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
    e = exp2(shifted, EXP, ASM)
    if MASKED:
        e = tl.where(valid, e, 0.0)  # a row that sees no key keeps l = 0
    if ENTROPY:
        # t re-based to the new max (masked entries: e = 0, shifted finite).
        t_i = alpha * (t_i + (m_i - m_new) * qk_scale * l_i) + tl.sum(e * shifted, axis=1)
    l_i = l_i * alpha + tl.sum(e, axis=1)
    return m_new, l_i, a_i, t_i, e, alpha


@triton.jit
def store_rows(
    LSE, MAX, ARG, ENT, out, row_ok, m_i, l_i, a_i, t_i, qk_scale, sink2,
    SINKS: tl.constexpr, ENTROPY: tl.constexpr,
):  # fmt: skip
    """Turn a row state (raw max ``m``, ``l``, argmax, ``t``; see softmax_tile) into the
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
        # H = ln l - ln2 * t / l with t in log2 units (see softmax_tile).
        ent = tl.math.log(l_i) - 0.6931471805599453 * t_i / l_i
        tl.store(ENT + out, tl.where(seen, ent, 0.0), mask=row_ok)
