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


def test_lukv_curve_rows_prune_their_ratio_best_heads_last(tmp_path):
    from headhunt.kvbudget import fold_kv

    files = export("lukv", tmp_path / "l", M, SHAPE)
    curve = np.load(files[0], allow_pickle=False)  # as kvpress's load_budget_curve reads it
    assert curve.shape == (99, 3, 2) and curve.dtype == np.float64
    assert np.allclose(curve.reshape(99, -1).mean(1), np.arange(1, 100) / 100, atol=1e-9)
    assert (curve >= 0).all() and (curve <= 1).all() and (np.diff(curve, axis=0) >= -1e-12).all()
    kv = fold_kv(M, 2).ravel()  # 0.9 best, 0.0 worst: the best is pruned least at every ratio
    rows = curve.reshape(99, -1)
    assert (rows[:, kv.argmax()] <= rows[:, kv.argmin()]).all()
    assert rows[49, kv.argmax()] == 0.0 and rows[49, kv.argmin()] > 0.5  # ratio 0.5
    # LUKVPress's own arithmetic for layer 0 at ratio 0.5 and 1,000 tokens: the keep counts
    keep = np.floor((1 - curve[49, 0]) * 1000)
    assert keep[0] == 1000 and keep[1] < 500
    with pytest.raises(HeadhuntError, match="3 layers x 4 heads; the model's config has 3 x 8"):
        export("lukv", tmp_path / "x", M, ModelShape(3, 8, 2))


def test_adakv_weights_mean_one_per_layer_in_score_order(tmp_path):
    files = export("adakv", tmp_path / "a", M, SHAPE, floor=0.1)
    w = np.load(files[0], allow_pickle=False)
    assert w.shape == (3, 2) and np.allclose(w.mean(1), 1)
    assert w[0, 0] > w[0, 1] and w[2, 1] > w[2, 0]  # KV maxima 0.9 > 0.1, 0.6 > 0.0
    assert w[2, 1] / w[2, 0] == pytest.approx((0.1 + 0.6 / 0.9) / 0.1)
    with pytest.raises(HeadhuntError, match="floor"):
        export("adakv", tmp_path / "b", M, SHAPE, floor=0)


def test_kvpress_budget_counts_bytes_not_heads(tmp_path):
    shape = ModelShape(3, 4, 2, head_dim=64)
    export("kvpress", tmp_path / "k", M, shape, sink=4, recent=28, context=1024)
    budget = json.loads((tmp_path / "k" / "budget.json").read_text())
    rows = {(r["target"], r["run"].startswith("kvpress")): r for r in budget["ratios"]}
    as_evaluated = rows[(0.5, True)]  # head ratio 0.5: 3 of 6 KV heads stream
    assert as_evaluated["streaming_kv_heads"] == 3
    removed = 3 * (1024 - 32) / (6 * 1024)  # each streaming head keeps 32 of 1024 entries
    assert as_evaluated["kvpress_reported_ratio"] == pytest.approx(removed)
    assert as_evaluated["entries_removed_share"] == pytest.approx(removed) and removed < 0.5
    full = 6 * 1024 * 2 * 64 * 2
    assert as_evaluated["kv_bytes_full"] == full
    assert as_evaluated["kv_bytes_kept"] == (3 * 1024 + 3 * 32) * 2 * 64 * 2
    assert rows[(0.5, False)]["head_compression_ratio"] == pytest.approx(0.5 / (1 - 32 / 1024))
    # at 128 tokens streaming heads keep a quarter: 0.875 of the bytes is unreachable, said so
    export("kvpress", tmp_path / "c", M, shape, sink=4, recent=28, context=128)
    budget = json.loads((tmp_path / "c" / "budget.json").read_text())
    rows = {(r["target"], r["run"].startswith("kvpress")): r for r in budget["ratios"]}
    assert not rows[(0.875, False)]["reachable"] and rows[(0.5, False)]["reachable"]
    # a context shorter than sink + recent: kvpress reports a negative ratio, nothing is removed
    export("kvpress", tmp_path / "s", M, shape, sink=4, recent=28, context=16, full_fraction=0.5)
    short = json.loads((tmp_path / "s" / "budget.json").read_text())["ratios"][0]
    assert short["kvpress_reported_ratio"] < 0 and short["entries_removed_share"] == 0


def test_ranking_stability_planted():
    from headhunt.kvbudget import ranking_stability

    rng = np.random.default_rng(0)
    # 3 layers x 4 heads, 2 KV heads: KV heads (0, 0) and (2, 1) copy in every trial
    signal = np.zeros((3, 4))
    signal[0, 1] = signal[2, 2] = 1.0
    steady = signal + 0.01 * rng.random((40, 3, 4))
    report = ranking_stability(steady, 2, full_fraction=2 / 6)
    assert report["trials"] == 40 and report["top_k"] == 2 and report["overlap"] == 1.0
    assert "warning" not in report
    noise = rng.random((6, 3, 4))  # no head copies more than another: halves disagree
    report = ranking_stability(noise, 2, full_fraction=2 / 6)
    assert report["overlap"] < 0.9 and "6 trials" in report["warning"]
    assert "warning" in ranking_stability(steady[:1], 2, 0.5)


def test_stability_report_reads_a_retrieval_runs_trials(tmp_path):
    from headhunt.export import stability_report
    from headhunt.rundir import RunDir

    run = RunDir.open(tmp_path / "r", "retrieval")
    per = {
        f"{layer}-{head}": [float(M[layer, head])] * 10 for layer in range(3) for head in range(4)
    }
    run.path("retrieval_heads.json").write_text(json.dumps(per))
    run.finalize(model={}, parameters={}, timings={})
    report = stability_report(tmp_path / "r", "retrieval_score", 2, [0.5])
    assert report["trials"] == 10 and report["budgets"][0]["overlap"] == 1.0
    assert report["warnings"] == []
    bare = stability_report(tmp_path / "r", "needle_attention", 2, [0.5])
    assert bare["trials"] is None and "no per-trial" in bare["note"]


def test_kv_eval_ranking_report_warns_for_a_noisy_ranking(tmp_path):
    from headhunt.methods.kv_eval import ranking_report
    from headhunt.rundir import RunDir

    rng = np.random.default_rng(1)
    run = RunDir.open(tmp_path / "r", "retrieval")
    per = {f"{la}-{h}": rng.random(8).tolist() for la in range(3) for h in range(4)}
    run.path("retrieval_heads.json").write_text(json.dumps(per))
    run.finalize(model={}, parameters={}, timings={})
    report = ranking_report(str(tmp_path / "r"), "retrieval_score", 2, [0, 0.5, 1, 1 / 3])
    assert [b["full_fraction"] for b in report["budgets"]] == [0.5, 1 / 3]
    assert report["trials"] == 8 and report["warnings"]
