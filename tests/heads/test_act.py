"""ACT calibration: the maths, a dense reference, prefill = cached decoding, GQA, isolation."""

from __future__ import annotations

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.heads.interventions.act import (
    ActConfig,
    act_calibration,
    calibrate_rows,
    causal_sink_mask,
)
from headhunt.probes.attention import AttentionHook


class Recorder(AttentionHook):
    """Keeps each layer's q, k, v and (post-intervention) output of the last call."""

    def __init__(self):
        self.qkv, self.out = {}, {}

    def before(self, call):
        self.qkv[call.layer] = (call.query.clone(), call.key.clone(), call.value.clone())

    def after(self, call, output):
        self.out[call.layer] = output.clone()
        return output


def dense_reference(q, k, v, scale, heads, cfg):
    """Row-by-row, loop-based ACT with causal sink sets: an independent re-derivation."""
    b, hq, n, _ = q.shape
    group = hq // k.shape[1]
    outs = {}
    for h in heads:
        kv = h // group
        scores = (q[:, h] @ k[:, kv].transpose(-1, -2)) * scale
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        a = scores.softmax(-1)  # [b, n, n]
        new = a.clone()
        for p in range(n):
            col = a[:, : p + 1, : p + 1].sum(1)  # [b, p+1] sums over rows <= p
            count = torch.tensor([p - j + 1 for j in range(p + 1)], dtype=torch.float32)
            s = col / count
            for bi in range(b):
                sinks = [
                    j for j in range(p + 1) if s[bi, j] > cfg.tau and count[j] >= cfg.min_queries
                ]
                if cfg.exclude_first and sinks:
                    sinks = sinks[1:]
                row = a[bi, p, : p + 1]
                on = float(sum(row[j] for j in sinks))
                off = float(row.sum()) - on
                if off <= 1e-6 or not sinks:
                    continue
                r = (1 - cfg.beta) * on
                for j in range(p + 1):
                    if j in sinks:
                        new[bi, p, j] = cfg.beta * row[j]
                    else:
                        new[bi, p, j] = row[j] * (1 + r / off)
        outs[h] = new @ v[:, kv]  # [b, n, d]
    return outs


def cache_of(output):
    """The KV cache of an output: ``cache`` in newer transformers, ``past_key_values`` before.
    (It is passed back positionally, as the fourth argument, for the same reason.)"""
    return output["cache"] if "cache" in output else output["past_key_values"]


def ids_for(model, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, len(model.tokenizer), (n,), generator=g)


def test_calibrate_rows_maths():
    g = torch.Generator().manual_seed(1)
    probs = torch.rand(6, 10, generator=g).softmax(-1)
    sinks = torch.rand(6, 10, generator=g) < 0.3
    sinks[4] = True  # all mass on sinks: unchanged
    sinks[5] = False  # no sinks: unchanged
    new = calibrate_rows(probs, sinks, 0.4)
    torch.testing.assert_close(new.sum(-1), torch.ones(6))
    on_old = torch.where(sinks, probs, 0).sum(-1)
    on_new = torch.where(sinks, new, 0).sum(-1)
    torch.testing.assert_close(on_new[:4], 0.4 * on_old[:4])
    # The removed mass goes to the non-sinks in proportion to their attention.
    ratio = torch.where(sinks, float("nan"), new / probs)
    for row in ratio[:4]:
        vals = row[~row.isnan()]
        torch.testing.assert_close(vals, vals[0].expand_as(vals))
        assert float(vals[0]) > 1.0
    torch.testing.assert_close(new[4:], probs[4:])


def test_causal_sink_mask_rules():
    # One row at position 4 whose column sums make keys 0, 2 and 4 pass tau.
    cum = torch.tensor([[2.5, 0.0, 0.9, 0.0, 0.5]])
    pos = torch.tensor([4])
    m = causal_sink_mask(cum, pos, tau=0.1, min_queries=1, exclude_first=False)
    assert m[0].tolist() == [True, False, True, False, True]
    m = causal_sink_mask(cum, pos, tau=0.1, min_queries=1, exclude_first=True)
    assert m[0].tolist() == [False, False, True, False, True]  # the first sink is kept
    m = causal_sink_mask(cum, pos, tau=0.1, min_queries=2, exclude_first=True)
    assert m[0].tolist() == [False, False, True, False, False]  # key 4 seen by 1 row only


@pytest.mark.parametrize("min_queries", [1, 3])
def test_hook_matches_dense_reference_gqa(tiny, min_queries):
    cfg = ActConfig(beta=0.4, min_queries=min_queries, chunk_elems=50)  # force several chunks
    heads = [(1, 0), (1, 3)]  # query heads of both KV heads (4 heads, 2 KV heads)
    ids = torch.stack([ids_for(tiny, 20, 0), ids_for(tiny, 20, 1)])
    rec = Recorder()
    with act_calibration(tiny, heads, cfg) as hook, tiny.hooks(rec, layers=[1]):
        tiny.forward(ids)
    q, k, v = rec.qkv[1]
    ref = dense_reference(q, k, v, tiny.head_dim**-0.5, [0, 3], cfg)
    for h in (0, 3):
        torch.testing.assert_close(rec.out[1][:, :, h], ref[h], atol=1e-5, rtol=1e-4)
    assert float(hook.sink_mass[1].sum()) > 0  # sinks were found: the test is not vacuous


