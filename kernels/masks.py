"""Which keys each query row sees: one interval of key indices per row.

Every mask :func:`headhunt.kernels.attention_stats` supports (causal, a sliding window,
chunked attention, padding and any other per-row limit given as ``key_lo`` / ``key_hi``)
leaves each query row a contiguous run of visible keys, so one ``[lo, hi]`` pair per row
describes it exactly. Both backends work from these bounds: the torch reference scores
only the keys between a block's lowest ``lo`` and highest ``hi``, the Triton kernels skip
every key tile outside them, so the work scales with the visible keys.

Positions follow the transformers mask functions (``masking_utils``): query ``i`` sits at
position ``p = q_offset + i`` counted from key 0 and

- causal: key ``j`` is visible when ``j <= p`` (``causal_mask_function``);
- sliding window ``w``: also ``j > p - w`` (``sliding_window_overlay``), i.e. the row sees
  its own key and the ``w - 1`` before it;
- chunk ``c``: also ``j // c == p // c`` (``chunked_overlay`` with no left padding; that
  overlay shifts the chunk boundaries by each row's left padding, which callers express
  through ``key_lo`` instead);
- ``key_lo[b, i] <= j <= key_hi[b, i]`` (padding, or any per-row limit).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int64
from torch import Tensor

__all__ = ["key_visible_counts", "row_key_bounds"]


def row_key_bounds(
    b: int,
    nq: int,
    nk: int,
    *,
    causal: bool,
    q_offset: int,
    window: int | None = None,
    chunk: int | None = None,
    key_lo: Int64[Tensor, "b nq"] | None = None,
    key_hi: Int64[Tensor, "b nq"] | None = None,
    device: torch.device | None = None,
) -> tuple[Int64[Tensor, "b nq"], Int64[Tensor, "b nq"]]:
    """First and last visible key index of every query row (see the module docstring).

    Args:
        b: Batch size.
        nq: Number of queries.
        nk: Number of keys.
        causal: Whether key ``j`` must satisfy ``j <= q_offset + i``.
        q_offset: Position of query 0 minus position of key 0.
        window: Sliding-window size (keys ``j > p - window``); needs ``causal``.
        chunk: Chunk size (``j // chunk == p // chunk``); needs ``causal``.
        key_lo: Per-row first visible key (inclusive), or None for 0.
        key_hi: Per-row last visible key (inclusive), or None for ``nk - 1``.
        device: Device of the result (that of ``key_lo`` / ``key_hi`` when given).

    Returns:
        ``(lo, hi)``, int64 ``[b, nq]``, clipped to ``[0, nk - 1]``. A row that sees no key
        gets ``lo = nk`` and ``hi = -1`` (so it falls outside every key range).
    """
    if key_lo is not None:
        device = key_lo.device
    elif key_hi is not None:
        device = key_hi.device
    pos = torch.arange(nq, device=device, dtype=torch.int64) + q_offset
    lo = torch.zeros_like(pos)
    hi = torch.full_like(pos, nk - 1)
    if causal:
        hi = torch.minimum(hi, pos)
    if window is not None:
        lo = torch.maximum(lo, pos - window + 1)
    if chunk is not None:
        lo = torch.maximum(lo, torch.div(pos, chunk, rounding_mode="floor") * chunk)
    lo = lo.expand(b, nq)
    hi = hi.expand(b, nq)
    if key_lo is not None:
        lo = torch.maximum(lo, key_lo.to(torch.int64))
    if key_hi is not None:
        hi = torch.minimum(hi, key_hi.to(torch.int64))
    empty = lo > hi
    lo = torch.where(empty, nk, lo).contiguous()
    hi = torch.where(empty, -1, hi).contiguous()
    return lo, hi


def key_visible_counts(
    lo: Int64[Tensor, "b nq"], hi: Int64[Tensor, "b nq"], nk: int
) -> Float[Tensor, "b nk"]:
    """Number of query rows that see each key (the ``col_mean`` normaliser).

    A difference array: +1 at each row's ``lo``, -1 after its ``hi``, then a running sum,
    so the cost is ``O(nq + nk)`` per batch row.

    Args:
        lo: First visible key per row, from :func:`row_key_bounds`.
        hi: Last visible key per row (``lo > hi`` for a row that sees nothing).
        nk: Number of keys.

    Returns:
        Float32 ``[b, nk]`` counts.
    """
    seen = (lo <= hi).to(torch.int64)
    diff = torch.zeros(lo.shape[0], nk + 1, dtype=torch.int64, device=lo.device)
    diff.scatter_add_(1, lo.clamp(0, nk), seen)
    diff.scatter_add_(1, (hi + 1).clamp(0, nk), -seen)
    return diff[:, :nk].cumsum(1).to(torch.float32)
