"""One description of an attention call's variant: its mask and how its scores are formed.

Every entry point of :mod:`headhunt.kernels` (the public functions, the torch reference, the
Triton launches) takes an :class:`AttentionVariant` instead of repeating the mask keywords, so
a new variant is one field here, validated once (:meth:`AttentionVariant.checked`), and each
backend either implements it or is not chosen for it (:attr:`AttentionVariant.TRITON_FIELDS`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int64
from torch import Tensor

from .masks import row_key_bounds

__all__ = ["AttentionVariant"]


@dataclass(frozen=True, eq=False)
class AttentionVariant:
    """Which keys each query sees and how its scores are formed.

    Scores are ``s_ij = scale * q_i . k_j``, then ``softcap * tanh(s / softcap)`` with a
    softcap; query ``i`` sits at position ``p = q_offset + i`` counted from key 0 and sees key
    ``j`` when every rule that is set holds (transformers' ``masking_utils``):
    ``causal`` ``j <= p``; ``window`` ``p - window < j``; ``chunk``
    ``j // chunk == p // chunk``; ``key_lo[b, i] <= j <= key_hi[b, i]``. ``sinks`` adds one
    logit per query head to every row's softmax denominator (gpt-oss). ``alibi_slopes`` adds
    the linear bias of ALiBi (Press et al. 2022, https://arxiv.org/abs/2108.12409; bloom,
    mpt) to every scaled score before the softcap: ``s_ij += alibi_slopes[h] * (j - p)``.
    ``bias`` adds a score bias the model itself built (Inkling's hidden-state-conditioned
    relative-position bias): ``s_ij += bias[b, h, i, j]``, also before the softcap; the torch
    reference adds it query block by query block (a block of the bias next to the block of
    scores, no copy of the whole), and the Triton kernels do not take it (a call with a bias
    runs on the torch backend on every device: exact, slower). ``row_sinks`` is a sink logit
    per query (Inkling 2: made from each query's hidden state), one extra logit in that row's
    softmax as ``sinks`` is in every row's; torch backend only too. See
    :func:`headhunt.kernels.attention_stats` for the full definitions.

    Attributes:
        causal: Apply the causal mask (bottom-right aligned by the default ``q_offset``).
        scale: Score scale (positive); None for ``1 / sqrt(head dim)``.
        q_offset: Position of query 0 minus that of key 0; None for ``nk - nq``.
        window: Sliding-window size (needs ``causal``).
        chunk: Attention chunk size (needs ``causal``).
        softcap: Logit softcap (positive).
        sinks: Float ``[hq]`` sink logit per query head.
        key_lo: Int64 ``[batch, queries]`` first visible key of each row (inclusive).
        key_hi: Int64 ``[batch, queries]`` last visible key of each row (inclusive).
        alibi_slopes: Float ``[hq]`` ALiBi slope per query head (scores in the units of
            the scaled scores, as ``sinks``).
        bias: Float ``[b or 1, hq or 1, nq, nk]`` additive score bias (scaled-score units),
            finite; a dimension of 1 is shared by every batch row or head.
        row_sinks: Float ``[b or 1, hq, nq]`` sink logit of each query row (not with
            ``sinks``).
    """

    causal: bool = True
    scale: float | None = None
    q_offset: int | None = None
    window: int | None = None
    chunk: int | None = None
    softcap: float | None = None
    sinks: Float[Tensor, " hq"] | None = None
    key_lo: Int64[Tensor, "b nq"] | None = None
    key_hi: Int64[Tensor, "b nq"] | None = None
    alibi_slopes: Float[Tensor, " hq"] | None = None
    bias: Float[Tensor, "bb hb nq nk"] | None = None
    row_sinks: Float[Tensor, "bb hq nq"] | None = None

    # Fields the Triton kernels implement when set; a variant that sets any other field
    # goes to the torch backend under "auto" and is refused by backend="triton".
    TRITON_FIELDS = frozenset(
        {"causal", "scale", "q_offset", "window", "chunk", "softcap", "sinks", "key_lo", "key_hi",
         "alibi_slopes"}
    )  # fmt: skip
    # Fields the torch reference implements; a variant that sets any other is refused there
    # (never computed without it).
    TORCH_FIELDS = frozenset(
        {"causal", "scale", "q_offset", "window", "chunk", "softcap", "sinks", "key_lo", "key_hi",
         "alibi_slopes", "bias", "row_sinks"}
    )  # fmt: skip

    @classmethod
    def of(cls, variant: AttentionVariant | None = None, **options) -> AttentionVariant:
        """``variant`` (default: the plain causal mask) with the fields named in ``options``
        replaced; an unknown name raises ``TypeError`` as an unknown keyword would."""
        base = variant if variant is not None else cls()
        return dataclasses.replace(base, **options) if options else base

    def set_fields(self) -> dict:
        """The fields that differ from "not set" (None), plus ``causal``."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name == "causal" or getattr(self, f.name) is not None
        }

    def triton_unsupported(self) -> list[str]:
        """Names of the set fields the Triton kernels do not implement (sorted)."""
        return sorted(n for n in self.set_fields() if n not in self.TRITON_FIELDS)

    def torch_unsupported(self) -> list[str]:
        """Names of the set fields the torch reference does not implement (sorted)."""
        return sorted(n for n in self.set_fields() if n not in self.TORCH_FIELDS)

    @property
    def has_intervals(self) -> bool:
        """Whether a rule beyond the plain causal / full mask limits the rows' keys."""
        return (self.window, self.chunk, self.key_lo, self.key_hi) != (None,) * 4

    def resolved(self, q: Tensor, k: Tensor) -> AttentionVariant:
        """This variant with ``scale`` and ``q_offset`` given their defaults for these
        ``q`` [b, hq, nq, d] and ``k`` [b, hkv, nk, d] (no validation)."""
        scale = 1.0 / math.sqrt(q.shape[-1]) if self.scale is None else self.scale
        q_offset = k.shape[2] - q.shape[2] if self.q_offset is None else self.q_offset
        return dataclasses.replace(self, scale=float(scale), q_offset=int(q_offset))

    def row_bounds(
        self, b: int, nq: int, nk: int, device: torch.device | None = None
    ) -> tuple[Int64[Tensor, "b nq"], Int64[Tensor, "b nq"]]:
        """First and last visible key of every row
        (:func:`~headhunt.kernels.masks.row_key_bounds`) of a resolved variant."""
        return row_key_bounds(
            b, nq, nk, causal=self.causal, q_offset=self.q_offset, window=self.window,
            chunk=self.chunk, key_lo=self.key_lo, key_hi=self.key_hi, device=device,
        )  # fmt: skip

    def checked(self, q: Tensor, k: Tensor) -> AttentionVariant:
        """Validate every field against ``q`` [b, hq, nq, d] and ``k``; return the variant
        normalised (ints, a float scale and softcap, float32 sinks and int64 bounds on
        ``q``'s device) and resolved (:meth:`resolved`). Raises ``ValueError``."""
        b, hq, nq = q.shape[:3]
        for name, value in (("window", self.window), ("chunk", self.chunk)):
            if value is None:
                continue
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
            if not self.causal:
                raise ValueError(f"{name} is defined on top of the causal mask; pass causal=True")
        if self.scale is not None and not self.scale > 0:
            # The kernels fold the scale into the exponent after taking the max of raw
            # products, which is only valid for a positive scale.
            raise ValueError(f"scale must be positive; got {self.scale}")
        softcap = self.softcap
        if softcap is not None and not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"softcap must be a positive finite number; got {softcap!r}")
        per_head = {}
        for name, what in (("sinks", "logit"), ("alibi_slopes", "slope")):
            t = getattr(self, name)
            if t is not None:
                if tuple(t.shape) != (hq,):
                    raise ValueError(
                        f"{name} must be [{hq}] (one {what} per query head); got {tuple(t.shape)}"
                    )
                t = t.detach().to(device=q.device, dtype=torch.float32)
                if not torch.isfinite(t).all():
                    raise ValueError(f"{name} must be finite")
            per_head[name] = t
        bias = self.bias
        if bias is not None:
            nk = k.shape[2]
            if (
                bias.dim() != 4
                or bias.shape[0] not in (1, b)
                or bias.shape[1] not in (1, hq)
                or tuple(bias.shape[2:]) != (nq, nk)
            ):
                raise ValueError(
                    f"bias must be [{b} or 1, {hq} or 1, {nq}, {nk}]; got {tuple(bias.shape)}"
                )
            if not bias.is_floating_point() or not bool(torch.isfinite(bias).all()):
                raise ValueError("bias must be a finite floating-point tensor")
            bias = bias.detach().to(device=q.device)  # kept in its dtype: no float32 copy
        row_sinks = self.row_sinks
        if row_sinks is not None:
            if self.sinks is not None:
                raise ValueError("give sinks (per head) or row_sinks (per query), not both")
            if (
                row_sinks.dim() != 3
                or row_sinks.shape[0] not in (1, b)
                or tuple(row_sinks.shape[1:]) != (hq, nq)
            ):
                raise ValueError(
                    f"row_sinks must be [{b} or 1, {hq}, {nq}]; got {tuple(row_sinks.shape)}"
                )
            row_sinks = row_sinks.detach().to(device=q.device, dtype=torch.float32)
            if not bool(torch.isfinite(row_sinks).all()):
                raise ValueError("row_sinks must be finite")
        bounds = {}
        for name in ("key_lo", "key_hi"):
            t = getattr(self, name)
            if t is None:
                bounds[name] = None
                continue
            if tuple(t.shape) != (b, nq) or t.dtype not in (torch.int64, torch.int32):
                raise ValueError(
                    f"{name} must be an int64 [{b}, {nq}] tensor; got {t.dtype} {tuple(t.shape)}"
                )
            bounds[name] = t.to(device=q.device, dtype=torch.int64)
        return dataclasses.replace(
            self,
            causal=bool(self.causal),
            window=None if self.window is None else int(self.window),
            chunk=None if self.chunk is None else int(self.chunk),
            softcap=None if softcap is None else float(softcap),
            **per_head,
            **bounds,
            bias=bias,
            row_sinks=row_sinks,
        ).resolved(q, k)
