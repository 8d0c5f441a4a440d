"""Exports read back the way DuoAttention, kvpress and HeadKV read them (their documented
layouts: duo_attn/utils.py load_attn_pattern, kvpress DuoAttentionPress, HeadKV snapkv_utils)."""

import json

import numpy as np
import pytest

from headhunt.errors import HeadhuntError
from headhunt.export import ModelShape, export, read_duo

SHAPE = ModelShape(n_layers=3, n_heads=4, n_kv_heads=2)
M = np.array(
    [[0.0, 0.9, 0.1, 0.0], [0.2, 0.0, 0.0, 0.05], [0.0, 0.0, 0.6, 0.3]]
)  # KV maxima: [0.9, 0.1], [0.2, 0.05], [0.0, 0.6]


def _duo_load(folder):
    """DuoAttention's reader: tab-separated floats clipped to [0, 1] and two config keys."""
    heads = np.clip(
        np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t"), 0, 1
    )
    cfg = json.loads((folder / "config.json").read_text())
    return heads, cfg["sink_size"], cfg["recent_size"]


def test_duo_round_trip_and_quantile_deployment(tmp_path):
    export("duo", tmp_path / "d", M, SHAPE, sink=8, recent=64)
    heads, sink, recent = _duo_load(tmp_path / "d")
    assert heads.shape == (3, 2) and (sink, recent) == (8, 64)
    assert heads.max() == 1 and heads.min() == 0
    # sparsity 0.5 by quantile, as DuoAttention deploys: the top half of KV heads stay full
    full = heads >= np.quantile(heads, 0.5)
    assert full.tolist() == [[True, False], [True, False], [False, True]]
    got, s, r = read_duo(tmp_path / "d", SHAPE)
    assert np.allclose(got, heads) and (s, r) == (8, 64)


def test_duo_binary_budget(tmp_path):
    export("duo", tmp_path / "d", M, SHAPE, sink=4, recent=32, full_fraction=1 / 3)
    heads, _, _ = _duo_load(tmp_path / "d")
    assert heads.tolist() == [[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]]


def test_kvpress_ratio_selects_the_lowest_entries(tmp_path):
    export("kvpress", tmp_path / "k", M, SHAPE, sink=4, recent=32, full_fraction=0.5)
    heads, _, _ = _duo_load(tmp_path / "k")
    ratio = 0.5
    # kvpress: argsort over all (layer, KV head) entries, the lowest round(n * r) stream
    streaming = np.zeros(heads.shape, bool)
    idx = np.argsort(heads, axis=None)[: round(heads.size * ratio)]
    streaming[np.unravel_index(idx, heads.shape)] = True
    assert streaming.tolist() == [[False, True], [False, True], [True, False]]
    assert "head_compression_ratio=0.5" in (tmp_path / "k" / "README.md").read_text()


def test_headkv_round_trip(tmp_path):
    export("headkv", tmp_path / "h", M, SHAPE)
    with open(tmp_path / "h" / "retrieval_heads.json") as f:
        head_list = json.loads(f.readline())  # HeadKV reads the first line
    scores = np.array([np.mean(v) for v in head_list.values()]).reshape(3, 4)
    assert np.allclose(scores, M)
    budget = json.loads((tmp_path / "h" / "budget.json").read_text())
    assert budget["capacity_min"] == round(128 - 128 // 1.2)


def test_mismatched_counts_and_bad_scores_are_refused(tmp_path):
    with pytest.raises(HeadhuntError, match="3 layers x 4 heads; the model's config has 32 x 32"):
        export("duo", tmp_path / "x", M, ModelShape(32, 32, 8))
    with pytest.raises(HeadhuntError, match="non-negative"):
        export("headkv", tmp_path / "x", M - 1, SHAPE)
    export("duo", tmp_path / "d", M, SHAPE)
    with pytest.raises(HeadhuntError, match="3 layers x 2 KV heads; the model has 3 x 4"):
        read_duo(tmp_path / "d", ModelShape(3, 8, 4))
