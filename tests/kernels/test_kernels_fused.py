"""attention_forward (output + statistics in one call) against a float64 dense oracle.

The torch backend runs on the CPU; the fused Triton kernel runs under TRITON_INTERPRET=1
on CPU tensors at small sizes (set by conftest.py) and compiled on CUDA, where the ``gpu``
tests add long sequences, d = 128 and realistic tiles.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from headhunt.kernels import AttentionVariant, attention_forward, attention_stats, fused_supported

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# (name, b, hq, hkv, nq, nk, options): GQA, decode-like nq < nk, windows, chunks, softcaps,
# sinks, padding (left pads: rows that see no key), a bidirectional layer.
CASES = [
    ("causal-gqa", 2, 4, 2, 37, 37, {}),
    ("offset", 1, 3, 1, 21, 45, {}),
    ("q_offset-scale", 1, 3, 1, 20, 24, {"q_offset": -6, "scale": 0.3}),  # rows see no key
    ("full", 1, 2, 2, 19, 26, {"causal": False}),
    ("window", 1, 4, 2, 40, 40, {"window": 7}),
    ("chunk", 1, 4, 1, 35, 35, {"chunk": 16}),
    ("softcap", 2, 4, 2, 33, 33, {"softcap": 2.5}),
    ("sinks", 1, 4, 2, 30, 30, {"sinks": True}),
    ("sinks-window-softcap", 1, 4, 2, 34, 34, {"sinks": True, "window": 9, "softcap": 3.0}),
    ("padding", 2, 4, 2, 36, 36, {"pad": (0, 9)}),
]


def _options(b, hq, nq, nk, opts: dict, device) -> dict:
    """Kernel keyword arguments: sinks drawn per head, pads as key_lo / key_hi bounds."""
    out = {k: v for k, v in opts.items() if k not in ("sinks", "pad")}
    if opts.get("sinks"):
        out["sinks"] = torch.randn(hq, generator=torch.Generator().manual_seed(1)).to(device)
    if "pad" in opts:
        # Left pads: row r of batch row i sees keys [pads_i, r] and pad rows see nothing.
        pads = torch.tensor(opts["pad"])
        rows = torch.arange(nq)
        hi = torch.where(rows[None] >= pads[:, None], rows[None] + nk - nq, -1)
        out.update(causal=False, key_lo=pads[:, None].expand(b, nq).contiguous(), key_hi=hi)
        out = {k: v.to(device) if torch.is_tensor(v) else v for k, v in out.items()}
    return out


def _inputs(b, hq, hkv, nq, nk, d, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g)
    k = torch.randn(b, hkv, nk, d, generator=g) * 1.5
    v = torch.randn(b, hkv, nk, d, generator=g)
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)


def _dense_output(q, k, v, ref) -> torch.Tensor:
    """Float64 output from the oracle's probabilities (sink share left out)."""
    group = q.shape[1] // k.shape[1]
    return ref.probs @ v.double().cpu().repeat_interleave(group, dim=1)


def _check(out, st, q, k, v, kw, oracle, *, tol, out_tol):
    ref = oracle.dense(q, k, **{n: kw.get(n) for n in _ORACLE_ARGS if n in kw})
    oracle.check(st, ref, tol=tol, entropy=True, key_stats=True)
    dense_out = _dense_output(q, k, v, ref)
    assert out.shape == q.shape[:3] + v.shape[-1:] and out.dtype == v.dtype
    assert not torch.isnan(out).any()
    assert (out.double().cpu() - dense_out).abs().max().item() < out_tol
    assert (out.cpu()[~ref.seen] == 0).all()  # rows that see no key: zero output


_ORACLE_ARGS = ("causal", "scale", "q_offset", "window", "chunk", "softcap", "sinks")
_ORACLE_ARGS += ("key_lo", "key_hi")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_torch_reference_matches_dense(case, oracle):
    _, b, hq, hkv, nq, nk, opts = case
    q, k, v = _inputs(b, hq, hkv, nq, nk, 16, torch.float32, "cpu")
    kw = _options(b, hq, nq, nk, opts, "cpu")
    out, st = attention_forward(q, k, v, entropy=True, backend="torch", **kw)
    _check(out, st, q, k, v, kw, oracle, tol=1e-5, out_tol=1e-5)
    # The statistics are attention_stats' own, bit for bit.
    ref = attention_stats(q, k, entropy=True, backend="torch", **kw)
    for name in ("lse", "max_score", "argmax", "entropy", "col_sum", "col_mean"):
        assert torch.equal(getattr(st, name), getattr(ref, name)), name


