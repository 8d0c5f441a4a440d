"""The RULER-like set: exact lengths, the answers really are in the prompt, RULER's scoring."""

import pytest

from headhunt.errors import HeadhuntError
from headhunt.heads.inputs.needles import default_haystack_text
from headhunt.heads.inputs.ruler import TASKS, TaskTrial, build_ruler
from headhunt.probes.tiny import word_tokenizer


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer()


def test_tasks_have_exact_lengths_and_answers_in_the_prompt(tok):
    from collections import Counter

    hay = default_haystack_text()
    trials = build_ruler(tok, hay, [300, 500], repeats=2, seed=1)
    assert len(trials) == len(TASKS) * 2 * 2
    assert all(len(t.input_ids) == t.length for t in trials)
    real = build_ruler(_gpt2_like(), hay, [400], repeats=1)  # a tokenizer that knows the words
    for t in real:
        text = _gpt2_like().decode(t.input_ids)
        if t.task == "vt":  # random variable names are unknown words here: count the chain
            assert text.count("VAR") == 4 and len(set(t.answers)) == 4
            continue
        for a in t.answers:  # the word tokenizer splits digits: compare without spaces
            assert a in text.replace(" ", ""), (t.task, a)
        if t.task == "cwe":
            counts = Counter(text.split())
            top = {w for w, _ in counts.most_common(40)}
            assert set(t.answers) <= top
    assert build_ruler(tok, hay, [300], seed=1)[0].input_ids == trials[0].input_ids


def _gpt2_like():
    """A word tokenizer whose vocabulary covers the haystack (words, digits, capitals)."""
    import re
    import string

    hay = default_haystack_text()
    words = sorted(set(re.findall(r"[A-Za-z]+", hay)))
    from headhunt.heads.inputs.needles import CITIES

    extra = words + CITIES + list(string.ascii_uppercase) + ["VAR", "="]
    return word_tokenizer(extra_words=extra)


def test_scoring_is_string_match_all():
    t = TaskTrial("x", "mv_niah", 10, [], ["123456", "654321"])
    assert t.score("The numbers are 123456 and 111.") == 0.5
    assert TaskTrial("y", "needle", 10, [], ["blue red"]).score("red blue") == 1.0


def test_too_short_and_unknown_tasks_are_refused(tok):
    with pytest.raises(HeadhuntError, match="unknown task"):
        build_ruler(tok, default_haystack_text(), [300], tasks=["qa"])
    with pytest.raises(HeadhuntError, match="too short"):
        build_ruler(tok, default_haystack_text(), [20], tasks=["mk_niah"])
