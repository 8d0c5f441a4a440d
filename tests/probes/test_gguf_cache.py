"""GGUF loading users can live with (issue 29, item 1): no copy of the weights is ever written.
The first load keeps the GGUF's parsed metadata (config, tokenizer, tensor names) in the cache,
keyed by the file's content, said when written; later loads read it and the weights from the
GGUF; --no-cache writes nothing; `headhunt cache list|clear`. On a real tiny GGUF
(tests/probes/gguf_fixtures.py); benchmarks/gguf_load.py times the bundled models' loads."""

from __future__ import annotations

import json

import pytest
import torch

from headhunt.cli import main
from headhunt.probes import gguf_weights, loading
from headhunt.probes.loading import gguf_cache_folder

# Files that would hold weights (any format transformers or torch writes).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npy", ".gguf")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("HEADHUNT_CACHE", str(root))
    return root


def _files(root):
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_the_cache_entry_is_keyed_by_content(cache, tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b" / "a.gguf"
    b.parent.mkdir()
    a.write_bytes(b"GGUF same content")
    b.write_bytes(b"GGUF same content")
    assert gguf_cache_folder(a) == gguf_cache_folder(b)  # two clones share one entry
    b.write_bytes(b"GGUF other content")
    assert gguf_cache_folder(a) != gguf_cache_folder(b)


def test_the_file_hash_is_computed_once_and_redone_when_the_file_changes(cache, tmp_path):
    import hashlib

    f = tmp_path / "w.bin"
    f.write_bytes(b"x" * 1000)
    first = loading.file_sha256(f)
    assert first == hashlib.sha256(b"x" * 1000).hexdigest()
    assert first in (cache / "hashes.json").read_text()
    f.write_bytes(b"y" * 1001)
    assert loading.file_sha256(f) == hashlib.sha256(b"y" * 1001).hexdigest()


def test_no_weights_are_written_and_the_second_load_reads_the_metadata(
    cache, tiny_gguf, capsys, monkeypatch
):
    model, tok = loading._load_gguf(tiny_gguf, dtype="float32")
    err = capsys.readouterr().err
    folder = gguf_cache_folder(tiny_gguf)
    said = [line for line in err.splitlines() if "reading" in line]
    assert len(said) == 1 and str(folder) in said[0] and "no weights" in said[0]
    kept = [line for line in err.splitlines() if "headhunt: kept" in line]
    assert "--no-cache" in said[0] and len(kept) == 1 and f"B in {folder}" in kept[0]
    files = _files(cache)
    written = [p for p in files if p.name.endswith(WEIGHT_SUFFIXES)]
    assert written == [], f"weights written: {written}"
    weight_bytes = sum(p.numel() * 4 for p in model.parameters())
    entry_bytes = sum(p.stat().st_size for p in files if folder in p.parents)
    assert {"config.json", "recipe.json", "backend.json", ".complete"} <= {
        p.name for p in files if folder in p.parents
    }
    assert entry_bytes < weight_bytes / 20  # a few KB of metadata for a 4 MB model
    first = {k: v.clone() for k, v in model.state_dict().items()}

    def no_parse(path):
        raise AssertionError("parsed the GGUF's metadata again")

    def no_header(path):
        raise AssertionError("walked the GGUF's header again (its tensor table is kept)")

    monkeypatch.setattr(loading, "_parse_gguf", no_parse)
    monkeypatch.setattr(gguf_weights, "read_header", no_header)
    again, tok2 = loading._load_gguf(tiny_gguf, dtype="float32")
    assert "reading" not in capsys.readouterr().err
    assert all(torch.equal(first[k], v) for k, v in again.state_dict().items())
    assert tok2("the cat").input_ids == tok("the cat").input_ids
    half, _ = loading._load_gguf(tiny_gguf, dtype="bfloat16")  # the same entry serves any dtype
    assert next(half.parameters()).dtype == torch.bfloat16
    assert _files(cache) == files


def test_no_cache_writes_nothing(cache, tiny_gguf, capsys):
    loading._load_gguf(tiny_gguf, dtype="float32", cache=False)
    assert not (cache / "gguf").exists()
    assert "nothing is written" in capsys.readouterr().err


def test_an_entry_of_another_transformers_or_a_damaged_one_is_rebuilt(cache, tiny_gguf, capsys):
    loading._load_gguf(tiny_gguf, dtype="float32")
    folder = gguf_cache_folder(tiny_gguf)
    made = json.loads((folder / ".complete").read_text())
    (folder / ".complete").write_text(json.dumps(made | {"transformers": "5.0.0"}))
    capsys.readouterr()
    loading._load_gguf(tiny_gguf, dtype="float32")
    assert "reading" in capsys.readouterr().err  # another version's parse is not trusted
    (folder / "recipe.json").write_text("{")
    loading._load_gguf(tiny_gguf, dtype="float32")
    assert "rebuilding" in capsys.readouterr().err
    loading._load_gguf(tiny_gguf, dtype="float32")
    assert "reading" not in capsys.readouterr().err


def test_a_full_disk_costs_the_next_load_its_speed_not_this_run(
    cache, tiny_gguf, capsys, monkeypatch
):
    from headhunt.probes.gguf_weights import Recipe

    def full(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Recipe, "save", full)
    model, _ = loading._load_gguf(tiny_gguf, dtype="float32")
    assert model is not None
    assert "No space left" in capsys.readouterr().err
    assert not any((cache / "gguf").iterdir())  # no entry, no temporary folder left


def test_cache_list_and_clear(cache, tiny_gguf, capsys):
    loading._load_gguf(tiny_gguf, dtype="float32")
    old = cache / "gguf" / "tiny-llama-0123456789abcdef-float32"  # an older version's copy
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"x" * 5000)
    (old / ".complete").write_text("tiny-llama.gguf")
    (cache / "models").mkdir()
    (cache / "models" / "joined.gguf").write_bytes(b"x" * 10)
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "metadata" in out and gguf_cache_folder(tiny_gguf).name in out
    assert "old copy" in out and old.name in out
    assert "joined" in out and "total" in out
    assert main(["cache", "clear"]) == 0
    assert not any((cache / "gguf").iterdir())
    assert (cache / "models" / "joined.gguf").is_file()  # kept without --all
    assert main(["cache", "clear", "--all"]) == 0
    assert not any((cache / "models").iterdir())


