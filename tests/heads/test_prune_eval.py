"""The pruning sweep on a planted model: heads whose output is silenced score 0 and the rest
score 1; pruning by that ranking changes nothing measurable, the reverse ranking does."""

import numpy as np
import pytest
import torch

from headhunt.heads.prune_eval import PruneEvalConfig, largest_budget_within, prune_sweep, summarize
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
        keep=[0.5], draws=1, lengths=[150], depths=[50.0], needles=["passkey"], max_new_tokens=4,
        ppl_windows=2, ppl_length=64, speed_length=64,
    )  # fmt: skip
    table = prune_sweep(model, scores, cfg, progress=False)
    full = table[table["order"] == "none"].iloc[0]
    top = table[table["order"] == "headhunt"].iloc[0]
    rev = table[table["order"] == "reverse"].iloc[0]
    assert top["dropped"] == rev["dropped"] == 4
    assert top["perplexity"] == pytest.approx(full["perplexity"], rel=1e-5)
    assert top["needle_recall"] == full["needle_recall"]
    assert top["parameters"] < full["parameters"]
    assert abs(rev["perplexity"] - full["perplexity"]) > 1e-3 * full["perplexity"]
    s = summarize(table)
    assert set(s["order"]) == {"none", "headhunt", "reverse", "random0", "random"}
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
