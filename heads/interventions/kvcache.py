"""KV-cache head pruning: DuoAttention-style streaming heads with a really smaller cache.

Xiao et al. 2024 (DuoAttention, arXiv:2410.10819) split the KV heads of a model in two: *full*
(retrieval) heads attend to the whole context; *streaming* heads attend only to the first
``sink`` tokens (attention sinks) and the last ``recent`` tokens, so their cache holds at most
``sink + recent`` entries whatever the context length. DuoAttention learns the split (a gate per
KV head, hours of training per 7B model); here the split comes from any head score (headhunt's
retrieval score, a random ranking, its reverse, or a DuoAttention pattern file).

The rule, for query position p (absolute, 0-based) and key position j <= p:
    full KV head:      every j <= p
    streaming KV head: j < sink  or  p - recent < j <= p
in prefill and in decoding alike. Decisions are per KV head (the cache is stored per KV head):
a query head's score is aggregated over its KV group by the max (a KV head is full when its best
query head ranks high enough), as DuoAttention's gates and RazorAttention's scores are per KV
head. All query heads of a KV head follow it.

Two pieces work together:

- :class:`SplitCacheLayer` (a transformers cache layer): keeps full heads' keys/values whole and
  streaming heads' only at sink + recent positions, so the cache's memory really falls.
- :class:`StreamingHeads` (an :class:`~headhunt.probes.attention.AttentionHook`): hands only the
  full heads to the model's own attention kernel (SDPA/eager, unchanged) and computes the
  streaming heads' attention itself, chunked over queries (memory linear in the context).

Batches must be unpadded (all prompts of one length): positions are shared by the batch.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel


@dataclass(frozen=True)
class KVPlan:
    """Which KV heads keep the full cache.

    Attributes:
        full: [layers, kv_heads] True where the KV head (and all its query heads) sees the whole
            cache; False for streaming heads.
        sink: leading tokens every streaming head keeps (attention sinks).
        recent: trailing tokens every streaming head keeps (the current token included).
    """

    full: np.ndarray
    sink: int
    recent: int

    def __post_init__(self) -> None:
        if self.sink < 0 or self.recent < 1:
            raise HeadhuntError("sink must be >= 0 and recent >= 1 tokens")

    @property
    def full_fraction(self) -> float:
        """Share of KV heads that keep the full cache."""
        return float(np.mean(self.full))


def kv_scores(
    matrix: Float[np.ndarray, "layers heads"], n_kv_heads: int
) -> Float[np.ndarray, "layers hkv"]:
    """Per-KV-head score: the max over the query heads of its group (NaN counts as -inf)."""
    layers, heads = matrix.shape
    if heads % n_kv_heads:
        raise HeadhuntError(f"{heads} query heads do not split into {n_kv_heads} KV groups")
    m = np.where(np.isnan(matrix), -np.inf, matrix)
    return m.reshape(layers, n_kv_heads, heads // n_kv_heads).max(-1)


def rank_kv_heads(scores: Float[np.ndarray, "layers hkv"], seed: int = 0) -> np.ndarray:
    """Flat indices of KV heads, best first; ties broken by a seeded random order (so many
    equal scores, e.g. zeros, do not favour early layers)."""
    rng = np.random.default_rng(seed)
    tiebreak = rng.permutation(scores.size)
    return np.lexsort((tiebreak, -scores.ravel()))


def plan_from_ranking(
    ranking: Sequence[int], shape: tuple[int, int], fraction: float, sink: int, recent: int
) -> KVPlan:
    """Keep the full cache for the first ``round(fraction * n)`` KV heads of ``ranking``."""
    if not 0 <= fraction <= 1:
        raise HeadhuntError(f"full-head fraction {fraction} is outside 0..1")
    full = np.zeros(shape, dtype=bool)
    k = round(fraction * full.size)
    full.ravel()[np.asarray(ranking[:k], dtype=int)] = True
    return KVPlan(full=full, sink=sink, recent=recent)


def random_ranking(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


class SplitCacheLayer(DynamicLayer):
    """One layer's cache: full KV heads grow with the context; streaming KV heads keep only
    positions ``< sink`` and the last ``recent`` positions.

    ``update`` returns the full heads' keys/values (what the model's kernel sees) and leaves
    the streaming heads' keys for this call (kept cache + new tokens, with positions) in
    :attr:`pending` for :class:`StreamingHeads`.
    """

    def __init__(self, full: Tensor, stream: Tensor, sink: int, recent: int):
        super().__init__()
        self.full_idx, self.stream_idx = full, stream
        self.sink, self.recent = sink, recent
        self.seen = 0
        self.pending: tuple[Tensor, Tensor, Tensor] | None = None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device = key_states.device
        b, _, _, d = key_states.shape

        def empty(n: int, like: Tensor) -> Tensor:
            return like.new_zeros(b, n, 0, d)

        self.full_idx = self.full_idx.to(self.device)
        self.stream_idx = self.stream_idx.to(self.device)
        self.keys = empty(len(self.full_idx), key_states)
        self.values = empty(len(self.full_idx), value_states)
        self.stream_keys = empty(len(self.stream_idx), key_states)
        self.stream_values = empty(len(self.stream_idx), value_states)
        self.stream_pos = torch.zeros(0, dtype=torch.long, device=self.device)
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        self.keys = torch.cat([self.keys, key_states[:, self.full_idx]], dim=2)
        self.values = torch.cat([self.values, value_states[:, self.full_idx]], dim=2)
        pos = torch.cat(
            [self.stream_pos, torch.arange(self.seen, self.seen + n, device=self.device)]
        )
        k = torch.cat([self.stream_keys, key_states[:, self.stream_idx]], dim=2)
        v = torch.cat([self.stream_values, value_states[:, self.stream_idx]], dim=2)
        self.pending = (k, v, pos)
        self.seen += n
        keep = (pos < self.sink) | (pos >= self.seen - self.recent)
        # Copies (not views): the dropped middle of a long prefill is freed.
        self.stream_keys, self.stream_values = k[:, :, keep].clone(), v[:, :, keep].clone()
        self.stream_pos = pos[keep]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def nbytes(self) -> int:
        """Bytes of keys and values held (full and streaming heads)."""
        if not self.is_initialized:
            return 0
        tensors = (self.keys, self.values, self.stream_keys, self.stream_values)
        return sum(t.numel() * t.element_size() for t in tensors)

    def reset(self) -> None:
        self.is_initialized, self.seen, self.pending = False, 0, None


class SplitCache(Cache):
    """A transformers cache of :class:`SplitCacheLayer` (one per model layer)."""

    def __init__(self, layers: list[SplitCacheLayer]):
        super().__init__(layers=layers)

    def nbytes(self) -> int:
        """Bytes of keys and values held over all layers."""
        return sum(layer.nbytes() for layer in self.layers)


def streaming_attention(
    q: Float[Tensor, "b hq nq d"],
    k: Float[Tensor, "b hkv nk d"],
    v: Float[Tensor, "b hkv nk d"],
    q_pos: Int[Tensor, " nq"],
    k_pos: Int[Tensor, " nk"],
    *,
    sink: int,
    recent: int,
    scale: float,
    chunk: int = 1024,
) -> Float[Tensor, "b hq nq d"]:
    """Attention where query position p sees key positions j <= p with j < sink or
    j > p - recent (``k_pos`` ascending). Queries go in chunks, each against only the keys it
    can see (sinks plus a window), so memory stays linear in the context."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)

    def attend(qc: Tensor, pq: Tensor, idx: Tensor | None) -> Tensor:
        kk, vv, pk = (k, v, k_pos) if idx is None else (k[:, :, idx], v[:, :, idx], k_pos[idx])
        allowed = (pk[None] <= pq[:, None]) & (
            (pk[None] < sink) | (pk[None] > pq[:, None] - recent)
        )
        return F.scaled_dot_product_attention(qc, kk, vv, attn_mask=allowed, scale=scale)

    if k.shape[2] <= sink + recent + chunk:  # decoding and short prompts: one call, no search
        return attend(q, q_pos, None)
    out = torch.empty_like(q)
    n_sink = int(torch.searchsorted(k_pos, torch.tensor(sink, device=k_pos.device)))
    for a in range(0, q.shape[2], chunk):
        pq = q_pos[a : a + chunk]
        lo = int(torch.searchsorted(k_pos, pq[0] - recent + 1))
        hi = int(torch.searchsorted(k_pos, pq[-1], right=True))
        idx = torch.cat(
            [
                torch.arange(min(n_sink, lo), device=k.device),  # sinks left of the window
                torch.arange(lo, hi, device=k.device),
            ]
        )
        out[:, :, a : a + chunk] = attend(q[:, :, a : a + chunk], pq, idx)
    return out


