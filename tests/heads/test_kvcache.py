"""KV-cache head pruning: the streaming-head intervention equals eager attention with the same
mask, and its cache really holds sink + recent entries per streaming head."""

import numpy as np
import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.heads.interventions.kvcache import (
    KVPlan,
    StreamingHeads,
    generate_with_plan,
    kv_scores,
    plan_from_ranking,
    rank_kv_heads,
    stream_mask,
)
from headhunt.probes.attention import AttentionHook
from headhunt.probes.tiny import tiny_llama


class DenseMasked(AttentionHook):
    """Reference: eager attention (explicit softmax over a dense per-head mask) for all heads,
    computed from the full cache a plain DynamicCache gives."""

    def __init__(self, plan: KVPlan, group: int):
        self.plan, self.group = plan, group

    def after(self, call, output):
        q, k, v = call.query.double(), call.key.double(), call.value.double()
        n_q, n_k = q.shape[2], k.shape[2]
        off = n_k - n_q
        causal = stream_mask(n_q, n_k, n_k, offset=off, n_k=n_k)  # recent >= n_k: plain causal
        stream = stream_mask(n_q, self.plan.sink, self.plan.recent, offset=off, n_k=n_k)
        heads = []
        for h in range(q.shape[1]):
            kv = h // self.group
            mask = causal if self.plan.full[call.layer, kv] else stream
            s = (q[:, h] @ k[:, kv].transpose(-1, -2)) * call.scaling
            s = s.masked_fill(~mask, float("-inf"))
            heads.append(torch.softmax(s, -1) @ v[:, kv])
        return torch.stack(heads, 2).to(output.dtype)  # [b, n_q, heads, d]


def _plan(model, fraction, sink=2, recent=5, seed=0):
    shape = (model.n_layers, model.n_kv_heads)
    order = np.random.default_rng(seed).permutation(shape[0] * shape[1])
    return plan_from_ranking(order, shape, fraction, sink, recent)


@pytest.mark.parametrize("fraction", [0.0, 0.5])
@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_split_cache_equals_dense_masked_eager(fraction, base):
    torch.set_default_dtype(torch.float32)
    model = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2, attn_implementation=base)
    model.model.double()
    plan = _plan(model, fraction)
    ids = torch.randint(5, 60, (2, 23))
    hook = StreamingHeads(plan, model.n_heads, model.n_kv_heads, chunk=4)
    ref = DenseMasked(plan, model.group_size)
    with torch.inference_mode():
        cache = hook.new_cache()
        with model.hooks(hook):
            got = [model.model(ids[:, :15], None, None, cache, use_cache=True).logits[:, -1]]
            for t in range(15, 23):
                got.append(
                    model.model(ids[:, t : t + 1], None, None, cache, use_cache=True).logits[:, -1]
                )
        with model.hooks(ref):
            full = model.model(ids, use_cache=False).logits
    want = [full[:, 14]] + [full[:, t] for t in range(15, 23)]
    for g, w in zip(got, want, strict=True):
        # eager softmax runs in float32 even for a float64 model
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)
    # Streaming heads keep sink + recent positions only; full heads the whole context.
    for layer, row in zip(cache.layers, plan.full, strict=True):
        assert layer.keys.shape[1:3] == (int(row.sum()), 23)
        assert layer.stream_keys.shape[1:3] == (int((~row).sum()), 2 + 5)
        assert layer.stream_pos.tolist() == [0, 1, 18, 19, 20, 21, 22]


def test_all_full_is_the_plain_model_and_memory_falls():
    model = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2)
    ids = torch.randint(5, 60, (1, 40))
    plain = generate_with_plan(model, ids, None, max_new_tokens=4)
    full = generate_with_plan(model, ids, _plan(model, 1.0), max_new_tokens=4)
    assert torch.equal(plain[0], full[0])
    assert plain[2] == full[2] == 2 * 2 * 2 * 43 * 16 * 4  # layers, k+v, kv heads, tokens, d, fp32
    half = generate_with_plan(model, ids, _plan(model, 0.5, sink=2, recent=5), max_new_tokens=4)
    assert half[2] == 2 * 2 * (43 + 7) * 16 * 4  # per layer one full and one streaming KV head


def test_kv_scores_rank_by_best_query_head():
    m = np.array([[0.0, 0.9, 0.1, 0.2], [0.3, 0.0, 0.0, 0.0]])
    s = kv_scores(m, 2)
    assert s.tolist() == [[0.9, 0.2], [0.3, 0.0]]
    assert rank_kv_heads(s)[:3].tolist() == [0, 2, 1]


def test_padded_batches_are_refused():
    model = tiny_llama()
    hook = StreamingHeads(_plan(model, 0.0), model.n_heads, model.n_kv_heads)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, :3] = 0
    with pytest.raises(HeadhuntError, match="unpadded"), model.hooks(hook):
        model.forward(torch.randint(5, 60, (2, 10)), attention_mask=mask, use_cache=False)


@pytest.mark.parametrize(
    ("family", "what"),
    [("mistral", "sliding window"), ("gemma2", "softcap|sliding window"), ("gpt_oss", "sink")],
)
def test_layers_that_do_more_than_plain_causal_attention_are_refused(family, what):
    """Streaming heads compute plain causal softmax: a window, softcap or learned sinks would be
    dropped silently, so such layers are refused in one line."""
    from headhunt.probes.hooked import HookedModel
    from headhunt.probes.tiny import tiny_causal_lm, word_tokenizer

    model = HookedModel(tiny_causal_lm(family), word_tokenizer(), name=family)
    hook = StreamingHeads(_plan(model, 0.0), model.n_heads, model.n_kv_heads)
    with pytest.raises(HeadhuntError, match=what), model.hooks(hook):
        model.forward(torch.randint(5, 60, (1, 12)), use_cache=False)
