"""The attention hook layer: transparent when idle, sees post-rotary q/k, can intervene."""

from __future__ import annotations

import pytest
import torch

from headhunt.heads.interventions.masking import mask_heads
from headhunt.probes.attention import AttentionHook
from headhunt.probes.capture import capture_qk, greedy_decode


@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_hooked_model_matches_plain_transformers(tiny, plain_model, base):
    ids = torch.randint(5, 60, (2, 33), device=tiny.device)
    for m in tiny.modules:
        m.headhunt_base = base
    try:
        with torch.no_grad():
            ours = tiny.model(ids).logits
            ref = plain_model(tiny).to(tiny.device)(ids).logits
    finally:
        for m in tiny.modules:
            m.headhunt_base = "sdpa"
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)


def test_capture_qk_is_post_rotary(tiny, plain_model):
    ids = torch.randint(5, 60, (1, 17), device=tiny.device)
    qk = capture_qk(tiny, ids)
    assert sorted(qk) == [0, 1]
    q, k = qk[0]
    assert q.shape == (1, 4, 17, 16) and k.shape == (1, 2, 17, 16)
    # Recompute layer 0's attention from the captured q, k: it must match eager's weights.
    ref = plain_model(tiny).to(tiny.device)
    with torch.no_grad():
        weights = ref(ids, output_attentions=True).attentions[0]
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k.repeat_interleave(2, 1)) / 4.0
    scores = scores.masked_fill(
        torch.ones(17, 17, dtype=torch.bool, device=tiny.device).triu(1), float("-inf")
    )
    torch.testing.assert_close(scores.softmax(-1), weights, atol=1e-5, rtol=1e-4)


def test_decode_with_cache_matches_full_forward(tiny):
    ids = torch.randint(5, 60, (2, 21), device=tiny.device)
    dec = greedy_decode(tiny, ids, max_new_tokens=5, capture_argmax=True)
    assert dec.argmax.shape == (5, 2, 2, 4)
    full = torch.cat([ids, dec.tokens], 1)
    with torch.no_grad():
        logits = tiny.model(full).logits
    torch.testing.assert_close(logits[:, 20:-1].argmax(-1), dec.tokens[:, :5])


def test_masked_query_gives_uniform_attention(tiny):
    seen = {}

    class Out(AttentionHook):
        def after(self, call, output):
            seen[call.layer] = (output.clone(), call.value.clone())
            return output

    ids = torch.randint(5, 60, (1, 9), device=tiny.device)
    with mask_heads(tiny, [(1, 3)]), tiny.hooks(Out(), layers=[1]):
        tiny.forward(ids)
    out, value = seen[1]
    # Head 3 uses KV head 1; with a zero query each row averages the values it can see.
    v = value[0, 1]
    expected = torch.cumsum(v, 0) / torch.arange(1, 10, device=v.device)[:, None]
    torch.testing.assert_close(out[0, :, 3], expected, atol=1e-5, rtol=1e-4)
    # Other heads are untouched, and the hook is gone after the block.
    with tiny.hooks(Out(), layers=[1]):
        tiny.forward(ids)
    assert not torch.allclose(seen[1][0][0, :, 3], expected)


def test_output_mask_zeroes_the_head(tiny):
    seen = {}

    class Out(AttentionHook):
        def after(self, call, output):
            seen["out"] = output.clone()
            return output

    ids = torch.randint(5, 60, (1, 9))
    with mask_heads(tiny, [(0, 1)], mode="output"), tiny.hooks(Out(), layers=[0]):
        tiny.forward(ids)
    assert seen["out"][0, :, 1].abs().max() == 0
    assert seen["out"][0, :, 0].abs().max() > 0


@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_left_padded_batch_matches_each_sequence_alone(tiny, base):
    # transformers drops padding masks for attention implementations it has no mask builder
    # for; without ours, the short sequence would attend to its pads.
    long_ids = torch.randint(5, 60, (1, 12), device=tiny.device)
    short_ids = torch.randint(5, 60, (1, 7), device=tiny.device)
    batch = torch.cat(
        [
            long_ids,
            torch.cat([torch.zeros(1, 5, dtype=torch.long, device=tiny.device), short_ids], 1),
        ]
    )
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    for m in tiny.modules:
        m.headhunt_base = base
    try:
        with torch.no_grad():
            padded = tiny.model(batch, attention_mask=mask, position_ids=position_ids).logits
            alone = [tiny.model(ids).logits[0] for ids in (long_ids, short_ids)]
    finally:
        for m in tiny.modules:
            m.headhunt_base = "sdpa"
    torch.testing.assert_close(padded[0], alone[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(padded[1, 5:], alone[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("hooked", [False, True])
def test_cached_sdpa_calls_run_with_cudnn_attention_off(tiny, monkeypatch, hooked):
    # cuDNN's decode kernel is not reproducible (benchmarks/gpu_determinism.py): every cached
    # SDPA call through headhunt's implementation must see it switched off; whole-sequence calls
    # keep it; the flag comes back afterwards.
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, *args, **kwargs):
        seen.append((query.shape[2] == key.shape[2], torch.backends.cuda.cudnn_sdp_enabled()))
        return sdpa(query, key, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    ids = torch.randint(5, 60, (1, 9), device=tiny.device)
    with torch.no_grad():
        if hooked:
            greedy_decode(tiny, ids, max_new_tokens=3, capture_argmax=True)
        else:
            tiny.model(ids[:, :-1], use_cache=True)
    n = tiny.n_layers
    expected = [(True, True)] * n + ([(False, False)] * 3 * n if hooked else [])
    assert seen == expected
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_greedy_decode_repeats_exactly(tiny):
    ids = torch.randint(5, 60, (3, 40), device=tiny.device)
    a = greedy_decode(tiny, ids, max_new_tokens=6, capture_argmax=True)
    b = greedy_decode(tiny, ids, max_new_tokens=6, capture_argmax=True)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.argmax, b.argmax)
