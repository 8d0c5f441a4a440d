"""Public entry points: :func:`attention_stats` and :func:`attention_probs_at`."""

from __future__ import annotations

import math
from typing import Literal

import torch
from jaxtyping import Float, Int64
from torch import Tensor

from .reference import attention_forward_torch, attention_probs_at_torch, attention_stats_torch
from .types import AttentionStats

__all__ = [
    "attention_forward",
    "attention_probs_at",
    "attention_stats",
    "fused_supported",
    "triton_available",
]

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


def _check_mask_options(
    q: Tensor,
    b: int,
    hq: int,
    nq: int,
    causal: bool,
    window: int | None,
    chunk: int | None,
    softcap: float | None,
    sinks: Tensor | None,
    key_lo: Tensor | None,
    key_hi: Tensor | None,
) -> dict:
    """Validate the mask / score options; return them normalised (ints, float32 sinks,
    int64 bounds on q's device)."""
    for name, value in (("window", window), ("chunk", chunk)):
        if value is None:
            continue
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if not causal:
            raise ValueError(f"{name} is defined on top of the causal mask; pass causal=True")
    if softcap is not None and not (math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap must be a positive finite number; got {softcap!r}")
    if sinks is not None:
        if tuple(sinks.shape) != (hq,):
            raise ValueError(
                f"sinks must be [{hq}] (one logit per query head); got {tuple(sinks.shape)}"
            )
        sinks = sinks.detach().to(device=q.device, dtype=torch.float32)
        if not torch.isfinite(sinks).all():
            raise ValueError("sinks must be finite")
    bounds = {}
    for name, t in (("key_lo", key_lo), ("key_hi", key_hi)):
        if t is None:
            bounds[name] = None
            continue
        if tuple(t.shape) != (b, nq) or t.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"{name} must be an int64 [{b}, {nq}] tensor; got {t.dtype} {tuple(t.shape)}"
            )
        bounds[name] = t.to(device=q.device, dtype=torch.int64)
    return dict(
        window=None if window is None else int(window),
        chunk=None if chunk is None else int(chunk),
        softcap=None if softcap is None else float(softcap),
        sinks=sinks,
        **bounds,
    )


# Options the Triton kernels implement; any other set option sends "auto" to torch.
_TRITON_OPTIONS = frozenset({"window", "chunk", "softcap", "sinks", "key_lo", "key_hi"})
# Arguments every backend takes (not mask options).
_GENERAL_OPTIONS = frozenset({"causal", "scale", "q_offset", "key_stats", "entropy", "backend"})


