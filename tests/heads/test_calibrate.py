"""Tasks (format, splits, bundled data) and the calibration protocol (evaluation, search,
bootstrap) with planted ground truth."""

from __future__ import annotations

import json
from collections import Counter
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from headhunt.errors import HeadhuntError
from headhunt.heads.evaluations.calibrate import (
    CalibrateConfig,
    encode_task,
    evaluate,
    movable_sink_mass,
    paired_bootstrap,
    rank_candidates,
    search_heads,
)
from headhunt.heads.inputs.calibration_tasks import (
    bundled_tasks,
    load_task,
    split_task,
    write_bundled,
)
from headhunt.heads.interventions.act import ActConfig


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def tiny_task(path: Path, n: int = 30) -> Path:
    rng = np.random.default_rng(0)
    words = ["the", "a", "of", "and", "to", "in", "is", "was", "it", "for", "on", "that", "with"]
    rows = []
    for _ in range(n):
        lab = ["red", "blue", "green"][rng.integers(3)]
        rows.append(
            {
                "text": " ".join(rng.choice(words, 10)) + f" {lab}",
                "labels": ["red", "blue", "green"],
                "label": lab,
            }
        )
    return write_jsonl(path, rows)


def test_bundled_tasks_are_many_varied_balanced_and_reproducible(tmp_path):
    names = bundled_tasks()
    assert {"sentiment", "topic", "animals", "compare", "arithmetic"} <= set(names)
    for name in names:
        task = load_task(name)
        assert len(task.items) >= 400, name
        prompts = [it.prompt for it in task.items]
        assert len(set(prompts)) == len(prompts), f"{name} repeats an item"
        counts = Counter(it.answer for it in task.items)
        assert min(counts.values()) >= 0.3 * max(counts.values()), (name, counts)
    # The committed files are exactly what the generator writes.
    write_bundled(tmp_path)
    folder = resources.files("headhunt.heads") / "data" / "tasks"
    for name in names:
        assert (tmp_path / f"{name}.jsonl").read_text() == (folder / f"{name}.jsonl").read_text()


def test_formats_render_as_documented(tmp_path):
    cls = load_task(
        write_jsonl(
            tmp_path / "c.jsonl",
            [{"text": "great film", "labels": ["good", "bad"], "label": "bad", "id": 7}],
        )
    )
    assert cls.kind == "classification"
    item = cls.items[0]
    assert item.prompt.endswith("great film\nAnswer:") and "good, bad" in item.prompt
    assert item.choices == [" good", " bad"] and item.answer == 1
    mc = load_task(
        write_jsonl(
            tmp_path / "m.jsonl",
            [
                {"question": "2+2?", "options": ["3", "4"], "answer": "B"},
                {"question": "3+3?", "options": ["6", "5"], "answer": 0},
                {
                    "question": "1+1?",
                    "options": ["1", "2", "3"],
                    "answer": "2",
                    "instruction": "Hi",
                },
            ],
        )
    )
    assert mc.kind == "multiple_choice"
    assert [it.answer for it in mc.items] == [1, 0, 1]
    assert mc.items[0].prompt.endswith("2+2?\nA. 3\nB. 4\nAnswer:")
    assert mc.items[2].prompt.startswith("Hi\n\n") and mc.items[2].choices == [" A", " B", " C"]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (['{"text": "x", "labels": ["a", "b"], "label": "a"', ""], "line 1: not valid JSON"),
        ([{"text": "x", "labels": ["a", "b"], "label": "c"}], "label 'c' is not one of"),
        ([{"text": "x", "labels": ["a"], "label": "a"}], "at least 2 distinct"),
        ([{"text": "", "labels": ["a", "b"], "label": "a"}], "non-empty string 'text'"),
        ([{"question": "q", "options": ["a", "b"], "answer": "E"}], "is not an option"),
        (
            [
                {"text": "x", "labels": ["a", "b"], "label": "a"},
                {"question": "q", "options": ["a", "b"], "answer": 0},
            ],
            "mixes",
        ),
        (["", "  "], "holds no items"),
        (["[1, 2]"], "expected a JSON object"),
    ],
)
def test_bad_task_files(tmp_path, rows, message):
    with pytest.raises(HeadhuntError, match=message):
        load_task(write_jsonl(tmp_path / "bad.jsonl", rows))


def test_unknown_task_name():
    with pytest.raises(HeadhuntError, match="bundled: .*sentiment"):
        load_task("no-such-task")


def test_split_is_disjoint_seeded_and_checked():
    s = split_task(50, 10, 15, seed=3)
    assert len(s.calibration) == 10 and len(s.dev) == 15 and len(s.test) == 25
    assert not (set(s.calibration) & set(s.dev) or set(s.dev) & set(s.test))
    assert set(s.calibration) | set(s.dev) | set(s.test) == set(range(50))
    assert split_task(50, 10, 15, seed=3) == s and split_task(50, 10, 15, seed=4) != s
    assert len(split_task(50, 10, 15, n_test=5).test) == 5
    with pytest.raises(HeadhuntError, match="leave none"):
        split_task(20, 10, 10)


def test_encode_task_errors(tiny, tmp_path):
    same_first = write_jsonl(
        tmp_path / "s.jsonl", [{"text": "the", "labels": ["zebra", "yak"], "label": "yak"}]
    )
    with pytest.raises(HeadhuntError, match="start with the same token"):
        encode_task(tiny, load_task(same_first))  # both unknown words: one <unk> token
    long = write_jsonl(
        tmp_path / "l.jsonl",
        [{"text": "the " * (tiny.max_context + 5), "labels": ["red", "blue"], "label": "red"}],
    )
    with pytest.raises(HeadhuntError, match="more than the model's context"):
        encode_task(tiny, load_task(long))


