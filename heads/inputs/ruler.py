"""A RULER-like long-context task set built from the bundled haystack (Hsieh et al. 2024, RULER).

Four of RULER's synthetic task kinds, at exact token lengths (so trials of one length batch
without padding) and scored as RULER scores them (``string_match_all``: the share of the
expected strings found in the response, case-insensitive):

- ``mk_niah`` (multi-key needles): four "special magic number" needles with different keys; the
  question asks for one key's number.
- ``mv_niah`` (multi-value needles): four numbers for the same key; all four are asked for.
- ``vt`` (variable tracking): ``VAR A = 12345.`` then ``VAR B = A.``, ... (a chain of four
  variables spread over the haystack); the answer is every variable holding the number.
- ``cwe`` (common words): a numbered list of words from the haystack's vocabulary where three
  words appear many times and the rest once; the answer is the three common words.

Needle-in-a-haystack trials from :mod:`headhunt.heads.inputs.needles` join the set as task
``needle``, scored by ROUGE-1 recall of the answer as in :mod:`headhunt.heads.retrieval`.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass

from headhunt.errors import HeadhuntError
from headhunt.heads.inputs.needles import CITIES, NeedleTrial, TrialBuilder, rouge1_recall

TASKS = ("mk_niah", "mv_niah", "vt", "cwe")
# Decoding budget per task: long enough for every expected string of the task.
MAX_NEW_TOKENS = {"needle": 24, "mk_niah": 16, "mv_niah": 48, "vt": 32, "cwe": 24}


@dataclass
class TaskTrial:
    """One prompt of the set.

    Attributes:
        id: stable identifier (task, length, repeat).
        task: ``needle`` or one of :data:`TASKS`.
        input_ids: the prompt, exactly ``length`` tokens.
        answers: the strings the response must contain.
    """

    id: str
    task: str
    length: int
    input_ids: list[int]
    answers: list[str]

    def score(self, response: str) -> float:
        """Needles: ROUGE-1 recall of the answer; RULER tasks: share of answers found."""
        if self.task == "needle":
            return rouge1_recall(self.answers[0], response)
        low = response.lower()
        return sum(a.lower() in low for a in self.answers) / len(self.answers)


def from_needles(trials: list[NeedleTrial]) -> list[TaskTrial]:
    """Needle trials as task ``needle``."""
    return [TaskTrial(t.id, "needle", t.length, t.input_ids, [t.answer]) for t in trials]


def _number(rng: random.Random) -> str:
    return str(rng.randrange(100_000, 1_000_000))


def _variable(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(4))


class RulerBuilder:
    """Builds the tasks for one tokenizer and haystack (reusing the needle trial framing)."""

    def __init__(self, tokenizer, haystack: str):
        self.base = TrialBuilder(tokenizer, haystack)
        words = re.findall(r"\b[a-z]{4,9}\b", haystack)
        self.words = sorted(set(words))
        if len(self.words) < 50:
            raise HeadhuntError("the haystack has too few distinct words for the cwe task")

    def _encode(self, text: str) -> list[int]:
        return self.base._encode(text)

    def _embed(
        self, length: int, sentences: list[str], question: str, lead: str, rng: random.Random
    ) -> list[int]:
        """Frame + haystack with ``sentences`` inserted in order at random sentence starts."""
        before, after = self.base.frame(question, lead)
        inserts = [self._encode(" " + s) for s in sentences]
        n_hay = length - len(before) - len(after) - sum(map(len, inserts))
        if n_hay < 1:
            raise HeadhuntError(f"length {length} is too short for the task's prompt")
        hay = self.base.hay
        if n_hay > len(hay):
            raise HeadhuntError(
                f"the haystack has {len(hay)} tokens; a {length}-token task needs {n_hay}"
            )
        starts = [p for p in self.base.starts if p + n_hay <= len(hay)] or [0]
        start = rng.choice(starts)
        local = [p - start for p in self.base.starts if start <= p < start + n_hay] or [0]
        points = sorted(rng.choice(local) for _ in inserts)
        ids, prev = list(before), 0
        for point, ins in zip(points, inserts, strict=True):
            ids += hay[start + prev : start + point] + ins
            prev = point
        ids += hay[start + prev : start + n_hay] + after
        assert len(ids) == length
        return ids

    def mk_niah(self, length: int, rng: random.Random) -> tuple[list[int], list[str]]:
        keys = rng.sample(CITIES, 4)
        values = [_number(rng) for _ in keys]
        sentences = [
            f"The special magic number for {k} is {v}." for k, v in zip(keys, values, strict=True)
        ]
        rng.shuffle(sentences)
        ask = rng.randrange(4)
        q = f"What is the special magic number for {keys[ask]}?"
        lead = f"The special magic number for {keys[ask]} is"
        return self._embed(length, sentences, q, lead, rng), [values[ask]]

    def mv_niah(self, length: int, rng: random.Random) -> tuple[list[int], list[str]]:
        key = rng.choice(CITIES)
        values = [_number(rng) for _ in range(4)]
        sentences = [f"One of the special magic numbers for {key} is {v}." for v in values]
        q = f"What are all the special magic numbers for {key}?"
        lead = f"The special magic numbers for {key} are"
        return self._embed(length, sentences, q, lead, rng), values

    def vt(self, length: int, rng: random.Random) -> tuple[list[int], list[str]]:
        value = _number(rng)
        names = []
        while len(names) < 4:
            name = _variable(rng)
            if name not in names:
                names.append(name)
        sentences = [f"VAR {names[0]} = {value}."]
        sentences += [f"VAR {b} = {a}." for a, b in zip(names, names[1:], strict=False)]
        q = f"Find all variables that are assigned the value {value}."
        lead = f"The variables assigned the value {value} are:"
        return self._embed(length, sentences, q, lead, rng), names

    def cwe(self, length: int, rng: random.Random) -> tuple[list[int], list[str]]:
        q = "What are the three most common words in the list above?"
        lead = "The three most common words in the list are:"
        before, after = self.base.frame(q, lead)
        room = length - len(before) - len(after)
        pool = rng.sample(self.words, len(self.words))
        common, rare = pool[:3], pool[3:]
        n_items = max(12, room // 4)  # about four tokens per numbered item
        repeats = max(3, n_items // 12)  # the three common words fill about a quarter
        items = common * repeats + rare[: max(0, n_items - 3 * repeats)]
        rng.shuffle(items)
        body: list[int] = []
        shown = []
        for i, w in enumerate(items):
            piece = self._encode(f" {i + 1}. {w}")
            if len(body) + len(piece) > room:
                break
            body += piece
            shown.append(w)
        counts = sorted((shown.count(w) for w in set(shown)), reverse=True)
        if len(counts) < 4 or counts[2] <= counts[3]:
            raise HeadhuntError(f"length {length} is too short for the cwe task")
        filler = self.base.hay[: room - len(body)]  # a few haystack tokens make the length exact
        ids = before + filler + body + after
        if len(ids) != length:
            raise HeadhuntError(f"length {length} is too short for the cwe task")
        return ids, common


def build_ruler(
    tokenizer,
    haystack: str,
    lengths: list[int],
    tasks: list[str] | tuple[str, ...] = TASKS,
    repeats: int = 4,
    seed: int = 0,
) -> list[TaskTrial]:
    """``repeats`` trials per (task, length), deterministic for a seed."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise HeadhuntError(f"unknown task {unknown[0]!r} (choose from {', '.join(TASKS)})")
    builder = RulerBuilder(tokenizer, haystack)
    out = []
    for task in tasks:
        for length in lengths:
            for rep in range(repeats):
                tid = f"{task}-L{length}-{rep}"
                ids, answers = getattr(builder, task)(length, random.Random(f"{seed}/{tid}"))
                out.append(TaskTrial(tid, task, length, ids, answers))
    return out
