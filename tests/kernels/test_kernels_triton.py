"""Triton kernels of headhunt.kernels against a float64 dense oracle.

Without CUDA they run under TRITON_INTERPRET=1 (set by conftest.py) on CPU tensors, at
small sizes with 16x16 tiles; with CUDA the same tests run compiled, and the ``gpu``
tests add realistic sizes and tile shapes.
"""

from __future__ import annotations

import pytest
import torch
from triton_runs import CUDA, DEVICE, require_triton

require_triton()

from headhunt.kernels import (  # noqa: E402
    AttentionVariant,
    attention_probs_at,
    attention_stats,
    launch,
)
from headhunt.kernels.config import KernelConfig, default_config, exp_mode  # noqa: E402

TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2, torch.float16: 1e-2}

# Under the interpreter, numpy warns about the intentional -inf arithmetic of masked
# entries (exp2(-inf), log(0) for rows that see no key); those are not failures.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# (b, hq, hkv, nq, nk, d, causal, q_offset, dtype): GQA 3/4/1, lengths that are not a
# multiple of the 16-wide interpreter tiles, decode-like nq < nk, nq > nk, queries
# past the last key, and q_offset < 0 (rows that see no key).
CASES = [
    (1, 3, 1, 37, 37, 16, True, None, torch.float32),
    (2, 4, 1, 29, 45, 32, True, None, torch.bfloat16),
    (1, 2, 2, 33, 33, 8, False, None, torch.float32),
    (1, 4, 1, 1, 50, 16, True, None, torch.bfloat16),
    (1, 3, 1, 20, 24, 16, True, -6, torch.float32),
    (1, 6, 2, 40, 17, 24, False, None, torch.float16),
    (1, 8, 2, 19, 53, 16, True, 40, torch.float32),
    (1, 4, 4, 48, 64, 16, True, None, torch.bfloat16),
]


def _inputs(b, hq, hkv, nq, nk, d, dtype):
    q = torch.randn(b, hq, nq, d, device=DEVICE).to(dtype)
    k = (torch.randn(b, hkv, nk, d, device=DEVICE) * 1.5).to(dtype)
    return q, k


def _case_id(case) -> str:
    return "-".join(map(str, case[:8])) + "-" + str(case[8]).removeprefix("torch.")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_triton_matches_dense(case, oracle, poison):
    *shape, causal, q_offset, dtype = case
    q, k = _inputs(*shape, dtype)
    ref = oracle.dense(q, k, causal=causal, q_offset=q_offset)
    st = launch.attention_stats_triton(
        q, k, AttentionVariant(causal=causal, q_offset=q_offset), entropy=True
    )
    assert (st.argmax != launch.ARGMAX_POISON).all()
    oracle.check(st, ref, tol=TOL[dtype])


@pytest.mark.parametrize(
    "config",
    [
        KernelConfig(32, 16, 1, 1, 16, 32, 1, 1),
        KernelConfig(16, 32, 1, 1, 32, 16, 1, 1, argmax_mode=2),
        KernelConfig(16, 16, 1, 1, 16, 16, 1, 1, argmax_mode=3, row_pipeline=True),
        KernelConfig(32, 16, 1, 1, 16, 32, 1, 1, col_pipeline=True, row_pipeline=True),
        KernelConfig(32, 16, 1, 1, 16, 32, 1, 1, argmax_mode=2, row_pipeline=True),
    ],
    ids=["rowM32-colM32", "rowN32-colN32-argmax2", "argmax3-rowpipe", "pipelines", "argmax2-pipe"],
)
def test_triton_tile_shapes(config, oracle, poison):
    # Unequal tiles move the diagonal inside the tiles and change which tiles are masked;
    # the argmax modes and software-pipelined loops must give identical statistics.
    q, k = _inputs(1, 3, 1, 45, 70, 16, torch.float32)
    for causal in (True, False):
        st = launch.attention_stats_triton(
            q, k, AttentionVariant(causal=causal), entropy=True, config=config
        )
        oracle.check(st, oracle.dense(q, k, causal=causal), tol=1e-3)


