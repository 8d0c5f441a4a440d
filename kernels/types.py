"""Result container shared by every backend of :mod:`headhunt.kernels`."""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float, Int64
from torch import Tensor

__all__ = ["AttentionStats"]


@dataclass
class AttentionStats:
    """Per-head attention statistics computed without the ``nq x nk`` matrix.

    Scores are ``s_ij = scale * q_i . k_j`` (then ``softcap * tanh(s / softcap)`` with a
    softcap) and probabilities ``p_ij = exp(s_ij - lse_i)`` over the keys query ``i`` can
    see (see :func:`headhunt.kernels.attention_stats` for the masks and sink logits).
    All tensors are float32 except ``argmax``.

    Attributes:
        lse: Natural-log log-sum-exp of the scores of each query row,
            ``log sum_j exp(s_ij)`` (plus ``exp(sink)`` with sink logits, so that
            ``exp(s_ij - lse_i)`` are the model's probabilities); ``-inf`` for a row
            that sees no key (the sink logit with sinks).
        max_score: Largest score of each query row (keys only, never the sink);
            ``-inf`` for a row that sees no key.
        argmax: Key index of the row maximum (lowest index on ties); ``-1`` for a row
            that sees no key.
        entropy: Entropy of each query's attention distribution in nats
            (``-sum_j p_ij log p_ij``, plus the sink slot's term with sinks); 0 for a
            row that sees no key. ``None`` unless
            requested.
        col_sum: For each key, the attention probability it receives summed over all
            queries, ``sum_i p_ij``. ``None`` unless requested.
        col_mean: ``col_sum`` divided by the number of queries that can see key ``j``
            under every mask rule
            (the ACT / Gu et al. ``s_j`` normalisation); 0 for a key no query sees.
            ``None`` unless requested.
    """

    lse: Float[Tensor, "b hq nq"]
    max_score: Float[Tensor, "b hq nq"]
    argmax: Int64[Tensor, "b hq nq"]
    entropy: Float[Tensor, "b hq nq"] | None = None
    col_sum: Float[Tensor, "b hq nk"] | None = None
    col_mean: Float[Tensor, "b hq nk"] | None = None
