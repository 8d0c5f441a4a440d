"""The tokenizer a later load reads from the cache entry is the one the first load built from
the GGUF (issue 29): the same class, backend (normalizer, pre-tokenizer, model, decoder, added
tokens), special tokens and chat template, and the same ids for the same text. Read back by
AutoTokenizer from ``tokenizer.json`` (the entries of earlier versions), a Qwen2 GGUF's
tokenizer came back with Qwen2Tokenizer's own normalizer and pre-tokenizer instead of the ones
transformers built from the file, and split text differently."""

from __future__ import annotations

import json

import pytest
from gguf_fixtures import _byte_tokens

from headhunt.probes import loading
from headhunt.probes.loading import gguf_cache_folder

TEXTS = [
    "The capital of France is Paris, and the river that runs through the city is long.",
    "  leading spaces, tabs\tand\nnew lines\n\n, ünïcödé ½ 漢字 🙂 and digits 1234567",
    "<|endoftext|>special tokens inside text<|endoftext|> the end",
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADHUNT_CACHE", str(tmp_path / "cache"))


def _write_tokenizer_gguf(path, arch: str, pre: str | None) -> None:
    """A GGUF with a model's hyperparameters and a byte-level BPE tokenizer, and no tensors:
    what the metadata parse (config, tokenizer, tensor names) reads."""
    import gguf

    tokens = _byte_tokens() + ["Ġt", "he", "Ġthe", "Ġc", "ap", "Ġcap", "<|endoftext|>"]
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_name(f"Tiny {arch} tokenizer")
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(["Ġ t", "h e", "Ġt he", "Ġ c", "a p", "Ġc ap"])
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def assert_same_tokenizer(first, again) -> None:
    assert type(again) is type(first)
    assert json.loads(again.backend_tokenizer.to_str()) == json.loads(
        first.backend_tokenizer.to_str()
    )
    assert again.special_tokens_map == first.special_tokens_map
    assert again.added_tokens_decoder == first.added_tokens_decoder
    assert again.chat_template == first.chat_template
    assert len(again) == len(first)
    for text in TEXTS:
        for special in (True, False):
            ids = first(text, add_special_tokens=special).input_ids
            assert again(text, add_special_tokens=special).input_ids == ids
        assert again.decode(ids) == first.decode(ids)


@pytest.mark.parametrize(
    "arch, pre", [("llama", None), ("qwen2", "qwen2"), ("qwen2", None)], ids=str
)
def test_a_later_load_reads_the_first_loads_tokenizer(cache, tmp_path, arch, pre):
    path = tmp_path / f"{arch}-tokenizer.gguf"
    _write_tokenizer_gguf(path, arch, pre)
    config, first, recipe = loading._parse_gguf(path)
    folder = gguf_cache_folder(path)
    loading._save_entry(folder, config, first, recipe, path)
    _, again, _ = loading._read_entry(folder)
    assert_same_tokenizer(first, again)


@pytest.mark.slow
def test_the_embedded_models_kept_tokenizer_is_its_first_loads(cache):
    path = loading.REGISTRY["smollm2-135m"].path()
    config, first, recipe = loading._parse_gguf(path)
    folder = gguf_cache_folder(path)
    loading._save_entry(folder, config, first, recipe, path)
    _, again, _ = loading._read_entry(folder)
    assert_same_tokenizer(first, again)


def test_an_entry_with_a_tokenizer_json_put_there_is_read_from_it(cache, tmp_path):
    """benchmarks/taskheads_gguf_fix.py replaces an entry's tokenizer.json (a broken
    transformers 5.17 conversion of Gemma 3's): that file is what the entry's tokenizer is."""
    path = tmp_path / "llama-tokenizer.gguf"
    _write_tokenizer_gguf(path, "llama", None)
    config, first, recipe = loading._parse_gguf(path)
    folder = gguf_cache_folder(path)
    loading._save_entry(folder, config, first, recipe, path)
    backend = json.loads((folder / "backend.json").read_text())
    backend["added_tokens"] = []  # a visibly different tokenizer
    backend["model"]["merges"] = backend["model"]["merges"][:1]
    (folder / "tokenizer.json").write_text(json.dumps(backend))
    _, again, _ = loading._read_entry(folder)
    assert again("the cap").input_ids != first("the cap").input_ids
