"""headhunt's presses for NVIDIA kvpress (https://github.com/NVIDIA/kvpress, 0.5.5).

Importable only where kvpress is installed (``make kvpress-env``: kvpress pins transformers
< 5.3, so it lives in its own environment). Both presses take head data headhunt exports
(:mod:`headhunt.kvbudget`) and run inside kvpress's own pipeline:

- :class:`HeadWeightedPress`: a token scorer whose scores are multiplied by a per-KV-head weight
  (``export --format adakv``). Inside kvpress's ``AdaKVPress``, which evicts the lowest scores
  across each layer's heads, the weights move budget towards the heads the weights favour.
- :class:`HeadBudgetPress`: per-head token budgets from head scores combined with a token
  scorer. Every KV head of every layer gets the kept share of
  :func:`headhunt.kvbudget.keep_shares` (the best-scoring heads keep their whole cache first;
  the others in proportion to ``floor + score``), so the budget moves across layers as well as
  heads; within a head the token scorer (expected attention by default, or key norms via
  ``KnormPress``, or the most recent ones via :class:`RecencyPress`) picks the tokens, after
  the first ``sink`` and last ``window`` tokens.

:func:`attention_spread` measures the head data for a per-head budget that head scores of
retrieval runs cannot give: each query head's share of attention mass outside its first ``sink``
and last ``window`` keys (the tokens :class:`HeadBudgetPress` always keeps), exactly, from the
model's own (eager) attention probabilities on a set of texts.

Both evict by kvpress's head-wise masking (``module.masked_key_indices``, read by kvpress's
attention patch): evicted keys stay in memory, masked, as in kvpress's AdaKV, DuoAttention and
LU-KV presses. :attr:`HeadBudgetPress.kept_share` records the share of KV entries it kept in the
last prefill (over the layers it compressed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

try:
    from kvpress.presses.base_press import BasePress
    from kvpress.presses.expected_attention_press import ExpectedAttentionPress
    from kvpress.presses.scorer_press import ScorerPress
except ImportError as e:  # the main environment has no kvpress (its transformers is too new)
    from headhunt.errors import HeadhuntError

    raise HeadhuntError(
        "headhunt.kvpress_press needs kvpress 0.5.5 (its own environment: make kvpress-env)"
    ) from e

from headhunt.kvbudget import DEFAULT_FLOOR, keep_shares, scaled


def _layer_count(model) -> tuple[int, int]:
    c = getattr(model.config, "text_config", model.config)
    return int(c.num_hidden_layers), int(c.num_key_value_heads or c.num_attention_heads)


def _check_shape(array: np.ndarray, model, what: str) -> None:
    want = _layer_count(model)
    if tuple(array.shape) != want:
        raise ValueError(
            f"{what} cover {array.shape[0]} layers x {array.shape[1]} KV heads; the model has "
            f"{want[0]} x {want[1]}"
        )


@dataclass
class HeadWeightedPress(ScorerPress):
    """``press``'s token scores times ``weights[layer, kv_head]`` (needs non-negative token
    scores: ExpectedAttention, SnapKV, TOVA...). Alone it evicts the same tokens as ``press``
    (a per-head factor does not change a head's own order); inside ``AdaKVPress`` it shifts
    budget between heads."""

    press: ScorerPress = field(default_factory=ExpectedAttentionPress)
    weights: np.ndarray | None = None

    def __post_init__(self):
        assert isinstance(self.press, ScorerPress), "HeadWeightedPress wraps a ScorerPress"
        assert self.weights is not None and (np.asarray(self.weights) > 0).all(), (
            "HeadWeightedPress needs positive weights [layers, kv_heads]"
        )
        self.weights = np.asarray(self.weights, dtype=float)

    def post_init_from_model(self, model):
        _check_shape(self.weights, model, "the head weights")
        self.press.post_init_from_model(model)

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        if (scores < 0).any():
            raise ValueError(f"{type(self.press).__name__} gives negative token scores")
        w = torch.as_tensor(self.weights[module.layer_idx], device=scores.device)
        return scores * w.to(scores.dtype).view(1, -1, 1)


@dataclass
class HeadBudgetPress(BasePress):
    """Per-KV-head token budgets from head scores (``head_scores``: [layers, kv_heads], e.g.
    the max retrieval score of each KV head's query heads), tokens chosen by ``press``.

    ``compression_ratio`` c: the mean kept share over all (layer, KV head) pairs is 1 - c, as
    :func:`headhunt.kvbudget.keep_shares` splits it (``floor``: a zero-score head's weight).
    The first ``sink`` and last ``window`` tokens of every head are kept before the scorer's
    choice (they count towards the head's budget)."""

    head_scores: np.ndarray | None = None
    press: ScorerPress = field(default_factory=ExpectedAttentionPress)
    compression_ratio: float = 0.0
    floor: float = DEFAULT_FLOOR
    sink: int = 4
    window: int = 64
    kept_entries: int = field(init=False, default=0)
    total_entries: int = field(init=False, default=0)

    def __post_init__(self):
        assert self.head_scores is not None, "HeadBudgetPress needs head_scores [layers, kv_heads]"
        assert 0 <= self.compression_ratio < 1, "compression_ratio must be in [0, 1)"
        assert self.floor > 0, "floor must be positive"
        self.head_scores = np.asarray(self.head_scores, dtype=float)

    def post_init_from_model(self, model):
        _check_shape(self.head_scores, model, "the head scores")
        self.press.post_init_from_model(model)
        self.kept_entries = self.total_entries = 0

    @property
    def kept_share(self) -> float:
        return self.kept_entries / max(self.total_entries, 1)

    def shares(self) -> np.ndarray:
        """[layers, kv_heads] kept shares for the current ratio."""
        return keep_shares(scaled(self.head_scores), 1 - self.compression_ratio, self.floor)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        bsz, n_kv, k_len, _ = keys.shape
        self.total_entries += bsz * n_kv * k_len
        if self.compression_ratio == 0:
            self.kept_entries += bsz * n_kv * k_len
            return keys, values
        share = torch.as_tensor(self.shares()[module.layer_idx], device=keys.device)
        keep = (share * k_len).round().long().clamp(min=1, max=k_len)  # [kv_heads]
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        top = scores.max().item() + 1
        scores[..., : min(self.sink, k_len)] = top
        scores[..., max(0, k_len - self.window) :] = top
        order = torch.argsort(scores, dim=-1, descending=True, stable=True)
        rank = torch.arange(k_len, device=keys.device).view(1, 1, k_len)
        pruned = rank >= keep.view(1, n_kv, 1)  # by rank: the lowest-scored positions go
        b, h, r = torch.where(pruned.expand(bsz, n_kv, k_len))
        self.kept_entries += int(bsz * keep.sum().item())
        module.masked_key_indices = (b, h, order[b, h, r]) if b.numel() else None
        return keys, values


@dataclass
class RecencyPress(ScorerPress):
    """Scores each token by its position, so a budget keeps the most recent tokens (inside
    :class:`HeadBudgetPress`: a per-head StreamingLLM window whose length is the head's budget).
    """

    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        bsz, n_kv, k_len, _ = keys.shape
        pos = torch.arange(1, k_len + 1, device=keys.device, dtype=keys.dtype) / k_len
        return pos.view(1, 1, k_len).expand(bsz, n_kv, k_len).clone()


def outside_mass(weights: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """Per-head mean share of attention mass outside the first ``sink`` keys and the last
    ``window`` keys of each query row (its own key included in the window), over the rows that
    have such keys (row ``i >= sink + window``). ``weights``: [batch, heads, queries, keys]
    causal attention probabilities with queries aligned to the last keys; returns [heads]."""
    b, h, nq, nk = weights.shape
    first = max(sink + window, nk - nq)
    if first >= nk:
        raise ValueError(f"{nk} keys leave no row beyond sink {sink} + window {window}")
    rows = torch.arange(first, nk, device=weights.device)  # absolute positions of the rows
    w = weights[:, :, rows - (nk - nq)].float()
    c = torch.cumsum(w, dim=-1)  # c[..., j] = mass on keys 0..j
    hi = (rows - window).view(1, 1, -1, 1).expand(b, h, -1, 1)  # last key outside the window
    middle = c.gather(-1, hi).squeeze(-1) - (c[..., sink - 1] if sink > 0 else 0.0)
    return middle.mean(dim=(0, 2))


def attention_spread(model, texts_ids: list[list[int]], sink: int, window: int) -> np.ndarray:
    """[layers, query heads] mean :func:`outside_mass` of the model's attention on the texts
    (token id lists), from its eager attention probabilities (exact: no approximation; one
    layer's [heads, n, n] matrix at a time, reduced inside a forward hook)."""
    layers = attention_layers(model)
    sums = [None] * len(layers)
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")

    def hook(i):
        def reduce(_module, _args, output):
            m = outside_mass(output[1], sink, window)
            sums[i] = m if sums[i] is None else sums[i] + m

        return reduce

    handles = [layer.self_attn.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            for ids in texts_ids:
                model.model(input_ids=torch.tensor([ids], device=model.device))
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(before)
    return torch.stack(sums).cpu().numpy() / len(texts_ids)


def attention_layers(model) -> list:
    """The decoder layers kvpress hooks (a multimodal model's language model, as kvpress's
    ``BasePress.__call__`` finds them)."""
    inner = model.model
    return list((inner.language_model if hasattr(inner, "language_model") else inner).layers)


def kv_entries(model, cache) -> tuple[int, int]:
    """(entries held, entries kept) of a kvpress-compressed cache, summed over layers: held =
    batch x KV heads x positions in the cache; kept = held minus the entries kvpress masked
    (``module.masked_key_indices``, set by head-wise presses for the last prefill). One entry
    is a key and a value of head_dim numbers each."""
    held = kept = 0
    for layer, cache_layer in zip(attention_layers(model), cache.layers, strict=True):
        k = cache_layer.keys
        n = int(k.shape[0] * k.shape[1] * k.shape[2])
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        held += n
        kept += n - (0 if masked is None else int(masked[0].numel()))
    return held, kept
