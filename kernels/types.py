"""Result container shared by every backend of :mod:`headhunt.kernels`."""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float, Int64
from torch import Tensor

__all__ = ["AttentionStats"]


@dataclass
class AttentionStats:
    """Per-head attention statistics computed without the ``nq x nk`` matrix.

    Scores are ``s_ij = scale * q_i . k_j`` and probabilities ``p_ij = softmax_j(s_ij)``
    over the keys query ``i`` can see. All tensors are float32 except ``argmax``.

    Attributes:
        lse: Natural-log log-sum-exp of the scaled scores of each query row,
            ``log sum_j exp(s_ij)``; ``-inf`` for a row that sees no key.
        max_score: Largest scaled score of each query row; ``-inf`` for a row that
            sees no key.
        argmax: Key index of the row maximum (lowest index on ties); ``-1`` for a row
            that sees no key.
        entropy: Entropy of each query's attention distribution in nats
            (``-sum_j p_ij log p_ij``); 0 for a row that sees no key. ``None`` unless
            requested.
        col_sum: For each key, the attention probability it receives summed over all
            queries, ``sum_i p_ij``. ``None`` unless requested.
        col_mean: ``col_sum`` divided by the number of queries that can see key ``j``
            (the ACT / Gu et al. ``s_j`` normalisation); 0 for a key no query sees.
            ``None`` unless requested.
    """

    lse: Float[Tensor, "b hq nq"]
    max_score: Float[Tensor, "b hq nq"]
    argmax: Int64[Tensor, "b hq nq"]
    entropy: Float[Tensor, "b hq nq"] | None = None
    col_sum: Float[Tensor, "b hq nk"] | None = None
    col_mean: Float[Tensor, "b hq nk"] | None = None
