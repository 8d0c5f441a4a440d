"""The kv-eval sweep on a tiny model: conditions, memory accounting and the summary."""

import numpy as np
import pytest

from headhunt.heads.evaluations.kv_eval import (
    FULL,
    STREAMING,
    KVEvalConfig,
    build_eval_trials,
    conditions,
    kv_eval,
    kv_rankings,
    smallest_fraction_within,
    summarize,
)
from headhunt.probes.tiny import tiny_llama


@pytest.fixture(scope="module")
def model():
    return tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2)


def _config(**kw):
    base = dict(
        fractions=[0.0, 0.5, 1.0], lengths=[200], depths=[50.0], needles=["passkey"],
        tasks=["mk_niah"], task_repeats=2, random_draws=1, batch_size=4,
    )  # fmt: skip
    return KVEvalConfig(**{**base, **kw})


def test_conditions_share_the_end_points():
    c = conditions({"headhunt": [], "random0": []}, [0.0, 0.25, 1.0])
    assert c == [(FULL, 1.0), (STREAMING, 0.0), ("headhunt", 0.25), ("random0", 0.25)]


def test_a_window_longer_than_the_prompt_changes_nothing(model):
    cfg = _config(recent=10_000)
    trials = build_eval_trials(model, cfg)
    ranks = kv_rankings(model, cfg, scores=np.random.default_rng(0).random((2, 4)))
    table = kv_eval(model, cfg, ranks, trials, progress=False)
    full = table[table["ranking"] == FULL].set_index("trial")["response"]
    for _, group in table.groupby(["ranking", "fraction"]):
        assert group.set_index("trial")["response"].equals(full)
    s = summarize(table)
    assert np.allclose(s["kv_fraction"], 1.0)  # nothing to drop: streaming caches hold it all
    assert smallest_fraction_within(s, "headhunt", "needle") == 0.0


def test_memory_falls_as_measured(model):
    cfg = _config(sink=2, recent=8, fractions=[0.0, 1.0])
    trials = build_eval_trials(model, cfg)
    table = kv_eval(model, cfg, kv_rankings(model, cfg), trials, progress=False)
    s = summarize(table).set_index(["ranking", "fraction", "task"])
    # all streaming: every KV head holds sink + recent entries instead of 200 + generated tokens
    full = s.loc[(FULL, 1.0, "mk_niah"), "kv_bytes"]
    stream = s.loc[(STREAMING, 0.0, "mk_niah"), "kv_bytes"]
    per_entry = 2 * 2 * 2 * 16 * 4  # layers, k+v, KV heads, head_dim, float32 bytes
    assert stream == 10 * per_entry
    assert full % per_entry == 0 and full // per_entry > 200
