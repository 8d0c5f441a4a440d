"""Fixtures for the kernel tests: float64 dense oracle, output poisoning, GPU marker.

Without CUDA, Triton kernels run under the interpreter on CPU tensors. Triton decides
between interpreter and compiler when a kernel is decorated, i.e. when
a module of ``headhunt.kernels`` that defines kernels is first imported, so TRITON_INTERPRET is set here at
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

    lse: Tensor  # [b, hq, nq], -inf for rows that see no key (the sink logit with sinks)
    max_score: Tensor  # [b, hq, nq]
    argmax: Tensor  # [b, hq, nq], first index of the max; -1 for empty rows
    gap: Tensor  # [b, hq, nq], best minus second-best score (inf if one key)
    entropy: Tensor  # [b, hq, nq], nats (keys plus the sink slot), 0 for empty rows
    col_sum: Tensor  # [b, hq, nk]
    col_mean: Tensor  # [b, hq, nk]
    probs: Tensor  # [b, hq, nq, nk]
    scores: Tensor  # [b, hq, nq, nk], scaled (and softcapped), -inf where masked
    seen: Tensor  # [b, hq, nq], the row sees at least one key


def dense_visible(
    b, nq, nk, *, causal=True, q_offset=None, window=None, chunk=None, key_lo=None, key_hi=None
) -> Tensor:
    """[b, nq, nk] visibility, written from the transformers mask functions one rule at a
    time (independently of headhunt.kernels.masks)."""
    q_offset = nk - nq if q_offset is None else q_offset
    p = (torch.arange(nq) + q_offset).view(1, nq, 1)
    j = torch.arange(nk).view(1, 1, nk)
    vis = torch.ones(b, nq, nk, dtype=torch.bool)
    if causal:
        vis = vis & (j <= p)
    if window is not None:
        vis = vis & (j > p - window)
    if chunk is not None:
        vis = vis & (j // chunk == p // chunk)
    if key_lo is not None:
        vis = vis & (j >= key_lo.cpu().view(b, nq, 1))
    if key_hi is not None:
        vis = vis & (j <= key_hi.cpu().view(b, nq, 1))
    return vis


def dense_reference(
    q: Tensor,
    k: Tensor,
    *,
    causal: bool = True,
    scale: float | None = None,
    q_offset=None,
    window=None,
    chunk=None,
    softcap=None,
    sinks=None,
    key_lo=None,
    key_hi=None,
    alibi_slopes=None,
    bias=None,
    row_sinks=None,
) -> Dense:
    """Materialise the float64 score matrix and derive every statistic from it, as the
    eager attention of transformers does: scale, ALiBi bias (``slope_h * (j - p_i)``),
    softcap, mask, softmax over the keys and (gpt-oss) one sink logit per head."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kk = k.double().cpu().repeat_interleave(group, dim=1)
    s = (q.double().cpu() @ kk.transpose(-1, -2)) * scale
    if alibi_slopes is not None:
        q_off = nk - nq if q_offset is None else q_offset
        rel = torch.arange(nk).view(1, nk) - (torch.arange(nq) + q_off).view(nq, 1)
        s = s + alibi_slopes.double().cpu().view(1, hq, 1, 1) * rel.double()
    if bias is not None:  # a score bias the model built, [b or 1, hq or 1, nq, nk]
        s = s + bias.double().cpu()
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    visible = dense_visible(
        b,
        nq,
        nk,
        causal=causal,
        q_offset=q_offset,
        window=window,
        chunk=chunk,
        key_lo=key_lo,
        key_hi=key_hi,
    ).unsqueeze(1)  # [b, 1, nq, nk]
    s = s.masked_fill(~visible, -math.inf)
    seen = visible.any(-1).expand(b, hq, nq)
    if sinks is not None or row_sinks is not None:
        if sinks is not None:
            sink = sinks.double().cpu().view(1, hq, 1, 1).expand(b, hq, nq, 1)
        else:  # a sink logit per query row, [b or 1, hq, nq]
            sink = row_sinks.double().cpu()[..., None].expand(b, hq, nq, 1)
        lse = torch.logsumexp(torch.cat([s, sink], -1), dim=-1)
        p_sink = torch.exp(sink[..., 0] - lse)
    else:
        lse = torch.logsumexp(s, dim=-1)
        p_sink = torch.zeros_like(lse)
    p = torch.where(visible, torch.exp(s - lse.unsqueeze(-1)), 0.0)
    p = torch.nan_to_num(p, nan=0.0)
    mx, am = s.max(dim=-1)
    am = torch.where(seen, am, -1)
    top2 = s.topk(min(2, nk), dim=-1).values if nk else s
    gap = top2[..., 0] - top2[..., 1] if nk > 1 else torch.full_like(mx, math.inf)
    plogp = lambda x: x * torch.where(x > 0, x.log(), 0.0)  # noqa: E731
    ent = -plogp(p).sum(-1) - plogp(p_sink)
    col_sum = p.sum(dim=-2)
    count = visible.sum(-2).double()  # [b, 1, nk]
    col_mean = torch.where(count > 0, col_sum / count.clamp_min(1), 0.0)
    return Dense(lse, mx, am, gap, ent, col_sum, col_mean, p, s, seen)


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
    launch = pytest.importorskip("headhunt.kernels.launch")
    old = launch.POISON_OUTPUTS
    launch.POISON_OUTPUTS = True
    yield
    launch.POISON_OUTPUTS = old


def check_stats(
    st, ref: Dense, *, tol: float, entropy: bool = True, key_stats: bool = True
) -> None:
    """Assert that an AttentionStats matches the dense oracle.

    Relative errors (norm-wise over rows that see a key) must stay under ``tol``; rows
    that see no key must carry exactly -inf / -1 / 0; no NaN or poison may survive.
    The argmax must match wherever the oracle's top-2 gap exceeds rounding, and
    elsewhere point at a key whose score is within rounding of the max.
    """
    seen = ref.seen
    lse = st.lse.cpu()
    assert st.lse.dtype == torch.float32 and st.max_score.dtype == torch.float32
    assert st.argmax.dtype == torch.int64
    assert not torch.isnan(lse).any() and not torch.isnan(st.max_score).any()
    finite = torch.isfinite(ref.lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert rel_err(lse, ref.lse, finite) < tol
    assert rel_err(st.max_score, ref.max_score, seen) < tol
    assert (lse[~finite] == -math.inf).all() and (st.max_score.cpu()[~seen] == -math.inf).all()
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
        assert (st.col_mean.cpu()[ref.col_mean == 0] == 0).all()
    else:
        assert st.col_sum is None and st.col_mean is None


@pytest.fixture(scope="session")
def oracle(largest_tensor) -> SimpleNamespace:
    """Helpers shared by the kernel tests (fixtures avoid importing conftest)."""
    return SimpleNamespace(
        dense=dense_reference,
        visible=dense_visible,
        rel_err=rel_err,
        check=check_stats,
        largest_tensor=largest_tensor,
    )
