"""Fixtures for the kernel tests: float64 dense oracle, output poisoning, GPU marker.

Without CUDA, Triton kernels run under the interpreter on CPU tensors. Triton decides
between interpreter and compiler when a kernel is decorated, i.e. when
``headhunt.kernels.triton_stats`` is first imported, so TRITON_INTERPRET is set here at
collection time, before any test imports it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped on CPU)")


@pytest.fixture(autouse=True)
def _skip_gpu_without_cuda(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("gpu") and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@dataclass
class Dense:
    """Float64 statistics from the full score matrix (the test oracle)."""

    lse: Tensor  # [b, hq, nq], -inf for rows that see no key
    max_score: Tensor  # [b, hq, nq]
    argmax: Tensor  # [b, hq, nq], first index of the max; -1 for empty rows
    gap: Tensor  # [b, hq, nq], best minus second-best score (inf if one key)
    entropy: Tensor  # [b, hq, nq], nats, 0 for empty rows
    col_sum: Tensor  # [b, hq, nk]
    col_mean: Tensor  # [b, hq, nk]
    probs: Tensor  # [b, hq, nq, nk]
    scores: Tensor  # [b, hq, nq, nk], scaled, -inf where masked


def dense_reference(
    q: Tensor, k: Tensor, *, causal: bool = True, scale: float | None = None, q_offset=None
) -> Dense:
    """Materialise the float64 score matrix and derive every statistic from it."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q_offset = nk - nq if q_offset is None else q_offset
    kk = k.double().cpu().repeat_interleave(group, dim=1)
    s = (q.double().cpu() @ kk.transpose(-1, -2)) * scale
    visible = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        pos = torch.arange(nq).unsqueeze(1) + q_offset
        visible = torch.arange(nk).unsqueeze(0) <= pos
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    seen = visible.any(-1).expand(b, hq, nq)
    p = torch.where(visible, torch.exp(s - lse.unsqueeze(-1)), 0.0)
    p = torch.nan_to_num(p, nan=0.0)
    mx, am = s.max(dim=-1)
    am = torch.where(seen, am, -1)
    top2 = s.topk(min(2, nk), dim=-1).values if nk else s
    gap = top2[..., 0] - top2[..., 1] if nk > 1 else torch.full_like(mx, math.inf)
    ent = -(p * torch.where(p > 0, p.log(), 0.0)).sum(-1)
    col_sum = p.sum(dim=-2)
    count = visible.sum(0).double()
    col_mean = torch.where(count > 0, col_sum / count.clamp_min(1), 0.0)
    return Dense(lse, mx, am, gap, ent, col_sum, col_mean, p, s)


def rel_err(out: Tensor, ref: Tensor, mask: Tensor | None = None) -> float:
    """||out - ref|| / ||ref|| over finite reference entries (mask selects entries)."""
    out = out.double().cpu()
    ref = ref.double().cpu()
    if mask is not None:
        out, ref = out[mask], ref[mask]
    diff = torch.linalg.vector_norm(out - ref).item()
    return diff / max(torch.linalg.vector_norm(ref).item(), 1e-30)


@pytest.fixture
def poison() -> Iterator[None]:
    """Make the Triton wrapper allocate outputs full of NaN / a sentinel argmax."""
    ts = pytest.importorskip("headhunt.kernels.triton_stats")
    old = ts.POISON_OUTPUTS
    ts.POISON_OUTPUTS = True
    yield
    ts.POISON_OUTPUTS = old


def check_stats(
    st, ref: Dense, *, tol: float, entropy: bool = True, key_stats: bool = True
) -> None:
    """Assert that an AttentionStats matches the dense oracle.

    Relative errors (norm-wise over rows that see a key) must stay under ``tol``; rows
    that see no key must carry exactly -inf / -1 / 0; no NaN or poison may survive.
    The argmax must match wherever the oracle's top-2 gap exceeds rounding, and
    elsewhere point at a key whose score is within rounding of the max.
    """
    seen = torch.isfinite(ref.lse)
    lse = st.lse.cpu()
    assert st.lse.dtype == torch.float32 and st.max_score.dtype == torch.float32
    assert st.argmax.dtype == torch.int64
    assert not torch.isnan(lse).any() and not torch.isnan(st.max_score).any()
    assert torch.equal(torch.isfinite(lse), seen)
    assert rel_err(lse, ref.lse, seen) < tol
    assert rel_err(st.max_score, ref.max_score, seen) < tol
    assert (lse[~seen] == -math.inf).all() and (st.max_score.cpu()[~seen] == -math.inf).all()
    am = st.argmax.cpu()
    assert (am[~seen] == -1).all()
    clear = seen & (ref.gap > 1e-2 * ref.max_score.abs().clamp_min(1.0))
    assert torch.equal(am[clear], ref.argmax[clear])
    # Near-ties: the chosen key must be visible and score within rounding of the max.
    picked = ref.scores.gather(-1, am.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    slack = 1e-2 * ref.max_score.abs().clamp_min(1.0)
    assert (picked[seen] >= (ref.max_score - slack)[seen]).all()
    if entropy:
        assert st.entropy is not None and st.entropy.dtype == torch.float32
        assert not torch.isnan(st.entropy).any()
        assert rel_err(st.entropy, ref.entropy) < tol
        assert (st.entropy.cpu()[~seen] == 0).all()
    else:
        assert st.entropy is None
    if key_stats:
        assert st.col_sum is not None and st.col_mean is not None
        assert not torch.isnan(st.col_sum).any() and not torch.isnan(st.col_mean).any()
        assert rel_err(st.col_sum, ref.col_sum) < tol
        assert rel_err(st.col_mean, ref.col_mean) < tol
        assert (st.col_mean.cpu()[..., ref.col_mean[0, 0] == 0] == 0).all()
    else:
        assert st.col_sum is None and st.col_mean is None


@pytest.fixture(scope="session")
def oracle() -> SimpleNamespace:
    """Helpers shared by the kernel tests (fixtures avoid importing conftest)."""
    return SimpleNamespace(dense=dense_reference, rel_err=rel_err, check=check_stats)
