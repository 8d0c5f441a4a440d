"""An additive score bias the model builds (``AttentionVariant.bias``: Inkling's
hidden-state-conditioned relative-position bias) and a sink logit per query row
(``row_sinks``: Inkling 2's) in the torch reference: statistics, exact
pair probabilities and the attention output equal the float64 dense oracle with the bias added
after the scaling and before the softcap, per batch row and head or broadcast, with GQA,
offsets, windows, padding, softcaps, sinks and small query blocks; a planted bias that moves
the argmax key; the Triton backend refuses it and "auto" takes the torch path."""

from __future__ import annotations

import pytest
import torch

from headhunt.kernels import (
    AttentionVariant,
    attention_forward,
    attention_probs_at,
    attention_stats,
)

CASES = [
    # name, b, hq, hkv, nq, nk, bias batch, bias heads, options
    ("causal-gqa", 2, 4, 2, 25, 25, 2, 4, {}),
    ("shared-heads", 2, 4, 1, 20, 20, 1, 1, {}),
    ("offset", 1, 4, 1, 12, 30, 1, 4, {"q_offset": 18}),
    ("full", 1, 2, 2, 19, 26, 1, 2, {"causal": False}),
    ("window-softcap-sinks", 1, 4, 2, 24, 24, 1, 4, {"window": 9, "softcap": 3.0, "sinks": 1}),
    ("padded-blocks", 2, 2, 1, 70, 70, 2, 2, {"pad": 5, "block_q": 16}),
    # a sink logit per query row (Inkling 2), with the bias, padded rows and small blocks
    ("row-sinks", 2, 4, 2, 40, 40, 2, 4, {"row_sinks": 1, "pad": 5, "block_q": 16}),
    ("row-sinks-softcap", 1, 2, 1, 21, 21, 1, 1, {"row_sinks": 1, "softcap": 2.5}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reference_bias_matches_the_float64_oracle(case, oracle):
    _, b, hq, hkv, nq, nk, bb, hb, options = case
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(b, hq, nq, 16, generator=g), torch.randn(b, hkv, nk, 16, generator=g)
    v = torch.randn(b, hkv, nk, 16, generator=g)
    bias = torch.randn(bb, hb, nq, nk, generator=g) * 2.0
    kw = {n: x for n, x in options.items() if n not in ("sinks", "row_sinks", "pad", "block_q")}
    kw["sinks"] = torch.linspace(-1.0, 2.0, hq) if options.get("sinks") else None
    if options.get("row_sinks"):
        kw["row_sinks"] = torch.randn(b, hq, nq, generator=g) * 2.0
    if options.get("pad"):  # row 1 left-padded: its first keys are seen by no query
        lo = torch.zeros(b, nq, dtype=torch.long)
        lo[1] = options["pad"]
        hi = torch.arange(nq).expand(b, nq).clone()
        hi[1, : options["pad"]] = -1
        lo[1, : options["pad"]] = nk
        kw.update(causal=False, key_lo=lo, key_hi=hi)
    ref = oracle.dense(q, k, bias=bias, **kw)
    if options.get("block_q"):
        from headhunt.kernels.reference import attention_stats_torch

        variant = AttentionVariant.of(bias=bias, **kw).checked(q, k)
        st = attention_stats_torch(q, k, variant, entropy=True, block_q=options["block_q"])
    else:
        st = attention_stats(q, k, entropy=True, bias=bias, **kw)
    oracle.check(st, ref, tol=1e-5)
    qi, ki = torch.meshgrid(torch.arange(nq), torch.arange(nk), indexing="ij")
    p = attention_probs_at(q, k, st.lse, qi.flatten(), ki.flatten(), bias=bias, **kw)
    torch.testing.assert_close(p.view(b, hq, nq, nk).double(), ref.probs, atol=1e-6, rtol=1e-5)
    out, _ = attention_forward(q, k, v, bias=bias, **kw)
    want = ref.probs @ v.double().repeat_interleave(hq // hkv, 1)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_planted_bias_moves_the_argmax_key():
    """q . k favours key 0 in every row; a bias of +5 on key j(i) = i // 2 moves every row's
    argmax there, and its probability follows the closed form."""
    n = 10
    q = torch.ones(1, 1, n, 4)
    k = torch.zeros(1, 1, n, 4)
    k[0, 0, 0] = 1.0  # score 2 on key 0 (scale 1/2), 0 elsewhere
    st = attention_stats(q, k, backend="torch")
    assert torch.equal(st.argmax[0, 0], torch.zeros(n, dtype=torch.long))
    bias = torch.zeros(1, 1, n, n)
    target = torch.arange(n) // 2
    bias[0, 0, torch.arange(n), target] = 5.0
    st = attention_stats(q, k, bias=bias)
    assert torch.equal(st.argmax[0, 0], target)
    p = attention_probs_at(q, k, st.lse, torch.arange(n), target, bias=bias)[0, 0]
    i = torch.arange(n, dtype=torch.float64)
    e2, e5, e7 = torch.exp(torch.tensor([2.0, 5.0, 7.0], dtype=torch.float64))
    # rows whose target is key 0 get e^(2+5); the others e^5 against e^2 and i - 1 ones
    want = torch.where(target == 0, e7 / (e7 + i), e5 / (e5 + e2 + i - 1))
    torch.testing.assert_close(p.double(), want, atol=1e-6, rtol=1e-5)


def test_row_sinks_on_zero_scores_are_the_closed_form():
    """q = 0: row i's i + 1 scores are 0 and its sink logit is r_i, so its lse is
    log(i + 1 + e^r_i) and each key gets 1 / (i + 1 + e^r_i)."""
    n = 8
    r = torch.linspace(-2.0, 3.0, n)
    q, k = torch.zeros(1, 1, n, 4), torch.randn(1, 1, n, 4)
    st = attention_stats(q, k, row_sinks=r.view(1, 1, n), entropy=True)
    i = torch.arange(n, dtype=torch.float64)
    want = torch.log(i + 1 + torch.exp(r.double()))
    torch.testing.assert_close(st.lse[0, 0].double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        st.col_sum[0, 0].double(),
        (1 / torch.exp(want)).flip(0).cumsum(0).flip(0),
        atol=1e-5,
        rtol=1e-5,
    )


def test_bias_goes_to_the_torch_backend_and_is_checked():
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    assert AttentionVariant(row_sinks=torch.zeros(1, 2, 6)).triton_unsupported() == ["row_sinks"]
    with pytest.raises(ValueError, match="not both"):
        attention_stats(q, k, row_sinks=torch.zeros(1, 2, 6), sinks=torch.zeros(2))
    assert AttentionVariant(bias=torch.zeros(1, 1, 6, 6)).triton_unsupported() == ["bias"]
    with pytest.raises(ValueError, match="Triton backend does not support bias"):
        attention_stats(q, k, bias=torch.zeros(1, 1, 6, 6), backend="triton")
    with pytest.raises(ValueError, match="bias must be"):
        attention_stats(q, k, bias=torch.zeros(1, 2, 6, 5))
    with pytest.raises(ValueError, match="finite"):
        attention_stats(q, k, bias=torch.full((1, 1, 6, 6), float("nan")))
