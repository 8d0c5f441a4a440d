"""The specialised column kernel (kernels/triton_columns.py) against the float64 oracle and
against the general column kernel.

Without CUDA it runs under TRITON_INTERPRET=1 (conftest.py) with 16-wide tiles; with CUDA
compiled, plus the model's [b, n, heads, d] memory layout with bulk tensor copies.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from triton_runs import CUDA, DEVICE, require_triton

require_triton()

from headhunt.kernels import AttentionVariant, launch  # noqa: E402
from headhunt.kernels import triton_columns as tc  # noqa: E402
from headhunt.kernels.config import KernelConfig, default_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# The interpreter's tiles: (col_block_n keys, col_block_m rows); on CUDA the defaults too.
TILES = [(16, 16), (32, 16), (16, 32)]


def _config(block_n: int, block_m: int, **kw) -> KernelConfig:
    base = KernelConfig(16, 16, 1, 1, block_n, block_m, 1, 1)
    return dataclasses.replace(base, **kw)


def _inputs(b, hq, hkv, nq, nk, d, dtype, model_layout):
    """q, k as [b, heads, n, d]; ``model_layout``: views of [b, n, heads, d] memory."""
    if model_layout:
        q = torch.randn(b, nq, hq, d, device=DEVICE).to(dtype).transpose(1, 2)
        k = (torch.randn(b, nk, hkv, d, device=DEVICE) * 1.5).to(dtype).transpose(1, 2)
    else:
        q = torch.randn(b, hq, nq, d, device=DEVICE).to(dtype)
        k = (torch.randn(b, hkv, nk, d, device=DEVICE) * 1.5).to(dtype)
    return q, k


def _columns(q, k, cfg, **kw):
    return launch.attention_stats_triton(q, k, AttentionVariant(**kw), config=cfg)


def test_fast_kernel_serves_exactly_the_plain_masks(monkeypatch):
    calls = []
    real = tc.launch_fast_columns
    monkeypatch.setattr(tc, "launch_fast_columns", lambda *a: calls.append(a) or real(*a))
    q, k = _inputs(1, 2, 1, 20, 20, 16, torch.float32, False)
    cfg = _config(16, 16)
    for causal in (True, False):
        _columns(q, k, cfg, causal=causal)
    assert len(calls) == 2
    # per-row bounds, softcaps and the general kernel's own options keep the general kernel
    _columns(q, k, cfg, window=5)
    _columns(q, k, cfg, softcap=10.0)
    _columns(q, k, cfg, key_lo=torch.zeros(1, 20, dtype=torch.long, device=DEVICE))
    _columns(q, k, _config(16, 16, col_pipeline=True))
    _columns(q, k, _config(16, 16, col_exp=2))
    assert len(calls) == 2


# (b, hq, hkv, nq, nk, d, causal, q_offset, dtype, model_layout): GQA, lengths off the
# tile grid, nq < nk and nq > nk, q_offset < 0 (rows that see no key), queries past the
# last key, both memory layouts.
CASES = [
    (2, 4, 2, 45, 45, 16, True, None, torch.bfloat16, True),
    (1, 3, 1, 29, 61, 32, True, None, torch.float32, False),
    (1, 2, 2, 40, 33, 16, False, None, torch.float16, True),
    (1, 3, 1, 20, 24, 16, True, -6, torch.float32, False),
    (2, 4, 1, 19, 53, 16, True, 40, torch.bfloat16, False),
]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_fast_columns_match_dense_and_general_kernel(case, oracle, poison):
    *shape, causal, q_offset, dtype, layout = case
    q, k = _inputs(*shape, dtype, layout)
    ref = oracle.dense(q, k, causal=causal, q_offset=q_offset)
    tiles = TILES if not CUDA else [(None, None)]
    for block_n, block_m in tiles:
        cfg = default_config(q.shape[-1], dtype) if block_n is None else _config(block_n, block_m)
        st = _columns(q, k, cfg, causal=causal, q_offset=q_offset)
        # the general kernel (forced by its pipelined loop) on the same lse
        general = _columns(
            q, k, dataclasses.replace(cfg, col_pipeline=True), causal=causal, q_offset=q_offset
        )
        for name in ("col_sum", "col_mean"):
            out = getattr(st, name)
            assert not torch.isnan(out).any(), name
            assert oracle.rel_err(out, getattr(ref, name)) < TOL[dtype], name
            assert oracle.rel_err(out, getattr(general, name)) < 1e-5, name
        assert (st.col_mean.cpu()[ref.col_mean == 0] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_fast_columns_on_model_layout(d, oracle, poison):
    # [b, n, heads, d] memory: bulk copies over its [b * n, heads * d] view, where the rows
    # past a batch row's end belong to the next batch row and must not leak in.
    q, k = _inputs(2, 8, 2, 1000, 1237, d, torch.bfloat16, True)
    ref = oracle.dense(q, k)
    cfg = default_config(d)
    fast = _columns(q, k, cfg)
    pointers = _columns(q, k, dataclasses.replace(cfg, col_tma=False))
    general = _columns(q, k, dataclasses.replace(cfg, col_pipeline=True))
    for name in ("col_sum", "col_mean"):
        assert oracle.rel_err(getattr(fast, name), getattr(ref, name)) < 1e-2
        for other in (pointers, general):
            assert oracle.rel_err(getattr(fast, name), getattr(other, name)) < 1e-5
