"""Task inputs: the JSONL rows (refused with their line number), the prompt's token layout, the
bundled tasks."""

from __future__ import annotations

import json

import pytest

from headhunt.errors import HeadhuntError
from headhunt.heads.inputs import task_inputs as T
from headhunt.probes.tiny import word_tokenizer

GOOD = {"context": ["the code is blue .", "it was a sunny day ."], "question": "what is the code ?",
        "answer": "blue"}  # fmt: skip


def write(tmp_path, rows) -> str:
    path = tmp_path / "task.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "line 2: not JSON"),
        ({**GOOD, "answer": ""}, "line 2: missing answer"),
        ({k: v for k, v in GOOD.items() if k != "question"}, "line 2: missing question"),
        ({**GOOD, "context": ["ok", ""]}, "line 2: context must be"),
        ({**GOOD, "evidence": [5]}, "line 2: evidence must list document indices in [0, 1]"),
        ({**GOOD, "colour": 1}, "line 2: unknown field 'colour'"),
        ([1, 2], "line 2: a row must be a JSON object"),
    ],
)
def test_a_bad_row_is_refused_with_its_line(tmp_path, bad, message):
    with pytest.raises(HeadhuntError, match=message.replace("[", r"\[").replace("]", r"\]")):
        T.read_examples(write(tmp_path, [GOOD, bad]))


def test_layout_of_a_prompt_and_its_null_twin(tmp_path):
    tok = word_tokenizer()
    (ex,) = T.read_examples(write(tmp_path, [GOOD]))
    enc = T.Encoder(tok, 512).encode(ex)
    assert enc.evidence == [0]  # located by the answer
    assert tok.decode(enc.ids[slice(*enc.doc_spans[0])]).endswith("the code is blue .")
    assert tok.decode(enc.ids[slice(*enc.question)]) == "what is the code ?"
    assert tok.decode(enc.answer_ids) == "blue"
    assert enc.ids[: enc.question[0]] == enc.null_ids[: enc.question[0]]  # docs shared
    assert enc.null_ids[enc.null_question[1] :] == enc.ids[enc.question[1] : enc.answer_start]
    with pytest.raises(HeadhuntError, match="line 1: .* tokens, more than the model's context"):
        T.Encoder(tok, 20).encode(ex)
    missing = T.Example("x", ["a b c"], "q", "blue", where="line 7")
    with pytest.raises(HeadhuntError, match="line 7: the answer is in no document"):
        T.Encoder(tok, 512).encode(missing)


def test_a_single_text_is_cut_around_the_answers_sentence():
    text = "it was a sunny day . the code is blue . read the answer ."
    ex = T.Example("s", [text], "what is the code ?", "blue", single=True)
    pieces, evidence = T.Encoder(word_tokenizer(), 512).pieces(ex)
    assert pieces[evidence[0]].strip() == "the code is blue ." and "".join(pieces) == text


@pytest.mark.parametrize("task", T.TASKS)
def test_bundled_tasks_hold_their_answer_in_the_evidence(task):
    examples = T.bundled(task, 4, 5, 30, seed=1)
    assert len({e.id for e in examples}) == 4
    for ex in examples:
        pieces, evidence = T.Encoder(word_tokenizer(), 10_000).pieces(ex)
        assert all(ex.answer.lower() in pieces[i].lower() for i in evidence)
        if task != "needle":
            assert len(pieces) == 5
            others = [p for i, p in enumerate(pieces) if i not in evidence]
            assert all(f" {ex.answer}." not in p and f'"{ex.answer}"' not in p for p in others)
    assert [e.answer for e in T.bundled(task, 4, 5, 30, seed=1)] == [e.answer for e in examples]