def test_triton_optional_outputs_and_api(oracle, poison):
    q, k = _inputs(1, 4, 2, 21, 21, 16, torch.float32)
    st = attention_stats(q, k, key_stats=False, backend="triton")
    oracle.check(st, oracle.dense(q, k), tol=1e-3, entropy=False, key_stats=False)


@pytest.mark.parametrize("mode", [1, 2, 3])
def test_triton_ties_pick_lowest_index(mode, poison):
    # Identical keys 3, 19 and 35 (in three different 16-key tiles) and at 7 (same tile
    # as 3): every query's maximum is an exact four-way tie.
    # Unit-norm keys: q = 4 k_3 scores 4 on the copies of k_3 and < 4 on every other key.
    k = torch.nn.functional.normalize(torch.randn(1, 1, 40, 16, device=DEVICE), dim=-1)
    k[0, 0, [7, 19, 35]] = k[0, 0, 3].clone()
    q = k[:, :, 3:4].repeat(1, 3, 20, 1) * 4.0
    cfg = KernelConfig(16, 16, 1, 1, 16, 16, 1, 1, argmax_mode=mode, row_pipeline=mode == 3)
    if CUDA:
        cfg = KernelConfig(argmax_mode=mode, row_pipeline=mode == 3)
    st = launch.attention_stats_triton(q, k, AttentionVariant(causal=False), config=cfg)
    assert (st.argmax == 3).all()


def test_triton_agrees_with_torch_backend_and_probs_at(oracle, poison):
    q, k = _inputs(2, 6, 2, 26, 30, 16, torch.bfloat16)
    st = launch.attention_stats_triton(q, k, entropy=True)
    ref = attention_stats(q.cpu(), k.cpu(), entropy=True, backend="torch")
    for name in ("lse", "max_score", "entropy", "col_sum", "col_mean"):
        assert oracle.rel_err(getattr(st, name), getattr(ref, name), None) < 1e-4, name
    qi, ki = torch.randint(0, 26, (40,)), torch.randint(0, 30, (40,))
    p = attention_probs_at(q, k, st.lse, qi.to(DEVICE), ki.to(DEVICE))
    want = oracle.dense(q, k).probs[:, :, qi, ki]
    torch.testing.assert_close(p.double().cpu(), want, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- CUDA only (compiled)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("hq", "hkv", "n", "d", "causal"),
    [
        (9, 3, 1000, 64, True),
        (8, 2, 1537, 128, True),
        (4, 4, 777, 64, False),
        (6, 2, 2048, 96, True),
    ],
)
def test_gpu_default_config_matches_dense(hq, hkv, n, d, causal, oracle, poison):
    q, k = _inputs(1, hq, hkv, n, n, d, torch.bfloat16)
    st = attention_stats(q, k, causal=causal, entropy=True)  # auto -> triton on CUDA
    oracle.check(st, oracle.dense(q, k, causal=causal), tol=1e-2)


