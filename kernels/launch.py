"""Launching the Triton kernels: one call's arguments prepared once, outputs allocated, the
kernel families chosen and run (the role of ``interface.py`` in flash-attention's
``flash_attn/cute``, Dao-AILab/flash-attention).

:func:`attention_stats_triton` runs the row statistics (:mod:`~headhunt.kernels.triton_rows`,
or for a few queries over a long cache the split-K kernels of
:mod:`~headhunt.kernels.triton_decode`) and then the column pass
(:mod:`~headhunt.kernels.triton_columns`); :func:`attention_forward_triton` runs the fused
forward (:mod:`~headhunt.kernels.triton_fused`, on Hopper its Gluon fast path) and then the same
column pass. Each family's module launches its own kernels from the :class:`Launch` prepared
here.

Importing this module imports Triton; :mod:`headhunt.kernels` only does so lazily.
Set ``TRITON_INTERPRET=1`` before importing Triton to run the kernels on CPU tensors.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from .config import KernelConfig, default_config, fused_config, interpreting
from .tma import tma_views
from .triton_columns import launch_columns
from .triton_decode import DECODE_MAX_ROWS, DECODE_MIN_KEYS, launch_decode
from .triton_fused import launch_fused
from .triton_rows import launch_rows
from .types import AttentionStats
from .variant import AttentionVariant

__all__ = [
    "Launch",
    "alloc",
    "attention_forward_triton",
    "attention_stats_triton",
    "prepare",
]

# Tests set this to True: outputs are then allocated filled with NaN (argmax with a
# sentinel) instead of torch.empty, so any element a kernel forgets to write shows up.
POISON_OUTPUTS = False
ARGMAX_POISON = -7

_LOG2E = 1.0 / math.log(2.0)


def alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An output tensor (poisoned when :data:`POISON_OUTPUTS` is set)."""
    if not POISON_OUTPUTS:
        return torch.empty(shape, dtype=dtype, device=device)
    fill = ARGMAX_POISON if dtype == torch.int64 else float("nan")
    return torch.full(shape, fill, dtype=dtype, device=device)


@dataclass(frozen=True)
class Launch:
    """Arguments shared by the kernel launches of one call (prepared once by
    :func:`prepare`).

    ``variant`` is resolved (``scale`` and ``q_offset`` set). ``lo`` / ``hi`` (int32
    ``[b, nq]``) are the per-row key intervals when a window, a chunk or ``key_lo`` /
    ``key_hi`` is given (the kernels then skip tiles by them; see :meth:`with_bounds`); None
    for the plain causal / full masks, which the kernels derive from ``q_offset``.
    """

    q: Tensor
    k: Tensor
    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int
    variant: AttentionVariant
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
    alibi: Tensor | None = None  # float32 [hq]: ALiBi slopes over the scale (raw-product units)

    @property
    def causal(self) -> bool:
        return self.variant.causal

    @property
    def q_offset(self) -> int:
        return self.variant.q_offset

    @property
    def group(self) -> int:
        """Query heads per kv head (GQA)."""
        return self.hq // self.hkv

    @property
    def strides(self) -> tuple[int, ...]:
        """q's then k's batch, head and row strides: the kernels' six stride arguments."""
        return (*self.q.stride()[:3], *self.k.stride()[:3])

    @property
    def sizes_and_scales(self) -> tuple:
        """``(nq, nk, q_offset, hq, group, qk_scale, softcap_in, softcap_out)``, the scalar
        arguments of the row, general column and fused kernels, in their order."""
        return (self.nq, self.nk, self.q_offset, self.hq, self.group, self.qk_scale,
                self.softcap_in, self.softcap_out)  # fmt: skip

    @property
    def block_d(self) -> int:
        """The head-dimension tile: ``d`` rounded up to a power of two, at least 16."""
        return max(16, 1 << (self.d - 1).bit_length())

    def with_bounds(self) -> Launch:
        """This launch with the per-row key intervals the row and column passes use, when
        the variant limits rows beyond the plain causal / full mask (computed once, on q's
        device)."""
        if self.lo is not None or not self.variant.has_intervals:
            return self
        lo, hi = self.variant.row_bounds(self.b, self.nq, self.nk, device=self.q.device)
        return dataclasses.replace(self, lo=lo.to(torch.int32), hi=hi.to(torch.int32))

    def operands(self, q_rows: int, k_rows: int, use: bool):
        """q and k as the row and general column kernels take them: tensors, or TMA
        descriptors over the flattened [b * heads * n, d] tensors with [rows, d] blocks."""
        if not (use and self.tma):
            return self.q, self.k
        from triton.tools.tensor_descriptor import TensorDescriptor

        q2, k2 = self.q.view(-1, self.d), self.k.view(-1, self.d)
        return (
            TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [q_rows, self.d]),
            TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [k_rows, self.d]),
        )


