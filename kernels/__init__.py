"""Attention statistics without the ``N x N`` attention matrix.

``attention_stats`` gives, per query head, each query's log-sum-exp, max score,
argmax key and (optionally) entropy, and each key's summed / mean received attention,
in memory linear in the sequence length. ``attention_probs_at`` then gives exact
probabilities of chosen (query, key) pairs from the log-sum-exp. Both take the attention
variants of current model families: sliding windows, chunked attention, logit softcaps,
learned sink logits and per-row key intervals (padding), as transformers' eager
attention defines them.

Every entry point takes the call's variant as one :class:`AttentionVariant` (or its fields as
keywords). Backends: a blocked PyTorch implementation (any device; the CPU path and test
oracle, :mod:`.reference`) and Triton kernels for CUDA, arranged as flash-attention's
``flash_attn/cute`` arranges its kernels: shared device helpers (:mod:`.device`), one launch
module (:mod:`.launch`), one module per kernel family (:mod:`.triton_rows`,
:mod:`.triton_columns`, :mod:`.triton_decode`, :mod:`.triton_fused`, :mod:`.gluon_fused`) and
their configurations (:mod:`.config`). ``attention_forward`` returns the attention output with
the same statistics; on CUDA one fused kernel computes the output and the row statistics
together. Triton is imported lazily, so this package imports without Triton or CUDA.
"""

from . import api
from .api import *  # noqa: F403 (its __all__, the entry points and checks)
from .masks import key_visible_counts, row_key_bounds
from .reference import visible_query_count
from .types import AttentionStats
from .variant import AttentionVariant

# The public API: api's entry points and checks, the result and variant types, and the
# mask helpers callers use to build key intervals.
__all__ = [
    *api.__all__,
    "AttentionStats",
    "AttentionVariant",
    "key_visible_counts",
    "row_key_bounds",
    "visible_query_count",
]