def test_an_architecture_of_transformers_newer_pipeline_is_converted_by_it_in_memory(
    cache, tiny_gguf, capsys, monkeypatch
):
    """qwen35, lfm2, ...: gguf_weights does not reproduce that pipeline, so transformers
    converts them itself at every load, and nothing is written."""
    from transformers import AutoModelForCausalLM

    assert loading._transformers_own_pipeline("qwen35")  # transformers 5.24's newer pipeline
    assert not loading._transformers_own_pipeline("llama")
    assert not loading._transformers_own_pipeline("gemma3")
    monkeypatch.setattr(loading, "_transformers_own_pipeline", lambda arch: arch == "llama")
    model, _ = loading._load_gguf(tiny_gguf, dtype="float32")
    assert "in memory with transformers (nothing is written)" in capsys.readouterr().err
    assert not (cache / "gguf").exists()
    theirs = AutoModelForCausalLM.from_pretrained(
        tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype="float32"
    )
    a, b = model.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert getattr(model, "hf_quantizer", None) is None
    assert not hasattr(model.config, "quantization_config")


def test_two_threads_patch_transformers_parse_one_at_a_time():
    """``_parse_once`` patches transformers' and gguf-py's module globals: a second thread
    waits until the first has put the originals back, so neither keeps the other's patch."""
    import threading

    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    originals = (gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map)
    inside, leave, order = threading.Event(), threading.Event(), []

    def first():
        with loading._parse_once():
            order.append("first in")
            inside.set()
            leave.wait(10)
            order.append("first out")

    def second():
        inside.wait(10)
        with loading._parse_once():
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    inside.wait(10)
    threads[1].join(0.3)  # the second thread is blocked while the first holds the patch
    assert threads[1].is_alive() and order == ["first in"]
    leave.set()
    for t in threads:
        t.join(10)
    assert order == ["first in", "first out", "second in"]
    assert (gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map) == originals
