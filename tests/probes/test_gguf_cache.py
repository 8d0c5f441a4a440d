"""GGUF loading users can live with (issue 29, item 1): the converted copy is in the run's
dtype, keyed by content and dtype, announced before it is written (what, where, how big),
refused when the disk lacks room, skipped with --no-cache; `headhunt cache list|clear`.

transformers' dequantisation itself is replaced by the tiny model here (it takes tens of
seconds on a real file); benchmarks/gguf_load.py times the real first and second loads."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest
import torch

from headhunt.cli import main
from headhunt.errors import HeadhuntError
from headhunt.probes import loading
from headhunt.probes.loading import gguf_cache_folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("HEADHUNT_CACHE", str(root))
    return root


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A .gguf path whose facts are given and whose conversion returns the tiny model in the
    dtype asked for (counting conversions)."""
    from headhunt.probes.tiny import tiny_llama

    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    facts = loading.GGUFFacts(architecture="llama", name="Tiny Llama 2L", n_parameters=50_000_000)
    monkeypatch.setattr(loading, "gguf_facts", lambda p: facts)
    conversions = []
    import transformers

    real_model = transformers.AutoModelForCausalLM.from_pretrained
    real_tok = transformers.AutoTokenizer.from_pretrained

    def fake_model(folder, gguf_file=None, dtype=None, **kw):
        if gguf_file is None:  # reading the cached copy: the real loader
            return real_model(folder, dtype=dtype, **kw)
        conversions.append(dtype)
        m = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2)
        return m.model.to(getattr(torch, dtype))

    def fake_tok(folder, gguf_file=None, **kw):
        if gguf_file is None:
            return real_tok(folder, **kw)
        return tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2).tokenizer

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tok)
    return path, conversions


def test_the_cache_entry_is_keyed_by_content_and_dtype(cache, tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b" / "a.gguf"
    b.parent.mkdir()
    a.write_bytes(b"GGUF same content")
    b.write_bytes(b"GGUF same content")
    assert gguf_cache_folder(a, "float32") == gguf_cache_folder(b, "float32")  # two clones
    assert gguf_cache_folder(a, "float32") != gguf_cache_folder(a, "bfloat16")
    b.write_bytes(b"GGUF other content")
    assert gguf_cache_folder(a, "float32") != gguf_cache_folder(b, "float32")


def test_the_file_hash_is_computed_once_and_redone_when_the_file_changes(cache, tmp_path):
    import hashlib

    f = tmp_path / "w.bin"
    f.write_bytes(b"x" * 1000)
    first = loading.file_sha256(f)
    assert first == hashlib.sha256(b"x" * 1000).hexdigest()
    assert first in (cache / "hashes.json").read_text()
    f.write_bytes(b"y" * 1001)
    assert loading.file_sha256(f) == hashlib.sha256(b"y" * 1001).hexdigest()


def test_first_load_says_what_it_writes_then_the_second_reads_the_copy(cache, fake_gguf, capsys):
    path, conversions = fake_gguf
    model, _ = loading._load_gguf(path, dtype="bfloat16")
    err = capsys.readouterr().err
    folder = gguf_cache_folder(path, "bfloat16")
    said = [line for line in err.splitlines() if "converting" in line]
    assert len(said) == 1
    assert "bfloat16" in said[0] and str(folder) in said[0] and "100 MB" in said[0]
    assert "--no-cache" in said[0]
    assert conversions == ["bfloat16"]
    assert (folder / ".complete").is_file()
    saved = next(folder.glob("*.safetensors"))
    from safetensors import safe_open

    with safe_open(saved, "pt") as f:  # a bfloat16 copy, not float32
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    again, _ = loading._load_gguf(path, dtype="bfloat16")
    assert conversions == ["bfloat16"]  # read from the copy, not converted again
    assert next(again.parameters()).dtype == torch.bfloat16
    assert "converting" not in capsys.readouterr().err
    loading._load_gguf(path, dtype="float32")  # another dtype is another entry
    assert conversions == ["bfloat16", "float32"]


def test_no_cache_converts_in_memory_and_writes_nothing(cache, fake_gguf, capsys):
    path, conversions = fake_gguf
    loading._load_gguf(path, dtype="float32", cache=False)
    assert conversions == ["float32"]
    assert not (cache / "gguf").exists()
    assert "nothing is written" in capsys.readouterr().err


def test_a_disk_without_room_is_refused_before_converting(cache, fake_gguf, monkeypatch):
    path, conversions = fake_gguf
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(HeadhuntError, match="--no-cache") as e:
        loading._load_gguf(path, dtype="float32")
    assert "200 MB" in str(e.value) and "1 MB free" in str(e.value)
    assert conversions == [] and not (cache / "gguf").exists()


def test_cache_list_and_clear(cache, fake_gguf, capsys):
    path, _ = fake_gguf
    loading._load_gguf(path, dtype="float32")
    (cache / "models").mkdir()
    (cache / "models" / "joined.gguf").write_bytes(b"x" * 10)
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "converted" in out and gguf_cache_folder(path, "float32").name in out
    assert "joined" in out and "total" in out
    assert main(["cache", "clear"]) == 0
    assert not any((cache / "gguf").iterdir())
    assert (cache / "models" / "joined.gguf").is_file()  # kept without --all
    assert main(["cache", "clear", "--all"]) == 0
    assert not any((cache / "models").iterdir())
