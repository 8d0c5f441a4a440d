"""Public entry points: :func:`attention_stats` and :func:`attention_probs_at`."""

from __future__ import annotations

import math
from typing import Literal

import torch
from jaxtyping import Float, Int64
from torch import Tensor

from .reference import attention_probs_at_torch, attention_stats_torch
from .types import AttentionStats

__all__ = ["attention_probs_at", "attention_stats", "triton_available"]

Backend = Literal["auto", "torch", "triton"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The Triton kernels keep a whole head-dim row of q in registers (padded to a power of
# two); past 256 they would spill, so larger heads go to the torch backend.
_TRITON_MAX_HEAD_DIM = 256


def triton_available() -> bool:
    """Whether the Triton backend can be imported (Triton installed, importable)."""
    try:
        from . import triton_stats  # noqa: F401
    except ImportError:
        return False
    return True


def _check_qk(q: Tensor, k: Tensor) -> tuple[int, int, int, int, int, int]:
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q and k must be 4-D [b, h, n, d]; got {q.shape} and {k.shape}")
    b, hq, nq, d = q.shape
    bk, hkv, nk, dk = k.shape
    if b != bk or d != dk:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on b or d")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv})")
    if q.dtype not in _DTYPES or k.dtype not in _DTYPES:
        raise TypeError(f"q/k dtype must be one of {_DTYPES}; got {q.dtype}/{k.dtype}")
    if q.device != k.device:
        raise ValueError(f"q on {q.device} but k on {k.device}")
    return b, hq, nq, d, hkv, nk


def _pick_backend(backend: Backend, q: Tensor, d: int) -> Literal["torch", "triton"]:
    if backend == "torch":
        return "torch"
    if backend == "triton":
        return "triton"
    if backend != "auto":
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton'; got {backend!r}")
    if q.is_cuda and d <= _TRITON_MAX_HEAD_DIM and triton_available():
        return "triton"
    return "torch"


def attention_stats(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    *,
    causal: bool = True,
    scale: float | None = None,
    key_stats: bool = True,
    entropy: bool = False,
    q_offset: int | None = None,
    backend: Backend = "auto",
) -> AttentionStats:
    """Per-head attention statistics in linear memory (no ``nq x nk`` matrix).

    Scores are ``s_ij = scale * q_i . k_j`` (float32 accumulation whatever the input
    dtype) and ``p_ij = softmax_j(s_ij)`` over the keys query ``i`` can see.

    Causal alignment is bottom-right, like FlashAttention: query ``i`` sits at absolute
    position ``q_offset + i`` and sees keys ``0 .. q_offset + i``. With the default
    ``q_offset = nk - nq`` the last query sees every key (so decode with ``nq = 1``
    sees the whole cache). A row that sees no key (only possible with
    ``q_offset < 0``) gets ``lse = max_score = -inf``, ``argmax = -1``,
    ``entropy = 0`` and adds nothing to the key statistics.

    Args:
        q: Queries ``[batch, query heads, queries, head dim]``, bf16/fp16/fp32.
        k: Keys ``[batch, kv heads, keys, head dim]``; ``hq`` must be a multiple of
            ``hkv`` and query head ``h`` reads kv head ``h // (hq // hkv)`` (GQA).
            Statistics are per query head.
        causal: Apply the causal mask (bottom-right aligned).
        scale: Score scale (must be positive); defaults to ``1 / sqrt(head dim)``.
        key_stats: Also compute ``col_sum`` / ``col_mean`` (a second pass over the
            scores on the Triton backend).
        entropy: Also compute each query's entropy in nats.
        q_offset: Absolute position of query 0; defaults to ``nk - nq``.
        backend: ``"auto"`` (Triton for CUDA tensors when available, else torch),
            ``"torch"`` (blocked PyTorch, any device) or ``"triton"``.

    Returns:
        :class:`AttentionStats` on ``q``'s device; float32 except int64 ``argmax``.
    """
    b, hq, nq, d, hkv, nk = _check_qk(q, k)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if not scale > 0:
        # The kernels fold the scale into the exponent after taking the max of raw
        # products, which is only valid for a positive scale.
        raise ValueError(f"scale must be positive; got {scale}")
    if q_offset is None:
        q_offset = nk - nq
    kwargs = dict(
        causal=causal,
        scale=float(scale),
        key_stats=key_stats,
        entropy=entropy,
        q_offset=int(q_offset),
    )
    if _pick_backend(backend, q, d) == "triton":
        from .triton_stats import attention_stats_triton

        return attention_stats_triton(q, k, **kwargs)
    return attention_stats_torch(q, k, **kwargs)


def attention_probs_at(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    lse: Float[Tensor, "b hq nq"],
    query_idx: Int64[Tensor, "*m"],
    key_idx: Int64[Tensor, "*m"],
    *,
    scale: float | None = None,
    q_offset: int | None = None,
    causal: bool = True,
) -> Float[Tensor, "b hq m"]:
    """Exact softmax probabilities of chosen (query, key) pairs.

    Computes ``p = exp(scale * q_i . k_j - lse_i)`` for each pair, with ``lse`` taken
    from :func:`attention_stats` on the same ``q``, ``k``, ``scale``, ``q_offset`` and
    ``causal``. Only the ``m`` requested rows of ``q`` and ``k`` are gathered, so memory
    is ``O(m * d)``.

    Args:
        q: Queries ``[batch, query heads, queries, head dim]``.
        k: Keys ``[batch, kv heads, keys, head dim]`` (GQA as in attention_stats).
        lse: ``AttentionStats.lse`` for these ``q`` and ``k``.
        query_idx: Query indices, int64, shape ``[m]`` (same pairs for every batch
            row and head) or ``[b, hq, m]``.
        key_idx: Key indices, same shape as ``query_idx``.
        scale: Score scale; defaults to ``1 / sqrt(head dim)``.
        q_offset: Absolute position of query 0; defaults to ``nk - nq``.
        causal: Whether the causal mask applies; pairs it forbids (key position after
            the query's position) give probability 0.

    Returns:
        Float32 probabilities ``[b, hq, m]``.
    """
    b, hq, nq, d, hkv, nk = _check_qk(q, k)
    if query_idx.shape != key_idx.shape:
        raise ValueError(f"query_idx {query_idx.shape} != key_idx {key_idx.shape}")
    if query_idx.dim() not in (1, 3) or (
        query_idx.dim() == 3 and tuple(query_idx.shape[:2]) != (b, hq)
    ):
        raise ValueError(f"indices must be [m] or [{b}, {hq}, m]; got {query_idx.shape}")
    if tuple(lse.shape) != (b, hq, nq):
        raise ValueError(f"lse must be [{b}, {hq}, {nq}]; got {tuple(lse.shape)}")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if q_offset is None:
        q_offset = nk - nq
    return attention_probs_at_torch(
        q,
        k,
        lse,
        query_idx.long(),
        key_idx.long(),
        scale=float(scale),
        q_offset=int(q_offset),
        causal=causal,
    )
