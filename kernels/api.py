"""Public entry points: :func:`attention_stats`, :func:`attention_forward`,
:func:`attention_probs_at`, the many-layer :func:`decode_argmax_layers`, and the eligibility
checks callers use to pick a path (:func:`fused_supported`, :func:`decode_argmax_supported`)."""

from __future__ import annotations

from typing import Literal

import torch
from jaxtyping import Float, Int64
from torch import Tensor

from .reference import attention_forward_torch, attention_probs_at_torch, attention_stats_torch
from .types import AttentionStats
from .variant import AttentionVariant

__all__ = [
    "DTYPES",
    "TRITON_MAX_HEAD_DIM",
    "attention_forward",
    "attention_probs_at",
    "attention_stats",
    "decode_argmax_layers",
    "decode_argmax_supported",
    "fused_supported",
    "triton_available",
]

Backend = Literal["auto", "torch", "triton"]

# Input dtypes every backend takes.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The Triton kernels keep a whole head-dim row of q in registers (padded to a power of
# two); past 256 they would spill, so larger heads go to the torch backend.
TRITON_MAX_HEAD_DIM = 256


def triton_available() -> bool:
    """Whether the Triton backend can be imported (Triton installed, importable)."""
    try:
        from . import launch  # noqa: F401
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
    if q.dtype not in DTYPES or k.dtype not in DTYPES:
        raise TypeError(f"q/k dtype must be one of {DTYPES}; got {q.dtype}/{k.dtype}")
    if q.device != k.device:
        raise ValueError(f"q on {q.device} but k on {k.device}")
    return b, hq, nq, d, hkv, nk


def _check_backend(backend: Backend) -> None:
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton'; got {backend!r}")


def _pick_backend(
    backend: Backend, q: Tensor, d: int, variant: AttentionVariant
) -> Literal["torch", "triton"]:
    _check_backend(backend)
    unsupported = variant.triton_unsupported()
    if backend == "triton":
        if unsupported:
            raise ValueError(f"the Triton backend does not support {', '.join(unsupported)} yet")
        return "triton"
    if (
        backend == "auto"
        and not unsupported
        and q.is_cuda
        and d <= TRITON_MAX_HEAD_DIM
        and triton_available()
    ):
        return "triton"
    _torch_supports(variant)
    return "torch"


def _torch_supports(variant: AttentionVariant) -> None:
    """Raise ``ValueError`` for a field the torch backend does not implement (so that it is
    never left out of a result silently)."""
    missing = variant.torch_unsupported()
    if missing:
        raise ValueError(
            f"the torch backend does not support {', '.join(missing)} yet (the Triton "
            "backend does, on CUDA)"
        )