def test_torch_reference_bf16_and_small_blocks(oracle):
    q, k, v = _inputs(1, 4, 2, 50, 50, 16, torch.bfloat16, "cpu")
    kw = {"window": 11, "softcap": 4.0}
    out, st = attention_forward(q, k, v, entropy=True, backend="torch", **kw)
    _check(out, st, q, k, v, kw, oracle, tol=1e-3, out_tol=2e-2)
    from headhunt.kernels.reference import attention_forward_torch

    small, _ = attention_forward_torch(q, k, v, AttentionVariant(**kw), block_q=16)
    torch.testing.assert_close(small, out, atol=1e-2, rtol=0)


def test_forward_rejects_bad_values():
    q, k, v = _inputs(1, 4, 2, 8, 8, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="v must be"):
        attention_forward(q, k, v[:, :1])
    with pytest.raises(ValueError, match="scale"):
        attention_forward(q, k, v, scale=-1.0)
    assert not fused_supported(q, k, v)  # CPU tensors: the torch path


def test_torch_reference_value_dim(oracle):
    """Values may have their own width on the torch backend (the Triton one refuses it)."""
    q, k, v = _inputs(1, 4, 2, 12, 12, 16, torch.float32, "cpu")
    v8 = v[..., :8].contiguous()
    out, _ = attention_forward(q, k, v8, backend="torch")
    assert out.shape == (1, 4, 12, 8)
    ref = _dense_output(q, k, v8, oracle.dense(q, k))
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or CUDA:
        with pytest.raises(ValueError, match="value dim"):
            attention_forward(q.to(DEVICE), k.to(DEVICE), v8.to(DEVICE), backend="triton")


triton = pytest.importorskip("triton")
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _triton_ok():
    if not CUDA and not INTERPRET:
        pytest.skip("no CUDA and the Triton interpreter is off")


# Under the interpreter every tile costs Python time: a few cases on the CPU, all on CUDA.
_INTERPRETED = {"causal-gqa", "sinks-window-softcap", "padding", "chunk", "q_offset-scale"}


@pytest.mark.parametrize(
    "case", [c for c in CASES if CUDA or c[0] in _INTERPRETED], ids=lambda c: c[0]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_forward_matches_dense(case, dtype, oracle, poison):
    _triton_ok()
    _, b, hq, hkv, nq, nk, opts = case
    q, k, v = _inputs(b, hq, hkv, nq, nk, 16, dtype, DEVICE)
    kw = _options(b, hq, nq, nk, opts, DEVICE)
    out, st = attention_forward(q, k, v, entropy=True, backend="triton", **kw)
    assert out.transpose(1, 2).is_contiguous()  # [b, nq, hq, d] memory, as the hook returns
    fp32 = dtype == torch.float32
    _check(out, st, q, k, v, kw, oracle, tol=1e-3 if fp32 else 1e-2, out_tol=1e-3 if fp32 else 3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "opts", [{}, {"window": 300, "softcap": 30.0, "sinks": True}, {"pad": (0, 77)}]
)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_triton_forward_long_against_reference(opts, d, layout):
    """Realistic tiles (d 64/128, 1000+ keys, bf16) against the torch reference and SDPA;
    inputs contiguous or in [b, n, heads, d] memory (what a model's projections give)."""
    b, hq, hkv, n = 2, 8, 2, 1500
    q, k, v = _inputs(b, hq, hkv, n, n, d, torch.bfloat16, "cuda")
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    kw = _options(b, hq, n, n, opts, "cuda")
    out, st = attention_forward(q, k, v, entropy=True, backend="triton", **kw)
    ref_out, ref = attention_forward(q, k, v, entropy=True, backend="torch", **kw)
    seen = torch.isfinite(ref.max_score)
    assert (out.float() - ref_out.float()).abs().max().item() < 2e-2
    for name in ("lse", "max_score", "entropy"):
        got, want = getattr(st, name)[seen], getattr(ref, name)[seen]
        assert (got - want).abs().max().item() < 1e-2 * max(1.0, want.abs().max().item()), name
    assert (st.argmax == ref.argmax).float().mean().item() > 0.99
    torch.testing.assert_close(st.col_sum, ref.col_sum, atol=1e-2, rtol=1e-2)
    if not opts:  # plain causal: SDPA's own output
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        )
        assert (out.float() - sdpa.float()).abs().max().item() < 2e-2


