"""headhunt's torch dequantisation is gguf-py's, bit for bit (issue 29): on planted random blocks
of every type it handles (every byte random but the float16 scales, drawn finite over their
whole range, subnormals included), on groups that split a tensor, and on a tensor with a NaN or
infinite scale (left to gguf-py). tests/probes/test_gguf_weights.py compares every tensor of the
tiny GGUFs and of both bundled models through the same path."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize

from headhunt.probes import gguf_dequant, gguf_weights

TYPES = sorted(gguf_dequant.SUPPORTED)


def _planted(rng, qtype: int, rows: int, blocks_per_row: int) -> np.ndarray:
    """Random blocks whose float16 scales are finite: magnitudes from subnormal to 65504, both
    signs, zeros included."""
    values, size, scales, _, _ = gguf_dequant.SUPPORTED[qtype]
    raw = rng.integers(0, 256, size=(rows * blocks_per_row, size), dtype=np.uint8)
    for at in scales:
        bits = rng.integers(0, 1 << 16, size=len(raw), dtype=np.uint16)
        finite = (bits & 0x7C00) != 0x7C00  # exponent not all ones
        bits[~finite] &= 0x7BFF  # the largest exponent below infinity
        bits[: len(bits) // 50] = 0  # some zero scales
        raw[:, at : at + 2] = bits.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, blocks_per_row * size)


def _same(data: np.ndarray, qtype: int) -> None:
    theirs = dequantize(data, GGMLQuantizationType(qtype))
    ours = gguf_dequant.dequantize(data, qtype)
    assert ours is not None, GGMLQuantizationType(qtype).name
    ours = ours.numpy()
    assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape)
    assert ours.tobytes() == theirs.tobytes(), GGMLQuantizationType(qtype).name


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: GGMLQuantizationType(t).name)
def test_every_type_is_gguf_py_bit_for_bit_on_planted_blocks(qtype, monkeypatch):
    rng = np.random.default_rng(qtype)
    assert GGML_QUANT_SIZES[GGMLQuantizationType(qtype)] == gguf_dequant.SUPPORTED[qtype][:2]
    _same(_planted(rng, qtype, rows=37, blocks_per_row=3), qtype)
    monkeypatch.setattr(gguf_dequant, "_GROUP_VALUES", 100)  # groups of a few blocks
    _same(_planted(rng, qtype, rows=5, blocks_per_row=7), qtype)
    monkeypatch.setattr(gguf_dequant, "_PIECE_VALUES", 700)  # pieces of a few groups
    _same(_planted(rng, qtype, rows=5, blocks_per_row=7), qtype)
    _same(_planted(rng, qtype, rows=1, blocks_per_row=1)[0], qtype)  # one dimension


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: GGMLQuantizationType(t).name)
def test_a_non_finite_scale_is_left_to_gguf_py(qtype):
    rng = np.random.default_rng(1)
    size, scales = gguf_dequant.SUPPORTED[qtype][1:3]
    data = _planted(rng, qtype, rows=4, blocks_per_row=2)
    for bad in (0x7E00, 0x7C00, 0xFC00):  # NaN, +inf, -inf
        spoiled = data.copy()
        spoiled[2, scales[-1] : scales[-1] + 2] = np.array([bad], dtype=np.uint16).view(np.uint8)
        assert gguf_dequant.dequantize(spoiled, qtype) is None
        ours = gguf_weights.dequantize(spoiled, GGMLQuantizationType(qtype))
        theirs = dequantize(spoiled, GGMLQuantizationType(qtype))
        assert ours.tobytes() == theirs.tobytes()  # NaN payloads included


def test_other_types_are_left_to_gguf_py():
    rng = np.random.default_rng(2)
    q2k = rng.integers(0, 256, size=(2, 84), dtype=np.uint8)
    assert gguf_dequant.dequantize(q2k, GGMLQuantizationType.Q2_K) is None
    f16 = rng.standard_normal((3, 8)).astype(np.float16)
    assert gguf_dequant.dequantize(f16, GGMLQuantizationType.F16) is None


def test_it_writes_into_one_tensor_and_reads_a_read_only_mapping(tmp_path):
    rng = np.random.default_rng(3)
    data = _planted(rng, 12, rows=8, blocks_per_row=2)
    path = tmp_path / "blocks.bin"
    data.tofile(path)
    mapped = np.memmap(path, mode="r", dtype=np.uint8).reshape(data.shape)
    out = gguf_dequant.dequantize(mapped, 12)
    assert isinstance(out, torch.Tensor) and out.is_contiguous() and out.shape == (8, 512)
    assert out.numpy().tobytes() == dequantize(data, GGMLQuantizationType.Q4_K).tobytes()


@pytest.mark.parametrize("qtype", [12, 14], ids=["Q4_K", "Q6_K"])
def test_pieces_run_in_any_order_fill_the_tensor_and_refuse_a_non_finite_scale(qtype, monkeypatch):
    rng = np.random.default_rng(4)
    size, scales = gguf_dequant.SUPPORTED[qtype][1:3]
    data = _planted(rng, qtype, rows=6, blocks_per_row=5)
    monkeypatch.setattr(gguf_dequant, "_PIECE_VALUES", 256 * 4)  # 4 blocks a piece: 8 pieces
    out, work = gguf_dequant.pieces(data, qtype)
    assert len(work) == 8
    assert all(run() for run in reversed(work))
    assert out.numpy().tobytes() == dequantize(data, GGMLQuantizationType(qtype)).tobytes()
    spoiled = data.copy()  # a NaN scale in the last block: the last piece alone refuses
    at = spoiled.shape[1] - size + scales[-1]
    spoiled[-1, at : at + 2] = np.array([0x7E00], dtype=np.uint16).view(np.uint8)
    out, work = gguf_dequant.pieces(spoiled, qtype)
    assert [run() for run in work] == [True] * 7 + [False]


def test_without_the_page_advice_the_values_are_the_same(monkeypatch):
    """Where madvise's MADV_POPULATE_WRITE is refused (Linux before 5.14) or absent (not
    Linux), pages fault in as written: the same bits, and no further call after a refusal."""
    rng = np.random.default_rng(6)
    data = _planted(rng, 12, rows=64, blocks_per_row=16)  # 1 MiB of float32 values
    want = dequantize(data, GGMLQuantizationType.Q4_K).tobytes()
    calls = []

    def refused(address, length, advice):
        calls.append((address, length, advice))
        return -1  # EINVAL

    monkeypatch.setattr(gguf_dequant, "_PIECE_VALUES", 256 * 256)  # four pieces
    monkeypatch.setattr(gguf_dequant, "_libc_madvise", [refused])
    assert gguf_dequant.dequantize(data, 12).numpy().tobytes() == want
    assert len(calls) == 1 and calls[0][2] == 23 and calls[0][0] % 4096 == 0
    assert gguf_dequant._libc_madvise == [None]
    monkeypatch.setattr(gguf_dequant, "_libc_madvise", [None])  # nothing to call
    assert gguf_dequant.dequantize(data, 12).numpy().tobytes() == want


@pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux's")
def test_the_advice_faults_the_pages_in_before_they_are_written(monkeypatch):
    import resource

    monkeypatch.setattr(gguf_dequant, "_libc_madvise", [])  # looked up afresh
    # 64 MiB of a fresh anonymous mapping: no page touched yet (torch.empty may hand back
    # memory the allocator kept from earlier tests, whose pages are already in)
    fresh = torch.frombuffer(mmap.mmap(-1, 1 << 26), dtype=torch.float32)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    gguf_dequant._populate(fresh)
    faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    if gguf_dequant._libc_madvise == [None]:
        pytest.skip("this kernel refuses MADV_POPULATE_WRITE (before Linux 5.14)")
    assert faulted >= (1 << 26) // 4096 // 2  # at least half its pages (a few may be huge)
