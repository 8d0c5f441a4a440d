"""Attention variants (sliding window, chunks, softcap, sink logits, per-row key intervals)
in every backend of headhunt.kernels, against the float64 dense oracle of conftest.py.

The oracle applies each rule of transformers' masking_utils and eager attention directly
on the full score matrix; the backends work from per-row key intervals and skip keys no
row of a block sees, so these tests also check the interval bookkeeping.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton_runs import DEVICE, require_triton

from headhunt.kernels import AttentionVariant, attention_probs_at, attention_stats
from headhunt.kernels.config import KernelConfig, default_config
from headhunt.kernels.masks import key_visible_counts, row_key_bounds
from headhunt.kernels.reference import attention_stats_torch

TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2}


def _bounds(kind: str, b: int, nq: int, nk: int, gen: torch.Generator):
    """key_lo / key_hi of one kind: left padding, random intervals (some empty), None."""
    if kind == "none":
        return None, None
    if kind == "leftpad":
        # Batch row r starts with pad[r] padding keys; padded query rows see nothing.
        pad = torch.tensor([0, 5, 12, 3][:b])
        return pad.view(b, 1).expand(b, nq).contiguous(), None
    lo = torch.randint(-3, nk, (b, nq), generator=gen)
    hi = lo + torch.randint(-4, nk // 2, (b, nq), generator=gen)  # some hi < lo: empty
    return lo, hi


# (name, b, hq, hkv, nq, nk, d, causal, q_offset, options, bounds kind, dtype)
CASES = [
    ("window", 2, 6, 2, 45, 45, 16, True, None, dict(window=7), "none", torch.float32),
    ("window-decode", 1, 4, 1, 1, 90, 16, True, None, dict(window=20), "none", torch.float32),
    ("window-offset", 1, 4, 2, 10, 70, 16, True, 50, dict(window=16), "none", torch.bfloat16),
    ("window-wide", 1, 2, 1, 30, 30, 8, True, None, dict(window=100), "none", torch.float32),
    ("chunk", 1, 4, 2, 50, 50, 16, True, None, dict(chunk=16), "none", torch.float32),
    ("chunk-offset", 2, 3, 1, 20, 40, 16, True, 13, dict(chunk=8), "none", torch.bfloat16),
    ("softcap", 1, 4, 2, 37, 37, 16, True, None, dict(softcap=3.0), "none", torch.float32),
    ("softcap-nc", 1, 2, 2, 20, 33, 16, False, None, dict(softcap=5.0), "none", torch.float32),
    # Scores within half the cap (Triton's polynomial tanh), and a mix of both tile kinds.
    ("softcap-50", 1, 4, 2, 37, 37, 16, True, None, dict(softcap=50.0), "none", torch.float32),
    ("softcap-30", 2, 4, 2, 40, 40, 16, True, None, dict(softcap=30.0), "none", torch.float32),
    ("sinks", 2, 4, 2, 30, 30, 16, True, None, dict(sinks=True), "none", torch.float32),
    ("sinks-empty", 1, 4, 1, 20, 24, 16, True, -6, dict(sinks=True), "none", torch.float32),
    ("leftpad", 3, 6, 2, 33, 33, 16, True, None, {}, "leftpad", torch.float32),
    ("intervals", 2, 4, 2, 29, 41, 16, False, None, {}, "random", torch.float32),
    ("intervals-causal", 2, 4, 1, 29, 41, 16, True, None, {}, "random", torch.bfloat16),
    (
        "all",
        3,
        6,
        2,
        40,
        40,
        16,
        True,
        None,
        dict(window=9, softcap=4.0, sinks=True),
        "leftpad",
        torch.bfloat16,
    ),
    ("chunk-sinks-pad", 2, 4, 2, 36, 36, 16, True, None, dict(chunk=10, sinks=True), "leftpad",
     torch.float32),
    ("decode-all", 2, 8, 2, 1, 77, 32, True, None, dict(window=30, softcap=6.0, sinks=True),
     "leftpad", torch.float32),
    ("decode-few", 2, 4, 2, 3, 64, 16, True, 70, dict(window=25, sinks=True), "random",
     torch.float32),
]  # fmt: skip


def make_case(case, device="cpu"):
    """q, k and the attention_stats keyword arguments of one CASES entry."""
    _, b, hq, hkv, nq, nk, d, causal, q_offset, options, bounds, dtype = case
    gen = torch.Generator().manual_seed(zlib.crc32(case[0].encode()))
    q = torch.randn(b, hq, nq, d, generator=gen)
    k = torch.randn(b, hkv, nk, d, generator=gen) * 1.5
    if "softcap" in options:
        q = q * 3.0  # scores up to ~20: the cap changes the distribution a lot
    kwargs = dict(causal=causal, q_offset=q_offset, **options)
    kwargs["sinks"] = torch.randn(hq, generator=gen) * 2.0 + 1.0 if options.get("sinks") else None
    kwargs["key_lo"], kwargs["key_hi"] = _bounds(bounds, b, nq, nk, gen)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    for name in ("sinks", "key_lo", "key_hi"):
        kwargs[name] = to(kwargs[name])
    return q.to(dtype).to(device), k.to(dtype).to(device), kwargs


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_torch_variants_match_dense(case, oracle):
    q, k, kw = make_case(case)
    ref = oracle.dense(q, k, **kw)
    # block_q=16 forces several (partial) blocks; the default adaptive blocks too.
    st = attention_stats_torch(q, k, AttentionVariant(**kw), entropy=True, block_q=16)
    oracle.check(st, ref, tol=TOL[q.dtype])
    st2 = attention_stats(q, k, entropy=True, backend="torch", **kw)
    oracle.check(st2, ref, tol=TOL[q.dtype])


def _triton():
    """The Triton module, compiled on CUDA or interpreted on the CPU (conftest.py)."""
    require_triton()
    from headhunt.kernels import launch

    return launch


# Under the interpreter every tile costs Python time: one case per feature.
TRITON_CASES = [
    c
    for c in CASES
    if c[0]
    in {"window", "window-decode", "chunk-offset", "softcap", "softcap-30", "sinks-empty", "leftpad",
        "intervals", "all", "decode-all"}
]  # fmt: skip


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: exp2(-inf), log(0)
@pytest.mark.parametrize("case", TRITON_CASES, ids=[c[0] for c in TRITON_CASES])
def test_triton_variants_match_dense(case, oracle, poison):
    _triton()
    q, k, kw = make_case(case, DEVICE)
    st = attention_stats(q, k, entropy=True, backend="triton", **kw)
    oracle.check(st, oracle.dense(q, k, **kw), tol=TOL[q.dtype])


DECODE_CASES = [
    c
    for c in CASES
    if c[0] in {"window-decode", "decode-all", "decode-few", "intervals", "chunk-offset"}
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("case", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_triton_decode_split_matches_dense(case, oracle, poison, monkeypatch):
    # The split-K decode kernels (forced here; chosen by default for few queries over
    # many keys), with splits that cut through key tiles and rows' intervals.
    launch = _triton()
    from headhunt.kernels import triton_decode

    monkeypatch.setattr(triton_decode, "sm_count", lambda device: 3)
    q, k, kw = make_case(case, DEVICE)
    st = launch.attention_stats_triton(q, k, AttentionVariant(**kw), entropy=True, decode=True)
    oracle.check(st, oracle.dense(q, k, **kw), tol=TOL[q.dtype])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", ["all", "intervals", "chunk-sinks-pad"])
def test_triton_variant_tiles_and_pipelines(name, oracle, poison):
    # Other tile shapes move the interval edges inside the tiles and change which tiles
    # are skipped, masked or full; the software-pipelined loops must agree too.
    launch = _triton()
    small = dict(row_warps=1, row_stages=1, col_warps=1, col_stages=1)
    configs = [
        KernelConfig(32, 16, col_block_n=16, col_block_m=32, **small),
        KernelConfig(16, 32, col_block_n=32, col_block_m=16, argmax_mode=2,
                        row_pipeline=True, col_pipeline=True, **small),
    ]  # fmt: skip
    if torch.cuda.is_available():
        configs = [default_config(16), KernelConfig(row_pipeline=True, argmax_mode=3)]
    case = next(c for c in CASES if c[0] == name)
    q, k, kw = make_case(case, DEVICE)
    ref = oracle.dense(q, k, **kw)
    for cfg in configs:
        st = launch.attention_stats_triton(q, k, AttentionVariant(**kw), entropy=True, config=cfg)
        oracle.check(st, ref, tol=TOL[q.dtype])


@pytest.mark.parametrize("kind", ["random", "leftpad-window"])
def test_triton_query_ranges(kind, oracle):
    # For every key tile, [first, stop) must hold every row that sees one of its keys,
    # whatever the intervals (random ones: some empty, not monotone), and be exactly their
    # span for monotone ones (causal + window + left padding); the rows [full_lo, full_hi)
    # that run unmasked must see all of the tile's keys or none.
    _triton()
    from headhunt.kernels.triton_columns import query_ranges

    gen = torch.Generator().manual_seed(3)
    b, nq, nk, block = 3, 40, 50, 8
    if kind == "random":
        kw = dict(causal=False, q_offset=0)
        kw["key_lo"], kw["key_hi"] = _bounds("random", b, nq, nk, gen)
    else:
        kw = dict(causal=True, q_offset=10, window=13, key_lo=_bounds("leftpad", b, nq, nk, gen)[0])
    ranges = query_ranges(*row_key_bounds(b, nq, nk, **kw), nk, block)
    vis = oracle.visible(b, nq, nk, **kw)
    full_tiles = 0
    for bi in range(b):
        for t in range(-(-nk // block)):
            tile = vis[bi, :, t * block : (t + 1) * block]
            first, full_lo, full_hi, stop = ranges[bi, t].tolist()
            # Rows [full_lo, full_hi) see every key of the tile or none of them.
            sees = tile[full_lo:full_hi]
            assert (sees.all(-1) | ~sees.any(-1)).all()
            full_tiles += full_hi > full_lo
            rows = tile.any(-1).nonzero().flatten()
            if not len(rows):
                continue
            lo_row, hi_row = rows.min().item(), rows.max().item() + 1
            assert first <= lo_row and stop >= hi_row
            if kind != "random":
                assert (first, stop) == (lo_row, hi_row)
    if kind != "random":
        assert full_tiles > 0


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_probs_at_variants(case, oracle):
    q, k, kw = make_case(case)
    b, hq, nq = q.shape[:3]
    nk = k.shape[2]
    ref = oracle.dense(q, k, **kw)
    st = attention_stats(q, k, key_stats=False, backend="torch", **kw)
    gen = torch.Generator().manual_seed(1)
    qi, ki = torch.randint(0, nq, (b, hq, 80), generator=gen), torch.randint(0, nk, (b, hq, 80))
    p = attention_probs_at(q, k, st.lse, qi, ki, **kw)
    bi, hi = torch.arange(b).view(b, 1, 1), torch.arange(hq).view(1, hq, 1)
    want = ref.probs[bi, hi, qi, ki]
    torch.testing.assert_close(p.double(), want, rtol=TOL[q.dtype], atol=1e-6)
    # Forbidden pairs are exactly 0.
    assert (p[want == 0] == 0).all()


def test_sinks_probabilities_and_entropy(oracle):
    # With a sink the key probabilities of a row sum to 1 - p_sink: the column sums add
    # up to nq minus the total sink mass, and a huge sink takes (almost) all of it.
    q, k = torch.randn(1, 2, 12, 16), torch.randn(1, 1, 12, 16)
    sinks = torch.tensor([0.0, 40.0])
    st = attention_stats(q, k, sinks=sinks, entropy=True)
    ref = oracle.dense(q, k, sinks=sinks)
    p_sink = torch.exp(sinks.view(1, 2, 1).double() - ref.lse).sum(-1)
    torch.testing.assert_close(st.col_sum.sum(-1).double(), 12 - p_sink, rtol=1e-5, atol=1e-5)
    assert st.col_sum[0, 1].sum() < 1e-6 and st.entropy[0, 1].abs().max() < 1e-6
    # max_score / argmax ignore the sink.
    plain = attention_stats(q, k)
    assert torch.equal(st.argmax, plain.argmax)
    torch.testing.assert_close(st.max_score, plain.max_score)


def test_row_without_keys_gets_sink_lse():
    q, k = torch.randn(1, 3, 4, 8), torch.randn(1, 3, 6, 8)
    sinks = torch.tensor([0.5, -1.0, 2.0])
    key_lo = torch.tensor([[0, 9, 0, 3]])  # row 1 starts past its last key: empty
    st = attention_stats(q, k, sinks=sinks, key_lo=key_lo, entropy=True)
    torch.testing.assert_close(st.lse[0, :, 1], sinks)
    assert (st.argmax[0, :, 1] == -1).all() and (st.max_score[0, :, 1] == -math.inf).all()
    assert (st.entropy[0, :, 1] == 0).all()


def test_bounds_and_counts_match_dense(oracle):
    gen = torch.Generator().manual_seed(0)
    b, nq, nk = 2, 31, 45
    for causal, q_offset, window, chunk in [
        (True, 14, 5, None),
        (True, -3, None, 4),
        (True, 20, 9, 6),
        (False, 0, None, None),
    ]:
        key_lo, key_hi = _bounds("random", b, nq, nk, gen)
        kw = dict(causal=causal, q_offset=q_offset, window=window, chunk=chunk)
        vis = oracle.visible(b, nq, nk, key_lo=key_lo, key_hi=key_hi, **kw)
        lo, hi = row_key_bounds(b, nq, nk, key_lo=key_lo, key_hi=key_hi, **kw)
        j = torch.arange(nk)
        assert torch.equal(vis, (j >= lo[..., None]) & (j <= hi[..., None]))
        assert (lo[~vis.any(-1)] == nk).all() and (hi[~vis.any(-1)] == -1).all()
        assert torch.equal(key_visible_counts(lo, hi, nk), vis.sum(1).float())


class _MatmulElements(TorchDispatchMode):
    """Sums the output elements of every matrix product (the scores the backend computes)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm):
            self.total += out.numel()
        return out


