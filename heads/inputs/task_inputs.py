"""Examples of a user's own task for :mod:`headhunt.heads.taskheads`: a JSONL reader, the bundled
tasks built offline from the bundled essays, and the token layout of one prompt.

A JSONL row is one example::

    {"context": "one text" | ["doc 1", "doc 2", ...], "question": "...", "answer": "...",
     "evidence": [0, 2],          # optional: which documents hold the answer (0-based)
     "lead": "The code is"}       # optional: the start of the answer, so the next tokens copy

Without ``evidence`` the documents holding the answer (case-insensitive) are the evidence; a
single text is cut into three pieces (before, the sentence holding the answer, after) so that
query focus and the write score have an evidence span and off-evidence keys.

The prompt is the model's chat template when it has one (the documents and the question in
the user turn, the answer in the assistant turn), else a plain "Question: ... Answer:" frame.
The gold answer is appended (teacher forcing). The null prompt (QRHead's calibration) is the
same prompt with the question replaced by "N/A".
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headhunt.errors import HeadhuntError
from headhunt.heads.inputs import task_closed_book as _closed_book

INSTRUCTION = "Read the documents and answer the question."
NULL_QUESTION = "N/A"  # QRHead's null query
TASKS = ("multidoc", "multidoc-hard", "kv", "needle")
_DOCS = "\u2063DOCS\u2063"
_QUESTION = "\u2063QUESTION\u2063"
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass
class Example:
    """One example as given: documents (a single text is one document with ``single``), the
    question, the gold answer, the evidence documents (None: located by the answer), an optional
    answer lead, and where it came from (``where``: "line N" of a JSONL, or the bundled id)."""

    id: str
    documents: list[str]
    question: str
    answer: str
    evidence: list[int] | None = None
    lead: str = ""
    single: bool = False
    where: str = ""


@dataclass
class Encoded:
    """The token layout of one example's teacher-forced and null prompts.

    Attributes:
        ids: prompt + gold answer (the teacher-forced sequence).
        null_ids: the same prompt with the question replaced by "N/A", without the answer.
        doc_spans: [start, end) of each document's tokens (the same in both sequences).
        evidence: indices of the evidence documents (pieces, for a single text).
        question, null_question: [start, end) of the question's tokens in each sequence.
        answer_start: index in ``ids`` of the first answer token; the answer runs to the end.
        texts: each document's text (for BM25).
    """

    id: str
    ids: list[int]
    null_ids: list[int]
    doc_spans: list[tuple[int, int]]
    evidence: list[int]
    question: tuple[int, int]
    null_question: tuple[int, int]
    answer_start: int
    texts: list[str] = field(default_factory=list)
    question_text: str = ""

    @property
    def answer_ids(self) -> list[int]:
        return self.ids[self.answer_start :]

    @property
    def context(self) -> tuple[int, int]:
        """[start, end) from the first document's first token to the last one's last."""
        return self.doc_spans[0][0], self.doc_spans[-1][1]


# ---------------------------------------------------------------- reading a user's JSONL


def read_examples(path: str | Path) -> list[Example]:
    """Examples of a JSONL file; a bad row is refused in one line naming its line number."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise HeadhuntError(f"cannot read {path}: {e}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise HeadhuntError(f"{path.name} line {n}: not JSON ({e.msg})") from None
        out.append(parse_row(row, f"{path.name} line {n}", str(n)))
    if not out:
        raise HeadhuntError(f"{path} has no examples")
    return out


def parse_row(row: Any, where: str, row_id: str) -> Example:
    """One JSONL row as an :class:`Example` (errors name ``where``)."""
    if not isinstance(row, dict):
        raise HeadhuntError(f"{where}: a row must be a JSON object")
    unknown = sorted(set(row) - {"context", "question", "answer", "evidence", "lead", "id"})
    if unknown:
        raise HeadhuntError(f"{where}: unknown field {unknown[0]!r}")
    for name in ("context", "question", "answer"):
        if name not in row or row[name] in (None, "", []):
            raise HeadhuntError(f"{where}: missing {name}")
    ctx = row["context"]
    single = isinstance(ctx, str)
    docs = [ctx] if single else ctx
    if not isinstance(docs, list) or not all(isinstance(d, str) and d.strip() for d in docs):
        raise HeadhuntError(f"{where}: context must be a text or a list of non-empty texts")
    for name in ("question", "answer", "lead"):
        if name in row and not isinstance(row[name], str):
            raise HeadhuntError(f"{where}: {name} must be a string")
    evidence = row.get("evidence")
    if evidence is not None:
        ok = isinstance(evidence, list) and evidence and all(isinstance(i, int) for i in evidence)
        if not ok or not all(0 <= i < len(docs) for i in evidence):
            raise HeadhuntError(
                f"{where}: evidence must list document indices in [0, {len(docs) - 1}]"
            )
        if single:
            raise HeadhuntError(f"{where}: evidence needs a list of documents, not one text")
    return Example(
        id=str(row.get("id", row_id)),
        documents=list(docs),
        question=row["question"].strip(),
        answer=row["answer"].strip(),
        evidence=evidence,
        lead=row.get("lead", "").strip(),
        single=single,
        where=where,
    )


