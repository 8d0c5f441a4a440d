"""Blocked PyTorch reference for per-head attention statistics.

The reference never builds the full ``nq x nk`` score matrix: it walks over blocks of
``block_q`` queries and, for every kv head, scores the whole GQA group of that block in
one matrix product (``[group * block_q, d] @ [d, nk]``). The largest intermediate is
therefore ``b * hq * block_q * nk`` floats, i.e. linear in the sequence length.

It runs on any device (CPU is the main target: it is the CPU backend of
:func:`headhunt.kernels.attention_stats` and the oracle the Triton kernels are tested
against) and always computes in float32, whatever the input dtype.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Int64
from torch import Tensor

from .masks import key_visible_counts
from .types import AttentionStats
from .variant import AttentionVariant

__all__ = [
    "attention_forward_torch",
    "attention_stats_torch",
    "default_block_q",
    "visible_query_count",
]

# Target size (in float32 elements) of one block of scores on CPU. 2**20 floats = 4 MiB
# keeps the score block close to L2/L3 on small CPUs, so the five element-wise passes
# over it (max, sub, exp, sum, column product) mostly hit the cache instead of DRAM.
_CPU_BLOCK_ELEMS = 1 << 20
# On GPUs the passes are bandwidth-bound anyway and launches cost ~10 us each, so use
# far bigger blocks (2**26 floats = 256 MiB per block).
_GPU_BLOCK_ELEMS = 1 << 26
# Width of the chunks of the chunked argmax (see _chunked_max).
_CHUNK = 64
_LOG2E = 1.0 / math.log(2.0)
_LN2 = math.log(2.0)


def _chunked_max(
    s: Float[Tensor, "*rows n"],
) -> tuple[Float[Tensor, "*rows"], Int64[Tensor, "*rows"]]:
    """Row maximum and first index of it, with n a multiple of _CHUNK.

    ``torch.max(dim=-1)`` with indices runs ~20x slower on CPU than ``amax``. Taking the
    max of each chunk of _CHUNK columns, the argmax over chunk maxima (the first chunk
    holding the row max) and then the first hit inside that chunk gives the same
    lowest-index answer for ~1/6 of the cost.
    """
    *lead, n = s.shape
    chunks = s.view(*lead, n // _CHUNK, _CHUNK)
    m, ci = chunks.amax(dim=-1).max(dim=-1)
    gather_idx = ci.view(*lead, 1, 1).expand(*lead, 1, _CHUNK)
    best = chunks.gather(-2, gather_idx).squeeze(-2)  # [*rows, _CHUNK]
    # argmax on a uint8 0/1 tensor returns the first 1, i.e. the lowest tied index.
    within = (best == m.unsqueeze(-1)).to(torch.uint8).argmax(dim=-1)
    return m, ci * _CHUNK + within


def _block_width(lo: torch.Tensor, hi: torch.Tensor, i0: int, i1: int) -> int:
    """Keys scored for query rows [i0, i1): from the lowest first visible key to the highest
    last one over the block's rows (``lo`` / ``hi``: [batch, nq] interval bounds on the CPU)."""
    return max(1, int(hi[:, i0:i1].max()) - int(lo[:, i0:i1].min()) + 1)


