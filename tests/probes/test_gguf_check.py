"""A GGUF model's load check is kept in its metadata entry and a later load of the same model,
by the same code, in the same dtype on the same device kind, applies the kept outcome instead of
running the check's forward (issue 29: on a 1.5B model that forward is about 4 s of a CPU
load). Anything in the key that changes, --no-cache, and a check that refused run it again."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from gguf_fixtures import write_tiny_gguf

from headhunt.errors import HeadhuntError
from headhunt.probes import gguf_check
from headhunt.probes.gguf_check import CHECKS_FILE
from headhunt.probes.hooked import HookedModel, load_model
from headhunt.probes.loading import gguf_cache_folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADHUNT_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def forwards(monkeypatch):
    """How many check forwards ran."""
    ran = []
    real = HookedModel._check_calls

    def counted(self):
        ran.append(1)
        return real(self)

    monkeypatch.setattr(HookedModel, "_check_calls", counted)
    return ran


def _load(path, dtype="float32", **kw):
    return load_model(str(path), device="cpu", dtype=dtype, **kw)


def _state(m: HookedModel) -> tuple:
    gated = [bool(getattr(m.modules[i], "headhunt_gated", False)) for i in m.attention_layers]
    return (m.attention_layers, m.score_bias_layers, m.kv_head_counts, gated)


def test_a_later_load_applies_the_kept_outcome_without_the_forward(cache, tiny_gguf, forwards):
    first = _load(tiny_gguf)
    assert len(forwards) == 1
    store = gguf_cache_folder(tiny_gguf) / CHECKS_FILE
    assert store.is_file()
    again = _load(tiny_gguf)
    assert len(forwards) == 1  # no second forward
    assert _state(again) == _state(first)
    ids = torch.tensor([[5, 9, 2, 7, 1]])
    assert torch.equal(again.forward(ids).logits, first.forward(ids).logits)
    seen = []

    class Count(gguf_check_hook()):
        def before(self, call):
            seen.append(call.layer)

    with again.hooks(Count()):
        again.forward(ids)
    assert seen == again.attention_layers  # the hooks see every layer once, as checked


def gguf_check_hook():
    from headhunt.probes.attention import AttentionHook

    class Hook(AttentionHook):
        indexes_heads = False

    return Hook


@pytest.mark.parametrize("change", ["dtype", "headhunt", "torch", "file", "no-cache"])
def test_the_check_runs_again_when_its_key_changes(cache, tiny_gguf, forwards, monkeypatch, change):
    _load(tiny_gguf)
    assert len(forwards) == 1
    dtype, kw = "float32", {}
    if change == "dtype":
        dtype = "bfloat16"
    elif change == "headhunt":  # an edit of headhunt's code
        gguf_check.headhunt_source_digest.cache_clear()
        monkeypatch.setattr(gguf_check, "headhunt_source_digest", lambda: "edited")
    elif change == "torch":
        monkeypatch.setattr(torch, "__version__", "0.0.1")
    elif change == "file":
        write_tiny_gguf(tiny_gguf, seed=1)  # other weights at the same path
    else:
        kw = {"cache": False}
    _load(tiny_gguf, dtype, **kw)
    assert len(forwards) == 2
    _load(tiny_gguf, dtype, **kw)  # kept for the new key too (but --no-cache keeps nothing)
    assert len(forwards) == (3 if change == "no-cache" else 2)


def test_a_check_that_refused_keeps_no_verdict(cache, tiny_gguf, forwards, monkeypatch):
    def refuse(self, logits):
        raise HeadhuntError("not causal")

    with monkeypatch.context() as m:
        m.setattr(HookedModel, "_check_causal", refuse)
        with pytest.raises(HeadhuntError, match="not causal"):
            _load(tiny_gguf)
        with pytest.raises(HeadhuntError, match="not causal"):
            _load(tiny_gguf)  # refused again: nothing was kept
    assert len(forwards) == 2
    assert not (gguf_cache_folder(tiny_gguf) / CHECKS_FILE).exists()


def test_the_kept_outcome_is_what_the_later_load_sets(cache, tiny_gguf, forwards):
    """Deferred layers, score-bias layers and key-head counts come from the kept outcome
    (planted here: the tiny Llama has none of them)."""
    _load(tiny_gguf)
    store = gguf_cache_folder(tiny_gguf) / CHECKS_FILE
    kept = json.loads(store.read_text())
    (entry,) = kept.values()
    entry["outcome"] |= {"deferred": [1], "score_bias_layers": [0], "kv_head_counts": [2, 1]}
    store.write_text(json.dumps(kept))
    again = _load(tiny_gguf)
    assert len(forwards) == 1
    assert _state(again) == ([0, 1], [0], [2, 1], [False, True])
    entry["outcome"]["attention_layers"] = [0]  # not this model's layers: the check runs
    store.write_text(json.dumps(kept))
    _load(tiny_gguf)
    assert len(forwards) == 2


def test_the_source_digest_reads_every_package_headhunt_installs():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    mapped = pyproject["tool"]["setuptools"]["package-dir"]
    outside = {name.removeprefix("headhunt.") for name, folder in mapped.items() if name != folder}
    assert outside == set(gguf_check._MAPPED_PACKAGES)
    digest = gguf_check.headhunt_source_digest()
    assert len(digest) == 64 and digest == gguf_check.headhunt_source_digest.__wrapped__()