class StreamingHeads(AttentionHook):
    """Runs a :class:`KVPlan`: full heads through the model's kernel, streaming heads through
    :func:`streaming_attention`.

    Use :meth:`new_cache` for a cache that really keeps only sink + recent entries of the
    streaming heads. Without it (``use_cache=False``, or a plain transformers cache) the
    attention is the same but the memory is not saved.
    """

    def __init__(self, plan: KVPlan, n_heads: int, n_kv_heads: int, chunk: int = 1024):
        self.plan, self.chunk = plan, chunk
        self.group = group = n_heads // n_kv_heads
        if plan.full.shape[1] != n_kv_heads:
            raise HeadhuntError(
                f"the plan has {plan.full.shape[1]} KV heads per layer; the model {n_kv_heads}"
            )
        self.idx: list[dict[str, Tensor]] = []
        for row in plan.full:
            full_kv = np.flatnonzero(row)
            stream_kv = np.flatnonzero(~row)

            def queries(kv: np.ndarray) -> Tensor:
                return torch.tensor(
                    [h * group + g for h in kv for g in range(group)], dtype=torch.long
                )

            self.idx.append(
                {
                    "full_kv": torch.tensor(full_kv, dtype=torch.long),
                    "stream_kv": torch.tensor(stream_kv, dtype=torch.long),
                    "full_q": queries(full_kv),
                    "stream_q": queries(stream_kv),
                }
            )
        self.cache: SplitCache | None = None
        self._stream_out: dict[int, Tensor] = {}

    def new_cache(self) -> SplitCache:
        """A fresh cache for one generation; the hook reads the streaming keys from it."""
        self.cache = SplitCache(
            [
                SplitCacheLayer(ix["full_kv"], ix["stream_kv"], self.plan.sink, self.plan.recent)
                for ix in self.idx
            ]
        )
        return self.cache

    def before(self, call: AttentionCall) -> None:
        ix = self.idx[call.layer]
        if not len(ix["stream_kv"]):
            return
        _check_plain(call)
        layer = self.cache.layers[call.layer] if self.cache is not None else None
        if layer is not None and layer.pending is not None:
            k, v, k_pos = layer.pending  # call.key already holds only the full heads
            layer.pending, end = None, layer.seen
        else:
            sk, fk = ix["stream_kv"].to(call.key.device), ix["full_kv"].to(call.key.device)
            k, v = call.key[:, sk], call.value[:, sk]
            end = call.key.shape[2]
            k_pos = torch.arange(end, device=call.key.device)
            call.key, call.value = call.key[:, fk], call.value[:, fk]
        n_q = call.query.shape[2]
        q_pos = torch.arange(end - n_q, end, device=k_pos.device)
        dev = call.query.device
        self._stream_out[call.layer] = streaming_attention(
            call.query[:, ix["stream_q"].to(dev)],
            k,
            v,
            q_pos,
            k_pos,
            sink=self.plan.sink,
            recent=self.plan.recent,
            scale=call.scaling,
            chunk=self.chunk,
        )
        if len(ix["full_kv"]):
            call.query = call.query[:, ix["full_q"].to(dev)]
        else:
            # No full head in this layer. The model's kernel still runs, so it gets one dummy
            # group (zero keys) whose output is dropped: CUDA SDPA kernels crash (SIGFPE) on
            # zero heads.
            b, _, n_k, d = call.key.shape
            call.key = call.key.new_zeros(b, 1, n_k, d)
            call.value = call.value.new_zeros(b, 1, n_k, d)
            call.query = call.query[:, : self.group]

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        stream = self._stream_out.pop(call.layer, None)
        if stream is None:
            return output
        ix = self.idx[call.layer]
        if not len(ix["full_kv"]):
            output = output[:, :, :0]  # the dummy group's output
        b, n_q, _, d = output.shape
        n_heads = len(ix["full_q"]) + len(ix["stream_q"])
        out = output.new_empty(b, n_q, n_heads, d)
        out[:, :, ix["full_q"].to(out.device)] = output
        out[:, :, ix["stream_q"].to(out.device)] = stream.transpose(1, 2).to(out.dtype)
        return out