@pytest.mark.gpu
def test_fused_supported_declines_decode_shapes():
    q, k, v = _inputs(1, 8, 2, 1, 4096, 64, torch.bfloat16, "cuda")
    assert not fused_supported(q, k, v)
    q2, k2, v2 = _inputs(1, 8, 2, 512, 512, 64, torch.bfloat16, "cuda")
    assert fused_supported(q2, k2, v2)
    assert not fused_supported(q2, k2, v2[..., :32])
    # A layer's kernel arguments (AttentionCall.kernel_kwargs) pass; unknown options do not.
    call_kw = {"scale": 0.125, "causal": True, "q_offset": 0, "window": 64, "softcap": 30.0}
    assert fused_supported(q2, k2, v2, options=call_kw)
    assert not fused_supported(q2, k2, v2, options={**call_kw, "alibi": torch.ones(8)})
    assert math.isfinite(attention_forward(q2, k2, v2)[1].lse.sum().item())


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape",
    [
        (2, 8, 2, 1500, 1500, 128, True, "bnhd"),
        (2, 8, 2, 1500, 1500, 64, True, "bhnd"),
        (1, 4, 1, 700, 1200, 128, True, "bnhd"),  # nq < nk: q_offset 500
        (1, 4, 2, 333, 777, 128, False, "bnhd"),  # bidirectional, keys' end inside a tile
        (1, 4, 4, 64, 64, 64, True, "bhnd"),
        (1, 2, 1, 1, 300, 128, True, "bhnd"),
    ],
    ids=str,
)
@pytest.mark.parametrize("ws", [False, True], ids=["pipelined", "warp-specialised"])
def test_fast_path_matches_general_kernel(shape, ws, poison, monkeypatch):
    """Hopper's Gluon kernel (kernels/gluon_fused.py) against the general Triton kernel on
    the plain masks it serves: same statistics (up to float32 summation order), same
    argmax, the output within one bf16 rounding; a launch that may not take it does not."""
    import dataclasses

    from headhunt.kernels import gluon_fused, launch
    from headhunt.kernels.config import fused_config

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the fast path is Hopper's (compute capability 9.x)")
    import triton

    # Run it on whatever Triton is installed: a pass here is what admits a version.
    version = tuple(int(x) for x in triton.__version__.split(".")[:2])
    monkeypatch.setattr(gluon_fused, "TESTED_TRITON", frozenset({version}))
    calls = []
    real = gluon_fused.gluon_forward
    monkeypatch.setattr(gluon_fused, "gluon_forward", lambda *a: calls.append(1) or real(*a))
    b, hq, hkv, nq, nk, d, causal, layout = shape
    q, k, v = _inputs(b, hq, hkv, nq, nk, d, torch.bfloat16, "cuda", seed=1)
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    fast = dataclasses.replace(fused_config(d, torch.bfloat16), gluon_ws=ws)
    assert fast.fast_path
    general = dataclasses.replace(fast, fast_path=False)
    var, kw = AttentionVariant(causal=causal), dict(entropy=True, key_stats=False)
    o1, s1 = launch.attention_forward_triton(q, k, v, var, config=fast, **kw)
    assert calls == [1]
    o0, s0 = launch.attention_forward_triton(q, k, v, var, config=general, **kw)
    assert calls == [1]
    assert (o1.float() - o0.float()).abs().max().item() <= 2e-2
    for name in ("lse", "max_score", "entropy"):
        got, want = getattr(s1, name), getattr(s0, name)
        assert (got - want).abs().max().item() < 1e-4 * max(1.0, want.abs().max().item()), name
    assert torch.equal(s1.argmax, s0.argmax)
    # Variants the fast path does not serve go to the general kernel.
    windowed = AttentionVariant(causal=causal, window=50)
    launch.attention_forward_triton(q, k, v, windowed, config=fast, **kw)
    fp32 = dataclasses.replace(fused_config(d, torch.float32), fast_path=True)
    launch.attention_forward_triton(q.float(), k.float(), v.float(), var, config=fp32, **kw)
    assert calls == [1]


def test_fast_path_only_on_tested_triton(monkeypatch):
    """Gluon's API moves between Triton releases: other versions take the general kernel."""
    gluon_fused = pytest.importorskip("headhunt.kernels.gluon_fused")
    monkeypatch.setattr(gluon_fused, "TESTED_TRITON", frozenset({(3, 6)}))
    monkeypatch.setattr(gluon_fused.triton, "__version__", "3.6.1")
    assert gluon_fused.triton_tested()
    monkeypatch.setattr(gluon_fused.triton, "__version__", "3.9.0")
    assert not gluon_fused.triton_tested()