def _pick_backend(
    backend: Backend, q: Tensor, d: int, options: dict | None = None
) -> Literal["torch", "triton"]:
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton'; got {backend!r}")
    if backend == "torch":
        return "torch"
    options = options or {}
    unsupported = sorted(
        n for n, v in options.items() if v is not None and n not in _TRITON_OPTIONS
    )
    if backend == "triton":
        if unsupported:
            raise ValueError(f"the Triton backend does not support {', '.join(unsupported)} yet")
        return "triton"
    if not unsupported and q.is_cuda and d <= _TRITON_MAX_HEAD_DIM and triton_available():
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
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    sinks: Float[Tensor, " hq"] | None = None,
    key_lo: Int64[Tensor, "b nq"] | None = None,
    key_hi: Int64[Tensor, "b nq"] | None = None,
    backend: Backend = "auto",
) -> AttentionStats:
    """Per-head attention statistics in linear memory (no ``nq x nk`` matrix).

    Scores are ``s_ij = scale * q_i . k_j`` (float32 accumulation whatever the input
    dtype), passed through ``softcap * tanh(s / softcap)`` when ``softcap`` is given
    (Gemma 2 eager: after the scaling, before the mask), and
    ``p_ij = exp(s_ij - lse_i)`` over the keys query ``i`` can see.

    Positions: query ``i`` sits at ``p = q_offset + i``, counted from key 0 (``q_offset``
    is the absolute position of query 0 minus that of key 0; a cache that keeps only a
    window needs the matching offset). With the default ``q_offset = nk - nq`` the last
    query is aligned with the last key (bottom-right, like FlashAttention), so decode
    with ``nq = 1`` sees the whole cache. Query ``i`` sees key ``j`` when all of these
    hold (the rules of transformers' ``masking_utils``):

    - ``causal``: ``j <= p``;
    - ``window`` (transformers' ``sliding_window``): ``p - window < j``, so a row sees
      at most ``window`` keys, its own included;
    - ``chunk`` (Llama 4 chunked attention): ``j // chunk == p // chunk``; chunk
      boundaries sit at multiples of ``chunk`` counted from key 0 (transformers shifts
      them by each batch row's left padding: express such rows through ``key_lo``);
    - ``key_lo[b, i] <= j <= key_hi[b, i]`` (padding or any per-row mask; each row's
      visible keys must form one interval).

    ``sinks`` (gpt-oss ``s_aux``, one logit per query head, in the units of the scaled
    scores) adds one logit to every row's softmax denominator:
    ``lse_i = log(sum_j exp(s_ij) + exp(sink_h))``, so ``exp(s_ij - lse_i)`` are the
    model's probabilities and sum to less than 1 over the keys. Then ``entropy`` is over
    the keys plus the sink slot, ``max_score`` / ``argmax`` are over keys only and
    ``col_sum`` / ``col_mean`` sum the true probabilities.

    A row that sees no key gets ``lse = max_score = -inf`` (``lse = sink`` with sinks),
    ``argmax = -1``, ``entropy = 0`` and adds nothing to the key statistics.

    Args:
        q: Queries ``[batch, query heads, queries, head dim]``, bf16/fp16/fp32.
        k: Keys ``[batch, kv heads, keys, head dim]``; ``hq`` must be a multiple of
            ``hkv`` and query head ``h`` reads kv head ``h // (hq // hkv)`` (GQA).
            Statistics are per query head.
        causal: Apply the causal mask (bottom-right aligned).
        scale: Score scale (must be positive); defaults to ``1 / sqrt(head dim)``.
        key_stats: Also compute ``col_sum`` / ``col_mean`` (a second pass over the
            scores on the Triton backend); ``col_mean`` divides by the number of rows
            that see each key under all the rules above.
        entropy: Also compute each query's entropy in nats.
        q_offset: Position of query 0 relative to key 0; defaults to ``nk - nq``.
        window: Sliding-window size (needs ``causal``).
        chunk: Attention chunk size (needs ``causal``).
        softcap: Logit softcap (positive).
        sinks: Float ``[hq]`` sink logit per query head.
        key_lo: Int64 ``[batch, queries]`` first visible key of each row (inclusive).
        key_hi: Int64 ``[batch, queries]`` last visible key of each row (inclusive).
        backend: ``"auto"`` (Triton for CUDA tensors when it supports every option
            given, else torch), ``"torch"`` (blocked PyTorch, any device) or
            ``"triton"`` (raises ``ValueError`` for an option it does not support).

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
    options = _check_mask_options(
        q, b, hq, nq, causal, window, chunk, softcap, sinks, key_lo, key_hi
    )
    kwargs = dict(
        causal=causal,
        scale=float(scale),
        key_stats=key_stats,
        entropy=entropy,
        q_offset=int(q_offset),
    )
    if _pick_backend(backend, q, d, options) == "triton":
        from .triton_stats import attention_stats_triton

        # Only the options that are set (all of them supported, see _pick_backend).
        used = {name: value for name, value in options.items() if value is not None}
        return attention_stats_triton(q, k, **kwargs, **used)
    return attention_stats_torch(q, k, **kwargs, **options)


def fused_supported(q: Tensor, k: Tensor, v: Tensor, *, options: dict | None = None) -> bool:
    """Whether :func:`attention_forward`'s Triton kernel serves these tensors: CUDA with
    Triton, one dtype, head dim <= 256 and the same for values, every option set in
    ``options`` (keyword arguments of :func:`attention_forward`) one it implements, and not
    a decode shape (a few query rows per kv head over a long cache,
    which the split-K row kernels of :func:`attention_stats` serve far better)."""
    from .triton_stats import DECODE_MAX_ROWS, DECODE_MIN_KEYS

    if not (q.is_cuda and triton_available()) or q.dim() != 4 or v.dim() != 4:
        return False
    if not q.dtype == k.dtype == v.dtype or q.dtype not in _DTYPES:
        return False
    d, hq, nq = q.shape[-1], q.shape[1], q.shape[2]
    if d > _TRITON_MAX_HEAD_DIM or v.shape[-1] != d or k.shape[1] == 0:
        return False
    masks = {n: val for n, val in (options or {}).items() if n not in _GENERAL_OPTIONS}
    if any(val is not None and n not in _TRITON_OPTIONS for n, val in masks.items()):
        return False
    return not (nq * (hq // k.shape[1]) <= DECODE_MAX_ROWS and k.shape[2] >= DECODE_MIN_KEYS)


def attention_forward(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    v: Float[Tensor, "b hkv nk dv"],
    *,
    causal: bool = True,
    scale: float | None = None,
    key_stats: bool = True,
    entropy: bool = False,
    q_offset: int | None = None,
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    sinks: Float[Tensor, " hq"] | None = None,
    key_lo: Int64[Tensor, "b nq"] | None = None,
    key_hi: Int64[Tensor, "b nq"] | None = None,
    backend: Backend = "auto",
) -> tuple[Float[Tensor, "b hq nq dv"], AttentionStats]:
    """The attention output and :func:`attention_stats`' statistics, from one forward.

    ``out_i = sum_j p_ij v_j`` over the keys row ``i`` sees, with the scores, masks,
    softcap and sink logits of :func:`attention_stats` (every argument means the same;
    with sinks the sink slot takes its share of each row and contributes no value, as in
    gpt-oss). A row that sees no key gets a zero output.

    On the Triton backend (:func:`fused_supported`) the output and the row statistics come
    out of one FlashAttention-style pass (scores in float32, probabilities rounded to the
    value dtype for the ``p @ v`` product, as flash kernels do); ``key_stats`` adds exactly
    one pass over the keys, which needs every row's final lse. The torch backend computes
    the statistics, then the output from their lse (float32), block by block.

    Args:
        q, k: As in :func:`attention_stats`.
        v: Values ``[batch, kv heads, keys, value dim]`` (same kv heads as ``k``).
        causal, scale, key_stats, entropy, q_offset, window, chunk, softcap, sinks,
        key_lo, key_hi: As in :func:`attention_stats`.
        backend: ``"auto"`` (Triton when :func:`fused_supported`, else torch), ``"torch"``
            or ``"triton"`` (raises ``ValueError`` for what it does not support).

    Returns:
        ``(out, stats)``: ``out`` ``[batch, query heads, queries, value dim]`` in ``v``'s
        dtype (from Triton, over ``[b, nq, hq, d]`` memory: ``out.transpose(1, 2)`` is
        contiguous); ``stats`` as :func:`attention_stats` returns them.
    """
    b, hq, nq, d, hkv, nk = _check_qk(q, k)
    if v.dim() != 4 or tuple(v.shape[:3]) != (b, hkv, nk):
        raise ValueError(f"v must be [{b}, {hkv}, {nk}, dv]; got {tuple(v.shape)}")
    if v.device != q.device:
        raise ValueError(f"q on {q.device} but v on {v.device}")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if not scale > 0:
        raise ValueError(f"scale must be positive; got {scale}")
    if q_offset is None:
        q_offset = nk - nq
    options = _check_mask_options(
        q, b, hq, nq, causal, window, chunk, softcap, sinks, key_lo, key_hi
    )
    kwargs = dict(
        causal=causal, scale=float(scale), key_stats=key_stats, entropy=entropy,
        q_offset=int(q_offset),
    )  # fmt: skip
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton'; got {backend!r}")
    use_triton = backend == "auto" and fused_supported(q, k, v, options=options)
    if backend == "triton":
        _pick_backend("triton", q, d, options)  # raises for an unsupported option
        if v.shape[-1] != d:
            raise ValueError(f"the Triton backend needs value dim = head dim ({d})")
        use_triton = True
    if use_triton:
        from .triton_fused import attention_forward_triton

        used = {name: value for name, value in options.items() if value is not None}
        return attention_forward_triton(q, k, v, **kwargs, **used)
    return attention_forward_torch(q, k, v, **kwargs, **options)


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
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    sinks: Float[Tensor, " hq"] | None = None,
    key_lo: Int64[Tensor, "b nq"] | None = None,
    key_hi: Int64[Tensor, "b nq"] | None = None,
) -> Float[Tensor, "b hq m"]:
    """Exact softmax probabilities of chosen (query, key) pairs.

    Computes ``p = exp(s_ij - lse_i)`` for each pair, with the score ``s_ij`` as in
    :func:`attention_stats` (scale, then softcap) and ``lse`` taken from
    :func:`attention_stats` on the same inputs and options. Pairs the mask forbids
    (causal, window, chunk, ``key_lo`` / ``key_hi``, as defined there) give 0. Only the
    ``m`` requested rows of ``q`` and ``k`` are gathered, so memory is ``O(m * d)``.

    ``sinks`` is accepted (and checked) so that the keyword arguments of an
    :func:`attention_stats` call can be passed unchanged; it does not enter the
    result, since the sink term is already part of that call's ``lse``.

    Args:
        q: Queries ``[batch, query heads, queries, head dim]``.
        k: Keys ``[batch, kv heads, keys, head dim]`` (GQA as in attention_stats).
        lse: ``AttentionStats.lse`` for these ``q``, ``k`` and options.
        query_idx: Query indices, int64, shape ``[m]`` (same pairs for every batch
            row and head) or ``[b, hq, m]``.
        key_idx: Key indices, same shape as ``query_idx``.
        scale: Score scale; defaults to ``1 / sqrt(head dim)``.
        q_offset: Position of query 0 relative to key 0; defaults to ``nk - nq``.
        causal: Whether the causal mask applies.
        window, chunk, softcap, sinks, key_lo, key_hi: As in :func:`attention_stats`.

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
    options = _check_mask_options(
        q, b, hq, nq, causal, window, chunk, softcap, sinks, key_lo, key_hi
    )
    options.pop("sinks")
    return attention_probs_at_torch(
        q,
        k,
        lse,
        query_idx.long(),
        key_idx.long(),
        scale=float(scale),
        q_offset=int(q_offset),
        causal=causal,
        **options,
    )