def _check_plain(call: AttentionCall) -> None:
    """Streaming heads compute plain causal softmax attention: refuse a layer whose kernel does
    more (softcap, learned sinks, a sliding window or chunk, bidirectional attention), and padded
    batches (streaming positions are shared by the whole batch)."""
    for what, value in (
        ("a logit softcap", call.softcap),
        ("learned sink logits", call.sinks),
        ("ALiBi position biases", call.alibi_slopes),
        ("a score bias the model builds", call.bias),
        ("sink logits per query", call.row_sinks),
        ("a sliding window", call.window),
        ("chunked attention", call.chunk),
    ):
        if value is not None:
            raise HeadhuntError(
                f"KV-cache head pruning reproduces plain causal attention only; layer "
                f"{call.layer} has {what}"
            )
    if not call.causal:
        raise HeadhuntError(
            f"KV-cache head pruning reproduces causal attention only; layer {call.layer} is "
            "bidirectional"
        )
    mask = call.attention_mask
    if mask is None or mask.dtype != torch.bool:
        return  # None: causal without padding; additive masks are built causal by headhunt
    if not bool(mask[..., -1, :].all()):
        raise HeadhuntError("KV-cache head pruning needs unpadded batches (prompts of one length)")


@torch.inference_mode()
def generate_with_plan(
    model: HookedModel,
    prompts: Int[Tensor, "b n"],
    plan: KVPlan | None,
    *,
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
) -> tuple[Int[Tensor, "b steps"], Int[Tensor, " b"], int]:
    """Greedy decoding with streaming heads (``plan``; None: the model as it is, with a
    transformers DynamicCache).

    Returns (tokens, valid lengths incl. the stop token, KV-cache bytes at the end).
    """
    if getattr(model.model.config, "headhunt_pruning", None) and plan is not None:
        raise HeadhuntError("KV-cache head pruning runs on unpruned models (heads per layer vary)")
    if getattr(model, "loop_modules", None) is not None and plan is not None:
        raise HeadhuntError(
            "KV-cache head pruning needs one cache layer per layer; this model reapplies its "
            "layers in loops, each application writing a cache slot the model numbers itself"
        )
    from headhunt.probes.capture import greedy_decode

    hooks: tuple[AttentionHook, ...] = ()
    cache = None
    if plan is not None:
        hook = StreamingHeads(plan, model.n_heads, model.n_kv_heads)
        cache, hooks = hook.new_cache(), (hook,)
    dec = greedy_decode(
        model, prompts, max_new_tokens=max_new_tokens, stop_ids=stop_ids, hooks=hooks, cache=cache
    )
    return dec.tokens, dec.lengths, cache_nbytes(dec.cache)


def cache_nbytes(cache) -> int:
    """Bytes of keys and values a transformers cache (or a :class:`SplitCache`) holds."""
    if isinstance(cache, SplitCache):
        return cache.nbytes()
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, Tensor):
                total += t.numel() * t.element_size()
    return total


def stream_mask(
    n: int, sink: int, recent: int, *, offset: int = 0, n_k: int | None = None
) -> Bool[Tensor, "nq nk"]:
    """Dense boolean mask of the streaming rule (for references and tests): query i at position
    ``offset + i`` and key j at position j."""
    n_k = offset + n if n_k is None else n_k
    p = torch.arange(offset, offset + n)[:, None]
    j = torch.arange(n_k)[None]
    return (j <= p) & ((j < sink) | (j > p - recent))