def attention_stats(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    variant: AttentionVariant | None = None,
    *,
    key_stats: bool = True,
    entropy: bool = False,
    backend: Backend = "auto",
    **options,
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
        variant: The mask and score options as one :class:`AttentionVariant` (default: the
            plain causal mask); its fields may also be given as keywords (``options``),
            which replace the variant's.
        key_stats: Also compute ``col_sum`` / ``col_mean`` (a second pass over the
            scores on the Triton backend); ``col_mean`` divides by the number of rows
            that see each key under all the rules above.
        entropy: Also compute each query's entropy in nats.
        backend: ``"auto"`` (Triton for CUDA tensors when it supports every option
            given, else torch), ``"torch"`` (blocked PyTorch, any device) or
            ``"triton"`` (raises ``ValueError`` for an option it does not support).
        **options: Fields of :class:`AttentionVariant`: ``causal`` (bottom-right aligned),
            ``scale`` (positive; default ``1 / sqrt(head dim)``), ``q_offset`` (default
            ``nk - nq``), ``window``, ``chunk``, ``softcap``, ``sinks``, ``key_lo``,
            ``key_hi``, as described above; ``alibi_slopes``, ``bias`` (a score bias the model
            builds, ``[b or 1, hq or 1, nq, nk]``, added before the softcap) and ``row_sinks``
            (a sink logit per query row, ``[b or 1, hq, nq]``), see
            :class:`AttentionVariant`; ``bias`` and ``row_sinks`` run on the torch backend
            only (under ``"auto"`` on every device).

    Returns:
        :class:`AttentionStats` on ``q``'s device; float32 except int64 ``argmax``.
    """
    b, hq, nq, d, hkv, nk = _check_qk(q, k)
    variant = AttentionVariant.of(variant, **options).checked(q, k)
    if _pick_backend(backend, q, d, variant) == "triton":
        from .launch import attention_stats_triton

        return attention_stats_triton(q, k, variant, key_stats=key_stats, entropy=entropy)
    return attention_stats_torch(q, k, variant, key_stats=key_stats, entropy=entropy)


def fused_supported(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    variant: AttentionVariant | None = None,
    *,
    options: dict | None = None,
) -> bool:
    """Whether :func:`attention_forward`'s Triton kernel serves these tensors: CUDA with
    Triton, one dtype, head dim <= 256 and the same for values, every field set in
    ``variant`` (or in ``options``, keyword arguments of :func:`attention_forward`) one it
    implements, and not a decode shape (a few query rows per kv head over a long cache,
    which the split-K row kernels of :func:`attention_stats` serve far better)."""
    if not (q.is_cuda and triton_available()) or q.dim() != 4 or v.dim() != 4:
        return False
    from .triton_decode import DECODE_MAX_ROWS, DECODE_MIN_KEYS

    if not q.dtype == k.dtype == v.dtype or q.dtype not in DTYPES:
        return False
    d, hq, nq = q.shape[-1], q.shape[1], q.shape[2]
    if d > TRITON_MAX_HEAD_DIM or v.shape[-1] != d or k.shape[1] == 0:
        return False
    outputs = ("key_stats", "entropy", "backend")
    mask = {n: val for n, val in (options or {}).items() if n not in outputs and val is not None}
    try:
        variant = AttentionVariant.of(variant, **mask)
    except TypeError:  # an option no variant field names: not one the kernel implements
        return False
    if variant.triton_unsupported():
        return False
    return not (nq * (hq // k.shape[1]) <= DECODE_MAX_ROWS and k.shape[2] >= DECODE_MIN_KEYS)


def attention_forward(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    v: Float[Tensor, "b hkv nk dv"],
    variant: AttentionVariant | None = None,
    *,
    key_stats: bool = True,
    entropy: bool = False,
    backend: Backend = "auto",
    **options,
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
        variant, key_stats, entropy, options: As in :func:`attention_stats`.
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
    variant = AttentionVariant.of(variant, **options).checked(q, k)
    _check_backend(backend)
    use_triton = backend == "auto" and fused_supported(q, k, v, variant)
    if backend == "triton":
        _pick_backend("triton", q, d, variant)  # raises for an unsupported option
        if v.shape[-1] != d:
            raise ValueError(f"the Triton backend needs value dim = head dim ({d})")
        use_triton = True
    if use_triton:
        from .launch import attention_forward_triton

        return attention_forward_triton(q, k, v, variant, key_stats=key_stats, entropy=entropy)
    _torch_supports(variant)
    return attention_forward_torch(q, k, v, variant, key_stats=key_stats, entropy=entropy)


def attention_probs_at(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    lse: Float[Tensor, "b hq nq"],
    query_idx: Int64[Tensor, "*m"],
    key_idx: Int64[Tensor, "*m"],
    variant: AttentionVariant | None = None,
    **options,
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
        variant, options: As in :func:`attention_stats` (the same as for ``lse``).

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
    variant = AttentionVariant.of(variant, **options).checked(q, k)
    _torch_supports(variant)
    return attention_probs_at_torch(q, k, lse, query_idx.long(), key_idx.long(), variant)


def decode_argmax_supported(q: Tensor, k: Tensor) -> bool:
    """Whether :func:`decode_argmax_layers` takes these tensors: CUDA with Triton, q and k
    of one dtype it takes on one device, head dim <= 256, unit stride along d."""
    return (
        q.is_cuda
        and q.dtype == k.dtype
        and q.device == k.device
        and q.stride(-1) == 1
        and k.stride(-1) == 1
        and q.dtype in DTYPES
        and q.shape[-1] <= TRITON_MAX_HEAD_DIM
        and triton_available()
    )


def decode_argmax_layers(
    queries: list[Tensor], keys: list[Tensor], key_start: int = 0, skip_rows: Tensor | None = None
) -> Int64[Tensor, "layers b hq"]:
    """Argmax key of each query head's single query over its whole key cache, for several
    layers in two kernel launches, plus ``key_start``: see
    :func:`headhunt.kernels.triton_decode.decode_argmax_layers` (tensors that
    :func:`decode_argmax_supported` accepts)."""
    from . import triton_decode

    return triton_decode.decode_argmax_layers(queries, keys, key_start, skip_rows)