def test_window_work_scales_with_visible_keys():
    # A 32-key window at 4k tokens: the torch reference scores only each block's visible
    # keys (block_q + window, rounded out to 64-key chunks), not the causal triangle.
    n, hq, block_q, window = 2048, 2, 64, 32
    q, k = torch.randn(1, hq, n, 16), torch.randn(1, 1, n, 16)
    with _MatmulElements() as windowed:
        st = attention_stats_torch(q, k, AttentionVariant(window=window), block_q=block_q)
    with _MatmulElements() as causal:
        attention_stats_torch(q, k, block_q=block_q)
    assert windowed.total <= hq * n * (block_q + window + 2 * 64), windowed.total
    assert causal.total > 5 * windowed.total
    counts = key_visible_counts(*row_key_bounds(1, n, n, causal=True, q_offset=0, window=window), n)
    assert counts[0, :-window].eq(window).all()
    torch.testing.assert_close(st.col_mean[0], st.col_sum[0] / counts)


def test_option_validation():
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    with pytest.raises(ValueError, match="window"):
        attention_stats(q, k, window=0)
    with pytest.raises(ValueError, match="causal"):
        attention_stats(q, k, window=4, causal=False)
    with pytest.raises(ValueError, match="chunk"):
        attention_stats(q, k, chunk=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="softcap"):
        attention_stats(q, k, softcap=-1.0)
    with pytest.raises(ValueError, match="sinks"):
        attention_stats(q, k, sinks=torch.zeros(2))
    with pytest.raises(ValueError, match="key_lo"):
        attention_stats(q, k, key_lo=torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="key_hi"):
        attention_stats(q, k, key_hi=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="causal"):
        attention_probs_at(
            q, k, torch.zeros(2, 4, 5), torch.tensor([0]), torch.tensor([0]), chunk=2, causal=False
        )