def test_batched_right_padded_evaluation_equals_one_by_one(tiny, tmp_path):
    enc = encode_task(tiny, load_task(tiny_task(tmp_path / "t.jsonl", 12)))
    # Vary the lengths so the batch really is padded.
    enc.ids = [x[: 6 + i] for i, x in enumerate(enc.ids)]
    idx = list(range(12))
    for heads in ([], [(1, 0), (1, 3)]):
        batched = evaluate(tiny, enc, idx, heads=heads, batch_size=5)
        single = [evaluate(tiny, enc, [i], heads=heads, batch_size=1) for i in idx]
        np.testing.assert_allclose(
            batched.logprob, [s.logprob[0] for s in single], rtol=1e-4, atol=1e-5
        )
        assert batched.correct.tolist() == [int(s.correct[0]) for s in single]
    plain = evaluate(tiny, enc, idx)
    calibrated = evaluate(tiny, enc, idx, heads=[(1, 0), (1, 3)])
    assert np.abs(plain.logprob - calibrated.logprob).max() > 1e-4


def test_movable_mass_and_candidates(tiny, tmp_path):
    enc = encode_task(tiny, load_task(tiny_task(tmp_path / "t.jsonl", 8)))
    mass = movable_sink_mass(tiny, enc, list(range(8)), ActConfig(), layers=[1], batch_size=3)
    assert mass.shape == (2, 4) and (mass[0] == 0).all() and (mass[1] > 0).any()
    assert (mass <= 1).all()
    # Ranking: excluded layers and zero-mass heads never appear; largest first; capped.
    m = np.array([[0.9, 0.0, 0.2], [0.5, 0.0, 0.7], [0.1, 0.3, 0.0]])
    assert rank_candidates(m, excluded=[0], max_heads=3) == [(1, 2), (1, 0), (2, 1)]
    assert rank_candidates(m, excluded=[], max_heads=10)[0] == (0, 0)
    assert (1, 1) not in rank_candidates(m, excluded=[], max_heads=10)


def test_search_finds_the_planted_helpful_head():
    """A fake evaluator where the ground truth is known: head (5, 2) fixes 20 items in every
    split; (7, 1) fixes calibration items only by chance and breaks dev items; (3, 3) hurts."""
    calib, dev = list(range(0, 100)), list(range(100, 200))
    rng = np.random.default_rng(0)
    base = rng.random(300) < 0.6
    helped = set(np.flatnonzero(~base)[::2][:40].tolist())
    lucky = set(np.flatnonzero(~base)[1::2][:5].tolist())
    lucky = {i for i in lucky if i < 100}
    calls = []

    def fake(key, indices, heads, **extra):
        calls.append(key)
        correct = []
        for i in indices:
            ok = bool(base[i])
            if (5, 2) in heads and i in helped:
                ok = True
            if (7, 1) in heads and i in lucky:
                ok = True
            if (7, 1) in heads and i >= 100 and base[i] and i % 7 == 0:
                ok = False
            if (3, 3) in heads and i % 3 == 0:
                ok = False
            correct.append(int(ok))
        return {"acc": float(np.mean(correct)), "logprob": 0.0, "correct": correct}

    found = search_heads(fake, [(3, 3), (7, 1), (5, 2)], calib, dev)
    assert found.kept[0] == (5, 2) and (7, 1) in found.kept and (3, 3) not in found.kept
    assert found.chosen == [(5, 2)]
    assert [g["accepted"] for g in found.greedy] == [True, False]
    assert ("screen", 3, 3) in calls and ("greedy", 1) in calls


def test_paired_bootstrap():
    b = paired_bootstrap(np.zeros(50), np.ones(50), 500, 0)
    assert b.gain == 1.0 and b.gain_ci == (1.0, 1.0) and b.n == 50
    rng = np.random.default_rng(1)
    base = rng.random(300) < 0.6
    cal = base.copy()
    cal[:30] = True  # a real improvement on some items
    r = paired_bootstrap(base, cal, 2000, 0)
    assert r.gain_ci[0] > 0 and r.gain_ci[0] <= r.gain <= r.gain_ci[1]
    assert r.baseline_ci[0] < r.baseline < r.baseline_ci[1]
    same = paired_bootstrap(base, base, 500, 0)
    assert same.gain_ci == (0.0, 0.0)
    with pytest.raises(HeadhuntError):
        paired_bootstrap(np.zeros(3), np.zeros(4), 500, 0)


def test_config_round_trip_and_defaults():
    c = CalibrateConfig(max_heads=5, exclude_layers=[2])
    assert CalibrateConfig.from_dict(c.to_dict()) == c
    assert CalibrateConfig().excluded(30) == [0, 1, 29]
    with pytest.raises(HeadhuntError, match="beta"):
        CalibrateConfig(beta=2.0)


@pytest.mark.slow
def test_embedded_model_beats_chance_and_has_movable_sinks(smol):
    enc = encode_task(smol, load_task("sentiment"))
    idx = list(range(24))
    base = evaluate(smol, enc, idx, batch_size=12)
    assert base.accuracy > 0.6  # 2 labels: chance is 0.5 (measured 0.87 on 120 items)
    mass = movable_sink_mass(smol, enc, idx[:6], ActConfig(), layers=list(range(2, 29)))
    assert (mass[[0, 1, 29]] == 0).all() and (mass > 0.1).sum() > 20
    head = rank_candidates(mass, [0, 1, 29], 1)
    calibrated = evaluate(smol, enc, idx, heads=head, batch_size=12)
    assert not np.allclose(calibrated.logprob, base.logprob)
