"""Fixtures of the probes tests: a tiny quantised GGUF (written by ``gguf_fixtures``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_fixtures import write_tiny_gguf


@pytest.fixture
def tiny_gguf(tmp_path) -> Path:
    """A tiny quantised Llama GGUF (tied embeddings), about 1 MB."""
    folder = tmp_path / "models"
    folder.mkdir(exist_ok=True)
    path = folder / "tiny-llama.gguf"
    write_tiny_gguf(path)
    return path