# ---------------------------------------------------------------- the prompt's tokens


class Encoder:
    """Lays out examples for one tokenizer (chat template when it has one)."""

    def __init__(self, tokenizer, max_context: int, chat: bool | None = None):
        self.tok = tokenizer
        self.max_context = max_context
        self.chat = getattr(tokenizer, "chat_template", None) is not None if chat is None else chat
        user = f"{INSTRUCTION}\n\n{_DOCS}\n\nQuestion: {_QUESTION}"
        if self.chat:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
            )
        else:
            text = f"{user}\nAnswer:"
        before, rest = text.split(_DOCS)
        mid, after = rest.split(_QUESTION)
        bos = tokenizer.bos_token_id
        self.before = ([bos] if bos is not None and not self.chat else []) + self._enc(before)
        self.mid, self.after_text = self._enc(mid), after

    def _enc(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False).input_ids if text else []

    def pieces(self, ex: Example) -> tuple[list[str], list[int]]:
        """The context's pieces and which hold the evidence."""
        if ex.single:
            return _split_single(ex)
        if ex.evidence is not None:
            return ex.documents, sorted(set(ex.evidence))
        low = ex.answer.lower()
        found = [i for i, d in enumerate(ex.documents) if low in d.lower()]
        if not found:
            raise HeadhuntError(
                f"{ex.where or ex.id}: the answer is in no document (give evidence)"
            )
        return ex.documents, found

    def encode(self, ex: Example) -> Encoded:
        where = ex.where or f"example {ex.id}"
        texts, evidence = self.pieces(ex)
        ids, spans = list(self.before), []
        for i, text in enumerate(texts):
            label = "" if ex.single else f"Document [{i + 1}] "
            sep = "" if ex.single and i < len(texts) - 1 else "\n"
            piece = self._enc(("" if ex.single and i else label) + text + sep)
            spans.append((len(ids), len(ids) + len(piece)))
            ids += piece
        ids += self.mid
        prefix = list(ids)
        after = self._enc(self.after_text + (" " + ex.lead if ex.lead else ""))
        q = self._enc(ex.question)
        nq = self._enc(NULL_QUESTION)
        # The answer follows the lead after a space, unless the lead opens it (a quote).
        glued = ex.lead[-1:] in ('"', "'", "(", "[") if ex.lead else self.chat
        answer = self._enc(("" if glued else " ") + ex.answer)
        full = prefix + q + after + answer
        null = prefix + nq + after
        if len(full) > self.max_context:
            raise HeadhuntError(
                f"{where}: {len(full)} tokens, more than the model's context ({self.max_context})"
            )
        return Encoded(
            id=ex.id,
            ids=full,
            null_ids=null,
            doc_spans=spans,
            evidence=evidence,
            question=(len(prefix), len(prefix) + len(q)),
            null_question=(len(prefix), len(prefix) + len(nq)),
            answer_start=len(prefix) + len(q) + len(after),
            texts=texts,
            question_text=ex.question,
        )


def _split_single(ex: Example) -> tuple[list[str], list[int]]:
    """A single text as (before, the sentence holding the answer, after); evidence = 1."""
    text = ex.documents[0]
    at = text.lower().find(ex.answer.lower())
    if at < 0:
        raise HeadhuntError(f"{ex.where or ex.id}: the answer is not in the context")
    ends = [m.end() for m in SENTENCE_END.finditer(text)]
    start = max([e for e in ends if e <= at], default=0)
    stop = min([m.start() for m in SENTENCE_END.finditer(text) if m.start() >= at + len(ex.answer)],
               default=len(text))  # fmt: skip
    stop = min(len(text), stop + 1)
    pieces = [text[:start], text[start:stop], text[stop:]]
    keep = [i for i, p in enumerate(pieces) if p]
    return [pieces[i] for i in keep], [keep.index(1)]


# ---------------------------------------------------------------- bundled tasks

