"""A GGUF's tensors dequantised on a pool of threads (issue 29): the same state dict, bit for bit
and in the same order, as on one thread; every tensor dequantised off the caller's thread with
torch on one thread there; the caller's torch thread count, and the one a new thread starts
with, as they were after the load, an error included."""

from __future__ import annotations

import threading

import pytest
import torch
from gguf_fixtures import write_tiny_gguf

from headhunt.probes import gguf_dequant, gguf_weights


@pytest.fixture
def tiny(tmp_path):
    from transformers import AutoConfig

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tied=False)
    config = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name)
    return path, gguf_weights.make_recipe(path, config)


@pytest.fixture
def torch_threads():
    """torch's thread count put back after the test, whatever it set."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _in_a_new_thread(fn):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("piece", [None, 64], ids=["whole", "split"])
def test_a_pool_gives_the_one_thread_state_dict_bit_for_bit(tiny, monkeypatch, dtype, piece):
    path, recipe = tiny
    monkeypatch.setattr(gguf_weights, "load_threads", lambda: 1)
    alone = gguf_weights.state_dict(path, recipe, dtype)
    seen = []
    in_pool = gguf_weights._in_pool

    def watched(work):
        seen.append((threading.get_ident(), torch.get_num_threads()))
        return in_pool(work)

    monkeypatch.setattr(gguf_weights, "_in_pool", watched)
    monkeypatch.setattr(gguf_weights, "load_threads", lambda: 3)
    if piece is not None:  # pieces of 64 values: every quantised tensor in several
        monkeypatch.setattr(gguf_dequant, "_PIECE_VALUES", piece)
    pooled = gguf_weights.state_dict(path, recipe, dtype)
    assert list(pooled) == list(alone)  # the same names, in the file's order
    for name, tensor in pooled.items():
        assert (tensor.dtype, tensor.shape) == (alone[name].dtype, alone[name].shape), name
        assert _bits(tensor) == _bits(alone[name]), name
    assert len(recipe.tensors) == 21  # untied: output.weight too
    if piece is None:  # each tensor of the tiny file is one piece
        assert len(seen) == 21
    else:
        assert len(seen) > 2 * 21
    assert threading.get_ident() not in {ident for ident, _ in seen}
    assert {threads for _, threads in seen} == {1}


def test_a_split_tensor_with_a_non_finite_scale_is_left_to_gguf_py(monkeypatch):
    import numpy as np
    from gguf import GGMLQuantizationType, dequantize

    from headhunt.probes.tiny import random_kquant_blocks

    data = random_kquant_blocks(np.random.default_rng(5), 6, 1024, GGMLQuantizationType.Q4_K)
    data[5, -144:-142] = np.array([0x7E00], dtype=np.uint16).view(np.uint8)  # a NaN d, last
    entry = gguf_weights.TensorEntry("blk.0.attn_q.weight", 12, (1024, 6), 0)
    monkeypatch.setattr(gguf_dequant, "_PIECE_VALUES", 256 * 4)
    work, finish = gguf_weights._work(data.reshape(-1), entry)
    assert len(work) == 6
    values = finish([run() for run in work])
    theirs = dequantize(data, GGMLQuantizationType.Q4_K)
    assert np.isnan(values).any() and values.tobytes() == theirs.tobytes()


def test_the_callers_thread_count_is_kept_through_a_pooled_load(tiny, monkeypatch, torch_threads):
    path, recipe = tiny
    monkeypatch.setattr(gguf_weights, "load_threads", lambda: 3)
    torch.set_num_threads(3)
    gguf_weights.state_dict(path, recipe, torch.float32)
    assert torch.get_num_threads() == 3
    assert _in_a_new_thread(torch.get_num_threads) == 3  # a new thread starts from the last set


def test_an_error_in_one_tensor_stops_the_pool_and_keeps_the_thread_count(
    tiny, monkeypatch, torch_threads
):
    path, recipe = tiny
    in_pool, calls = gguf_weights._in_pool, []

    def fails_on_the_fifth(work):
        calls.append(work)
        if len(calls) == 5:
            raise RuntimeError("planted")
        return in_pool(work)

    monkeypatch.setattr(gguf_weights, "_in_pool", fails_on_the_fifth)
    monkeypatch.setattr(gguf_weights, "load_threads", lambda: 2)
    torch.set_num_threads(2)
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="planted"):
        gguf_weights.state_dict(path, recipe, torch.float32)
    assert threading.active_count() == before  # the pool's threads have ended
    assert len(calls) < len(recipe.tensors)  # the rest were not dequantised
    assert torch.get_num_threads() == 2
    assert _in_a_new_thread(torch.get_num_threads) == 2


def test_the_pool_is_as_large_as_the_cpus_this_process_may_use_at_most_four(monkeypatch):
    import os

    for cpus, want in ((1, 1), (2, 2), (3, 3), (16, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _, n=cpus: set(range(n)), raising=False)
        assert gguf_weights.load_threads() == want
