"""The blocked torch backend of headhunt.kernels against a float64 dense oracle."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from headhunt.kernels import AttentionStats, AttentionVariant, attention_probs_at, attention_stats
from headhunt.kernels.reference import attention_stats_torch, visible_query_count

TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2, torch.float16: 1e-2}

# (b, hq, hkv, nq, nk, d, causal, q_offset): GQA 1/3/4, odd lengths, decode-like
# nq < nk, nq > nk, queries past the keys, and q_offset < 0 (rows that see no key).
CASES = [
    (2, 6, 2, 37, 37, 16, True, None),
    (1, 4, 1, 5, 70, 32, True, None),
    (1, 3, 3, 50, 50, 8, False, None),
    (1, 4, 2, 20, 30, 16, True, -5),
    (1, 8, 2, 33, 47, 24, False, None),
    (1, 9, 3, 1, 129, 64, True, None),
    (1, 4, 1, 40, 17, 16, False, None),
    (1, 6, 2, 19, 53, 16, True, 40),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_matches_dense(case, dtype, oracle):
    b, hq, hkv, nq, nk, d, causal, q_offset = case
    q = torch.randn(b, hq, nq, d).to(dtype)
    k = (torch.randn(b, hkv, nk, d) * 1.5).to(dtype)
    ref = oracle.dense(q, k, causal=causal, q_offset=q_offset)
    # block_q=16 forces several blocks (and partial ones) even at these small sizes.
    variant = AttentionVariant(causal=causal, q_offset=q_offset)
    st = attention_stats_torch(q, k, variant, entropy=True, block_q=16)
    oracle.check(st, ref, tol=TOL[dtype])
    # The default (adaptive) blocks through the public API give the same statistics.
    st2 = attention_stats(q, k, causal=causal, entropy=True, q_offset=q_offset, backend="torch")
    oracle.check(st2, ref, tol=TOL[dtype])


def test_custom_scale_and_no_optional_outputs(oracle):
    q, k = torch.randn(1, 4, 21, 16), torch.randn(1, 2, 21, 16)
    st = attention_stats(q, k, scale=0.37, key_stats=False)
    oracle.check(st, oracle.dense(q, k, scale=0.37), tol=1e-3, entropy=False, key_stats=False)


def test_ties_pick_lowest_index():
    # Keys 3, 7 and 11 are identical copies and the best match for every query, so
    # each row has an exact three-way tie; the answer must be the first copy.
    k = torch.nn.functional.normalize(torch.randn(1, 1, 16, 8), dim=-1)  # unit norm
    k[0, 0, [7, 11]] = k[0, 0, 3].clone()
    q = k[:, :, 3:4].repeat(1, 3, 16, 1) * 4.0
    st = attention_stats(q, k, causal=False, backend="torch")
    assert (st.argmax == 3).all()


def test_col_mean_counts_and_unseen_keys(oracle):
    # Queries at positions 2..5 see keys 0..position: keys 6..9 are seen by nobody.
    q, k = torch.randn(1, 2, 4, 16), torch.randn(1, 1, 10, 16)
    st = attention_stats(q, k, q_offset=2, backend="torch")
    count = visible_query_count(4, 10, causal=True, q_offset=2)
    assert count.tolist() == [4, 4, 4, 3, 2, 1, 0, 0, 0, 0]
    assert (st.col_mean[..., 6:] == 0).all() and (st.col_sum[..., 6:] == 0).all()
    torch.testing.assert_close(st.col_mean[..., :6], st.col_sum[..., :6] / count[:6])
    # Every query's probabilities sum to 1, so the column sums total nq per head.
    torch.testing.assert_close(st.col_sum.sum(-1), torch.full((1, 2), 4.0))


def test_decode_sees_all_keys(oracle):
    q, k = torch.randn(2, 6, 1, 32), torch.randn(2, 2, 300, 32)
    st = attention_stats(q, k, entropy=True)
    oracle.check(st, oracle.dense(q, k, causal=False), tol=1e-3)


def test_adaptive_blocks_stay_within_budget_for_one_head(oracle):
    # The default block is sized by the keys its first row sees; causal rows after it see
    # more. With one head and 8k tokens the first block once took 16k queries: the whole
    # 8k x 8k matrix (64M floats). Every block must stay near the CPU budget (2**20).
    n = 8192
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, n, 16), torch.randn(1, 1, n, 16)
    with oracle.largest_tensor() as probe:
        st = attention_stats_torch(q, k)
    assert probe.largest <= 2 * 2**20, probe.largest
    rows = torch.tensor([0, 1, 700, 4095, n - 1])
    s = (q[0, 0, rows].double() @ k[0, 0].double().T) / 4.0
    s = s.masked_fill(torch.arange(n)[None, :] > rows[:, None], -math.inf)
    assert oracle.rel_err(st.lse[0, 0, rows], torch.logsumexp(s, -1)) < 1e-5


def test_memory_is_linear_at_8k(oracle):
    # Dense fp32 scores for 2 heads x 8k x 8k would take 512 MiB; the blocked reference
    # must never hold more than one block of hq * block_q * (nk + chunk padding) floats
    # (4 MiB here). The dispatch mode sees every intermediate, in-place buffers too.
    n, hq, block_q = 8192, 2, 64
    torch.manual_seed(0)
    q = torch.randn(1, hq, n, 16, dtype=torch.bfloat16)
    k = torch.randn(1, 1, n, 16, dtype=torch.bfloat16)
    with oracle.largest_tensor() as probe:
        st = attention_stats_torch(q, k, block_q=block_q)
    budget = hq * block_q * (n + 64)
    assert probe.largest <= budget, (probe.largest, budget)
    assert budget * 100 < hq * n * n  # far below the dense matrix
    # Spot-check 48 query rows (including the first and last) against float64.
    rows = torch.cat([torch.tensor([0, n - 1]), torch.randint(0, n, (46,))])
    s = (q[0, :, rows].double() @ k[0, 0].double().T) / 4.0
    s = s.masked_fill(torch.arange(n)[None, None, :] > rows[None, :, None], -math.inf)
    lse = torch.logsumexp(s, -1)
    assert oracle.rel_err(st.lse[0][:, rows], lse) < 1e-5
    assert torch.equal(st.argmax[0][:, rows], s.argmax(-1))
    torch.testing.assert_close(st.col_sum.sum(-1), torch.full((1, hq), float(n)), rtol=1e-4, atol=0)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_probs_at_matches_dense(per_head, causal, oracle):
    b, hq, hkv, nq, nk, d = 2, 6, 2, 23, 31, 16
    q, k = torch.randn(b, hq, nq, d), torch.randn(b, hkv, nk, d)
    ref = oracle.dense(q, k, causal=causal)
    st = attention_stats(q, k, causal=causal)
    m = 57
    shape = (b, hq, m) if per_head else (m,)
    qi, ki = torch.randint(0, nq, shape), torch.randint(0, nk, shape)
    p = attention_probs_at(q, k, st.lse, qi, ki, causal=causal)
    assert p.shape == (b, hq, m) and p.dtype == torch.float32
    if per_head:
        bi, hi = torch.arange(b).view(b, 1, 1), torch.arange(hq).view(1, hq, 1)
        want = ref.probs[bi, hi, qi, ki]
    else:
        want = ref.probs[:, :, qi, ki]
    torch.testing.assert_close(p.double(), want, rtol=1e-4, atol=1e-7)
    if causal:
        # Pairs with the key after the query's position (q_offset = nk - nq) give 0.
        forbidden = (ki > qi + (nk - nq)).expand(b, hq, m)
        assert forbidden.any() and (p[forbidden] == 0).all()


def test_probs_at_rows_without_keys():
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 1, 6, 8)
    st = attention_stats(q, k, q_offset=-3)
    qi, ki = torch.tensor([0, 1, 2, 3, 5]), torch.tensor([0, 0, 0, 0, 2])
    p = attention_probs_at(q, k, st.lse, qi, ki, q_offset=-3)
    assert not torch.isnan(p).any()
    # Rows 0-2 (positions -3..-1) see nothing; row 3 (position 0) sees only key 0.
    assert (p[..., :3] == 0).all() and (p[..., 4] > 0).all()
    torch.testing.assert_close(p[..., 3], torch.ones(1, 2))


def test_input_validation():
    q, k = torch.randn(1, 6, 4, 8), torch.randn(1, 4, 4, 8)
    with pytest.raises(ValueError, match="multiple"):
        attention_stats(q, k)
    with pytest.raises(ValueError, match="backend"):
        attention_stats(q, k[:, :2], backend="cuda")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        attention_stats(q.int(), k[:, :2])
    with pytest.raises(ValueError, match="positive"):
        attention_stats(q, k[:, :2], scale=-1.0)
    st = attention_stats(q, k[:, :2])
    assert isinstance(st, AttentionStats)
    with pytest.raises(ValueError, match="lse"):
        attention_probs_at(q, k[:, :2], st.lse[:, :, :2], torch.tensor([0]), torch.tensor([0]))


def test_import_without_triton():
    # headhunt.kernels must import, and run on CPU, where Triton is not installed.
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, headhunt.kernels as K\n"
        "assert not K.triton_available()\n"
        "st = K.attention_stats(torch.randn(1, 2, 5, 8), torch.randn(1, 1, 5, 8))\n"
        "assert st.col_sum.shape == (1, 2, 5)\n"
        "assert 'triton' not in sys.modules or sys.modules['triton'] is None\n"
    )
    # -P: never import the repo checkout's headhunt/ folder in place of the installed package.
    subprocess.run([sys.executable, "-P", "-c", code], check=True, timeout=120)
