"""Linear probes: planted ground truth (a label linearly encoded in one layer only), controls,
the split by text, saved weights, and errors."""

from __future__ import annotations

import numpy as np
import pytest

from headhunt.errors import HeadhuntError
from headhunt.probes.linear import (
    RESIDUAL,
    ProbeConfig,
    Prober,
    ProbeResult,
    control_labels,
    curve_figure,
    save_weights,
    split_by_text,
    to_scores,
    within_type_labels,
)

N_TEXTS, PER_TEXT, D, N_LAYERS, CHOSEN = 100, 6, 32, 6, 4
FAST = {"grid": [1e-3, 1e-2, 1e-1], "folds": 3}


def planted(task: str, seed: int = 0):
    """States of N_LAYERS layers; the label is a linear function of layer CHOSEN's state only.

    Every layer has the same scale of noise; the other layers hold a strong random signal of
    their own (a per-text offset, so rows of a text share it) that is unrelated to the label.
    """
    rng = np.random.default_rng(seed)
    n = N_TEXTS * PER_TEXT
    groups = np.repeat(np.arange(N_TEXTS), PER_TEXT)
    types = rng.integers(200, size=n)
    w = rng.normal(size=(4, D))
    if task == "classification":
        labels = rng.integers(4, size=n)
        signal = w[labels] * 1.5
    else:
        labels = rng.normal(size=n)
        signal = labels[:, None] * w[0] / np.linalg.norm(w[0]) * 3
    states = rng.normal(size=(N_LAYERS, n, D)).astype(np.float32)
    for layer in range(N_LAYERS):
        if layer == CHOSEN:
            states[layer] += signal
        else:
            states[layer] += rng.normal(size=(N_TEXTS, D))[groups] * 2
    return states, labels, groups, types


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_planted_layer_is_singled_out_and_shuffled_labels_stay_at_chance(task):
    states, labels, groups, types = planted(task)
    prober = Prober(labels, groups, types, ProbeConfig(task=task, **FAST))
    results = [prober.fit(states[layer], layer) for layer in range(N_LAYERS)]
    name = "accuracy" if task == "classification" else "r2"
    curve = np.array([r.metrics[name] for r in results])
    chance = results[0].metrics["chance"]
    assert int(np.argmax(curve)) == CHOSEN
    others = np.delete(curve, CHOSEN)
    if task == "classification":
        assert curve[CHOSEN] > 0.9
        assert others.max() < chance + 0.15
    else:
        assert curve[CHOSEN] > 0.8
        assert others.max() < 0.1
    for r in results:
        assert abs(r.metrics["shuffled"] - chance) < 0.15
        # 200 random types unrelated to the labels: shuffling within them leaves nothing.
        assert abs(r.metrics["within_type"] - chance) < 0.15
        assert "control" not in r.metrics  # Hewitt & Liang's control: only when asked
    assert results[CHOSEN].metrics["selectivity"] > 0.6
    assert results[CHOSEN].metrics["n_test"] + results[CHOSEN].metrics["n_train"] == len(labels)


def test_control_catches_a_probe_that_memorises_types():
    """States that encode only the token type: the task (labels independent of the type) stays
    at chance while the Hewitt & Liang control is solved (H&L selectivity would be -0.5 and
    more); the within-type shuffle equals the task, as the type explains everything the probe
    sees, so selectivity against it is about zero: the states know nothing beyond the type."""
    rng = np.random.default_rng(1)
    n_texts, per = 80, 8
    groups = np.repeat(np.arange(n_texts), per)
    types = rng.integers(6, size=len(groups))
    labels = rng.integers(3, size=len(groups))
    emb = rng.normal(size=(6, 16)) * 3
    x = (emb[types] + rng.normal(size=(len(groups), 16))).astype(np.float32)
    cfg = ProbeConfig(controls=["control", "shuffled", "within_type"], **FAST)
    r = Prober(labels, groups, types, cfg).fit(x, 0)
    assert r.metrics["control"] > 0.9
    assert r.metrics["accuracy"] < r.metrics["chance"] + 0.15
    assert abs(r.metrics["within_type"] - r.metrics["accuracy"]) < 0.15
    assert abs(r.metrics["selectivity"]) < 0.15


def test_selectivity_against_the_informative_control_when_types_are_few():
    """Eight token types (as the n-gram words) and a label the states carry beyond the type:
    the Hewitt & Liang control memorises the types and beats the probe (the old headline, a
    negative selectivity), the within-type control stays near chance, far below the probe."""
    rng = np.random.default_rng(2)
    n_texts, per = 80, 8
    groups = np.repeat(np.arange(n_texts), per)
    types = rng.integers(8, size=len(groups))
    labels = rng.integers(4, size=len(groups))
    emb, lab = rng.normal(size=(8, 24)) * 3, rng.normal(size=(4, 24))
    x = (emb[types] + 1.2 * lab[labels] + rng.normal(size=(len(groups), 24))).astype(np.float32)
    cfg = ProbeConfig(controls=["control", "shuffled", "within_type"], **FAST)
    r = Prober(labels, groups, types, cfg).fit(x, 0).metrics
    assert r["control"] > r["accuracy"]  # why H&L is not the reference here
    assert r["accuracy"] > 0.6
    assert r["within_type"] < r["chance"] + 0.15
    assert r["selectivity"] == r["accuracy"] - r["within_type"] > 0.3


