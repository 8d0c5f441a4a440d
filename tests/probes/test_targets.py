"""Probe targets: labels recomputed independently from the built token ids."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from headhunt.errors import HeadhuntError
from headhunt.probes.targets import (
    MQAR_KEYS,
    MQAR_VALUES,
    NGRAM_WORDS,
    jsonl_target,
    mqar_target,
    needle_target,
    ngram_labels,
    ngram_target,
    word_ids,
)
from headhunt.probes.tiny import word_tokenizer


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(extra_words=sorted(set(NGRAM_WORDS + MQAR_KEYS + MQAR_VALUES)))


def brute_force(seq, k, stat):
    """Direct definition: scan all earlier k-gram occurrences for every position."""
    out = []
    for t in range(k - 1, len(seq)):
        ctx = seq[t - k + 1 : t + 1]
        nxt = [seq[j + 1] for j in range(k - 1, t) if seq[j - k + 1 : j + 1] == ctx]
        if not nxt:
            continue
        counts = Counter(nxt)
        if stat == "argmax":
            best = max(counts.values())
            winners = [w for w, c in counts.items() if c == best]
            if len(winners) == 1:
                out.append((t, float(winners[0])))
        elif t + 1 < len(seq):
            out.append((t, counts[seq[t + 1]] / len(nxt)))
    return out


def test_ngram_labels_by_hand_and_against_brute_force():
    # 0 is followed by 1, then 2 (a tie at t=4), then 1 again; 1 is followed by 0.
    assert ngram_labels([0, 1, 0, 2, 0, 1, 0], 1, "argmax") == [(2, 1.0), (5, 0.0), (6, 1.0)]
    assert ngram_labels([0, 1, 0, 2, 0, 1, 0], 1, "freq") == [(2, 0.0), (4, 0.5), (5, 1.0)]
    # (5, 6) was followed by 7; at t=7 by 7 and 8: a tie.
    assert ngram_labels([5, 6, 7, 5, 6, 8, 5, 6], 2, "argmax") == [(4, 7.0)]
    rng = np.random.default_rng(0)
    for _ in range(20):
        seq = rng.integers(4, size=60).tolist()
        for k in (1, 2, 3):
            for stat in ("argmax", "freq"):
                assert ngram_labels(seq, k, stat) == brute_force(seq, k, stat)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_ngram_target_labels_match_its_token_ids(tok, k):
    target = ngram_target(tok, k=k, n_texts=12, length=50, positions_per_text=5, seed=3)
    ids = word_ids(tok, NGRAM_WORDS)
    assert target.task == "classification" and target.classes == NGRAM_WORDS
    contexts = {}
    for text in target.texts:
        assert text.input_ids[0] == tok.bos_token_id and len(text.input_ids) == 51
        seq = [ids.index(t) for t in text.input_ids[1:]]
        expected = dict(brute_force(seq, k, "argmax"))
        assert len(text.positions) == min(5, len(expected))
        for p, y, ty in zip(text.positions, text.labels, text.types, strict=True):
            assert expected[p - 1] == y
            ctx = tuple(seq[p - k : p])
            assert contexts.setdefault(ty, ctx) == ctx  # one type per k-gram context
    labels, groups, types = target.arrays()
    assert len(labels) == len(groups) == len(types) == sum(len(t.positions) for t in target.texts)
    rows = list(target.rows())
    assert rows[0] == (target.texts[0].id, target.texts[0].positions[0], target.texts[0].labels[0])
    again = ngram_target(tok, k=k, n_texts=12, length=50, positions_per_text=5, seed=3)
    assert [t.input_ids for t in again.texts] == [t.input_ids for t in target.texts]


@pytest.mark.parametrize("build", ["ngram", "mqar"])
def test_builtin_targets_control_stays_below_a_probe_that_reads_the_label(tok, build):
    """States made as a model that has the property would hold them (the read token's
    embedding plus a direction per label): the target's own control stays far below the probe,
    while the Hewitt & Liang control memorises the few context / key types and reaches the
    probe (why it is not the reference)."""
    from headhunt.probes.linear import ProbeConfig, Prober

    if build == "ngram":
        target = ngram_target(tok, n_texts=80, length=60, seed=1)
    else:
        target = mqar_target(tok, n_texts=60, seed=1)
    assert target.control == "within_type" and target.control_why
    labels, groups, types = target.arrays()
    rng = np.random.default_rng(0)
    emb, lab = rng.normal(size=(types.max() + 1, 24)) * 3, rng.normal(size=(8, 24))
    x = emb[types] + 1.2 * lab[labels] + rng.normal(size=(len(labels), 24))
    prober = Prober(labels, groups, types, ProbeConfig(controls=["control"], grid=[1e-2, 1e-1]))
    assert prober.config.selectivity_vs == target.control  # "auto" picks the target's control
    m = prober.fit(x, 0).metrics
    assert m["accuracy"] > 0.6
    assert m["within_type"] < m["accuracy"] - 0.3 and m["selectivity"] > 0.3
    assert m["control"] > m["accuracy"] - 0.1


def test_jsonl_control_follows_how_often_tokens_repeat(tok, tmp_path):
    rows = [{"text": f"the river {i}", "position": 2, "label": i % 2} for i in range(6)]
    assert jsonl_target(write_jsonl(tmp_path / "r.jsonl", rows), tok).control == "within_type"
    words = ["river", "lamp", "red", "blue", "city", "park"]
    rows = [{"text": f"a {w}", "position": 2, "label": i % 2} for i, w in enumerate(words)]
    assert jsonl_target(write_jsonl(tmp_path / "u.jsonl", rows), tok).control == "shuffled"


def test_ngram_freq_is_a_regression(tok):
    target = ngram_target(tok, k=2, stat="freq", n_texts=5, length=40)
    labels, _, _ = target.arrays()
    assert target.task == "regression" and target.classes is None
    assert labels.min() >= 0 and labels.max() <= 1 and len(set(labels)) > 2


@pytest.mark.parametrize("layout", ["kv", "zoology"])
def test_mqar_labels_are_the_bound_values(tok, layout):
    target = mqar_target(tok, n_texts=10, n_pairs=5, seq_len=32, layout=layout, seed=1)
    key_ids, value_ids = word_ids(tok, MQAR_KEYS), word_ids(tok, MQAR_VALUES)
    colon = tok(":", add_special_tokens=False).input_ids[0]
    assert target.classes == MQAR_VALUES
    for text in target.texts:
        ids = text.input_ids
        assert ids[0] == tok.bos_token_id
        # The context: the first five keys of the text, each followed by its value.
        keys_seen = [i for i, t in enumerate(ids) if t in key_ids]
        bound = {}
        for i in keys_seen[:5]:
            v = ids[i + 2] if layout == "kv" else ids[i + 1]
            bound[ids[i]] = v
        assert len(bound) == 5 and len(set(bound.values())) == 5
        assert len(text.positions) == 5
        for p, y, ty in zip(text.positions, text.labels, text.types, strict=True):
            key = ids[p - 1] if layout == "kv" else ids[p]
            if layout == "kv":
                assert ids[p] == colon
            assert key_ids[ty] == key
            assert value_ids[int(y)] == bound[key]
        assert sorted(key_ids[t] for t in text.types) == sorted(bound)


@pytest.mark.slow
def test_needle_depth_bins_on_the_embedded_tokenizer(smol):
    tok = smol.tokenizer
    target = needle_target(tok, n_texts=40, length=192, bins=4, seed=0)
    labels, _, types = target.arrays()
    assert sorted(Counter(labels.tolist()).values()) == [10, 10, 10, 10]
    assert target.control == "shuffled"  # one row per prompt: nothing to shuffle within
    assert len(set(types)) == 40
    agree = 0
    for text, y in zip(target.texts, labels, strict=True):
        assert len(text.input_ids) == 192
        (p,) = text.positions
        assert tok.decode([text.input_ids[p]]).strip() == "?"
        # Independent depth, in characters of the decoded prompt.
        prompt = tok.decode(text.input_ids)
        start = prompt.index("Document:\n") + len("Document:\n")
        end = prompt.rindex("\n\nQuestion:")
        needle = next(
            s
            for s in ("The secret passkey", "The best thing to do", "The magic words")
            if s in prompt[start:end]
        )
        at = prompt.index(needle, start)
        sentence = prompt.index(".", at) + 1 - at
        depth = (at - start) / (end - start - sentence)
        agree += min(int(depth * 4), 3) == y
    assert agree >= 36  # token and character fractions differ slightly near bin edges
    last = needle_target(tok, n_texts=5, length=192, position="last")
    assert all(t.positions == [191] for t in last.texts)


def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_positions_substrings_and_classes(tok, tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"text": "the river is blue", "position": 2, "label": "noun"},
            {"text": "the river is blue", "substring": "is blu", "label": "adj"},
            {"text": "a red lamp", "position": -1, "label": "noun"},
            "",
            {"text": "a red lamp", "substring": "red", "label": "adj"},
        ],
    )
    target = jsonl_target(path, tok)
    assert target.task == "classification" and target.classes == ["adj", "noun"]
    assert len(target.texts) == 2
    river, lamp = target.texts
    assert river.input_ids[0] == tok.bos_token_id
    assert tok.convert_ids_to_tokens(river.input_ids)[river.positions[0]] == "river"
    assert tok.convert_ids_to_tokens(river.input_ids)[river.positions[1]] == "blue"
    assert lamp.positions == [3, 2] and lamp.labels == [1.0, 0.0]
    assert river.types == [river.input_ids[p] for p in river.positions]

    ints = write_jsonl(
        tmp_path / "i.jsonl",
        [{"text": "a b", "position": 1, "label": v} for v in (1, 1.0, 2)],
    )
    assert jsonl_target(ints, tok).classes == ["1", "2"]
    floats = write_jsonl(
        tmp_path / "f.jsonl",
        [{"text": "a b", "position": 1, "label": v} for v in (0.5, 1.25, 2)],
    )
    assert jsonl_target(floats, tok).task == "regression"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"text": "the river", "position": 3, "label": 1}, "position 3 is outside"),
        ({"text": "the river", "position": -4, "label": 1}, "position -4 is outside"),
        ({"text": "the river", "substring": "lamp", "label": 1}, "not in the text"),
        ({"text": "the river", "label": 1}, "exactly one of"),
        ({"text": "the river", "position": 1}, '"label"'),
        ({"text": "the river", "position": "1", "label": 1}, "must be an integer"),
        ({"text": "the river", "position": 1, "label": [1]}, "label must be"),
        ("{not json", "not valid JSON"),
    ],
)
def test_jsonl_errors_name_the_line(tok, tmp_path, row, message):
    good = {"text": "a lamp", "position": 1, "label": 0}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(HeadhuntError, match=message) as e:
        jsonl_target(path, tok)
    assert "bad.jsonl:2" in str(e.value) and "\n" not in str(e.value)


def test_builder_errors(tok, tmp_path):
    with pytest.raises(HeadhuntError, match="not a single token"):
        ngram_target(tok, words=["river", "lamp", "xylophone"], branch=2)
    with pytest.raises(HeadhuntError, match="k must be"):
        ngram_target(tok, k=0)
    with pytest.raises(HeadhuntError, match="n_pairs"):
        mqar_target(tok, n_pairs=8)
    with pytest.raises(HeadhuntError, match="disjoint"):
        mqar_target(tok, filler=["red"])
    with pytest.raises(HeadhuntError, match="cannot read"):
        jsonl_target(tmp_path / "missing.jsonl", tok)
    with pytest.raises(HeadhuntError, match="no rows"):
        jsonl_target(write_jsonl(tmp_path / "e.jsonl", [""]), tok)
    with pytest.raises(HeadhuntError, match="unknown needles"):
        needle_target(tok, needles=["nope"])