FIRST = ["Arlo", "Bea", "Cyrus", "Dana", "Elio", "Fern", "Gus", "Hana", "Ivo", "Juno", "Kai"]
FIRST += ["Lena", "Milo", "Nora", "Otto", "Pia", "Rafe", "Sora", "Tess", "Umar", "Vera"]
LAST = ["Penwick", "Harlow", "Quill", "Marsh", "Thorne", "Ashby", "Vance", "Rook", "Sterling"]
LAST += ["Fairley", "Cobb", "Lark", "Wren", "Holt", "Dale", "Stroud"]
# City names: words the small models spell in one or two tokens and answer well (pets and
# fruits, tried on SmolLM2-135M, drew articles and misspellings instead).
ATTRIBUTES = {
    "home city": ["Lisbon", "Oslo", "Kyoto", "Cairo", "Lima", "Dublin", "Hanoi", "Vienna"],
    "favourite city": ["Perth", "Porto", "Quito", "Seville", "Bergen", "Nairobi", "Montreal"],
}


def _sentences(haystack: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(haystack) if len(s.split()) >= 4]


def _paragraph(sentences: list[str], words: int, rng: random.Random) -> list[str]:
    """Consecutive sentences from a random start, about ``words`` words."""
    start = rng.randrange(len(sentences))
    out, n = [], 0
    while n < words:
        s = sentences[(start + len(out)) % len(sentences)]
        out.append(s)
        n += len(s.split())
    return out


def _insert(sentences: list[str], fact: str, rng: random.Random) -> str:
    at = rng.randrange(len(sentences) + 1)
    return " ".join(sentences[:at] + [fact] + sentences[at:])


def multidoc(n: int, docs: int, words: int, seed: int, haystack: str) -> list[Example]:
    """Multi-document QA with planted facts: one document states the asked person's attribute,
    the others state the same attribute of other people (distractors), all inside essay
    paragraphs; the evidence document's place is drawn uniformly."""
    sents = _sentences(haystack)
    out = []
    for i in range(n):
        rng = random.Random(f"multidoc/{seed}/{i}")
        attr = rng.choice(sorted(ATTRIBUTES))
        people = rng.sample([f"{f} {last}" for f in FIRST for last in LAST], docs)
        values = [rng.choice(ATTRIBUTES[attr]) for _ in people]
        ask = rng.randrange(docs)
        others = [v for v in ATTRIBUTES[attr] if v != values[ask]]
        values = [v if j == ask or v != values[ask] else rng.choice(others)
                  for j, v in enumerate(values)]  # fmt: skip
        texts = [
            _insert(_paragraph(sents, words, rng), f"The {attr} of {p} is {v}.", rng)
            for p, v in zip(people, values, strict=True)
        ]
        out.append(
            Example(
                id=f"multidoc-{i}",
                documents=texts,
                question=f"What is the {attr} of {people[ask]}?",
                answer=values[ask],
                evidence=[ask],
                lead=f"The {attr} of {people[ask]} is",
            )
        )
    return out


# How the hard set asks for each attribute: no word of the attribute's name, so a lexical
# retriever sees only the person's name, which a distractor document shares.
PARAPHRASES = {
    "home city": "Where does {p} live?",
    "favourite city": "Which place does {p} like best?",
}


def multidoc_hard(n: int, docs: int, words: int, seed: int, haystack: str) -> list[Example]:
    """Multi-document QA that word overlap does not solve: the question is a paraphrase with no
    word of the attribute's name ("Where does Bea Quill live?" for the home city), and the
    distractors share words with it. One document states the asked person's other attribute
    (the same full name: a lexical tie with the evidence), one each a person with the same
    first name and one with the same surname (the asked attribute, another city), the rest
    other people; all cities differ from the answer. The lead is the fact's start ("The home
    city of Bea Quill is"), so the answer is a copy once the right document is found."""
    if docs < 2:
        raise HeadhuntError("multidoc-hard needs --docs 2 or more")
    sents = _sentences(haystack)
    out = []
    for i in range(n):
        rng = random.Random(f"multidoc-hard/{seed}/{i}")
        attr = rng.choice(sorted(ATTRIBUTES))
        other_attr = next(a for a in sorted(ATTRIBUTES) if a != attr)
        first, last = rng.choice(FIRST), rng.choice(LAST)
        person = f"{first} {last}"
        answer = rng.choice(ATTRIBUTES[attr])
        others = [v for v in ATTRIBUTES[attr] if v != answer]
        facts = [(attr, person, answer), (other_attr, person, rng.choice(ATTRIBUTES[other_attr]))]
        namesakes = [f"{first} {rng.choice([x for x in LAST if x != last])}",
                     f"{rng.choice([x for x in FIRST if x != first])} {last}"]  # fmt: skip
        facts += [(attr, p, rng.choice(others)) for p in namesakes]
        strangers = [f"{f} {s}" for f in FIRST for s in LAST if f != first and s != last]
        for p in rng.sample(strangers, max(0, docs - len(facts))):
            a = rng.choice(sorted(ATTRIBUTES))
            facts.append((a, p, rng.choice([v for v in ATTRIBUTES[a] if v != answer])))
        facts = facts[:docs]
        rng.shuffle(facts)
        texts = [_insert(_paragraph(sents, words, rng), f"The {a} of {p} is {v}.", rng)
                 for a, p, v in facts]  # fmt: skip
        out.append(
            Example(
                id=f"multidoc-hard-{i}",
                documents=texts,
                question=PARAPHRASES[attr].format(p=person),
                answer=answer,
                evidence=[facts.index((attr, person, answer))],
                lead=f"The {attr} of {person} is",
            )
        )
    return out


