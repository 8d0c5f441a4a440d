"""ALiBi in the torch reference (kernels/reference.py): statistics, exact pair probabilities and
the attention output equal the float64 dense oracle with ``slope_h * (j - p_i)`` added after the
scaling and before the softcap, with GQA, offsets, windows, softcaps and sinks on top; and a
planted closed form (q = 0: the scores are the bias alone)."""

from __future__ import annotations

import math

import pytest
import torch

from headhunt.kernels import (
    AttentionVariant,
    attention_forward,
    attention_probs_at,
    attention_stats,
)


def _slopes(hq: int) -> torch.Tensor:
    """ALiBi's slopes 2**(-8 h / n), scaled up so the bias reorders keys (up to ~0.5)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / hq) for h in range(hq)]) * 128.0 ** (1 / hq)


CASES = [
    ("causal-gqa", 2, 4, 2, 25, 25, {}),
    ("offset", 1, 4, 1, 12, 30, {"q_offset": 20}),
    ("full", 1, 2, 2, 19, 26, {"causal": False}),
    ("window-softcap-sinks", 1, 4, 2, 24, 24, {"window": 9, "softcap": 3.0, "sinks": True}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reference_alibi_matches_the_float64_oracle(case, oracle):
    _, b, hq, hkv, nq, nk, options = case
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(b, hq, nq, 16, generator=g), torch.randn(b, hkv, nk, 16, generator=g) * 1.5
    v = torch.randn(b, hkv, nk, 16, generator=g)
    kw = {**options, "alibi_slopes": _slopes(hq)}
    kw["sinks"] = torch.linspace(-1.0, 2.0, hq) if options.get("sinks") else None
    ref = oracle.dense(q, k, **kw)
    st = attention_stats(q, k, entropy=True, **kw)
    oracle.check(st, ref, tol=1e-5)
    qi, ki = torch.meshgrid(torch.arange(nq), torch.arange(nk), indexing="ij")
    p = attention_probs_at(q, k, st.lse, qi.flatten(), ki.flatten(), **kw)
    torch.testing.assert_close(p.view(b, hq, nq, nk).double(), ref.probs, atol=1e-6, rtol=1e-5)
    out, _ = attention_forward(q, k, v, **kw)
    want = ref.probs @ v.double().repeat_interleave(hq // hkv, 1)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_reference_alibi_on_zero_queries_is_the_closed_form():
    """q = 0: query i's scores are slope * (j - i) over keys j <= i, so its lse is
    log sum_{t=0..i} exp(-slope t) and its argmax is key i itself."""
    hq, n = 4, 12
    slopes = _slopes(hq)
    q, k = torch.zeros(1, hq, n, 8), torch.randn(1, 1, n, 8)
    st = attention_stats(q, k, backend="torch", alibi_slopes=slopes)
    t = torch.arange(n, dtype=torch.float64)
    for h in range(hq):
        want = torch.logcumsumexp(-slopes[h].double() * t, 0)
        torch.testing.assert_close(st.lse[0, h].double(), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(st.argmax[0], torch.arange(n).expand(hq, n))
    assert "alibi_slopes" not in AttentionVariant(alibi_slopes=slopes).torch_unsupported()
    assert math.isclose(float(st.col_sum.sum()), hq * n, rel_tol=1e-5)