def prepare(
    q: Tensor, k: Tensor, variant: AttentionVariant | None, config: KernelConfig | None
) -> Launch:
    """The :class:`Launch` of one call: the variant resolved, k in q's dtype, unit stride
    along d, the configuration (default: :func:`~headhunt.kernels.config.default_config`),
    the dot precision and whether TMA can load q and k."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    if q.device.type != "cuda" and not interpreting():
        raise RuntimeError("the Triton backend needs CUDA tensors (or TRITON_INTERPRET=1)")
    variant = (variant or AttentionVariant()).resolved(q, k)
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
    precision = "tf32"
    if q.dtype == torch.float32:
        precision = "ieee" if interpreting() else cfg.fp32_dot
    # The interpreter stores bf16 as uint16 and its tl.dot multiplies those integers
    # (triton 3.9 interpreter.create_dot); exact fp32 products of the same bf16 values
    # are what the tensor cores compute, so upcast the tiles there.
    upcast = interpreting() and q.dtype == torch.bfloat16
    # The row and general column kernels' bulk tensor copies (TMA) take contiguous
    # [b, heads, n, d] tensors flattened to [b * heads * n, d] (tma_view's view of them).
    tma = (
        not interpreting()
        and q.is_contiguous()
        and k.is_contiguous()
        and tma_views(q, k) is not None
    )
    scale, softcap, sinks = variant.scale, variant.softcap, variant.sinks
    slopes = variant.alibi_slopes
    key_lo, key_hi = variant.key_lo, variant.key_hi
    variant = dataclasses.replace(
        variant,
        key_lo=None if key_lo is None else key_lo.contiguous(),
        key_hi=None if key_hi is None else key_hi.contiguous(),
    )
    return Launch(
        q=q,
        k=k,
        b=b,
        hq=hq,
        hkv=hkv,
        nq=nq,
        nk=nk,
        d=d,
        variant=variant,
        qk_scale=scale * _LOG2E,
        precision=precision,
        upcast=upcast,
        tma=tma,
        cfg=cfg,
        softcap_in=scale / softcap if softcap is not None else 0.0,
        softcap_out=softcap / scale if softcap is not None else 0.0,
        sinks=None if sinks is None else sinks.to(device=q.device, dtype=torch.float32),
        alibi=None if slopes is None else (slopes.to(q.device, torch.float32) / scale).contiguous(),
    )


def _row_outputs(L: Launch, entropy: bool) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """lse, max_score, argmax and (with ``entropy``) entropy outputs, [b, hq, nq]."""
    dev, shape = L.q.device, (L.b, L.hq, L.nq)
    lse = alloc(shape, torch.float32, dev)
    mx = alloc(shape, torch.float32, dev)
    arg = alloc(shape, torch.int64, dev)
    ent = alloc(shape, torch.float32, dev) if entropy else None
    return lse, mx, arg, ent


def _column_pass(L: Launch, lse: Tensor) -> tuple[Tensor, Tensor]:
    """col_sum and col_mean from every row's final lse (one more pass over the keys)."""
    L = L.with_bounds()
    col_sum = alloc((L.b, L.hq, L.nk), torch.float32, L.q.device)
    col_mean = alloc((L.b, L.hq, L.nk), torch.float32, L.q.device)
    launch_columns(L, lse, col_sum, col_mean)
    return col_sum, col_mean


