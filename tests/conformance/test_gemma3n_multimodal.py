"""Gemma 3n as released: ``Gemma3nForConditionalGeneration`` (text decoder, MobileNet-V5 vision
tower, audio encoder), the same conformance checks as every family, on its text decoder's
attention (the towers' attention is the encoders' own: no layer of headhunt's).

transformers builds the vision tower with ``timm.create_model(architecture, pretrained=False)``
(``TimmWrapperModel``), so this module needs timm, and timm needs a torchvision built for the
installed torch. The CPU suite has none that imports (the family's row in ``test_families``
checks the one-line refusal there), so this module skips in one line wherever timm does not
import and runs on the GPU machine's stack (CUDA torch with its torchvision), where the tiny
model below is built from the released timm architecture by name, random, with no download.
"""

from __future__ import annotations

import socket

import pytest


def _timm_missing() -> str | None:
    """Why timm cannot be used here, in one line (None when it imports)."""
    try:
        import timm  # noqa: F401
    except Exception as e:  # a torchvision built for another torch raises RuntimeError
        first = (str(e).splitlines() or [""])[0]
        return f"Gemma 3n's vision tower needs timm, which does not import here: {first}"
    return None


if (_reason := _timm_missing()) is not None:
    pytest.skip(_reason, allow_module_level=True)

from . import checks  # noqa: E402
from .conftest import OVERRIDES, build_pair  # noqa: E402

# The text decoder of the ``gemma3n_text`` row (sliding and full layers, the last two reusing
# the KV cache of the first two); the vision tower keeps its released timm architecture, its
# width that encoder's 2048 channels so the model's image embedder fits it.
GEMMA3N = {
    "text_config": OVERRIDES["gemma3n_text"],
    "vision_config": {"architecture": "mobilenetv5_300m_enc", "hidden_size": 2048},
}


@pytest.fixture(scope="module")
def pair():
    """Built once (the vision tower is 300M random parameters); no socket may connect while
    it is built, so a download attempt fails the test instead of passing silently."""

    def offline(*_args, **_kwargs):
        raise OSError("Gemma 3n's test tried to open a network connection")

    real = socket.socket.connect
    socket.socket.connect = offline
    try:
        return build_pair("gemma3n", **GEMMA3N)
    finally:
        socket.socket.connect = real


def test_gemma3n_builds_its_towers_offline(pair):
    model = pair.hooked.model
    assert type(model).__name__ == "Gemma3nForConditionalGeneration"
    tower = model.model.vision_tower
    assert type(tower).__name__ == "TimmWrapperModel"
    assert type(tower.timm_model).__name__ == "MobileNetV5Encoder"
    assert sum(p.numel() for p in tower.parameters()) > 100_000_000  # the released size
    # the text decoder's 4 layers are headhunt's; the audio encoder's attention is no layer
    assert pair.hooked.n_layers == 4 and pair.hooked.attention_layers == [0, 1, 2, 3]


def test_gemma3n_conforms(pair, zeroed):
    checks.check_dense_rows(pair)
    checks.check_decode(pair)
    checks.check_masking(pair, zeroed)
    checks.check_ngram(pair)


def test_gemma3n_prefill_stats(pair):
    checks.check_prefill_stats(pair)
