"""kvpress 0.5.5 on a text-only Gemma 3 (``Gemma3ForCausalLM``, e.g. Gemma 3 270M) under
kvpress's own Gemma 3 rule: compress the global layers only.

kvpress's ``BasePress.__call__`` skips Gemma 3's sliding-window layers ("Compression in Gemma3 is
only applied to layer without sliding window attention"), but its class check names only
``Gemma3ForConditionalGeneration``; the text-only class gets all 18 layers cut alike, and the
presses that re-rotate queries or keys call transformers 5.2's ``Gemma3RotaryEmbedding`` without
the layer type it needs (one frequency table per layer type). Three shims, each exact:

1. ``rule()``: the class check also matches ``Gemma3ForCausalLM`` (sliding layers are not hooked).
2. ``rope_default_global()``: a rotary call without a layer type gets the global layers' table.
   Under the rule only global layers are hooked, so every press call is a global layer's; the
   model's own calls pass the type. (DuoAttention's on-the-fly scorer rotates every layer with
   it; its sliding-layer scores are never used: those layers are never streamed.)
3. ``positioned_cache()``: transformers' sliding layers keep their 512-token window
   (``DynamicSlidingWindowLayer``); the global layers get a ``PositionedLayer`` that counts the
   positions a press dropped. Without it the question and decoded tokens are placed wrongly: the
   model takes its positions from layer 0 (a sliding, uncompressed layer: the true positions)
   while a compressed global layer indexes its keys 0..kept-1, so the causal mask lets every
   question token see the question tokens after it (``tests/kvpress_env/test_gemma3_rule.py``
   shows it). ``PositionedLayer`` reports the dropped count as the mask's key offset.
"""

from __future__ import annotations

import contextlib

import numpy as np
from kvpress.presses import base_press
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3ForConditionalGeneration
from transformers.cache_utils import DynamicLayer
from transformers.models.gemma3 import modeling_gemma3


def is_gemma3_text(model) -> bool:
    return isinstance(model, Gemma3ForCausalLM)


def global_layers(model) -> list[int]:
    return [i for i, t in enumerate(model.config.layer_types) if t == "full_attention"]


@contextlib.contextmanager
def rule(enabled: bool = True):
    """kvpress's Gemma 3 rule (sliding layers not compressed) for the text-only class too."""
    before = base_press.Gemma3ForConditionalGeneration
    if enabled:
        base_press.Gemma3ForConditionalGeneration = (
            Gemma3ForConditionalGeneration,
            Gemma3ForCausalLM,
        )
    try:
        yield
    finally:
        base_press.Gemma3ForConditionalGeneration = before


_forward = modeling_gemma3.Gemma3RotaryEmbedding.forward


def _forward_global_default(self, x, position_ids, layer_type=None):
    return _forward(self, x, position_ids, layer_type or "full_attention")


def rope_default_global(enabled: bool = True) -> None:
    modeling_gemma3.Gemma3RotaryEmbedding.forward = _forward_global_default if enabled else _forward


class PositionedLayer(DynamicLayer):
    """A full-attention cache layer that remembers how many positions it has seen, so a press
    that drops entries (kvpress sets ``keys``/``values`` directly) leaves the later tokens at
    their true positions: the mask's key offset is the number dropped."""

    def __init__(self):
        super().__init__()
        self.seen = 0

    def update(self, key_states, value_states, *args, **kwargs):
        self.seen += key_states.shape[-2]
        return super().update(key_states, value_states, *args, **kwargs)

    def stored(self) -> int:
        return super().get_seq_length()

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, cache_position):
        stored = self.stored()
        return stored + cache_position.shape[0], self.seen - stored


def positioned_cache(model) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    for i in global_layers(model):
        cache.layers[i] = PositionedLayer()
    return cache


def duo_window(target: float, length: int, n_global: int, sink: int = 128, recent: int = 256):
    """(streamed global KV heads k, recent window) with which DuoAttention removes exactly
    ``target`` of the global layers' entries at ``length`` tokens (1 KV head a layer: whole
    heads are coarse). k = the fewest heads that can remove it with the default window; the
    window is then widened so the removal is exact. Returns (0, recent) for target 0."""
    if target <= 0:
        return 0, recent
    most = 1 - (sink + recent) / length
    k = int(np.ceil(target * n_global / most - 1e-9))
    if k > n_global:
        raise ValueError(f"DuoAttention cannot remove {target} of the global entries")
    window = round(length * (1 - target * n_global / k)) - sink
    return k, window


def global_pattern(scores: np.ndarray, layers: list[int]) -> np.ndarray:
    """A [layers, KV heads] DuoAttention pattern whose sliding layers (all but ``layers``) can
    never be streamed (they are not compressed under the rule): their entries go above every
    global score."""
    out = np.array(scores, dtype=float, copy=True)
    sliding = [i for i in range(out.shape[0]) if i not in layers]
    out[sliding] = np.nanmax(out) + 1.0
    return out


def layer_entries(model, cache) -> list[tuple[int, int]]:
    """Per layer (entries held, entries kept): held = batch x KV heads x positions stored
    (a sliding layer stores at most its window - 1), kept = held minus kvpress's masked entries."""
    out = []
    for layer, cache_layer in zip(model.model.layers, cache.layers, strict=True):
        k = cache_layer.keys
        n = int(k.shape[0] * k.shape[1] * k.shape[2])
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        out.append((n, n - (0 if masked is None else int(masked[0].numel()))))
    return out
