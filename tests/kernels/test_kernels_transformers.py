"""headhunt.kernels against the installed transformers' own definitions of the variants:
the mask functions of ``masking_utils`` (causal, sliding window, chunks, padding), Gemma 2's
eager softcap and gpt-oss's eager sink logits. The oracle tests of the other files follow
these rules as written in the docstrings; these check the rules against the library."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from headhunt.kernels import attention_probs_at, attention_stats
from headhunt.kernels.masks import row_key_bounds

mu = pytest.importorskip("transformers.masking_utils")
gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")
gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")


def _hf_visible(b, nq, nk, q_offset, *, window=None, chunk=None, pad=None) -> torch.Tensor:
    """[b, nq, nk] visibility from transformers' mask functions, evaluated on index grids
    (q_idx is the query's cache position, kv_idx the key index, as masking_utils calls them)."""
    bi = torch.arange(b).view(b, 1, 1)
    qi = (torch.arange(nq) + q_offset).view(1, nq, 1)
    ki = torch.arange(nk).view(1, 1, nk)
    vis = mu.causal_mask_function(bi, 0, qi, ki)
    if window is not None:
        vis = vis & mu.sliding_window_overlay(window)(bi, 0, qi, ki)
    if chunk is not None:
        vis = vis & mu.chunked_overlay(chunk, torch.zeros(b, dtype=torch.long))(bi, 0, qi, ki)
    if pad is not None:
        padding = torch.arange(nk).view(1, nk) >= pad.view(b, 1)  # True = a real token
        vis = vis & mu.padding_mask_function(padding)(bi, 0, qi, ki)
    return vis.expand(b, nq, nk)


@pytest.mark.parametrize(
    ("q_offset", "window", "chunk"),
    [(0, 5, None), (30, 5, None), (0, None, 8), (13, None, 8), (7, 6, 4), (40, None, None)],
)
def test_intervals_match_masking_utils(q_offset, window, chunk):
    b, nq, nk = 3, 20, 60
    pad = torch.tensor([0, 4, 11])
    hf = _hf_visible(b, nq, nk, q_offset, window=window, chunk=chunk, pad=pad)
    key_lo = pad.view(b, 1).expand(b, nq)
    lo, hi = row_key_bounds(
        b, nq, nk, causal=True, q_offset=q_offset, window=window, chunk=chunk, key_lo=key_lo
    )
    j = torch.arange(nk)
    assert torch.equal(hf, (j >= lo[..., None]) & (j <= hi[..., None]))


def _module(hq, hkv, d, sinks=None):
    return SimpleNamespace(num_key_value_groups=hq // hkv, training=False, head_dim=d, sinks=sinks)


def _additive(vis: torch.Tensor) -> torch.Tensor:
    """The [b, 1, nq, nk] additive mask transformers' eager attention receives (the float32
    minimum, as for a float32 model: Gemma 2's eager softmax runs in float32)."""
    return torch.zeros(vis.shape, dtype=torch.float64).masked_fill(
        ~vis, torch.finfo(torch.float32).min
    )[:, None]


def _compare(st, probs, vis, q, k, kw, sink_mass):
    """Our statistics against eager probabilities [b, hq, nq, nk] (sink column dropped)."""
    rows = vis.any(-1)[:, None].expand_as(st.lse)
    torch.testing.assert_close(st.col_sum.double(), probs.sum(-2), rtol=1e-5, atol=1e-6)
    plogp = lambda x: x * torch.where(x > 0, x.log(), 0.0)  # noqa: E731
    ent = -plogp(probs).sum(-1) - plogp(sink_mass)
    torch.testing.assert_close(st.entropy.double()[rows], ent[rows], rtol=1e-4, atol=1e-5)
    assert torch.equal(st.argmax[rows], probs.argmax(-1)[rows])
    # exp(s - lse) reproduces every visible probability.
    b, hq, nq, nk = probs.shape
    qi = torch.arange(nq).repeat_interleave(nk)
    ki = torch.arange(nk).repeat(nq)
    p = attention_probs_at(q, k, st.lse, qi, ki, **kw).view(b, hq, nq, nk)
    torch.testing.assert_close(p.double(), probs, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("window", [None, 6])
def test_softcap_matches_gemma2_eager(window):
    torch.manual_seed(0)
    b, hq, hkv, n, d, cap = 2, 4, 2, 24, 16, 5.0
    q = torch.randn(b, hq, n, d, dtype=torch.float64) * 3
    k = torch.randn(b, hkv, n, d, dtype=torch.float64) * 1.5
    pad = torch.tensor([0, 3])
    vis = _hf_visible(b, n, n, 0, window=window, pad=pad)
    _, probs = gemma2.eager_attention_forward(
        _module(hq, hkv, d), q, k, k, _additive(vis), scaling=d**-0.5, softcap=cap
    )
    probs = probs.double() * vis[:, None]  # rows without keys: eager spreads them uniformly
    kw = dict(softcap=cap, window=window, key_lo=pad.view(b, 1).expand(b, n))
    st = attention_stats(q.float(), k.float(), entropy=True, backend="torch", **kw)
    _compare(st, probs, vis, q.float(), k.float(), kw, torch.zeros(b, hq, n, dtype=torch.float64))


@pytest.mark.parametrize("window", [None, 5])
def test_sinks_match_gpt_oss_eager(window):
    torch.manual_seed(1)
    b, hq, hkv, n, d = 2, 4, 2, 20, 16
    q = torch.randn(b, hq, n, d, dtype=torch.float64)
    k = torch.randn(b, hkv, n, d, dtype=torch.float64) * 1.5
    sinks = torch.randn(hq, dtype=torch.float64) + 1.0
    pad = torch.tensor([0, 6])
    vis = _hf_visible(b, n, n, 0, window=window, pad=pad)
    _, probs = gpt_oss.eager_attention_forward(
        _module(hq, hkv, d, sinks), q, k, k, _additive(vis), scaling=d**-0.5
    )
    sink_mass = 1 - probs.sum(-1)
    kw = dict(sinks=sinks.float(), window=window, key_lo=pad.view(b, 1).expand(b, n))
    st = attention_stats(q.float(), k.float(), entropy=True, backend="torch", **kw)
    _compare(st, probs, vis, q.float(), k.float(), kw, sink_mass)
    # A padded row (no visible key) puts all of its mass on the sink: lse = the sink logit.
    empty = ~vis.any(-1)
    assert empty.any()
    lse = st.lse.double().permute(0, 2, 1)[empty]  # [rows, hq]
    torch.testing.assert_close(lse, sinks.expand_as(lse), rtol=1e-6, atol=1e-6)
    assert math.isclose(float(sink_mass.permute(0, 2, 1)[empty].min()), 1.0, rel_tol=1e-9)
