"""Trials of the SAE method: seeds, subsets, records for resuming."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.sae.circuits import CircuitConfig, SAETrial, run_sae_trials, summarize


def _acts(n=12, heads=5, d=8, signal=(1, 3)):
    # heads in `signal` write a fixed vector on positives only; the rest write noise shared by
    # each positive and its negative
    g = torch.Generator().manual_seed(0)
    base = torch.randn(n, heads, d, generator=g)
    pos, neg = base.clone(), base.clone()
    for h in signal:
        pos[:, h] += 5 * torch.randn(d, generator=g)
    return torch.cat([pos, neg])


def test_trials_are_seeded_and_roundtrip_as_records():
    acts = _acts()
    truth = np.zeros(5, bool)
    truth[[1, 3]] = True
    cfg = CircuitConfig(trials=2, epochs=40, dict_size=16, subsample=0.5, seed=4)
    eap = np.random.default_rng(0).normal(size=(12, 5))
    a = run_sae_trials(acts, cfg, truth=truth, eap_pairs=eap, progress=False)
    b = run_sae_trials(acts, cfg, truth=truth, eap_pairs=eap, progress=False)
    assert [t.pairs for t in a] == [t.pairs for t in b]
    assert len(a[0].pairs) == 6 and a[0].pairs != a[1].pairs
    assert all(np.array_equal(x.node, y.node) for x, y in zip(a, b, strict=True))
    assert np.allclose(a[0].eap, np.abs(eap[a[0].pairs].mean(0)))
    back = SAETrial.from_record(a[0].record())
    assert np.array_equal(back.node, a[0].node) and back.auc == a[0].auc
    assert back.top_edges == a[0].top_edges
    s = summarize(a)
    assert set(s) == {
        "sae_node",
        "sae_node_norm",
        "sae_pos_only",
        "sae_changed",
        "sae_edge",
        "eap",
    }
    assert np.isclose(s["sae_node"]["mean"], np.mean([t.auc["sae_node"] for t in a]))


def test_resumed_trials_are_not_rerun():
    acts = _acts()
    cfg = CircuitConfig(trials=3, epochs=5, dict_size=8)
    first = run_sae_trials(acts, cfg, progress=False)
    seen = []
    again = run_sae_trials(acts, cfg, done=first[:2], on_trial=seen.append, progress=False)
    assert [t.index for t in seen] == [2]
    assert [t.index for t in again] == [0, 1, 2]
    assert again[0] is first[0]


def test_signal_heads_score_above_noise_heads():
    acts = _acts()
    cfg = CircuitConfig(trials=1, epochs=200, dict_size=32, subsample=1.0)
    (t,) = run_sae_trials(acts, cfg, progress=False)
    assert t.node[[0, 2, 4]].max() == 0  # identical on positive and negative: never counted
    assert t.node[[1, 3]].min() >= 1


def test_config_validation():
    for bad in (
        {"trials": 0},
        {"sae_examples": 0},
        {"subsample": 0},
        {"position": "first"},
        {"truth_share": None},
        {"truth_top": 3},
    ):
        with pytest.raises(HeadhuntError):
            CircuitConfig(**bad)
    cfg = CircuitConfig(trials=2, l1=0.05)
    assert CircuitConfig.from_dict({**cfg.to_dict(), "unrelated": 1}) == cfg
    with pytest.raises(HeadhuntError, match="positives then"):
        run_sae_trials(torch.zeros(3, 2, 4), cfg, progress=False)


def test_normalize_heads():
    from headhunt.sae.circuits import normalize_heads

    x = torch.randn(10, 3, 4) * torch.tensor([1.0, 10.0, 100.0])[None, :, None] + 5
    assert normalize_heads(x, "none") is x
    c = normalize_heads(x, "center")
    assert torch.allclose(c.mean(0), torch.zeros(3, 4), atol=1e-4)
    s = normalize_heads(x, "standardize")
    assert torch.allclose(s.norm(dim=-1).mean(0), torch.ones(3), atol=1e-5)


def test_standardized_heads_still_find_the_signal():
    acts = _acts()
    cfg = CircuitConfig(trials=1, epochs=200, dict_size=32, subsample=1.0, head_norm="standardize")
    (t,) = run_sae_trials(acts, cfg, progress=False)
    assert t.node[[0, 2, 4]].max() == 0
    assert t.node[[1, 3]].min() >= 1


def test_verdict_names_the_method_to_trust():
    from headhunt.sae.report import verdict

    summary = {"sae_changed": {"mean": 0.84, "std": 0.01}, "eap": {"mean": 0.99, "std": 0.0}}
    v = verdict(summary, {"patching": 500.0, "eap": 3.0, "sae_method": 40.0}, "sae_changed")
    assert v["trust"].startswith("EAP")
    assert v["methods"]["sae_changed"] == {"auc": 0.84, "seconds": 40.0, "role": "fast"}
    assert v["methods"]["patching"]["role"] == "reference"
    summary["eap"]["mean"] = 0.7
    assert verdict(summary, {}, "sae_changed")["trust"].startswith("SAE")
    assert "nothing says" in verdict({}, {}, "sae_changed")["trust"]