def key_value(n: int, pairs: int, seed: int) -> list[Example]:
    """Key-value retrieval (Liu et al. 2023, Lost in the Middle): a JSON object of random
    hexadecimal keys and values, one pair per document; the question gives a key."""
    out = []
    for i in range(n):
        rng = random.Random(f"kv/{seed}/{i}")
        keys: list[str] = []
        while len(keys) < pairs:
            k = "".join(rng.choice("0123456789abcdef") for _ in range(6))
            if k not in keys:
                keys.append(k)
        values = ["".join(rng.choice("0123456789abcdef") for _ in range(6)) for _ in keys]
        ask = rng.randrange(pairs)
        texts = [f'"{k}": "{v}",' for k, v in zip(keys, values, strict=True)]
        out.append(
            Example(
                id=f"kv-{i}",
                documents=texts,
                question=f'Extract the value corresponding to the key "{keys[ask]}".',
                answer=values[ask],
                evidence=[ask],
                lead=f'"{keys[ask]}": "',
            )
        )
    return out


def needle(n: int, words: int, seed: int, haystack: str) -> list[Example]:
    """The retrieval method's needles (:data:`headhunt.heads.inputs.needles.NEEDLES`) in one essay
    stretch of about ``words`` words, at a uniform depth."""
    from headhunt.heads.inputs.needles import NEEDLES

    sents = _sentences(haystack)
    names = sorted(NEEDLES)
    out = []
    for i in range(n):
        rng = random.Random(f"needle/{seed}/{i}")
        sentence, question, lead, answer = NEEDLES[names[i % len(names)]].draw(rng)
        text = _insert(_paragraph(sents, words, rng), sentence, rng)
        out.append(Example(f"needle-{i}", [text], question, answer, None, lead, True))
    return out


def bundled(task: str, n: int, docs: int, words: int, seed: int) -> list[Example]:
    """``n`` examples of a bundled task (see :data:`TASKS`)."""
    from headhunt.heads.inputs.needles import default_haystack_text

    if task == "multidoc":
        return multidoc(n, docs, words, seed, default_haystack_text())
    if task == "multidoc-hard":
        return multidoc_hard(n, docs, words, seed, default_haystack_text())
    if task == "kv":
        return key_value(n, docs, seed)
    if task == "needle":
        return needle(n, words * docs, seed, default_haystack_text())
    raise HeadhuntError(f"unknown task {task!r} (use {', '.join(TASKS)})")


# Closed-book prompts for the specificity control (evaluated) and its reference set (never
# evaluated: a mean ablation of the closed-book prompts puts in each head's mean output over
# these, the "mean over a reference set of the same task"; the task's mean, taken over
# long prompts with documents, is off-distribution in a 10-token prompt). Why a few hundred:
# headhunt.heads.inputs.task_closed_book.
CLOSED_BOOK = _closed_book.CLOSED_BOOK
CLOSED_BOOK_REFERENCE = _closed_book.CLOSED_BOOK_REFERENCE


def closed_book_ids(tokenizer, prompts=None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of the closed-book prompts (default: the evaluated ones), as
    plain text (no template)."""
    bos = tokenizer.bos_token_id
    out = []
    for prompt, answer in CLOSED_BOOK if prompts is None else prompts:
        p = tokenizer(prompt, add_special_tokens=False).input_ids
        a = tokenizer(" " + answer, add_special_tokens=False).input_ids
        out.append((([bos] if bos is not None else []) + p, a))
    return out
