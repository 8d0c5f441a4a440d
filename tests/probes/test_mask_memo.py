"""AttentionCall derives a mask once for all the layers that get the same mask tensor, and
never reuses what it derived for another tensor or an in-place change."""

from __future__ import annotations

import gc

import torch

from headhunt.probes import attention
from headhunt.probes.attention import AttentionCall


def _call(mask, layer=0, nq=6, nk=6, **kwargs):
    g = torch.Generator().manual_seed(layer)
    q = torch.randn(2, 4, nq, 8, generator=g)
    k, v = (torch.randn(2, 2, nk, 8, generator=g) for _ in range(2))
    return AttentionCall(layer, q, k, v, mask, 8**-0.5, kwargs=kwargs)


def _padded(n=6) -> torch.Tensor:
    allowed = torch.ones(2, 1, n, n, dtype=torch.bool).tril()
    allowed[0, :, :, :2] = False  # two left pads in batch row 0
    return allowed


def _count_derivations(monkeypatch) -> list[int]:
    calls = []
    real = attention._mask_intervals

    def counted(mask, nq, nk, layer, why=None):
        calls.append(layer)
        return real(mask, nq, nk, layer, why)

    monkeypatch.setattr(attention, "_mask_intervals", counted)
    return calls


def test_layers_sharing_a_mask_derive_it_once(monkeypatch):
    calls = _count_derivations(monkeypatch)
    mask = _padded()
    first = _call(mask, layer=0).kernel_kwargs()
    for layer in (1, 2, 3):
        kw = _call(mask, layer=layer).kernel_kwargs()
        assert torch.equal(kw["key_lo"], first["key_lo"])
        assert torch.equal(kw["key_hi"], first["key_hi"])
    assert calls == [0]
    # Another tensor with the same values, or other query / key counts: derived again.
    _call(_padded(), layer=4).kernel_kwargs()
    _call(mask, layer=5, nq=1).kernel_kwargs()
    assert calls == [0, 4, 5]


def test_plain_mask_decision_is_per_window(monkeypatch):
    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None].expand(2, 1, 6, 6)
    window = causal & ~torch.ones(6, 6, dtype=torch.bool).tril(-3)
    assert "window" not in _call(causal).kernel_kwargs()
    # The same causal tensor on a sliding layer (window larger than the sequence) and the
    # window mask on a layer of another window each get their own decision.
    assert _call(causal, sliding_window=8).kernel_kwargs().get("window") is None
    assert _call(window, sliding_window=3).kernel_kwargs()["window"] == 3
    kw = _call(window, sliding_window=4).kernel_kwargs()
    assert "window" not in kw and "key_lo" in kw


def test_in_place_change_is_derived_again():
    mask = _padded()
    before = _call(mask).kernel_kwargs()["key_lo"].clone()
    mask[1, :, :, :1] = False  # a pad in batch row 1 too
    after = _call(mask).kernel_kwargs()["key_lo"]
    assert not torch.equal(before, after)
    assert after[1].tolist() == [6, 1, 1, 1, 1, 1]


def test_memo_keeps_no_mask_alive():
    mask = _padded()
    _call(mask).kernel_kwargs()
    ref = next(r for r, _ in reversed(attention._MASK_MEMO.entries.values()))
    assert ref() is mask
    del mask
    gc.collect()
    assert ref() is None
