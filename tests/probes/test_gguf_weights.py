"""A GGUF's weights read straight from the file (issue 29): the header parser presents every
tensor as gguf-py's reader does, and a load's state dict is transformers' own conversion bit for
bit, in every dtype, on tiny GGUFs (every quantisation the bundled models use) and on both
bundled models (against tests/fixtures/gguf_fingerprints.json: benchmarks/gguf_fingerprint.py
made it from transformers' own conversion)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_fixtures import write_tiny_gguf

from headhunt.probes import gguf_weights, loading

FINGERPRINTS = Path(__file__).parents[1] / "fixtures" / "gguf_fingerprints.json"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("HEADHUNT_CACHE", str(root))
    return root


def _transformers_own(path: Path, dtype: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)


def _tensors(model) -> dict[str, torch.Tensor]:
    out = dict(model.named_parameters(remove_duplicate=False))
    return out | dict(model.named_buffers(remove_duplicate=False))


@pytest.mark.parametrize("tied", [True, False])
def test_the_header_parser_reads_each_tensor_as_gguf_reader_does(tmp_path, tied):
    from gguf import GGUFReader

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tied=tied)
    header = gguf_weights.read_header(path)
    table = header.tensors
    reader = GGUFReader(path)
    assert (header.architecture, header.name) == ("llama", "Tiny GGUF Llama")
    assert [e.name for e in table] == [t.name for t in reader.tensors]
    blob = np.memmap(path, mode="r", dtype=np.uint8)
    for entry, theirs in zip(table, reader.tensors, strict=True):
        ours = gguf_weights.tensor_data(blob, entry)
        assert entry.ggml_type == int(theirs.tensor_type)
        assert (ours.dtype, ours.shape) == (theirs.data.dtype, theirs.data.shape), entry.name
        assert np.array_equal(ours, theirs.data), entry.name
    assert {int(t.tensor_type) for t in reader.tensors} >= {0, 1, 2, 3, 8, 12, 14}


def _same_as_gguf_dequantize(path: Path) -> int:
    """Check gguf_weights.dequantize against gguf.dequantize on every tensor of a file; return
    the number of tensors compared."""
    from gguf import GGMLQuantizationType, dequantize

    blob = np.memmap(path, mode="r", dtype=np.uint8)
    tensors = gguf_weights.read_header(path).tensors
    for entry in tensors:
        data, qtype = gguf_weights.tensor_data(blob, entry), GGMLQuantizationType(entry.ggml_type)
        ours, theirs = gguf_weights.dequantize(data, qtype), dequantize(data, qtype)
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), entry.name
        assert ours.tobytes() == theirs.tobytes(), entry.name  # bit for bit, NaNs included
    return len(tensors)


def test_dequantising_in_larger_row_groups_is_gguf_dequantize_bit_for_bit(tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    assert _same_as_gguf_dequantize(path) == 20
    monkeypatch.setattr(gguf_weights, "_CHUNK_ELEMENTS", 1000)  # groups that split a tensor
    assert _same_as_gguf_dequantize(path) == 20


@pytest.mark.slow
def test_dequantising_the_bundled_models_in_larger_row_groups_is_bit_for_bit():
    """Q4_1, Q8_0 (SmolLM2), Q8_0, Q5_0, Q4_K, Q6_K (Gemma 3)."""
    for spec in ("smollm2-135m", "gemma3-270m"):
        assert _same_as_gguf_dequantize(loading.REGISTRY[spec].path()) > 200


@pytest.mark.parametrize(
    ("dtype", "tied"), [("float32", True), ("bfloat16", False), ("float16", True)]
)
def test_a_load_is_transformers_own_conversion_bit_for_bit(tmp_path, cache, dtype, tied):
    path = tmp_path / "tiny.gguf"
    planted = write_tiny_gguf(path, tied=tied)
    ours, _ = loading._load_gguf(path, dtype=dtype)
    theirs = _transformers_own(path, dtype)
    a, b = _tensors(ours), _tensors(theirs)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    assert next(ours.parameters()).dtype == getattr(torch, dtype)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tied
    # The planted norms come back as written (both sides could not share one mistake here).
    got = ours.model.layers[1].post_attention_layernorm.weight.detach().float().numpy()
    want = torch.tensor(planted["blk.1.ffn_norm.weight"]).to(getattr(torch, dtype)).float()
    assert np.array_equal(got, want.numpy())
    ids = torch.tensor([[1, 5, 9, 200, 257, 3]])
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)


def _fingerprint(model, dtype: str, spec: str) -> None:
    import transformers

    known = json.loads(FINGERPRINTS.read_text())
    if known["transformers"] != transformers.__version__:
        pytest.skip(f"the fingerprints are of transformers {known['transformers']}'s conversion")
    want = known["models"][spec]
    path = loading.REGISTRY[spec].path()
    assert loading.file_sha256(path) == want["sha256"], "another GGUF than the fingerprinted one"
    got = gguf_weights.fingerprint(model)
    assert got.keys() == want[dtype].keys()
    differ = [k for k in got if got[k] != want[dtype][k]]
    assert not differ, f"{len(differ)} tensors differ from transformers' own: {differ[:3]}"


@pytest.mark.slow
def test_both_bundled_models_are_read_bit_for_bit(smol, gemma):
    """The session's real models (float32 on the CPU, bfloat16 on a GPU) against transformers'
    own conversion of the same files."""
    for spec, hooked in (("smollm2-135m", smol), ("gemma3-270m", gemma)):
        dtype = str(next(hooked.model.parameters()).dtype).removeprefix("torch.")
        _fingerprint(hooked.model, dtype, spec)


@pytest.mark.slow
def test_the_embedded_model_in_bfloat16_is_read_bit_for_bit(monkeypatch):
    """On a pool of three threads, whatever the machine's CPUs (the session's models load on
    as many as the machine gives, up to four)."""
    from headhunt.probes import load_model

    monkeypatch.setattr(gguf_weights, "load_threads", lambda: 3)
    m = load_model("smollm2-135m", device="cpu", dtype="bfloat16")
    _fingerprint(m.model, "bfloat16", "smollm2-135m")
