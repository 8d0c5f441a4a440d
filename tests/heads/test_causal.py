"""The masking check against random heads: controls drawn outside the tested heads, conditions
in order, resumable; a planted measurement tells the tested heads from the controls."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from headhunt.errors import HeadhuntError
from headhunt.heads.evaluations.causal import MaskingCheck, random_head_sets

MODEL = SimpleNamespace(n_layers=3, n_heads=4)  # the check reads only the model's shape
PLANTED = [(1, 2), (2, 0)]


def behaviour(masked: list[tuple[int, int]]) -> float:
    """A planted behaviour: it needs both planted heads, and no other head matters."""
    return 0.0 if set(PLANTED) & set(masked) else 1.0


def test_random_sets_avoid_the_excluded_heads_and_continue_a_stream():
    sets = random_head_sets(3, 4, 3, 20, exclude=[(0, 0), (1, 1)], seed=7)
    assert all(len(s) == 3 == len(set(s)) and s == sorted(s) for s in sets)
    assert not {h for s in sets for h in s} & {(0, 0), (1, 1)}
    assert sets == random_head_sets(3, 4, 3, 20, exclude=[(1, 1), (0, 0)], seed=7)
    rng = random.Random(7)
    first = random_head_sets(3, 4, 3, 1, exclude=[(0, 0), (1, 1)], seed=rng)
    second = random_head_sets(3, 4, 3, 1, exclude=[(0, 0), (1, 1)], seed=rng)
    assert [*first, *second] == sets[:2]  # a Random goes on with its stream
    assert random_head_sets(1, 2, 3, 0) == []  # no set asked for: nothing to refuse
    with pytest.raises(HeadhuntError, match="cannot draw 3 random heads: only 2"):
        random_head_sets(1, 2, 3, 1)


def test_masking_check_tells_planted_heads_from_random_ones():
    check = MaskingCheck.draw(MODEL, PLANTED, 4, seed=0, exclude=[(0, 1)])
    assert list(check.conditions()) == [
        "baseline",
        "top",
        "random0",
        "random1",
        "random2",
        "random3",
    ]
    assert all(not set(s) & {*PLANTED, (0, 1)} for s in check.random_sets)
    res = check.run(behaviour)
    assert res["baseline"] == 1.0 and res["top"] == 0.0
    assert [res[f"random{i}"] for i in range(4)] == [1.0] * 4


def test_masking_check_resumes_and_reports_each_condition():
    check = MaskingCheck.draw(MODEL, PLANTED, 2, seed=3)
    seen: list[str] = []
    res = check.run(
        behaviour, done={"baseline": 0.5}, on_condition=lambda name, v: seen.append(name)
    )
    assert seen == ["top", "random0", "random1"]  # the recorded condition is not measured again
    assert res["baseline"] == 0.5


def test_masking_check_bad_heads():
    with pytest.raises(HeadhuntError, match="no heads to mask"):
        MaskingCheck.draw(MODEL, [], 1)
    with pytest.raises(HeadhuntError, match="head 3-0 is outside the model"):
        MaskingCheck.draw(MODEL, [(3, 0)], 1)


def test_needle_recall_batches_each_length_apart(tiny):
    """Trials per length that are no multiple of the batch size once put two lengths in one
    batch (a crash, found by running README's ablate); each trial's recall is the one it gets
    alone."""
    from headhunt.heads.configs import RetrievalConfig
    from headhunt.heads.evaluations.causal import needle_recall
    from headhunt.heads.retrieval import build_trials, stop_token_ids

    config = RetrievalConfig(lengths=[300, 400], depths=[25, 75], needles=["passkey"])
    trials = build_trials(tiny, config)  # 300, 300, 400, 400 tokens: a batch of 3 mixes them
    stop = stop_token_ids(tiny.tokenizer)
    together = needle_recall(tiny, trials, max_new_tokens=3, stop_ids=stop, batch_size=3)
    alone = [needle_recall(tiny, [t], max_new_tokens=3, stop_ids=stop)[0] for t in trials]
    assert together == alone