def test_beta_one_is_identity_and_other_heads_untouched(tiny):
    ids = ids_for(tiny, 24)
    base = Recorder()
    with tiny.hooks(base):
        logits0 = tiny.forward(ids).logits
    rec = Recorder()
    with act_calibration(tiny, [(1, 2)], ActConfig(beta=1.0)), tiny.hooks(rec):
        logits1 = tiny.forward(ids).logits
    torch.testing.assert_close(logits1, logits0, atol=1e-5, rtol=1e-4)

    rec = Recorder()
    with act_calibration(tiny, [(1, 2)], ActConfig(beta=0.4)), tiny.hooks(rec):
        logits2 = tiny.forward(ids).logits
    assert (logits2 - logits0).abs().max() > 1e-3  # the calibration does something
    torch.testing.assert_close(rec.out[0], base.out[0])  # an earlier layer: untouched
    others = [0, 1, 3]
    torch.testing.assert_close(rec.out[1][:, :, others], base.out[1][:, :, others])
    assert (rec.out[1][:, :, 2] - base.out[1][:, :, 2]).abs().max() > 1e-4


def test_decode_rows_equal_prefill_rows(tiny):
    heads = [(0, 1), (1, 0), (1, 3)]
    ids = ids_for(tiny, 24, 3)[None]
    with act_calibration(tiny, heads) as hook, torch.inference_mode():
        full = tiny.model(input_ids=ids, use_cache=False).logits[0]
        assert float(hook.sink_mass[1].sum()) > 0
        out = tiny.model(input_ids=ids[:, :16], use_cache=True)
        steps = [out.logits[0]]
        past = cache_of(out)
        for t in range(16, 24):
            out = tiny.model(ids[:, t : t + 1], None, None, past, use_cache=True)
            past = cache_of(out)
            steps.append(out.logits[0])
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-4, rtol=1e-4)
    with torch.inference_mode():
        plain = tiny.model(input_ids=ids, use_cache=False).logits[0]
    assert (plain - full).abs().max() > 1e-3


def test_decode_without_prefill_state_is_an_error(tiny):
    ids = ids_for(tiny, 10)[None]
    with torch.inference_mode():
        past = cache_of(tiny.model(input_ids=ids, use_cache=True))
        with act_calibration(tiny, [(1, 1)]), pytest.raises(HeadhuntError, match="KV cache"):
            tiny.model(ids[:, :1], None, None, past, use_cache=True)


def test_bad_inputs(tiny):
    with pytest.raises(HeadhuntError, match="outside the model"), act_calibration(tiny, [(5, 0)]):
        pass
    with pytest.raises(HeadhuntError, match="beta"):
        ActConfig(beta=1.5)
    assert ActConfig.from_dict(ActConfig(beta=0.5).to_dict()) == ActConfig(beta=0.5)


@pytest.mark.slow
def test_embedded_model_prefill_equals_decode(smol):
    ids = smol.encode("The river ran past the old mill. The miller, who was tired, sat down.")
    ids = ids[None]
    heads = [(10, 4), (20, 7)]
    with act_calibration(smol, heads) as hook, torch.inference_mode():
        full = smol.model(input_ids=ids, use_cache=False).logits[0]
        mass = float(hook.sink_mass[10].sum() + hook.sink_mass[20].sum())
        out = smol.model(input_ids=ids[:, :-3], use_cache=True)
        steps, past = [out.logits[0]], cache_of(out)
        for t in range(ids.shape[1] - 3, ids.shape[1]):
            out = smol.model(ids[:, t : t + 1], None, None, past, use_cache=True)
            past = cache_of(out)
            steps.append(out.logits[0])
    assert mass > 0
    torch.testing.assert_close(torch.cat(steps), full, atol=2e-3, rtol=1e-3)


def test_padding_mask_is_refused_causal_mask_accepted():
    from headhunt.heads.interventions.act import ActHook
    from headhunt.probes.attention import AttentionCall

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 5, 8, generator=g) for h in (4, 2, 2))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    hook = ActHook([(0, 1)])
    out = hook.after(AttentionCall(0, q, k, v, causal, 8**-0.5), torch.zeros(1, 5, 4, 8))
    assert out[:, :, 1].abs().sum() > 0 and out[:, :, 0].abs().sum() == 0
    padded = causal.clone()
    padded[..., 0] = False  # key 0 is padding
    with pytest.raises(HeadhuntError, match="padding"):
        hook.after(AttentionCall(0, q, k, v, padded, 8**-0.5), torch.zeros(1, 5, 4, 8))


def test_sliding_window_and_sinks_are_refused():
    from headhunt.heads.interventions.act import ActHook
    from headhunt.probes.attention import AttentionCall

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 6, 8, generator=g) for h in (4, 2, 2))
    window = torch.ones(6, 6, dtype=torch.bool).tril() & ~torch.ones(6, 6, dtype=torch.bool).tril(
        -3
    )
    hook = ActHook([(0, 1)])
    call = AttentionCall(0, q, k, v, window[None, None], 8**-0.5, kwargs={"sliding_window": 3})
    with pytest.raises(HeadhuntError, match="sliding window"):
        hook.after(call, torch.zeros(1, 6, 4, 8))
    call = AttentionCall(0, q, k, v, None, 8**-0.5, kwargs={"s_aux": torch.zeros(4)})
    with pytest.raises(HeadhuntError, match="sinks"):
        hook.after(call, torch.zeros(1, 6, 4, 8))
