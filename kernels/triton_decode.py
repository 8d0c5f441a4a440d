"""Decode kernels (CUDA): few queries over a long key cache.

Row statistics (:func:`launch_decode`): one program per key split and kv head scores every query
of the kv head's GQA group against its split of the keys (``_decode_split_kernel``), so each key
is read once per kv head and the whole cache is spread over the GPU; ``_decode_combine_kernel``
merges the splits into the statistics the row kernel (:mod:`~headhunt.kernels.triton_rows`)
gives. :func:`~headhunt.kernels.launch.attention_stats_triton` takes this path for at most
``DECODE_MAX_ROWS`` rows per kv head over at least ``DECODE_MIN_KEYS`` keys.

One decode step's attention argmax for many layers in two kernel launches
(:func:`decode_argmax_layers`): greedy decoding with a captured argmax (the retrieval scorer)
needs, at every step and for every layer, the key each query head attends to most. Per layer
that is a tiny problem (one query per head over the cache), so launching
:func:`headhunt.kernels.attention_stats` per layer costs more host time (argument checks,
allocations, two launches) than GPU time, and the small model's decoding is host-bound already.
Here the layers of one step go in one split-K pass and one combine: every layer's query and key
tensors are reached through a table of their addresses, so nothing is copied or stacked.

The argmax scores are the raw products ``q . k`` of the split-K statistics kernel, computed by
the same tile code (:func:`~headhunt.kernels.device.qk`, the same tile shapes, float32
accumulation), and ties go to the lowest key as there; the scale, a softcap (increasing) and the
softmax do not move an argmax, but a softcap could merge two scores in float32, so callers send
softcapped layers (and any mask beyond "the query sees the whole cache") to ``attention_stats``
instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from jaxtyping import Bool, Float, Int64
from torch import Tensor

from .config import default_config, exp_mode, interpreting, sm_count
from .device import LOG2E, qk, softmax_tile, store_rows

if TYPE_CHECKING:
    from .launch import Launch

__all__ = ["DECODE_MAX_ROWS", "DECODE_MIN_KEYS", "decode_argmax_layers", "launch_decode"]

# The decode path serves up to this many rows per kv head (GQA group x queries) ...
DECODE_MAX_ROWS = 64
# ... over at least this many keys (below, the row kernel's parallelism suffices).
DECODE_MIN_KEYS = 2048


@triton.jit
def _decode_split_kernel(
    Q, K, PM, PL, PA, PT, KLO, KHI, ALIBI_S,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    nq, nk, q_offset, hkv, group, qk_scale, sc_in, sc_out, window, chunk, split_len,
    n_splits,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, EXP: tl.constexpr,
    ASM: tl.constexpr, ALIBI: tl.constexpr,
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
    slope = 0.0
    if ALIBI:  # each row's head's ALiBi slope over the scale, as an [R, 1] column
        slope = tl.load(ALIBI_S + h, mask=row_ok, other=0.0)[:, None]

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
        s = qk(q, k, sc_in, sc_out, PRECISION, SOFTCAP, slope, pos, cols, ALIBI)
        valid = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
        valid = valid & (cols[None, :] < k1)
        m_i, l_i, a_i, t_i, _, _ = softmax_tile(
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
    store_rows(
        LSE, MAX, ARG, ENT, out, row_ok, m_top, l_i, a_i, t_i, qk_scale, sink2, SINKS, ENTROPY
    )


def launch_decode(L: Launch, lse: Tensor, mx: Tensor, arg: Tensor, ent: Tensor | None) -> None:
    """Row statistics of few queries over many keys: split-K pass + combine."""
    if L.nq == 0:
        return
    v = L.variant
    group = L.group
    rows = group * L.nq
    block_r = max(16, triton.next_power_of_2(rows))
    block_n = 16 if interpreting() else 64
    # About four programs per SM over all (batch, kv head) pairs, whole key tiles each.
    splits = max(
        1, min(triton.cdiv(L.nk, block_n), triton.cdiv(4 * sm_count(L.q.device), L.b * L.hkv))
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
        v.key_lo if v.key_lo is not None else pa, v.key_hi if v.key_hi is not None else pa,
        L.alibi if L.alibi is not None else pm,
        L.q.stride(0), L.q.stride(1), L.q.stride(2), L.k.stride(0), L.k.stride(1), L.k.stride(2),
        L.nq, L.nk, L.q_offset, L.hkv, group, L.qk_scale, L.softcap_in, L.softcap_out,
        v.window or 0, v.chunk or 0, split_len, splits,
        D=L.d, BLOCK_D=max(16, triton.next_power_of_2(L.d)), BLOCK_R=block_r, BLOCK_N=block_n,
        CAUSAL=L.causal, HAS_LO=v.key_lo is not None, HAS_HI=v.key_hi is not None,
        SOFTCAP=L.softcap_in > 0, ENTROPY=ent is not None, PRECISION=L.precision,
        UPCAST=L.upcast, EXP=exp_mode(L.cfg.row_exp, L.q.dtype), ASM=not interpreting(),
        ALIBI=L.alibi is not None, num_warps=4, num_stages=3,
    )  # fmt: skip
    _decode_combine_kernel[(L.b * L.hkv,)](
        pm, pl, pa, pt, L.sinks if L.sinks is not None else pm, lse, mx, arg,
        ent if ent is not None else lse, L.nq, L.hkv, group, splits, L.qk_scale,
        BLOCK_R=block_r, BLOCK_S=max(2, triton.next_power_of_2(splits)),
        SINKS=L.sinks is not None, ENTROPY=ent is not None, num_warps=4,
    )  # fmt: skip


# Arguments that change from step to step or batch to batch: not specialised on (equal to 1,
# divisible by 16), or each new combination would compile the kernel again mid-run.
_VARYING = ["n_layers", "nk", "split_len", "n_splits"]


@triton.jit(do_not_specialize=_VARYING)
def _argmax_split_kernel(
    PTRS, K0, PM, PA, SKIP,
    n_layers, stride_qb, stride_qh, stride_kb, stride_kh, stride_kn,
    nk, hkv, group, split_len, n_splits,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, HAS_SKIP: tl.constexpr,
):  # fmt: skip
    """One program per (key split, batch row x kv head, layer): the raw max and its first
    key over the split, for each query head of the kv head's group (one row each). A batch
    row flagged in ``SKIP`` reads no key (its split is empty)."""
    pid_s = tl.program_id(0)
    pid_bk = tl.program_id(1)
    pid_l = tl.program_id(2)
    b = pid_bk // hkv
    kvh = pid_bk % hkv
    dtype = K0.dtype.element_ty
    q_layer = tl.load(PTRS + pid_l).to(tl.pointer_type(dtype))
    k_layer = tl.load(PTRS + n_layers + pid_l).to(tl.pointer_type(dtype))
    r = tl.arange(0, BLOCK_R)
    row_ok = r < group
    h = kvh * group + r
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D
    q_ptr = (
        q_layer + b.to(tl.int64) * stride_qb + h.to(tl.int64)[:, None] * stride_qh
        + offs_d[None, :]
    )  # fmt: skip
    q = tl.load(q_ptr, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    s0 = pid_s * split_len
    s1 = tl.minimum(s0 + split_len, nk)
    if HAS_SKIP:
        s1 = tl.where(tl.load(SKIP + b) != 0, s0, s1)
    k_base = k_layer + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    k_base = k_base + offs_d[None, :]
    m_i = tl.full([BLOCK_R], -1.0e30, dtype=tl.float32)
    a_i = tl.full([BLOCK_R], -1, dtype=tl.int32)
    for n0 in range(s0, s1, BLOCK_N):
        cols = n0 + offs_n
        k = tl.load(
            k_base + cols.to(tl.int64)[:, None] * stride_kn,
            mask=(cols[:, None] < s1) & d_ok[None, :],
            other=0.0,
        )
        if UPCAST:
            k = k.to(tl.float32)
        s = qk(q, k, 0.0, 0.0, PRECISION, False)
        s = tl.where(cols[None, :] < s1, s, -1.0e30)
        # As softmax_tile's ARGMAX == 2: the tile max, its first column, and strict '>'
        # so an earlier tile keeps its key on ties.
        m_tile = tl.max(s, axis=1)
        a_tile = tl.min(tl.where(s == m_tile[:, None], offs_n[None, :], BLOCK_N), axis=1)
        a_i = tl.where(m_tile > m_i, n0 + a_tile, a_i)
        m_i = tl.maximum(m_i, m_tile)
    out = ((pid_l * tl.num_programs(1) + pid_bk) * n_splits + pid_s) * BLOCK_R + r
    tl.store(PM + out, m_i)
    tl.store(PA + out, a_i)


@triton.jit(do_not_specialize=["n_splits", "key_start"])
def _argmax_combine_kernel(
    PM, PA, OUT, SKIP, hkv, group, n_splits, key_start,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, HAS_SKIP: tl.constexpr,
):  # fmt: skip
    """One program per (batch row x kv head, layer): the first split reaching the top max
    (splits are in key order, so ties keep the lowest key), plus ``key_start``; -1 for a
    batch row flagged in ``SKIP``."""
    pid_bk = tl.program_id(0)
    pid_l = tl.program_id(1)
    b = pid_bk // hkv
    kvh = pid_bk % hkv
    r = tl.arange(0, BLOCK_R)
    sp = tl.arange(0, BLOCK_S)
    idx = ((pid_l * tl.num_programs(0) + pid_bk) * n_splits + sp[:, None]) * BLOCK_R + r[None, :]
    ok = sp[:, None] < n_splits
    m = tl.load(PM + idx, mask=ok, other=-1.0e30)
    a_s = tl.load(PA + idx, mask=ok, other=-1)
    m_top = tl.max(m, axis=0)
    best = (m == m_top[None, :]) & (a_s >= 0)
    a_i = tl.min(tl.where(best, a_s, 2147483647), axis=0)
    a_i = tl.where(a_i == 2147483647, -1, a_i)
    row_ok = r < group
    h = kvh * group + r
    out = (pid_l * tl.num_programs(0) + b * hkv) * group + h
    pos = a_i.to(tl.int64) + key_start
    if HAS_SKIP:
        pos = tl.where(tl.load(SKIP + b) != 0, -1, pos)
    tl.store(OUT + out, pos, mask=row_ok)


def decode_argmax_layers(
    queries: list[Float[Tensor, "b hq 1 d"]],
    keys: list[Float[Tensor, "b hkv nk d"]],
    key_start: int = 0,
    skip_rows: Bool[Tensor, " b"] | None = None,
) -> Int64[Tensor, "layers b hq"]:
    """Argmax key of each query head's single query over its whole key cache, for several
    layers at once, plus ``key_start`` (the absolute position of key 0).

    Equal to ``attention_stats(q, k, key_stats=False).argmax[:, :, 0] + key_start`` of each
    layer on the split-K decode path (no mask beyond the cache, no softcap). All layers
    must share shapes, strides, dtype and device; queries and keys must have unit stride
    along ``d`` and stay alive until the launches are queued (they are not copied).
    ``skip_rows`` (on the keys' device) flags batch rows whose argmax is not wanted: they
    get -1 in every layer and head, and their keys are not read (no host sync: the flags
    are read by the kernels).
    """
    q0, k0 = queries[0], keys[0]
    n_layers = len(queries)
    b, hq, nq, d = q0.shape
    hkv, nk = k0.shape[1], k0.shape[2]
    if nq != 1 or len(keys) != n_layers or hq % hkv:
        raise ValueError(f"one query per head and a key tensor per layer; got {tuple(q0.shape)}")
    layout = (q0.shape, q0.stride(), k0.shape, k0.stride())
    for q, k in zip(queries, keys, strict=True):
        if (q.shape, q.stride(), k.shape, k.stride()) != layout:
            raise ValueError("every layer's q and k must share shapes and strides")
        if q.dtype != k0.dtype or k.dtype != k0.dtype or q.device != k0.device:
            raise ValueError("every layer's q and k must share dtype and device")
    if q0.stride(-1) != 1 or k0.stride(-1) != 1:
        raise ValueError("q and k need unit stride along the head dimension")
    dev = k0.device
    if skip_rows is not None and (
        skip_rows.shape != (b,) or skip_rows.dtype != torch.bool or skip_rows.device != dev
    ):
        raise ValueError(f"skip_rows must be a [{b}] bool tensor on {dev}")
    out = torch.empty(n_layers, b, hq, dtype=torch.int64, device=dev)
    if nk == 0:
        out.fill_(key_start - 1)
        return out if skip_rows is None else out.masked_fill_(skip_rows.view(1, b, 1), -1)
    group = hq // hkv
    block_r = max(16, triton.next_power_of_2(group))
    block_n = 16 if interpreting() else 64
    # About four programs per SM over every (layer, batch row, kv head), whole key tiles.
    programs = n_layers * b * hkv
    splits = max(1, min(triton.cdiv(nk, block_n), triton.cdiv(4 * sm_count(dev), programs)))
    split_len = triton.cdiv(triton.cdiv(nk, splits), block_n) * block_n
    splits = triton.cdiv(nk, split_len)
    ptrs = [q.data_ptr() for q in queries] + [k.data_ptr() for k in keys]
    if dev.type == "cuda":
        # Pinned and queued without a host sync (the caching host allocator keeps the
        # buffer until the copy has run).
        table = torch.tensor(ptrs, dtype=torch.int64, pin_memory=True).to(dev, non_blocking=True)
    else:  # the interpreter reads CPU tensors
        table = torch.tensor(ptrs, dtype=torch.int64)
    n_part = programs * splits * block_r
    pm = torch.empty(n_part, dtype=torch.float32, device=dev)
    pa = torch.empty(n_part, dtype=torch.int32, device=dev)
    # Flags as bytes (a pointer the kernels read); any pointer when HAS_SKIP is off.
    skip = table if skip_rows is None else skip_rows.contiguous().view(torch.uint8)
    cfg = default_config(d, k0.dtype)
    precision = "ieee" if interpreting() else cfg.fp32_dot
    if k0.dtype != torch.float32:
        precision = "tf32"
    _argmax_split_kernel[(splits, b * hkv, n_layers)](
        table, k0, pm, pa, skip,
        n_layers, q0.stride(0), q0.stride(1), k0.stride(0), k0.stride(1), k0.stride(2),
        nk, hkv, group, split_len, splits,
        D=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_R=block_r, BLOCK_N=block_n,
        PRECISION=precision, UPCAST=interpreting() and k0.dtype == torch.bfloat16,
        HAS_SKIP=skip_rows is not None, num_warps=4, num_stages=3,
    )  # fmt: skip
    _argmax_combine_kernel[(b * hkv, n_layers)](
        pm, pa, out, skip, hkv, group, splits, key_start,
        BLOCK_R=block_r, BLOCK_S=max(2, triton.next_power_of_2(splits)),
        HAS_SKIP=skip_rows is not None, num_warps=4,
    )  # fmt: skip
    return out
