"""benchmarks/kvpress/gemma3_rule.py on a tiny random Gemma 3 (3 sliding layers of window 8, one
global layer): kvpress's Gemma 3 rule leaves the sliding layers whole, and with
``positioned_cache`` a press that drops entries answers exactly as the same press masking them
(the question tokens sit at their true positions); with a plain cache they do not (the leak
the positioned layer exists for). Runs in kvpress's environment (``make kvpress-test``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("kvpress")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from kvpress import BasePress, ScorerPress, SnapKVPress, StreamingLLMPress  # noqa: E402
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kvpress"))
import gemma3_rule as g3  # noqa: E402

CONTEXT, QUESTION = 40, 6


@dataclass
class AsMask(BasePress):
    """The same press, its evicted entries masked (kvpress's head-wise mechanism) instead of
    dropped: the reference in which every key keeps its index."""

    press: ScorerPress = None

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        k_len = keys.shape[2]
        n_kept = int(k_len * (1 - self.press.compression_ratio))
        keep = scores.topk(n_kept, dim=-1).indices
        dropped = torch.ones_like(scores, dtype=torch.bool).scatter_(-1, keep, False)
        module.masked_key_indices = torch.where(dropped)
        return keys, values


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        max_position_embeddings=256,
    )
    cfg._attn_implementation = "sdpa"
    m = Gemma3ForCausalLM(cfg).eval()
    # random weights put the global layer's attention nearly uniform: sharpen it so that
    # which keys it sees matters for the logits
    with torch.no_grad():
        m.model.layers[3].self_attn.q_proj.weight.mul_(8)
    return m


def answer_logits(model, press, ids, cache):
    ctx, question = ids[:, :CONTEXT], ids[:, CONTEXT:]
    g3.rope_default_global(True)
    try:
        with torch.no_grad(), g3.rule(), press(model) if press else torch.no_grad():
            model.model(input_ids=ctx, past_key_values=cache)
        pos = torch.arange(CONTEXT, CONTEXT + QUESTION).unsqueeze(0)
        with torch.no_grad():
            return model(input_ids=question, past_key_values=cache, position_ids=pos).logits
    finally:
        g3.rope_default_global(False)


def ids(seed=0):
    return torch.randint(
        0, 97, (1, CONTEXT + QUESTION), generator=torch.Generator().manual_seed(seed)
    )


def test_uncompressed_equals_one_forward(model):
    x = ids()
    with torch.no_grad():
        whole = model(input_ids=x).logits[:, CONTEXT:]
    got = answer_logits(model, None, x, g3.positioned_cache(model))
    torch.testing.assert_close(got, whole, atol=1e-5, rtol=1e-5)


def test_rule_compresses_global_layers_only(model):
    cache = g3.positioned_cache(model)
    answer_logits(model, StreamingLLMPress(compression_ratio=0.5), ids(), cache)
    stored = [layer.keys.shape[2] for layer in cache.layers]
    # sliding layers: their window - 1 (plus the question), the global layer: half the context
    assert stored[:3] == [7, 7, 7]
    assert stored[3] == CONTEXT // 2 + QUESTION
    assert g3.global_layers(model) == [3]


PRESSES = {
    "streaming": lambda: StreamingLLMPress(compression_ratio=0.5),
    "snapkv": lambda: SnapKVPress(compression_ratio=0.5, window_size=8),
}


@pytest.mark.parametrize("name", list(PRESSES))
def test_dropped_equals_masked_with_positions(model, name):
    x = ids(1)
    make = PRESSES[name]
    dropped = answer_logits(model, make(), x, g3.positioned_cache(model))
    masked = answer_logits(model, AsMask(press=make()), x, g3.positioned_cache(model))
    torch.testing.assert_close(dropped, masked, atol=1e-4, rtol=1e-4)


def test_plain_cache_lets_question_tokens_see_later_ones(model):
    """The leak: with transformers' own hybrid cache (sliding windows, plain global layers) the
    compressed global layer's mask takes the true positions from layer 0 but indexes its keys
    0..kept-1, so changing the last question token changes the first one's logits. (With an
    all-plain ``DynamicCache()`` the rule does not even run: the mask is sized from layer 0.)"""
    press = StreamingLLMPress(compression_ratio=0.5)
    x, y = ids(2), ids(2).clone()
    y[0, -1] = (y[0, -1] + 1) % 97
    a = answer_logits(model, press, x, DynamicCache(config=model.config))[0, 0]
    b = answer_logits(model, press, y, DynamicCache(config=model.config))[0, 0]
    assert (a - b).abs().max() > 1e-3
    a = answer_logits(model, press, x, g3.positioned_cache(model))[0, 0]
    b = answer_logits(model, press, y, g3.positioned_cache(model))[0, 0]
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_duo_window_removes_the_target_exactly():
    for target in (0.25, 0.5, 0.75, 0.875):
        k, window = g3.duo_window(target, 4096, 3)
        assert abs(k * (4096 - 128 - window) / (3 * 4096) - target) < 1e-3
    assert g3.duo_window(0.5, 4096, 3) == (2, 896)
    assert g3.duo_window(0.75, 4096, 3) == (3, 896)


def test_adakv_with_one_kv_head_a_layer_is_its_inner_press(model):
    """docs/kv.md leaves AdaKV out on Gemma 3 270M (one KV head a layer): spreading a layer's
    budget over its KV heads is then a no-op, so AdaKV(ExpectedAttention) masks exactly the
    entries ExpectedAttention drops, and answers alike."""
    from kvpress import AdaKVPress, ExpectedAttentionPress

    x = ids(3)
    inner = answer_logits(
        model, ExpectedAttentionPress(compression_ratio=0.5), x, g3.positioned_cache(model)
    )
    ada = answer_logits(
        model,
        AdaKVPress(ExpectedAttentionPress(compression_ratio=0.5)),
        x,
        g3.positioned_cache(model),
    )
    torch.testing.assert_close(ada, inner, atol=1e-4, rtol=1e-4)
    full = answer_logits(model, None, x, g3.positioned_cache(model))
    assert (inner - full).abs().max() > 1e-3  # the press does change the answer


def test_duo_snap_on_gemma_keeps_what_hh_duo_keeps_full_and_the_global_ratio():
    """compare.py's Gemma deployment of ``duo_snap`` (Gemma 3 270M's shape: 18 layers, one KV
    head each, global layers 5, 11, 17): at 0.5 DuoAttention's Gemma deployment streams 2 of the
    3 global heads, so the best-scored global layer stays whole and the other two share the
    rest of the global budget; at 0.75 all three are streamed; sliding layers keep share 1."""
    from compare import duo_snap

    pattern = np.zeros((18, 1))
    pattern[[5, 11, 17], 0] = [0.88, 0.94, 0.21]
    pattern[0, 0] = 5.0  # a sliding layer's score never picks a full head
    half = duo_snap(pattern, 0.5, 4096, [5, 11, 17]).shares()
    assert half[[5, 11, 17], 0].tolist() == pytest.approx([0.25, 1.0, 0.25])
    assert (half[[i for i in range(18) if i not in (5, 11, 17)]] == 1).all()
    most = duo_snap(pattern, 0.75, 4096, [5, 11, 17]).shares()
    assert most[[5, 11, 17], 0].tolist() == pytest.approx([0.25, 0.25, 0.25])
    for shares, ratio in ((half, 0.5), (most, 0.75)):  # removed: the ratio of global entries
        assert 1 - shares[[5, 11, 17]].mean() == pytest.approx(ratio)


def test_duo_snap_on_gemma_prunes_the_global_layer_only(model):
    """On the tiny Gemma 3 under the rule: the one global head (streamed at 0.5) keeps its share
    of the context, chosen by SnapKV, the sliding layers keep their window."""
    from compare import duo_snap

    press = duo_snap(np.full((4, 1), 0.5), 0.5, 4096, [3])
    assert press.shares()[:, 0].tolist() == pytest.approx([1.0, 1.0, 1.0, 0.5])
    press.press.window_size = 8  # SnapKV's observation window, shorter than the context
    cache = g3.positioned_cache(model)
    got = answer_logits(model, press, ids(4), cache)
    masked = model.model.layers[3].self_attn.masked_key_indices
    assert masked[2].numel() == CONTEXT // 2  # 20 of the 40 context entries masked
    assert all(
        getattr(model.model.layers[i].self_attn, "masked_key_indices", None) is None
        for i in range(3)
    )
    full = answer_logits(model, None, ids(4), g3.positioned_cache(model))
    assert (got - full).abs().max() > 1e-3