def attention_stats_triton(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    variant: AttentionVariant | None = None,
    *,
    key_stats: bool = True,
    entropy: bool = False,
    config: KernelConfig | None = None,
    decode: bool | None = None,
) -> AttentionStats:
    """Triton implementation of :func:`headhunt.kernels.attention_stats`.

    Args:
        q: Queries ``[batch, query heads, queries, head dim]`` on CUDA (or on CPU with
            ``TRITON_INTERPRET=1``).
        k: Keys ``[batch, kv heads, keys, head dim]`` on the same device.
        variant: The mask and score options (validated by the caller; default: the plain
            causal mask).
        key_stats: Run the second (column) pass for ``col_sum`` / ``col_mean``.
        entropy: Accumulate per-query entropy in the first pass.
        config: Tile sizes / warps / stages; defaults to
            :func:`~headhunt.kernels.config.default_config`.
        decode: Row statistics by the split-K decode kernels (one program per key split
            and kv head, all of its query heads' rows in one tile, then a combine) rather
            than the row kernel (one program per query tile and head, which leaves most
            of the GPU idle for a handful of queries). None: when there are at most
            ``DECODE_MAX_ROWS`` rows per kv head and ``DECODE_MIN_KEYS`` keys.

    Returns:
        The statistics (float32, int64 argmax) on ``q``'s device.
    """
    L = prepare(q, k, variant, config)
    lse, mx, arg, ent = _row_outputs(L, entropy)
    if decode is None:
        decode = L.nq * L.group <= DECODE_MAX_ROWS and L.nk >= DECODE_MIN_KEYS
    if decode:
        launch_decode(L, lse, mx, arg, ent)
    else:
        L = L.with_bounds()
        launch_rows(L, lse, mx, arg, ent)
    col_sum = col_mean = None
    if key_stats:
        col_sum, col_mean = _column_pass(L, lse)
    return AttentionStats(
        lse=lse, max_score=mx, argmax=arg, entropy=ent, col_sum=col_sum, col_mean=col_mean
    )


def attention_forward_triton(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    v: Float[Tensor, "b hkv nk d"],
    variant: AttentionVariant | None = None,
    *,
    key_stats: bool = True,
    entropy: bool = False,
    config: KernelConfig | None = None,
) -> tuple[Float[Tensor, "b hq nq d"], AttentionStats]:
    """Triton implementation of :func:`headhunt.kernels.attention_forward` (validated
    there): the attention output and the row statistics in one pass, then the column
    pass when ``key_stats``.

    Returns:
        ``(out, stats)``: ``out`` in ``v``'s dtype, ``[b, hq, nq, d]`` over ``[b, nq, hq,
        d]`` memory; the statistics as :func:`attention_stats` gives them.
    """
    L = prepare(q, k, variant, config or fused_config(q.shape[-1], q.dtype)).with_bounds()
    if v.dtype != L.q.dtype:
        v = v.to(L.q.dtype)
    if v.stride(-1) != 1:
        v = v.contiguous()
    lse, mx, arg, ent = _row_outputs(L, entropy)
    out = alloc((L.b, L.nq, L.hq, L.d), L.q.dtype, L.q.device).transpose(1, 2)
    if L.nq:
        launch_fused(L, v, out, lse, mx, arg, ent)
    col_sum = col_mean = None
    if key_stats:
        col_sum, col_mean = _column_pass(L, lse)
    stats = AttentionStats(
        lse=lse, max_score=mx, argmax=arg, entropy=ent, col_sum=col_sum, col_mean=col_mean
    )
    return out, stats
