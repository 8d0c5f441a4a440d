"""greedy_decode's captured argmax: the many-layer path (all layers of a step scored together
on CUDA) equals the per-layer attention_stats path, step by step."""

from __future__ import annotations

import pytest
import torch

from headhunt.kernels import attention_stats
from headhunt.kernels import triton_decode as td
from headhunt.probes import capture
from headhunt.probes.capture import greedy_decode


def _per_layer(queries, keys, key_start=0, skip_rows=None):
    """What decode_argmax_layers promises, from attention_stats one layer at a time."""
    out = torch.stack(
        [
            attention_stats(q, k, key_stats=False).argmax[:, :, 0] + key_start
            for q, k in zip(queries, keys, strict=True)
        ]
    )
    return out if skip_rows is None else out.masked_fill(skip_rows[None, :, None], -1)


@pytest.mark.parametrize("padded", [False, True])
def test_many_layer_decode_argmax_equals_per_layer_path(tiny, monkeypatch, padded):
    torch.manual_seed(0)
    ids = torch.randint(5, 60, (3, 25), device=tiny.device)
    mask = None
    if padded:  # left pads: those rows' layers take the per-layer path (key_lo / key_hi)
        mask = torch.ones_like(ids)
        mask[1, :4] = 0
    monkeypatch.setattr(capture.DecodeArgmax, "_batched_ok", lambda self, call: False)
    ref = greedy_decode(tiny, ids, max_new_tokens=6, capture_argmax=True, attention_mask=mask)

    launches = []
    real = td.decode_argmax_layers if tiny.device.type == "cuda" else _per_layer

    def counted(queries, keys, key_start=0, skip_rows=None):
        launches.append(len(queries))
        return real(queries, keys, key_start, skip_rows)

    monkeypatch.setattr(capture.DecodeArgmax, "_batched_ok", lambda self, call: True)
    monkeypatch.setattr(td, "decode_argmax_layers", counted)
    got = greedy_decode(tiny, ids, max_new_tokens=6, capture_argmax=True, attention_mask=mask)
    assert torch.equal(got.tokens, ref.tokens)
    assert torch.equal(got.argmax, ref.argmax)
    # Unpadded: one launch per step for both layers; padded: every layer has a mask.
    assert launches == ([] if padded else [tiny.n_layers] * got.argmax.shape[0])


def test_decode_argmax_flushes_an_unread_step(tiny, monkeypatch):
    # A hook whose steps are never read keeps at most one step's tensors.
    monkeypatch.setattr(capture.DecodeArgmax, "_batched_ok", lambda self, call: True)
    monkeypatch.setattr(td, "decode_argmax_layers", _per_layer)
    cap = capture.DecodeArgmax(tiny.n_layers)
    ids = torch.randint(5, 60, (1, 9), device=tiny.device)
    out = tiny.model(ids, use_cache=True)
    past = capture._cache(out)
    with tiny.hooks(cap):
        for _ in range(3):
            tok = out.logits[:, -1:].argmax(-1)
            out = capture._step(tiny, tok, None, None, past)
            past = capture._cache(out)
            assert sorted(cap._pending) == list(range(tiny.n_layers))
    assert [s.shape for s in cap.step] == [(1, 4)] * tiny.n_layers
    assert not cap._pending


@pytest.mark.parametrize("many_layer", [False, True])
def test_skip_stopped_rows_drops_only_steps_past_a_rows_stop(tiny, monkeypatch, many_layer):
    # Step t's argmax pairs with tokens[:, t]; a row whose token t is its stop token is
    # still scored at t (lengths counts it), and only its later steps get -1.
    if many_layer:
        monkeypatch.setattr(capture.DecodeArgmax, "_batched_ok", lambda self, call: True)
        if tiny.device.type != "cuda":
            monkeypatch.setattr(td, "decode_argmax_layers", _per_layer)
    torch.manual_seed(1)
    ids = torch.randint(5, 60, (3, 20), device=tiny.device)
    free = greedy_decode(tiny, ids, max_new_tokens=6, capture_argmax=True)
    stop = {int(free.tokens[0, 1])}  # row 0 stops at step 1 at the latest
    full = greedy_decode(tiny, ids, max_new_tokens=6, stop_ids=stop, capture_argmax=True)
    got = greedy_decode(
        tiny, ids, max_new_tokens=6, stop_ids=stop, capture_argmax=True, skip_stopped_rows=True
    )
    assert torch.equal(got.tokens, full.tokens) and torch.equal(got.lengths, full.lengths)
    steps = got.argmax.shape[0]
    assert int(got.lengths.min()) < steps, "no row stopped before the others"
    valid = torch.arange(steps, device=got.lengths.device)[:, None] < got.lengths[None, :]
    valid = valid[:, None, :, None].expand_as(got.argmax)
    assert torch.equal(got.argmax[valid], full.argmax[valid])
    assert (got.argmax[~valid] == -1).all()


def test_alibi_layers_stay_off_the_many_layer_kernel(monkeypatch):
    # Planted: all queries zero, so every raw score ties and the many-layer kernel (which adds
    # no bias) would pick key 0; with a positive ALiBi slope the bias slope * (j - p) is
    # largest at the query's own position, the last key.
    from headhunt.probes.attention import AttentionCall

    monkeypatch.setattr(capture.DecodeArgmax, "_batched_ok", lambda self, call: True)
    nk = 9
    q, k = torch.zeros(1, 2, 1, 4), torch.randn(1, 1, nk, 4)
    slopes = torch.tensor([0.5, 0.25])
    call = AttentionCall(0, q, k, k, None, 0.5, kwargs={"alibi_slopes": slopes})
    hook = capture.DecodeArgmax(1)
    hook.before(call)
    assert not hook._pending
    assert hook.step[0].tolist() == [[nk - 1, nk - 1]]
    plain = AttentionCall(0, q, k, k, None, 0.5)
    hook.before(plain)  # the check is ALiBi's: the same call without it takes the kernel
    assert 0 in hook._pending
