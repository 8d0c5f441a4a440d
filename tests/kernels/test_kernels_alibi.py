"""ALiBi (Press et al. 2022, bloom / mpt) in the Triton kernels: every score gets
``slope_h * (j - p_i)`` after the scaling and before the softcap (AttentionVariant.alibi_slopes).

Checked against the float64 dense oracle (conftest.py) on every kernel family that takes it
(row statistics, both loops of the general column kernel, the split-K decode kernels, the fused
forward), with the other variants on top; and against a closed form where q is zero (planted:
the scores are the bias alone). Without CUDA the kernels run under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import math

import pytest
import torch
from triton_runs import CUDA, DEVICE, require_triton

require_triton()

from headhunt.kernels import AttentionVariant, attention_stats, fused_supported, launch  # noqa: E402
from headhunt.kernels.config import KernelConfig  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # exp2(-inf) on empty rows
TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2}


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The slopes of the ALiBi paper for a power-of-two head count: 2**(-8 h / n)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / n_heads) for h in range(n_heads)])


def _inputs(b, hq, hkv, nq, nk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g)
    k = torch.randn(b, hkv, nk, d, generator=g) * 1.5
    v = torch.randn(b, hkv, nk, d, generator=g)
    return (t.to(DEVICE, dtype) for t in (q, k, v))


def _kwargs(hq, **options) -> dict:
    """Variant keywords with ALiBi slopes (strong enough to reorder the keys: up to 0.5)."""
    out = dict(alibi_slopes=alibi_slopes(hq).to(DEVICE) * 128.0 ** (1.0 / hq), **options)
    out["sinks"] = torch.linspace(-1.0, 2.0, hq).to(DEVICE) if options.get("sinks") else None
    return out


# (name, b, hq, hkv, nq, nk, dtype, options)
CASES = [
    ("causal-gqa", 2, 4, 2, 25, 25, torch.float32, {}),
    ("offset-bf16", 1, 4, 1, 12, 30, torch.bfloat16, {"q_offset": 20}),
    ("full", 1, 2, 2, 19, 26, torch.float32, {"causal": False}),
    ("window-softcap-sinks", 1, 4, 2, 24, 24, torch.float32,
     {"window": 9, "softcap": 3.0, "sinks": True}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_alibi_row_and_column_kernels_match_dense(case, oracle, poison):
    _, b, hq, hkv, nq, nk, dtype, options = case
    q, k, _ = _inputs(b, hq, hkv, nq, nk, 16, dtype)
    kw = _kwargs(hq, **options)
    ref = oracle.dense(q, k, **kw)
    st = attention_stats(q, k, entropy=True, backend="triton", **kw)
    oracle.check(st, ref, tol=TOL[dtype])
    if case[0] != "causal-gqa":
        return
    # The column pass's software-pipelined loop (its general kernel's other loop).
    small = KernelConfig(16, 16, 1, 1, 16, 16, 1, 1, col_pipeline=True)
    if CUDA:
        small = KernelConfig(col_pipeline=True)
    piped = launch.attention_stats_triton(q, k, AttentionVariant(**kw), config=small)
    oracle.check(piped, ref, tol=TOL[dtype], entropy=False)


def test_alibi_decode_kernels_match_dense(oracle, poison):
    # Split-K decode: the rows of one program belong to different heads (own slopes).
    q, k, _ = _inputs(1, 8, 2, 3, 40, 16, torch.float32, seed=1)
    kw = _kwargs(8, q_offset=45, window=30)
    st = launch.attention_stats_triton(q, k, AttentionVariant(**kw), entropy=True, decode=True)
    oracle.check(st, oracle.dense(q, k, **kw), tol=1e-3)


@pytest.mark.parametrize("sinks", [False, True])
def test_alibi_fused_forward_matches_dense(sinks, oracle, poison):
    q, k, v = _inputs(1, 4, 2, 20, 20, 16, torch.float32, seed=2)
    kw = _kwargs(4, softcap=4.0, sinks=sinks)
    ref = oracle.dense(q, k, **kw)
    out, st = launch.attention_forward_triton(q, k, v, AttentionVariant(**kw), entropy=True)
    oracle.check(st, ref, tol=1e-3)
    want = ref.probs @ v.double().cpu().repeat_interleave(2, dim=1)
    assert oracle.rel_err(out, want) < 1e-3


def test_alibi_on_zero_queries_is_the_closed_form(poison):
    # Planted: with q = 0 every score is the bias slope * (j - p) alone, so under the causal
    # mask each row's maximum is its own key (0 at j = p), and its lse is the geometric sum
    # log sum_{t=0..p} exp(-slope * t).
    hq, n = 4, 20
    slopes = alibi_slopes(hq) * 8.0
    q = torch.zeros(1, hq, n, 16, device=DEVICE)
    k = torch.randn(1, 1, n, 16, device=DEVICE)
    st = attention_stats(q, k, backend="triton", alibi_slopes=slopes.to(DEVICE))
    pos = torch.arange(n)
    assert torch.equal(st.argmax[0].cpu(), pos.expand(hq, n))
    assert torch.equal(st.max_score[0].cpu(), torch.zeros(hq, n))
    t = torch.arange(n, dtype=torch.float64)
    terms = torch.exp(-slopes.double().view(hq, 1, 1) * t.view(1, 1, n))  # [hq, 1, t]
    lse = torch.log((terms * (t.view(1, 1, n) <= pos.view(1, n, 1))).sum(-1))  # [hq, p]
    torch.testing.assert_close(st.lse[0].cpu().double(), lse, rtol=1e-5, atol=1e-6)
    # Each key's column sum: a row p gives key j the weight exp(-slope (p - j)) / l_p.
    assert math.isclose(st.col_sum[0].sum().item(), hq * n, rel_tol=1e-5)


def test_alibi_routing_and_checks():
    q, k, v = _inputs(1, 4, 2, 8, 8, 16, torch.float32)
    with pytest.raises(ValueError, match=r"alibi_slopes must be \[4\]"):
        attention_stats(q, k, alibi_slopes=torch.ones(2))
    with pytest.raises(ValueError, match="alibi_slopes must be finite"):
        attention_stats(q, k, alibi_slopes=torch.tensor([1.0, math.nan, 1.0, 1.0]))
    variant = AttentionVariant(alibi_slopes=torch.ones(4, device=DEVICE))
    assert "alibi_slopes" not in variant.triton_unsupported()
    # A backend that lacks a field refuses it in one line rather than leave it out.
    if variant.torch_unsupported():
        with pytest.raises(ValueError, match="torch backend does not support alibi_slopes"):
            attention_stats(q, k, variant, backend="torch")
    # The Gluon fast path and the specialised column kernel do not take ALiBi (the launch
    # sends it to the general kernels); the fused kernel does.
    if CUDA:
        assert fused_supported(q, k, v, variant)
    from headhunt.kernels.triton_columns import fast_columns_apply

    L = launch.prepare(q, k, variant, None)

    assert L.alibi is not None and not fast_columns_apply(L, L.cfg)