def test_backend_routing_never_drops_an_option(monkeypatch):
    # "auto" sends any option the Triton kernels lack to torch; "triton" refuses it.
    from headhunt.kernels import api

    cuda_q = SimpleNamespace(is_cuda=True)  # _pick_backend only asks where q lives
    monkeypatch.setattr(api, "triton_available", lambda: True)
    fields = frozenset({"causal", "scale", "q_offset", "window"})
    monkeypatch.setattr(AttentionVariant, "TRITON_FIELDS", fields)
    opts = AttentionVariant(sinks=torch.zeros(2), window=3, chunk=None)
    no_sinks = dataclasses.replace(opts, sinks=None)
    assert api._pick_backend("auto", cuda_q, 8, opts) == "torch"
    assert api._pick_backend("auto", cuda_q, 8, no_sinks) == "triton"
    with pytest.raises(ValueError, match="does not support sinks"):
        api._pick_backend("triton", cuda_q, 8, opts)
    assert api._pick_backend("triton", cuda_q, 8, no_sinks) == "triton"


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_variants_default_tiles(d, oracle, poison):
    # Lengths where the default tiles (64 x 128) leave skipped, full and masked tiles in
    # both passes; bf16 as models run.
    gen = torch.Generator(device="cuda").manual_seed(d)
    b, hq, hkv, n = 2, 8, 2, 1500
    q = torch.randn(b, hq, n, d, device="cuda", generator=gen).bfloat16()
    k = torch.randn(b, hkv, n, d, device="cuda", generator=gen).bfloat16()
    key_lo = torch.tensor([[0], [100]], device="cuda").expand(b, n).contiguous()
    sinks = torch.randn(hq, device="cuda", generator=gen)
    for kw in [
        dict(window=300),
        dict(key_lo=key_lo),
        dict(window=257, sinks=sinks, key_lo=key_lo),
        dict(chunk=384, softcap=4.0),
        dict(softcap=30.0, sinks=sinks),
    ]:
        st = attention_stats(q, k, entropy=True, **kw)
        oracle.check(st, oracle.dense(q, k, **kw), tol=1e-2)


