"""Prompt pairs: built-in tasks rendered for a tokenizer, task files, and their errors."""

from __future__ import annotations

import json

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.probes.tiny import word_tokenizer
from headhunt.sae import prompt_pairs


@pytest.fixture(scope="module")
def words():
    return word_tokenizer(["mary", "john"])


def test_length_batches_groups_equal_lengths():
    seqs = [torch.arange(n) for n in (3, 5, 3, 3, 5)]
    got = list(prompt_pairs.length_batches(seqs, batch_size=2))
    assert [idx for idx, _ in got] == [[0, 2], [3], [1, 4]]
    for idx, ids in got:
        assert ids.shape == (len(idx), len(seqs[idx[0]]))


def test_continuation_id(words):
    assert prompt_pairs.continuation_id(words, "the red", " lamp") == words.convert_tokens_to_ids(
        "lamp"
    )
    assert prompt_pairs.continuation_id(words, "the red", " lamp lamp") is None


def test_encode_pairs_checks_answers_and_lengths(words):
    ok = prompt_pairs.PromptPair("the red gate", "the blue gate", [" lamp"], [" river"])
    enc = prompt_pairs.encode_pairs(words, [ok], require_aligned=True)
    assert enc.aligned and enc.has_answers and len(enc) == 1
    assert enc.positive[0][0] == words.bos_token_id
    two = prompt_pairs.PromptPair("the red", "the blue", [" lamp river"], [" river"])
    with pytest.raises(HeadhuntError, match="single token"):
        prompt_pairs.encode_pairs(words, [two], require_aligned=False)
    uneven = prompt_pairs.PromptPair("the red gate", "the gate", [" lamp"], [" river"])
    with pytest.raises(HeadhuntError, match="equal lengths"):
        prompt_pairs.encode_pairs(words, [uneven], require_aligned=True)
    assert not prompt_pairs.encode_pairs(words, [uneven], require_aligned=False).aligned


def test_tasks_that_cannot_render_say_why(words):
    with pytest.raises(HeadhuntError, match="names are single tokens"):
        prompt_pairs.make_pairs("ioi", words, 4)
    with pytest.raises(HeadhuntError, match="argument names"):
        prompt_pairs.make_pairs("docstring", words, 4)
    with pytest.raises(HeadhuntError, match="unknown task"):
        prompt_pairs.make_pairs("sorting", words, 4)
    with pytest.raises(HeadhuntError, match="at least one"):
        prompt_pairs.make_pairs("ioi", words, 0)


def test_task_file(tmp_path, words):
    f = tmp_path / "t.jsonl"
    rows = [
        {
            "positive": "the red gate",
            "negative": "the blue gate",
            "answer": " lamp",
            "wrong": [" river"],
        },
        {"positive": "a red day", "negative": "a blue day"},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    pairs = prompt_pairs.read_task_file(f)
    assert pairs[0].answer == [" lamp"] and pairs[0].wrong == [" river"]
    assert pairs[1].answer == [] and pairs[1].positive == "a red day"
    enc = prompt_pairs.encode_pairs(words, pairs, require_aligned=True)
    assert not enc.has_answers  # the second pair has none


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "bad.jsonl:1: not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"positive": "a"}', "'negative'"),
        ('{"positive": "a", "negative": ""}', "'negative'"),
        ('{"positive": "a", "negative": "b", "answer": 3, "wrong": "c"}', "'answer'"),
        ('{"positive": "a", "negative": "b", "answer": "x"}', "both"),
        ("\n", "no prompt pairs"),
    ],
)
def test_bad_task_files(tmp_path, text, match):
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(HeadhuntError, match=match):
        prompt_pairs.read_task_file(f)


def test_missing_task_file(tmp_path):
    with pytest.raises(HeadhuntError, match="no task file"):
        prompt_pairs.read_task_file(tmp_path / "nope.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("task", prompt_pairs.TASKS)
def test_builtin_tasks_render_for_the_embedded_tokenizer(smol, task):
    tok = smol.tokenizer
    a = prompt_pairs.make_pairs(task, tok, 12, seed=5)
    b = prompt_pairs.make_pairs(task, tok, 12, seed=5)
    assert [p.positive for p in a.pairs] == [p.positive for p in b.pairs]  # seeded
    assert len(a) == 12 and a.aligned and a.has_answers
    for p, pos, neg, ans, wrong in zip(
        a.pairs, a.positive, a.negative, a.answer, a.wrong, strict=True
    ):
        assert p.positive != p.negative
        assert int((pos != neg).sum()) >= 1
        assert not set(ans) & set(wrong)
        for c, tid in zip(p.answer, ans, strict=True):  # each answer is one token in context
            assert tok(p.positive + c, add_special_tokens=False).input_ids[-1] == tid


@pytest.mark.slow
def test_task_specifics_on_the_embedded_tokenizer(smol):
    tok = smol.tokenizer
    ioi = prompt_pairs.make_pairs("ioi", tok, 8, seed=1)
    for p in ioi.pairs:
        io, s = p.answer[0].strip(), p.wrong[0].strip()
        assert p.positive.count(s) == 2 and p.positive.count(io) == 1
        assert p.negative.count(s) == 1  # the repeated subject is replaced by a third name
    gt = prompt_pairs.make_pairs("greater-than", tok, 8, seed=1)
    for p in gt.pairs:
        start = int(p.positive.split("year ")[1][:4])
        assert p.negative.split("year ")[1][2:4] == "01"
        tens = (start % 100) // 10
        # SmolLM2 splits digits: the next token is the tens digit
        assert p.answer == [str(d) for d in range(tens + 1, 10)]
        assert p.wrong == [str(d) for d in range(tens)]
    ds = prompt_pairs.make_pairs("docstring", tok, 8, seed=1)
    for p in ds.pairs:
        assert p.positive.endswith(":param") and p.answer[0].strip() in p.positive.split("):")[0]
        assert p.wrong[0].strip() in p.negative.split("):")[0]
