"""The pruning sweep on a planted model: heads whose output is silenced score 0 and the rest
score 1; pruning by that ranking changes nothing measurable, the reverse ranking does."""

import numpy as np
import pytest
import torch

from headhunt.heads.evaluations.prune_eval import (
    PruneEvalConfig,
    largest_budget_within,
    prune_sweep,
    summarize,
)
from headhunt.probes.tiny import tiny_llama


def test_pruning_silenced_heads_keeps_everything():
    model = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2)
    hd = model.head_dim
    scores = np.ones((2, 4))
    with torch.no_grad():
        for layer, head in [(0, 1), (0, 3), (1, 0), (1, 2)]:  # half the heads, uneven KV use
            model.modules[layer].o_proj.weight[:, head * hd : (head + 1) * hd] = 0
            scores[layer, head] = 0.0
    cfg = PruneEvalConfig(
        keep=[0.5], draws=1, lengths=[150], depths=[0.0, 100.0], needles=["passkey"],
        max_new_tokens=4, ppl_windows=2, ppl_length=64, speed_length=64,
    )  # fmt: skip
    table = prune_sweep(model, scores, cfg, progress=False)
    full = table[table["order"] == "none"].iloc[0]
    top = table[table["order"] == "headhunt"].iloc[0]
    rev = table[table["order"] == "reverse"].iloc[0]
    assert top["dropped"] == rev["dropped"] == 4
    assert top["perplexity"] == pytest.approx(full["perplexity"], rel=1e-5)
    assert top["needle_recall"] == full["needle_recall"]
    assert len(top["recall"]) == 2  # per trial, for paired changes
    assert top["parameters"] < full["parameters"]
    assert abs(rev["perplexity"] - full["perplexity"]) > 1e-3 * full["perplexity"]
    s = summarize(table)
    assert set(s["order"]) == {"none", "headhunt", "reverse", "random0", "random"}
    paired = s.set_index("order")
    assert (
        paired.loc["headhunt", "recall_change"] == paired.loc["headhunt", "recall_change_se"] == 0
    )
    assert largest_budget_within(s, "headhunt") == 0.5


def test_kv_unit_pruning_of_silenced_groups_keeps_everything_and_shrinks():
    model = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2)
    hd = model.head_dim
    scores = np.ones((2, 4))
    with torch.no_grad():
        for layer, head in [(0, 2), (0, 3), (1, 0), (1, 1)]:  # one whole KV group per layer
            model.modules[layer].o_proj.weight[:, head * hd : (head + 1) * hd] = 0
            scores[layer, head] = 0.0
    cfg = PruneEvalConfig(
        keep=[0.5], draws=1, lengths=[150], depths=[50.0], needles=["passkey"], max_new_tokens=4,
        ppl_windows=2, ppl_length=64, speed_length=64, unit="kv",
    )  # fmt: skip
    table = prune_sweep(model, scores, cfg, progress=False).set_index("order")
    assert table.loc["headhunt", "perplexity"] == pytest.approx(
        table.loc["none", "perplexity"], rel=1e-5
    )
    assert table.loc["headhunt", "pad_heads"] == 0
    assert (
        table.loc["headhunt", "kv_bytes_per_token"] == table.loc["none", "kv_bytes_per_token"] / 2
    )
    assert table.loc["reverse", "perplexity"] != pytest.approx(
        table.loc["none", "perplexity"], rel=1e-3
    )


def test_masking_effect_is_zero_for_silenced_heads_and_breaks_ties():
    from headhunt.heads.evaluations.prune_eval import masking_effect, needle_trials
    from headhunt.heads.interventions.pruning import ranked_heads

    model = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2)
    hd = model.head_dim
    silenced = [(0, 1), (1, 3)]
    with torch.no_grad():
        for layer, head in silenced:
            model.modules[layer].o_proj.weight[:, head * hd : (head + 1) * hd] = 0
    cfg = PruneEvalConfig(lengths=[150], depths=[0.0, 100.0], needles=["passkey"])
    effect = masking_effect(model, needle_trials(model, cfg, calibration=True), batch_size=4)
    assert effect.shape == (2, 4)
    assert all(effect[h] == 0 for h in silenced)
    assert (np.abs(np.delete(effect.ravel(), [1, 7])) > 1e-6).all()
    # calibration trials are another seed stream than the evaluation's
    assert (
        needle_trials(model, cfg)[0].input_ids
        != needle_trials(model, cfg, calibration=True)[0].input_ids
    )
    # equal primary scores: the secondary signal orders them (kept first = largest effect)
    order = ranked_heads(np.zeros((2, 4)), "top", 0, secondary=effect)
    kept_first = [effect[h] for h in order]
    assert kept_first == sorted(kept_first, reverse=True)
    ties = np.array([[1.0, 0, 0, 0], [0, 0, 0, 0]])
    assert ranked_heads(ties, "top", 0, secondary=effect)[0] == (0, 0)  # primary first