def test_within_type_on_unique_types_is_refused():
    groups = np.repeat(np.arange(30), 2)
    labels = np.arange(60) % 2
    with pytest.raises(HeadhuntError, match="against shuffled"):
        Prober(labels, groups, np.arange(60), ProbeConfig(selectivity_vs="within_type", **FAST))
    auto = Prober(labels, groups, np.arange(60), ProbeConfig(**FAST))
    assert auto.config.selectivity_vs == "shuffled"
    assert auto.fitted == ["shuffled", "within_type"]
    assert Prober(labels, groups, groups, ProbeConfig(**FAST)).config.selectivity_vs == (
        "within_type"
    )


def test_split_is_by_text_and_stratified():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(40), 5)
    labels = np.repeat(rng.integers(3, size=40), 5)
    cfg = ProbeConfig(test_fraction=0.25)
    train = split_by_text(labels, groups, cfg)
    assert not set(groups[train]) & set(groups[~train])
    assert len(set(groups[~train])) == 10
    assert set(labels[~train]) == set(labels)
    again = split_by_text(labels, groups, cfg)
    np.testing.assert_array_equal(train, again)


def test_control_labels_follow_types():
    rng = np.random.default_rng(0)
    labels = rng.integers(4, size=500)
    types = rng.integers(30, size=500)
    ctrl = control_labels(labels, types, rng)
    for t in np.unique(types):
        assert len(set(ctrl[types == t])) == 1
    assert set(ctrl) <= set(labels)
    within = within_type_labels(labels, types, rng)
    for t in np.unique(types):
        assert sorted(within[types == t]) == sorted(labels[types == t])
    assert (within != labels).mean() > 0.3


def test_weights_reproduce_the_test_score_and_save(tmp_path):
    from safetensors.numpy import load_file

    states, labels, groups, types = planted("classification")
    prober = Prober(labels, groups, types, ProbeConfig(controls=[], selectivity_vs=None, **FAST))
    r = prober.fit(states[CHOSEN], CHOSEN)
    w = r.weights
    x = states[CHOSEN][~prober.train]
    pred = w["classes"][np.argmax(((x - w["mean"]) / w["scale"]) @ w["coef"].T + w["intercept"], 1)]
    assert np.isclose((pred == labels[~prober.train]).mean(), r.metrics["accuracy"])
    assert "control" not in r.metrics and "selectivity" not in r.metrics
    head = ProbeResult(CHOSEN, 3, r.metrics, r.weights)
    save_weights([r, head], tmp_path / "w.safetensors")
    loaded = load_file(str(tmp_path / "w.safetensors"))
    np.testing.assert_array_equal(loaded[f"L{CHOSEN:02d}.coef"], w["coef"])
    assert f"L{CHOSEN:02d}.H03.classes" in loaded

    table = to_scores([r, head], n_heads_per_kv=2)
    df = table.df
    assert df["head"].dtype == np.int64 and df["kv_head"].dtype == np.int64
    assert set(df[df["head"] == RESIDUAL]["kv_head"]) == {RESIDUAL}
    assert set(df[df["head"] == 3]["kv_head"]) == {1}
    fig = curve_figure([r, head], "classification")
    assert {t.name for t in fig.data if t.name} >= {"accuracy", "chance"}
    assert any(t.type == "heatmap" for t in fig.data)


def test_bad_labels_are_one_line_errors():
    groups = np.repeat(np.arange(30), 2)
    with pytest.raises(HeadhuntError, match="one class"):
        Prober(np.zeros(60), groups, groups)
    with pytest.raises(HeadhuntError, match="same value"):
        Prober(np.ones(60), groups, groups, ProbeConfig(task="regression"))
    with pytest.raises(HeadhuntError, match="only 5 texts"):
        few = np.repeat(np.arange(5), 4)
        Prober(np.arange(20) % 2, few, few)
    with pytest.raises(HeadhuntError, match="one entry per row"):
        Prober(np.arange(60) % 2, groups[:-1], groups)
    with pytest.raises(HeadhuntError, match="unknown controls"):
        Prober(np.arange(60) % 2, groups, groups, ProbeConfig(controls=["nope"]))
    with pytest.raises(HeadhuntError, match="unknown controls"):
        Prober(np.arange(60) % 2, groups, groups, ProbeConfig(selectivity_vs="nope"))
    prober = Prober(np.arange(60) % 2, groups, groups % 10, ProbeConfig(**FAST))
    with pytest.raises(HeadhuntError, match="expected states"):
        prober.fit(np.zeros((59, 3)), 0)


def test_config_round_trips():
    cfg = ProbeConfig(task="regression", grid=[0.1, 1.0], controls=["shuffled"], seed=3)
    assert ProbeConfig.from_dict(cfg.to_dict() | {"unknown": 1}) == cfg
