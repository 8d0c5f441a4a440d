"""Where the kernel tests run the Triton kernels: compiled on a CUDA device, else under the
Triton interpreter on CPU tensors (conftest.py sets ``TRITON_INTERPRET=1`` without CUDA)."""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def require_triton() -> None:
    """Skip the calling test module (or test) where Triton is missing, or where there is no
    CUDA device and the interpreter has been turned off."""
    pytest.importorskip("triton")
    if not CUDA and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("no CUDA and the Triton interpreter is off", allow_module_level=True)
