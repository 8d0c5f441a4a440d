"""Attention statistics without the ``N x N`` attention matrix.

``attention_stats`` gives, per query head, each query's log-sum-exp, max score,
argmax key and (optionally) entropy, and each key's summed / mean received attention,
in memory linear in the sequence length. ``attention_probs_at`` then gives exact
probabilities of chosen (query, key) pairs from the log-sum-exp. Both take the attention
variants of current model families: sliding windows, chunked attention, logit softcaps,
learned sink logits and per-row key intervals (padding), as transformers' eager
attention defines them.

Backends: a blocked PyTorch implementation (any device; the CPU path and test oracle)
and Triton kernels for CUDA (a row pass and a column pass; for a few queries over a long
cache, split-K decode kernels for the row statistics). ``attention_forward`` returns the
attention output with the same statistics; on CUDA one fused kernel computes the output and
the row statistics together. Triton is imported lazily, so this package imports without
Triton or CUDA.
"""

from .api import (
    attention_forward,
    attention_probs_at,
    attention_stats,
    fused_supported,
    triton_available,
)
from .masks import key_visible_counts, row_key_bounds
from .reference import visible_query_count
from .types import AttentionStats

__all__ = [
    "AttentionStats",
    "attention_forward",
    "attention_probs_at",
    "attention_stats",
    "fused_supported",
    "key_visible_counts",
    "row_key_bounds",
    "triton_available",
    "visible_query_count",
]
