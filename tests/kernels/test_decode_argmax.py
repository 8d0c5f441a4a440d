"""The many-layer decode argmax (kernels/triton_decode.py) against the split-K decode path of
attention_stats (exactly: same tile code) and the float64 oracle.

Without CUDA it runs under TRITON_INTERPRET=1 (conftest.py) on CPU tensors.
"""

from __future__ import annotations

import pytest
import torch
from triton_runs import DEVICE, require_triton

require_triton()

from headhunt.kernels import launch  # noqa: E402
from headhunt.kernels.triton_decode import decode_argmax_layers  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _layers(n_layers, b, hq, hkv, nk, d, dtype, strided=False):
    qs, ks = [], []
    for _ in range(n_layers):
        if strided:  # as a model's projections: [b, n, h, d] viewed as [b, h, n, d]
            q = torch.randn(b, 1, hq, d, device=DEVICE).to(dtype).transpose(1, 2)
        else:
            q = torch.randn(b, hq, 1, d, device=DEVICE).to(dtype)
        qs.append(q)
        ks.append((torch.randn(b, hkv, nk, d, device=DEVICE) * 1.5).to(dtype))
    return qs, ks


def _split_k(q, k, key_start):
    st = launch.attention_stats_triton(q, k, key_stats=False, decode=True)
    return st.argmax[:, :, 0] + key_start


@pytest.mark.parametrize(
    "n_layers, b, hq, hkv, nk, d, dtype, strided",
    [
        (3, 2, 6, 2, 150, 16, torch.bfloat16, False),  # one split per program
        (2, 1, 4, 2, 131, 32, torch.float32, True),  # several splits, a ragged last tile
        (2, 1, 3, 3, 7, 16, torch.bfloat16, True),  # fewer keys than one tile
    ],
)
def test_decode_argmax_layers_equals_split_k_path(
    n_layers, b, hq, hkv, nk, d, dtype, strided, oracle
):
    torch.manual_seed(0)
    qs, ks = _layers(n_layers, b, hq, hkv, nk, d, dtype, strided)
    got = decode_argmax_layers(qs, ks, key_start=5)
    assert got.shape == (n_layers, b, hq) and got.dtype == torch.int64
    for layer, (q, k) in enumerate(zip(qs, ks, strict=True)):
        assert torch.equal(got[layer], _split_k(q, k, 5))
        ref = oracle.dense(q, k)
        clear = ref.gap[:, :, 0] > 1e-2 * ref.max_score[:, :, 0].abs().clamp_min(1.0)
        assert torch.equal((got[layer].cpu() - 5)[clear], ref.argmax[:, :, 0][clear])


def test_decode_argmax_layers_ties_go_to_the_lowest_key():
    # The winning key repeated in the same tile, in a later tile and in a later split:
    # the first copy wins everywhere, as in attention_stats.
    torch.manual_seed(1)
    qs, ks = _layers(2, 1, 2, 1, 140, 16, torch.float32)
    for q, k in zip(qs, ks, strict=True):
        best = q[0, 0, 0] * 10
        for j in (3, 9, 40, 120):
            k[0, 0, j] = best
    got = decode_argmax_layers(qs, ks)
    assert (got[:, 0, 0] == 3).all()
    for layer, (q, k) in enumerate(zip(qs, ks, strict=True)):
        assert torch.equal(got[layer], _split_k(q, k, 0))


@pytest.mark.parametrize("nk", [131, 0])
def test_decode_argmax_layers_skips_flagged_rows(nk):
    # Flagged rows get -1 in every layer and head (their keys hold NaN: never read into an
    # answer); the other rows are exactly what they are without flags.
    torch.manual_seed(3)
    qs, ks = _layers(2, 3, 4, 2, nk, 16, torch.bfloat16, strided=True)
    skip = torch.tensor([False, True, False], device=DEVICE)
    full = decode_argmax_layers(qs, ks, key_start=2)
    for k in ks:
        k[1] = float("nan")
    got = decode_argmax_layers(qs, ks, key_start=2, skip_rows=skip)
    assert (got[:, 1] == -1).all()
    assert torch.equal(got[:, [0, 2]], full[:, [0, 2]])
    none = torch.zeros(3, dtype=torch.bool, device=DEVICE)
    assert torch.equal(decode_argmax_layers(qs, ks, 2, none)[:, [0, 2]], full[:, [0, 2]])
    with pytest.raises(ValueError, match="skip_rows"):
        decode_argmax_layers(qs, ks, skip_rows=skip.long())


def test_decode_argmax_layers_refuses_mixed_layers():
    qs, ks = _layers(2, 1, 2, 1, 20, 16, torch.float32)
    with pytest.raises(ValueError, match="shapes"):
        decode_argmax_layers(qs, [ks[0], ks[1][:, :, :10]])
    with pytest.raises(ValueError, match="one query"):
        decode_argmax_layers([torch.cat([qs[0], qs[0]], 2)], ks[:1])


@pytest.mark.gpu
def test_gpu_decode_argmax_layers_model_sizes():
    # SmolLM2-135M's shape (9/3 heads, d64) over 1k-9k keys and the 8B shape (32/8, d128).
    torch.manual_seed(2)
    for n_layers, b, hq, hkv, nk, d in [(30, 9, 9, 3, 1000, 64), (30, 3, 9, 3, 9000, 64),
                                         (4, 1, 32, 8, 40_000, 128)]:  # fmt: skip
        qs, ks = _layers(n_layers, b, hq, hkv, nk, d, torch.bfloat16, strided=True)
        got = decode_argmax_layers(qs, ks, key_start=0)
        for layer, (q, k) in enumerate(zip(qs, ks, strict=True)):
            assert torch.equal(got[layer], _split_k(q, k, 0))
