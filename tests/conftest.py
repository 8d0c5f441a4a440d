"""Shared fixtures. One suite for CPU or GPU: `pytest --device cuda` runs it on a GPU."""

from __future__ import annotations

import os

import pytest
import torch


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


@pytest.fixture(scope="session")
def smol(device):
    """The embedded SmolLM2-135M (loaded once per session; cached as safetensors after the first load)."""
    from headhunt.probes import load_model

    try:
        return load_model("smollm2-135m", device=device)
    except Exception as e:  # pragma: no cover - only when the model wheel is missing
        if os.environ.get("CI"):
            raise
        pytest.skip(f"embedded model unavailable: {e}")