@pytest.mark.gpu
def test_gpu_decode_long_cache(oracle, poison):
    # One and four queries over 40k keys (the default picks the split-K kernels), with
    # ties across splits: key 5 is copied to 20000 and 39990, the argmax must say 5.
    launch = _triton()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for nq in (1, 4):
        q = torch.randn(1, 32, nq, 128, device="cuda", generator=gen).bfloat16()
        k = torch.randn(1, 8, 40000, 128, device="cuda", generator=gen).bfloat16()
        k[:, :, [20000, 39990]] = k[:, :, 5:6]
        q[:, :, :] = k[:, :, 5:6].repeat_interleave(4, 1) * 2
        sinks = torch.randn(32, device="cuda", generator=gen)
        for kw in [{}, dict(window=4096, sinks=sinks), dict(softcap=30.0)]:
            st = attention_stats(q, k, entropy=True, key_stats=False, **kw)
            ref = oracle.dense(q, k, **kw)
            oracle.check(st, ref, tol=1e-2, key_stats=False)
            if "window" not in kw:
                assert (st.argmax == 5).all()
        row = launch.attention_stats_triton(q, k, key_stats=False, decode=False)
        torch.testing.assert_close(
            row.lse, attention_stats(q, k, key_stats=False).lse, rtol=1e-5, atol=1e-5
        )
