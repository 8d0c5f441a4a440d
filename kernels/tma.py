"""2-D views of [b, heads, n, d] tensors that Hopper's bulk tensor copies (TMA) can address.

Shared by the kernels that load q, k (and v) by TMA over the model's own memory layout: the
fused forward (:mod:`headhunt.kernels.triton_fused`, :mod:`headhunt.kernels.gluon_fused`) and
the column pass (:mod:`headhunt.kernels.triton_columns`).
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor


def tma_view(t: Tensor) -> tuple[Tensor, int, int, int] | None:
    """A 2-D view of a [b, heads, n, d] tensor that bulk copies can address, with where head
    ``h`` of batch row ``i`` starts in it: row ``i * rb + h * rh``, column ``h * ch``, as
    ``(view, rb, rh, ch)``. Contiguous tensors view as [b * heads * n, d]; [b, n, heads, d]
    memory (what a model's projections give, viewed [b, heads, n, d]) as [b * n, heads * d].
    None for any other layout."""
    b, h, n, d = t.shape
    if t.is_contiguous():
        return t.view(b * h * n, d), h * n, n, 0
    if t.transpose(1, 2).is_contiguous():
        return t.transpose(1, 2).reshape(b * n, h * d), n, 0, d
    return None


def tma_views(*tensors: Tensor) -> list[tuple[Tensor, int, int, int]] | None:
    """:func:`tma_view` of every tensor when TMA can take them all: a CUDA card of compute
    capability 9 or more, a head size that is a power of two (at least 16), every view
    16-byte aligned; else None (the caller loads by pointers)."""
    t0 = tensors[0]
    d = t0.shape[-1]
    if (
        not t0.is_cuda
        or d < 16
        or d & (d - 1)
        or torch.cuda.get_device_capability(t0.device)[0] < 9
    ):
        return None
    views = [tma_view(t) for t in tensors]
    if any(v is None or v[0].data_ptr() % 16 for v in views):
        return None
    return views


@cache
def _descriptors_available() -> bool:
    """Whether this Triton has ``triton.tools.tensor_descriptor`` (older ones do not)."""
    try:
        import triton.tools.tensor_descriptor  # noqa: F401
    except ImportError:
        return False
    return True
