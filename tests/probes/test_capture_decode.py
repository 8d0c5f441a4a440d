"""greedy_decode's captured argmax: the many-layer path (all layers of a step scored together
on CUDA) equals the per-layer attention_stats path, step by step."""

from __future__ import annotations

import pytest
import torch

from headhunt.kernels import attention_stats
from headhunt.kernels import triton_decode as td
from headhunt.probes import capture
from headhunt.probes.capture import greedy_decode


def _per_layer(queries, keys, key_start=0):
    """What decode_argmax_layers promises, from attention_stats one layer at a time."""
    return torch.stack(
        [
            attention_stats(q, k, key_stats=False).argmax[:, :, 0] + key_start
            for q, k in zip(queries, keys, strict=True)
        ]
    )


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

    def counted(queries, keys, key_start=0):
        launches.append(len(queries))
        return real(queries, keys, key_start)

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
