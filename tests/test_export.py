"""Exports read back the way DuoAttention, kvpress and HeadKV read them (their documented
layouts: duo_attn/utils.py load_attn_pattern, kvpress DuoAttentionPress, HeadKV snapkv_utils)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from headhunt.errors import HeadhuntError
from headhunt.export import (
    ModelShape,
    export,
    read_duo,
    sink_size_from_run,
    streaming_window,
)

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


FIXTURE = Path(__file__).parent / "fixtures" / "duo_pattern"  # DuoAttention's real layout
DUO_LINE = re.compile(r"-?\d\.\d{18}e[+-]\d{2}(\t-?\d\.\d{18}e[+-]\d{2})*")


def test_a_pattern_in_duoattentions_layout_reads_as_duoattention_reads_it():
    values, sink, recent = read_duo(FIXTURE, ModelShape(n_layers=2, n_heads=4, n_kv_heads=2))
    heads, s, r = _duo_load(FIXTURE)
    assert np.array_equal(values, heads) and (sink, recent) == (s, r) == (8, 16)
    assert values[0, 0] == 0.0  # a gate just below 0 is clipped, as DuoAttention's loader does
    with pytest.raises(HeadhuntError, match="2 layers x 2 KV heads; the model has 3 x 2"):
        read_duo(FIXTURE, ModelShape(n_layers=3, n_heads=4, n_kv_heads=2))


def test_exported_duo_files_have_duoattentions_layout(tmp_path):
    export("duo", tmp_path / "d", M, SHAPE, sink=8, recent=64)
    fixture_lines = (FIXTURE / "full_attention_heads.tsv").read_text().splitlines()
    lines = (tmp_path / "d" / "full_attention_heads.tsv").read_text().splitlines()
    assert all(DUO_LINE.fullmatch(line) for line in fixture_lines + lines)
    assert len(lines) == SHAPE.n_layers and {len(x.split("\t")) for x in lines} == {2}
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert {"sink_size", "recent_size"} <= set(cfg) & set(
        json.loads((FIXTURE / "config.json").read_text())
    )


def _sinks_run(folder, positions, eps_tokens=64):
    import pandas as pd

    from headhunt.rundir import RunDir

    run = RunDir.open(folder, "sinks")
    pd.DataFrame({"position": positions}).to_parquet(run.path("sinks.parquet"))
    run.finalize(model={}, parameters={"eps_tokens": eps_tokens}, timings={})
    return folder


def test_sink_size_from_a_sinks_run_and_the_window_precedence(tmp_path):
    run = _sinks_run(tmp_path / "sinks", [36, 3, 36, 500, 63, 64])
    assert sink_size_from_run(run)[0] == 64  # token 0 .. position 63; 64 and 500 are mid-text
    assert sink_size_from_run(_sinks_run(tmp_path / "none", [], 64))[0] == 1
    assert streaming_window(None, None)[:2] == (4, 256)
    assert streaming_window(None, None, str(run))[:2] == (64, 256)
    assert streaming_window(2, None, str(run))[:2] == (2, 256)  # a flag wins
    assert streaming_window(None, None, None, FIXTURE)[:2] == (8, 16)
    s, w, note = streaming_window(None, None, str(run), FIXTURE)
    assert (s, w) == (64, 16) and "sinks run" in note
    with pytest.raises(HeadhuntError, match="not a sinks run"):
        sink_size_from_run(_retrieval_run(tmp_path / "r"))


def _retrieval_run(folder):
    from headhunt.rundir import RunDir

    run = RunDir.open(folder, "retrieval")
    run.finalize(model={}, parameters={}, timings={})
    return folder
