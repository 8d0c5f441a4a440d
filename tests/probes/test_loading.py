"""Model loading: registry, folders, GGUF checks, and the errors users see."""

from __future__ import annotations

import pytest

from headhunt.errors import HeadhuntError
from headhunt.probes.loading import check_gguf, resolve_spec


def test_unknown_names_and_paths(tmp_path):
    with pytest.raises(HeadhuntError, match="unknown model"):
        resolve_spec("definitely-not-a-model")
    with pytest.raises(HeadhuntError, match="no GGUF file"):
        resolve_spec(str(tmp_path / "x.gguf"))
    with pytest.raises(HeadhuntError, match="not a Hugging Face model folder"):
        resolve_spec(str(tmp_path))
    assert resolve_spec("someorg/some-model") == ("hub", "someorg/some-model")


def test_gguf_checks(tmp_path):
    gguf = pytest.importorskip("gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(HeadhuntError, match="not a GGUF"):
        check_gguf(bad)
    truncated = tmp_path / "trunc.gguf"
    truncated.write_bytes(b"GGUF" + b"\3\0\0\0" + b"\xff" * 20)
    with pytest.raises(HeadhuntError, match="corrupt"):
        check_gguf(truncated)
    # A well-formed GGUF of an architecture transformers cannot read.
    odd = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(odd), arch="notanarch")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(HeadhuntError, match="not supported"):
        check_gguf(odd)


def test_uncached_hub_id_is_refused(monkeypatch, tmp_path):
    from headhunt.probes.hooked import load_model

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(HeadhuntError, match="local Hugging Face cache"):
        load_model("someorg/not-cached-model")


def test_local_folder_loads(tiny_folder):
    from headhunt.probes.hooked import load_model

    m = load_model(str(tiny_folder), device="cpu")
    assert (m.n_layers, m.n_heads, m.n_kv_heads, m.group_size) == (2, 4, 2, 2)
    assert m.kv_head(3) == 1
    assert m.model.config._attn_implementation == "headhunt"


@pytest.mark.slow
def test_embedded_model(smol):
    d = smol.describe()
    assert (d["n_layers"], d["n_heads"], d["n_kv_heads"], d["head_dim"]) == (30, 9, 3, 64)
    assert d["max_context"] == 8192


@pytest.mark.slow
def test_second_real_model_is_a_sliding_window_family(gemma):
    d = gemma.describe()
    assert (d["n_layers"], d["n_heads"], d["n_kv_heads"], d["head_dim"]) == (18, 4, 1, 256)
    types = gemma.model.config.layer_types
    assert [i for i, t in enumerate(types) if t == "full_attention"] == [5, 11, 17]
    assert gemma.model.config.sliding_window == 512


def _chunk_package(root, name: str, chunks: list[bytes], sha: str):
    """A package shaped like the chunked-GGUF wheels: chunk_paths(), MODEL_NAME, EXPECTED_SHA256."""
    pkg = root / name
    pkg.mkdir()
    paths = []
    for i, data in enumerate(chunks):
        (pkg / f"part{i}").write_bytes(data)
        paths.append(str(pkg / f"part{i}"))
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        f"MODEL_NAME = '{name}.gguf'\nEXPECTED_SHA256 = '{sha}'\n"
        f"def chunk_paths():\n    return [Path(p) for p in {paths!r}]\n"
    )


def test_chunked_gguf_is_joined_once_and_checked(tmp_path, monkeypatch):
    import hashlib

    from headhunt.probes.loading import ChunkedGGUF

    monkeypatch.setenv("HEADHUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path))
    good = hashlib.sha256(b"GGUFabcdef").hexdigest()
    _chunk_package(tmp_path, "chunky_ok", [b"GGUF", b"abc", b"def"], good)
    path = ChunkedGGUF("chunky_ok", "install it").path()
    assert path.read_bytes() == b"GGUFabcdef"
    assert [p.name for p in path.parent.iterdir()] == ["chunky_ok.gguf"]  # no temporary left
    _chunk_package(tmp_path, "chunky_bad", [b"GGUF", b"xyz"], good)
    with pytest.raises(HeadhuntError, match="do not join"):
        ChunkedGGUF("chunky_bad", "install it").path()
    assert not (path.parent / "chunky_bad.gguf").exists()
    with pytest.raises(HeadhuntError, match="not installed; install it"):
        ChunkedGGUF("no_such_chunky_package", "install it").path()


def test_a_chunked_gguf_without_room_to_join_is_refused_in_one_line(tmp_path, monkeypatch):
    import hashlib
    import shutil
    from collections import namedtuple

    from headhunt.probes.loading import ChunkedGGUF

    monkeypatch.setenv("HEADHUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path))
    good = hashlib.sha256(b"GGUFabcdef").hexdigest()
    _chunk_package(tmp_path, "chunky_full", [b"GGUF", b"abc", b"def"], good)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(HeadhuntError, match="needs 10 B .* has 1 MB free: set HEADHUNT_CACHE"):
        ChunkedGGUF("chunky_full", "install it").path()
    assert not any((tmp_path / "cache" / "models").iterdir())  # nothing half-written


def test_bf16_load_keeps_the_rotary_frequencies_in_float32(tiny_folder):
    import torch

    from headhunt.probes import load_model

    model = load_model(str(tiny_folder), device="cpu", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    # transformers keeps inv_freq in float32 in bf16 models: position x a bf16-rounded
    # frequency is off by radians at a few thousand tokens.
    assert model.model.model.rotary_emb.inv_freq.dtype == torch.float32


def test_a_folder_without_a_tokenizer_is_refused_in_one_line(tmp_path):
    """transformers' own message blames sentencepiece; the folder's missing tokenizer is the cause."""
    from headhunt.probes.hooked import load_model
    from headhunt.probes.tiny import tiny_llama

    tiny_llama().model.save_pretrained(tmp_path)
    with pytest.raises(HeadhuntError, match="has no tokenizer"):
        load_model(str(tmp_path), device="cpu")


class _Spelling:
    """A tokenizer stand-in: ``size`` pieces, each word one token or one token per character."""

    def __init__(self, size: int, by_char: bool):
        self.size, self.by_char = size, by_char

    def __len__(self):
        return self.size

    def __call__(self, text, add_special_tokens=False):
        pieces = list(text.replace(" ", "")) if self.by_char else text.split()
        return type("Enc", (), {"input_ids": list(range(len(pieces)))})()


def test_a_gguf_tokenizer_that_spells_words_in_pieces_is_refused():
    """transformers 5.17 builds Gemma 3's GGUF tokenizer without merges: refused in one line
    (the model would read text it never saw); a word-level one and a tiny vocabulary pass."""
    from headhunt.probes.loading import check_gguf_tokenizer

    check_gguf_tokenizer(_Spelling(262_144, by_char=False), "good.gguf")
    check_gguf_tokenizer(_Spelling(300, by_char=True), "tiny.gguf")
    with pytest.raises(HeadhuntError, match="tokenizer wrong .*cache clear"):
        check_gguf_tokenizer(_Spelling(262_144, by_char=True), "gemma.gguf", cached=True)