def default_block_q(rows_per_query: int, nk: int, device: torch.device) -> int:
    """Pick the query-block length for the blocked reference.

    Args:
        rows_per_query: Score rows produced per query position and block
            (``batch * hq``: every query head of every batch row).
        nk: Number of keys (columns of one score row).
        device: Device the computation runs on.

    Returns:
        Number of query positions per block (at least 16, a multiple of 16).
    """
    budget = _GPU_BLOCK_ELEMS if device.type == "cuda" else _CPU_BLOCK_ELEMS
    block = budget // max(1, rows_per_query * max(nk, 1))
    return max(16, (block // 16) * 16)


def visible_query_count(
    nq: int, nk: int, *, causal: bool, q_offset: int, device: torch.device | None = None
) -> Float[Tensor, " nk"]:
    """Number of queries that can see each key (the ``s_j`` normaliser of ``col_mean``).

    With bottom-right causal alignment, query ``i`` sits at position ``q_offset + i`` and
    sees keys ``0 .. q_offset + i``, so key ``j`` is seen by the queries with
    ``i >= j - q_offset``: ``count_j = nq - clamp(j - q_offset, 0, nq)``.

    Args:
        nq: Number of queries.
        nk: Number of keys.
        causal: Whether the causal mask applies (otherwise every query sees every key).
        q_offset: Absolute position of query 0.
        device: Device of the returned tensor.

    Returns:
        Float32 tensor of length ``nk`` with the count of queries that see each key.
    """
    if not causal:
        return torch.full((nk,), float(nq), dtype=torch.float32, device=device)
    j = torch.arange(nk, device=device, dtype=torch.int64)
    return (nq - (j - q_offset).clamp(0, nq)).to(torch.float32)


def _alibi_bias(
    variant: AttentionVariant, hkv: int, group: int, rows: Tensor, cols: Tensor
) -> Float[Tensor, "1 hkv group rows cols"] | None:
    """ALiBi's linear bias ``slope_h * (j - p_i)`` (Press et al. 2022) for query rows
    ``rows`` (indices) and key columns ``cols``, natural units, float32; None without
    slopes. ``p_i = q_offset + i`` is the query's position counted from key 0."""
    slopes = variant.alibi_slopes
    if slopes is None:
        return None
    dist = cols.view(1, -1).float() - (rows.view(-1, 1) + variant.q_offset).float()
    return slopes.to(cols.device, torch.float32).view(1, hkv, group, 1, 1) * dist


def _bias_block(
    variant: AttentionVariant, hkv: int, group: int, i0: int, i1: int, c0: int, c1: int
) -> Float[Tensor, "bb hkv group rows cols"] | None:
    """Rows ``[i0, i1)`` and key columns ``[c0, c1)`` of the variant's additive ``bias``, as
    float32 grouped like the scores (a head dimension of 1 stays 1, broadcast); None without
    a bias. Only this block is converted: the whole bias is never copied."""
    bias = variant.bias
    if bias is None:
        return None
    blk = bias[:, :, i0:i1, c0:c1]
    heads = (hkv, group) if bias.shape[1] > 1 else (1, 1)
    return blk.reshape(blk.shape[0], *heads, *blk.shape[2:]).float()


def attention_stats_torch(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    variant: AttentionVariant | None = None,
    *,
    key_stats: bool = True,
    entropy: bool = False,
    block_q: int | None = None,
) -> AttentionStats:
    """Blocked PyTorch implementation of :func:`headhunt.kernels.attention_stats`.

    Args:
        q: Queries, ``[batch, query heads, queries, head dim]``.
        k: Keys, ``[batch, kv heads, keys, head dim]``; ``hq`` must be a multiple of
            ``hkv`` (query head ``h`` reads kv head ``h // (hq // hkv)``).
        variant: The mask and score options (validated by the caller,
            :meth:`AttentionVariant.checked`; default: the plain causal mask).
        key_stats: Also compute ``col_sum`` and ``col_mean`` (per-key statistics).
        entropy: Also compute the per-query entropy (nats).
        block_q: Query positions per block; the largest intermediate holds about
            ``batch * hq * block_q * (visible keys of the block)`` floats. Defaults to
            an adaptive size that keeps each block near a device-dependent element
            budget (see :func:`default_block_q`).

    Returns:
        The statistics, all float32 except ``argmax`` (int64), on ``q``'s device.
    """
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    group = hq // hkv
    variant = (variant or AttentionVariant()).resolved(q, k)
    scale, softcap, sinks = variant.scale, variant.softcap, variant.sinks
    dev = q.device
    rows_per_query = b * hq

    f32 = torch.float32
    lse = torch.full((b, hq, nq), -math.inf, dtype=f32, device=dev)
    max_score = torch.full((b, hq, nq), -math.inf, dtype=f32, device=dev)
    argmax = torch.full((b, hq, nq), -1, dtype=torch.int64, device=dev)
    ent = torch.zeros((b, hq, nq), dtype=f32, device=dev) if entropy else None
    col_sum = torch.zeros((b, hq, nk), dtype=f32, device=dev) if key_stats else None

    # Views grouping the query heads that share a kv head: [b, hkv, group, n].
    lse_g = lse.view(b, hkv, group, nq)
    max_g = max_score.view(b, hkv, group, nq)
    arg_g = argmax.view(b, hkv, group, nq)
    ent_g = ent.view(b, hkv, group, nq) if ent is not None else None
    col_g = col_sum.view(b, hkv, group, nk) if col_sum is not None else None
    # Sink logits in log2 units, [1, hkv, group, 1] against the [b, hkv, group, nb] rows.
    sink2 = None
    if sinks is not None:
        sink2 = (sinks.to(device=dev, dtype=f32) * _LOG2E).view(1, hkv, group, 1)
        # Rows that see no key keep only the sink: lse = sink, entropy 0.
        lse_g.copy_((sink2 * _LN2).expand_as(lse_g))
    # A sink logit per query row instead (Inkling 2), [1 or b, hkv, group, nq], log2 units.
    rows2 = None
    if variant.row_sinks is not None:
        rs = variant.row_sinks.to(device=dev, dtype=f32)
        rows2 = (rs * _LOG2E).reshape(rs.shape[0], hkv, group, nq)
        lse_g.copy_((rows2 * _LN2).expand_as(lse_g))

    # Visible keys of each row as one interval; block bounds are read on the CPU copy.
    lo, hi = variant.row_bounds(b, nq, nk, device=dev)
    lo_c, hi_c = lo.cpu(), hi.cpu()
    seen_c = lo_c <= hi_c
    span_c = torch.where(seen_c, hi_c - lo_c + 1, 0).amax(0)  # [nq] widest row over batch

    # Scores are computed in log2 units (s2 = s * log2(e)) because exp2 is about twice
    # as fast as exp on CPU; log2(e) and the scale are folded into q once (O(n d)).
    # With a softcap the tanh needs natural units first, so only the scale is folded.
    q_mult = scale if softcap is not None else scale * _LOG2E
    qs = (q.to(f32) * q_mult).view(b, hkv, group, nq, d)
    # Keys are zero-padded to a multiple of _CHUNK so that every score row splits into
    # whole chunks for the chunked argmax below; padded columns are masked to -inf.
    nk_pad = -(-nk // _CHUNK) * _CHUNK
    kt = torch.zeros((b, hkv, d, nk_pad), dtype=f32, device=dev)
    kt[..., :nk] = k.to(f32).transpose(-1, -2)  # K^T, read by matmul as [d, keys]

    i0 = 0
    while i0 < nq:
        if block_q is not None:
            nb = block_q
        else:
            # Adaptive block: rows that see few keys (early causal rows, windows) allow
            # more queries per block.
            seen = min(nk, int(span_c[i0]) + 16)
            nb = default_block_q(rows_per_query, max(seen, _CHUNK), dev)
            # The block's rows see more keys than its first (causal rows grow): halve it
            # until the keys it scores fit the same budget, so no block is quadratic.
            budget = default_block_q(rows_per_query, _CHUNK, dev) * _CHUNK
            while nb > 16 and nb * _block_width(lo_c, hi_c, i0, min(i0 + nb, nq)) > budget:
                nb = max(16, nb // 2 // 16 * 16)
        i1 = min(i0 + nb, nq)
        nb = i1 - i0
        rows_seen = seen_c[:, i0:i1]
        if not rows_seen.any():
            i0 = i1  # no row of the block sees a key: the defaults above stand
            continue
        # Score only the keys some row of the block sees (from a _CHUNK boundary).
        lo_blk, hi_blk = lo_c[:, i0:i1][rows_seen], hi_c[:, i0:i1][rows_seen]
        c0 = int(lo_blk.min()) // _CHUNK * _CHUNK
        c1 = c0 + -(-(int(hi_blk.max()) + 1 - c0) // _CHUNK) * _CHUNK
        qb = qs[:, :, :, i0:i1].reshape(b, hkv, group * nb, d)
        s = torch.matmul(qb, kt[..., c0:c1]).view(b, hkv, group, nb, c1 - c0)
        bias = _alibi_bias(
            variant, hkv, group, torch.arange(i0, i1, device=dev), torch.arange(c0, c1, device=dev)
        )
        if bias is not None:  # scores are in log2 units here unless a softcap follows
            s.add_(bias if softcap is not None else bias * _LOG2E)
        extra = _bias_block(variant, hkv, group, i0, i1, c0, min(c1, nk))
        if extra is not None:  # the model's own bias; key columns past nk are padding
            w = extra.shape[-1]
            s[..., :w].add_(extra if softcap is not None else extra * _LOG2E)
        if softcap is not None:
            # Gemma 2 eager: scores -> softcap * tanh(scores / softcap), then the mask.
            s.div_(softcap).tanh_().mul_(softcap * _LOG2E)
        # Columns [full_lo, full_hi] are visible to every row of the block; only the
        # strips outside them need a mask (all of it if some row sees nothing).
        if rows_seen.all():
            full_lo, full_hi = int(lo_blk.max()), int(hi_blk.min())
        else:
            full_lo, full_hi = c1, c1 - 1
        strips = []
        for a, e in ((c0, min(full_lo, c1)), (max(full_hi + 1, full_lo, c0), c1)):
            if a < e:
                cols = torch.arange(a, e, device=dev).view(1, 1, -1)
                out = (cols < lo[:, i0:i1, None]) | (cols > hi[:, i0:i1, None])
                strips.append((slice(a - c0, e - c0), out.view(b, 1, 1, nb, e - a)))
        for cs, out in strips:
            s[..., cs].masked_fill_(out, -math.inf)
        m, idx = _chunked_max(s)
        empty = m == -math.inf
        max_g[..., i0:i1] = m * _LN2
        arg_g[..., i0:i1] = torch.where(empty, -1, idx + c0)
        m = m.masked_fill(empty, 0.0)  # empty rows: s - 0 = -inf, so e = 0 and l = 0
        s.sub_(m.unsqueeze(-1))  # s - m <= 0, so exp2 never overflows
        if ent_g is not None:
            e = torch.exp2(s)
            # 0 * (-inf) would poison the dot below; masked entries carry e = 0.
            for cs, out in strips:
                s[..., cs].masked_fill_(out, 0.0)
            # sum_j e_j (s_j - m) as a batched dot product: one pass, no temporary.
            t = torch.matmul(e.unsqueeze(-2), s.unsqueeze(-1)).view(m.shape)
        else:
            e = s.exp2_()
            t = torch.zeros_like(m)
        l_sum = e.sum(dim=-1)
        block_sink = sink2 if rows2 is None else rows2[..., i0:i1]
        if block_sink is not None:
            # One more logit per row: rebase (m, l, t) to M = max(m, sink) and add the
            # sink's term e_s = 2**(sink - M), for the sum and for the entropy.
            m_top = torch.maximum(m.masked_fill(empty, -math.inf), block_sink)
            alpha = torch.exp2(m - m_top).masked_fill(empty, 0.0)
            e_sink = torch.exp2(block_sink - m_top)
            t = alpha * (t + (m - m_top) * l_sum) + e_sink * (block_sink - m_top)
            l_sum = alpha * l_sum + e_sink
            m = m_top
        else:
            alpha = None
        log2_l = torch.log2(l_sum)
        lse_g[..., i0:i1] = (m + log2_l) * _LN2
        if ent_g is not None:
            # H = -sum p ln p = ln l - ln2 * sum_j e_j (s2_j - m2) / l, with p = e / l.
            h = (log2_l - t / l_sum) * _LN2
            ent_g[..., i0:i1] = torch.where(l_sum > 0, h, 0.0)
        if col_g is not None:
            # sum_i p_ij = sum_i e_ij * w_i: a vector-matrix product per head, where
            # w = 1 / l (times the rebase factor with a sink; 0 for empty rows).
            w = torch.where(l_sum > 0, l_sum.reciprocal(), 0.0)
            if alpha is not None:
                w = w * alpha
            c_end = min(c1, nk)
            col_g[..., c0:c_end] += torch.matmul(w.unsqueeze(-2), e).squeeze(-2)[..., : c_end - c0]
        i0 = i1

    col_mean = None
    if col_sum is not None:
        count = key_visible_counts(lo, hi, nk).unsqueeze(1)  # [b, 1, nk]
        col_mean = torch.where(count > 0, col_sum / count.clamp_min(1.0), 0.0)
    return AttentionStats(
        lse=lse,
        max_score=max_score,
        argmax=argmax,
        entropy=ent,
        col_sum=col_sum,
        col_mean=col_mean,
    )


def attention_probs_at_torch(
    q: Tensor, k: Tensor, lse: Tensor, query_idx: Tensor, key_idx: Tensor,
    variant: AttentionVariant | None = None,
) -> Float[Tensor, "b hq m"]:  # fmt: skip
    """Gather-based implementation of :func:`headhunt.kernels.attention_probs_at`.

    Only the ``m`` requested query and key rows are gathered (``O(m d)`` memory); the
    variant's sink logits are already part of ``lse``.
    """
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    group = hq // hkv
    variant = (variant or AttentionVariant()).resolved(q, k)
    scale, softcap = variant.scale, variant.softcap
    dev = q.device
    if query_idx.dim() == 1:
        query_idx = query_idx.view(1, 1, -1).expand(b, hq, -1)
        key_idx = key_idx.view(1, 1, -1).expand(b, hq, -1)
    bi = torch.arange(b, device=dev).view(b, 1, 1)
    hi = torch.arange(hq, device=dev).view(1, hq, 1)
    qi = query_idx.to(dev)
    ki = key_idx.to(dev)
    # Advanced indexing gathers [b, hq, m, d] rows; the kv head of query head h is
    # h // group, so no repeated copy of k is ever made.
    q_rows = q[bi, hi, qi].to(torch.float32)
    k_rows = k[bi, hi // group, ki.clamp(0, max(nk - 1, 0))].to(torch.float32)
    s = (q_rows * k_rows).sum(-1) * scale
    if variant.alibi_slopes is not None:
        slope = variant.alibi_slopes.to(dev, torch.float32).view(1, hq, 1)
        s = s + slope * (ki - (qi + variant.q_offset)).float()
    if variant.bias is not None:  # the model's bias at each pair, gathered
        bias = variant.bias
        bb = bi if bias.shape[0] > 1 else torch.zeros_like(bi)
        hb = hi if bias.shape[1] > 1 else torch.zeros_like(hi)
        s = s + bias[bb, hb, qi, ki.clamp(0, max(nk - 1, 0))].float()
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    lse_rows = torch.gather(lse.to(torch.float32), 2, qi)
    lo, hi_key = variant.row_bounds(b, nq, nk, device=dev)
    allowed = (ki >= lo[bi, qi]) & (ki <= hi_key[bi, qi])
    # A row that sees no key has lse = -inf (or its sink logit); every pair of it is
    # forbidden anyway, and the where() keeps exp(+inf) out of the result.
    return torch.where(allowed, torch.exp(s - lse_rows), 0.0)


def attention_forward_torch(
    q: Tensor, k: Tensor, v: Tensor, variant: AttentionVariant | None = None, *,
    key_stats: bool = True, entropy: bool = False, block_q: int | None = None,
) -> tuple[Float[Tensor, "b hq nq dv"], AttentionStats]:  # fmt: skip
    """Blocked PyTorch implementation of :func:`headhunt.kernels.attention_forward`.

    Two passes, unlike the fused Triton kernel (which is tested against it): the
    statistics of :func:`attention_stats_torch`, then ``out_i = sum_j p_ij v_j`` with
    ``p_ij = exp(s_ij - lse_i)`` from those statistics' ``lse`` (so the sink logit's
    share is left out of the output, as gpt-oss' eager attention drops the sink column).
    A row that sees no key gets a zero output. Computed in float32, returned in ``v``'s
    dtype; memory stays linear in the sequence length (blocks of ``block_q`` queries).
    """
    variant = (variant or AttentionVariant()).resolved(q, k)
    stats = attention_stats_torch(
        q, k, variant, key_stats=key_stats, entropy=entropy, block_q=block_q
    )
    b, hq, nq, d = q.shape
    hkv, nk, dv = k.shape[1], k.shape[2], v.shape[-1]
    group = hq // hkv
    scale, softcap = variant.scale, variant.softcap
    dev, f32 = q.device, torch.float32
    lo, hi = variant.row_bounds(b, nq, nk, device=dev)
    out = torch.zeros(b, hkv, group, nq, dv, dtype=f32, device=dev)
    kf, vf = k.to(f32), v.to(f32)
    qg = q.to(f32).view(b, hkv, group, nq, d)
    lse_g = stats.lse.view(b, hkv, group, nq)
    nb = block_q or default_block_q(b * hq, max(nk, 1), dev)
    cols = torch.arange(nk, device=dev)
    for i0 in range(0, nq, nb):
        i1 = min(i0 + nb, nq)
        s = torch.matmul(qg[:, :, :, i0:i1], kf.unsqueeze(2).transpose(-1, -2)) * scale
        bias = _alibi_bias(variant, hkv, group, torch.arange(i0, i1, device=dev), cols)
        if bias is not None:
            s = s + bias
        extra = _bias_block(variant, hkv, group, i0, i1, 0, nk)
        if extra is not None:
            s = s + extra
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        seen = (cols >= lo[:, i0:i1, None]) & (cols <= hi[:, i0:i1, None])  # [b, rows, nk]
        seen = seen.view(b, 1, 1, i1 - i0, nk)
        # Masked entries (and every entry of a row without keys, lse = -inf) give 0.
        p = torch.where(seen, torch.exp(s - lse_g[..., i0:i1, None]), 0.0)
        out[:, :, :, i0:i1] = torch.matmul(p, vf.unsqueeze(2))
    return out.view(b, hq, nq, dv).to(v.dtype), stats