@pytest.mark.gpu
def test_gpu_decode_and_strided_inputs(oracle, poison):
    # [b, n, h, d] projections viewed as [b, h, n, d] (no copy), and nq = 1 decode.
    qa = torch.randn(2, 300, 8, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    ka = torch.randn(2, 300, 2, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    st = attention_stats(qa, ka, entropy=True)
    oracle.check(st, oracle.dense(qa, ka), tol=1e-2)
    st1 = attention_stats(qa[:, :, -1:], ka, entropy=True)
    oracle.check(st1, oracle.dense(qa[:, :, -1:], ka), tol=1e-2)


@pytest.mark.gpu
def test_gpu_fp32_and_fp16(oracle, poison):
    for dtype in (torch.float32, torch.float16):
        q, k = _inputs(1, 4, 1, 700, 900, 64, dtype)
        st = attention_stats(q, k, entropy=True)
        oracle.check(st, oracle.dense(q, k), tol=TOL[dtype])


# ------------------------------------------------- exp2 modes, TMA and fp32 configurations


@pytest.mark.parametrize("mode", [1, 2, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_triton_exp2_modes_match_dense(mode, causal, oracle, poison):
    # fp16 (1), ftz fp32 (2) and fp32 + polynomial (3) exponentials, both passes, with
    # the plain and software-pipelined loops; bf16 inputs at the bf16 tolerance.
    q, k = _inputs(2, 6, 2, 45, 61, 16, torch.bfloat16)
    base = dict(row_exp=mode, col_exp=mode)
    if CUDA:
        configs = [KernelConfig(**base), KernelConfig(row_pipeline=True, **base)]
    else:
        configs = [
            KernelConfig(16, 16, 1, 1, 16, 16, 1, 1, **base),
            KernelConfig(32, 16, 1, 1, 16, 32, 1, 1, row_pipeline=True, col_pipeline=True, **base),
        ]
    ref = oracle.dense(q, k, causal=causal)
    for cfg in configs:
        st = launch.attention_stats_triton(
            q, k, AttentionVariant(causal=causal), entropy=True, config=cfg
        )
        oracle.check(st, ref, tol=1e-2)


def test_triton_exp2_modes_fall_back_for_fp32(oracle, poison):
    # fp32 inputs promise < 1e-3: the fp16 (1) and polynomial (3) modes become mode 2.
    assert exp_mode(1, torch.float32) == 2 and exp_mode(3, torch.float32) == 2
    assert exp_mode(1, torch.bfloat16) == 1 and exp_mode(0, torch.float32) == 0
    q, k = _inputs(1, 4, 2, 40, 40, 16, torch.float32)
    cfg = KernelConfig(row_exp=1, col_exp=3)
    if not CUDA:
        cfg = KernelConfig(16, 16, 1, 1, 16, 16, 1, 1, row_exp=1, col_exp=3)
    st = launch.attention_stats_triton(q, k, entropy=True, config=cfg)
    oracle.check(st, oracle.dense(q, k), tol=1e-3)


def test_default_config_fp32_and_interpreter():
    # fp32 inputs get their own tiles on the GPU (tf32x3 products); the interpreter
    # always uses the tiny tiles.
    cfg = default_config(64, torch.float32)
    assert cfg.fp32_dot in ("tf32x3", "ieee")
    if not CUDA:
        assert cfg == KernelConfig(16, 16, 1, 1, 16, 16, 1, 1)
    else:
        assert not cfg.row_pipeline and cfg.row_block_m == 64


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_tma_matches_pointer_loads(d, oracle, poison):
    # TMA descriptors over the flattened [b * heads * n, d] tensors: rows past a head's
    # end come from the next head (b = 2, lengths not a multiple of any tile) and must
    # not leak into the statistics; the pointer-load path must agree.
    q, k = _inputs(2, 8, 2, 1000, 1237, d, torch.bfloat16)
    ref = oracle.dense(q, k)
    cfg = default_config(d)
    assert cfg.row_tma and cfg.col_tma
    off = KernelConfig(**{**cfg.__dict__, "row_tma": False, "col_tma": False})
    a = launch.attention_stats_triton(q, k, entropy=True, config=cfg)
    b = launch.attention_stats_triton(q, k, entropy=True, config=off)
    oracle.check(a, ref, tol=1e-2)
    oracle.check(b, ref, tol=1e-2)
    for name in ("lse", "col_sum"):
        assert oracle.rel_err(getattr(a, name), getattr(b, name), None) < 1e-5


@pytest.mark.gpu
def test_gpu_fp32_tf32x3_and_ieee(oracle, poison):
    q, k = _inputs(1, 4, 2, 900, 900, 128, torch.float32)
    ref = oracle.dense(q, k)
    for dot in ("tf32x3", "ieee"):
        cfg = KernelConfig(**{**default_config(128, torch.float32).__dict__, "fp32_dot": dot})
        st = launch.attention_stats_triton(q, k, entropy=True, config=cfg)
        oracle.check(st, ref, tol=1e-3)
