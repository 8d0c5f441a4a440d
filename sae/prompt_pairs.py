"""Prompt pairs for circuit finding: IOI, greater-than, docstring, or the user's own JSONL.

Each task yields :class:`PromptPair` s: a *positive* (clean) prompt on which the model performs
the task, a *negative* (corrupted) prompt that differs minimally and removes the cue, and the
answer continuations the positive should favour over the wrong ones. The SAE method only needs
the positives and negatives; activation patching and attribution patching also need the
answers, and a positive and its negative of the same token length (positions line up).

Every answer must be one token *in context*: ``tokens(prompt + answer) == tokens(prompt) +
[one id]``. Name, year and argument-name pools are filtered for the loaded tokenizer and every
rendered pair is checked; a task that cannot be rendered raises :class:`HeadhuntError`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.reading import read_rows

TASKS = ("ioi", "greater-than", "docstring")


@dataclass
class PromptPair:
    """One positive (clean) prompt, its negative (corrupted) twin, and the answers.

    Attributes:
        positive: the prompt on which the task behaviour is present.
        negative: the minimally changed prompt on which it is absent.
        answer: continuations the positive prompt should make likely (one token each).
        wrong: continuations it should make unlikely (one token each).
    """

    positive: str
    negative: str
    answer: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "positive": self.positive,
            "negative": self.negative,
            "answer": self.answer,
            "wrong": self.wrong,
        }


@dataclass
class EncodedPairs:
    """Token ids of a task's pairs (BOS included when the tokenizer has one).

    Attributes:
        positive, negative: one 1-D id tensor per pair.
        answer, wrong: per pair, the token ids of the answers / wrong answers (empty lists when
            the task file gave none).
        pairs: the text pairs, for the record.
    """

    positive: list[Int[Tensor, " n"]]
    negative: list[Int[Tensor, " n"]]
    answer: list[list[int]]
    wrong: list[list[int]]
    pairs: list[PromptPair]

    def __len__(self) -> int:
        return len(self.positive)

    @property
    def has_answers(self) -> bool:
        return all(self.answer) and all(self.wrong)

    @property
    def aligned(self) -> bool:
        """Every positive has the same token length as its negative."""
        return all(len(p) == len(n) for p, n in zip(self.positive, self.negative, strict=True))

    def subset(self, idx: Sequence[int]) -> EncodedPairs:
        return EncodedPairs(
            positive=[self.positive[i] for i in idx],
            negative=[self.negative[i] for i in idx],
            answer=[self.answer[i] for i in idx],
            wrong=[self.wrong[i] for i in idx],
            pairs=[self.pairs[i] for i in idx],
        )


def length_batches(
    seqs: Sequence[Tensor], batch_size: int
) -> Iterator[tuple[list[int], Int[Tensor, "b n"]]]:
    """Group sequences of equal length into batches (no padding, so every position is real).

    Yields:
        (indices into ``seqs``, stacked ids [batch, n]).
    """
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_len.setdefault(len(s), []).append(i)
    for n in sorted(by_len):
        idx = by_len[n]
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            yield chunk, torch.stack([seqs[i] for i in chunk])


# --- tokenizer checks -------------------------------------------------------------------------


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def single_tokens(tokenizer, words: Sequence[str]) -> list[str]:
    """The words (with their leading space, if any) that the tokenizer keeps as one known token
    (never the unknown-word token)."""
    unk = tokenizer.unk_token_id
    return [w for w in words if len(ids := _ids(tokenizer, w)) == 1 and ids[0] != unk]


def continuation_id(tokenizer, prompt: str, continuation: str) -> int | None:
    """The one token id that ``continuation`` adds after ``prompt``, or None when it adds more
    than one token or merges with the prompt's last token."""
    base = _ids(tokenizer, prompt)
    full = _ids(tokenizer, prompt + continuation)
    if len(full) != len(base) + 1 or full[: len(base)] != base:
        return None
    if full[-1] == tokenizer.unk_token_id:
        return None
    return full[-1]


def encode_pairs(tokenizer, pairs: Sequence[PromptPair], *, require_aligned: bool) -> EncodedPairs:
    """Tokenize pairs and check every answer is a single token in context.

    Args:
        tokenizer: the model's tokenizer.
        pairs: the prompt pairs.
        require_aligned: raise unless every positive and negative have the same token length
            (needed by patching, which swaps activations position by position).

    Raises:
        HeadhuntError: an answer is not one token, or lengths differ when they must not.
    """
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    out = EncodedPairs([], [], [], [], list(pairs))
    for k, p in enumerate(pairs):
        pos = bos + _ids(tokenizer, p.positive)
        neg = bos + _ids(tokenizer, p.negative)
        if require_aligned and len(pos) != len(neg):
            raise HeadhuntError(
                f"pair {k}: positive and negative have {len(pos)} and {len(neg)} tokens; "
                "patching needs equal lengths"
            )
        ids: list[list[int]] = []
        for group in (p.answer, p.wrong):
            got = []
            for c in group:
                tid = continuation_id(tokenizer, p.positive, c)
                if tid is None:
                    raise HeadhuntError(
                        f"pair {k}: answer {c!r} is not a single token after its prompt"
                    )
                got.append(tid)
            ids.append(got)
        out.positive.append(torch.tensor(pos, dtype=torch.long))
        out.negative.append(torch.tensor(neg, dtype=torch.long))
        out.answer.append(ids[0])
        out.wrong.append(ids[1])
    return out


# --- the three built-in tasks -----------------------------------------------------------------

NAMES = [
    "Mary",
    "John",
    "Tom",
    "James",
    "Sarah",
    "David",
    "Michael",
    "Emma",
    "Anna",
    "Paul",
    "Mark",
    "Alice",
    "Kate",
    "Daniel",
    "Laura",
    "Peter",
    "Susan",
    "Robert",
    "Linda",
    "Jack",
    "Lisa",
    "Steve",
    "Rachel",
    "Chris",
    "Amy",
    "Brian",
    "Helen",
    "Kevin",
    "Karen",
    "Eric",
    "Jessica",
    "Adam",
    "Emily",
    "Ryan",
    "Anne",
    "George",
    "Lucy",
    "Henry",
    "Grace",
    "Frank",
    "Jane",
    "Scott",
    "Julia",
    "Sam",
    "Kelly",
    "Tim",
    "Nancy",
    "Max",
    "Rose",
    "Andrew",
    "Claire",
    "Ben",
    "Diana",
    "Joe",
    "Ruth",
    "Matt",
    "Sophie",
    "Luke",
    "Victoria",
    "Oliver",
    "Ella",
    "Harry",
    "Olivia",
    "Jacob",
    "Maria",
    "Nick",
    "Sandra",
    "Richard",
    "Amanda",
    "William",
    "Tina",
    "Charles",
    "Sara",
    "Thomas",
    "Martin",
    "Joseph",
    "Jason",
]
PLACES = [
    "store",
    "garden",
    "school",
    "park",
    "hospital",
    "station",
    "office",
    "restaurant",
    "house",
    "market",
    "beach",
    "library",
    "church",
    "museum",
]
OBJECTS = [
    "drink",
    "book",
    "ring",
    "bone",
    "kiss",
    "ball",
    "computer",
    "necklace",
    "snack",
    "letter",
    "gift",
    "bottle",
    "flower",
    "key",
]
IOI_TEMPLATES = [
    "When {A} and {B} went to the {place}, {S} gave a {obj} to",
    "Then, {A} and {B} went to the {place}. {S} gave a {obj} to",
    "After {A} and {B} went to the {place}, {S} gave a {obj} to",
    "While {A} and {B} were working at the {place}, {S} gave a {obj} to",
    "Friends {A} and {B} found a {obj} at the {place}. {S} gave it to",
    "Then, {A} and {B} had a long argument. Afterwards {S} said to",
]


def _pool(tokenizer, words: Sequence[str], need: int, what: str) -> list[str]:
    pool = [w[1:] for w in single_tokens(tokenizer, [" " + w for w in words])]
    if len(pool) < need:
        raise HeadhuntError(
            f"only {len(pool)} {what} are single tokens for this tokenizer (need {need})"
        )
    return pool


def ioi_pairs(tokenizer, n: int, seed: int = 0) -> list[PromptPair]:
    """Indirect-object identification (Wang et al. 2022), ABBA and BABA orders.

    Positive: "When Mary and John went to the store, John gave a drink to" (answer " Mary",
    wrong " John"). Negative (the paper's): the repeated subject is replaced by a third name
    ("..., Tom gave a drink to"), so no name is repeated and the IO is no longer identified.
    """
    rng = random.Random(seed)
    names = _pool(tokenizer, NAMES, 3, "names")
    places = _pool(tokenizer, PLACES, 1, "places")
    objs = _pool(tokenizer, OBJECTS, 1, "objects")
    out = []
    for _ in range(n):
        io, s, c = rng.sample(names, 3)
        first, second = (io, s) if rng.random() < 0.5 else (s, io)  # ABBA or BABA
        t = rng.choice(IOI_TEMPLATES)
        slots = {"A": first, "B": second, "place": rng.choice(places), "obj": rng.choice(objs)}
        out.append(
            PromptPair(
                positive=t.format(S=s, **slots),
                negative=t.format(S=c, **slots),
                answer=[" " + io],
                wrong=[" " + s],
            )
        )
    return out


GT_NOUNS = [
    "war",
    "trip",
    "expedition",
    "reign",
    "drought",
    "project",
    "season",
    "strike",
    "campaign",
    "festival",
    "journey",
    "dynasty",
    "crisis",
    "conflict",
    "partnership",
]


def _year_mode(tokenizer) -> str:
    """ "pair" when a two-digit year ending is one token (GPT-2), "digit" when digits are split."""
    prompt = "The war lasted from the year 1732 to the year 17"
    if continuation_id(tokenizer, prompt, "45") is not None:
        return "pair"
    if continuation_id(tokenizer, prompt, "4") is not None:
        return "digit"
    raise HeadhuntError("greater-than: this tokenizer splits years in an unsupported way")


def greater_than_pairs(tokenizer, n: int, seed: int = 0) -> list[PromptPair]:
    """Greater-than (Hanna et al. 2023): "The war lasted from the year 1732 to the year 17".

    Negative (the paper's): the start year ends in "01", so any ending is plausible. With a
    tokenizer that keeps two-digit endings whole, answers are the endings above ``yy`` and wrong
    ones those below. With one token per digit (SmolLM2, Llama 3, ...), the next token is the
    tens digit: answers are the digits above the start year's tens digit, wrong ones those below
    (equal tens digits are left out: they are right or wrong depending on the next digit).
    """
    rng = random.Random(seed)
    mode = _year_mode(tokenizer)
    out = []
    for _ in range(n):
        cent = rng.randint(11, 17)
        noun = rng.choice(GT_NOUNS)
        if mode == "pair":
            yy = rng.randint(2, 97)
            answer = [f"{v:02d}" for v in range(yy + 1, 100)]
            wrong = [f"{v:02d}" for v in range(0, yy)]
        else:
            yy = rng.randint(20, 79)
            answer = [str(d) for d in range(yy // 10 + 1, 10)]
            wrong = [str(d) for d in range(0, yy // 10)]
        tmpl = "The {noun} lasted from the year {cent}{yy} to the year {cent}"
        out.append(
            PromptPair(
                positive=tmpl.format(noun=noun, cent=cent, yy=f"{yy:02d}"),
                negative=tmpl.format(noun=noun, cent=cent, yy="01"),
                answer=answer,
                wrong=wrong,
            )
        )
    return out


ARG_NAMES = [
    "path",
    "mode",
    "size",
    "name",
    "state",
    "file",
    "data",
    "key",
    "value",
    "count",
    "index",
    "user",
    "text",
    "color",
    "width",
    "height",
    "order",
    "limit",
    "source",
    "target",
    "result",
    "message",
    "number",
    "token",
    "config",
    "model",
    "image",
    "label",
    "page",
    "query",
    "scale",
    "shape",
    "start",
    "step",
    "time",
    "type",
    "url",
    "year",
    "level",
    "node",
    "item",
    "list",
    "table",
    "field",
    "line",
    "word",
    "option",
    "group",
    "content",
    "format",
    "filter",
    "prefix",
    "title",
    "weight",
]
FUNC_NAMES = [
    "load",
    "save",
    "update",
    "process",
    "create",
    "parse",
    "fetch",
    "build",
    "render",
    "check",
    "draw",
    "send",
    "read",
    "write",
    "merge",
]
DESCRIPTIONS = [
    "the input value",
    "a flag to set",
    "the number of items",
    "where to look",
    "what to use",
    "the current setting",
    "how many to keep",
    "the default choice",
]
DOCSTRING_TEMPLATE = (
    'def {fn}(self, {a}, {b}, {c}):\n    """{summary}\n\n'
    "    :param {A}: {dA}\n    :param {B}: {dB}\n    :param"
)


def docstring_pairs(tokenizer, n: int, seed: int = 0) -> list[PromptPair]:
    """Docstring argument completion (Heimersheim & Janiak 2023).

    Positive: a ``def`` with three arguments and a docstring documenting the first two; the
    next token is the third argument's name. Negative (the "random def" corruption): the
    ``def``'s arguments are renamed to three other names; the docstring is unchanged. Answer:
    the positive's third argument; wrong: the negative's third argument.
    """
    rng = random.Random(seed)
    args = _pool(tokenizer, ARG_NAMES, 6, "argument names")
    out = []
    for _ in range(n):
        a, b, c, a2, b2, c2 = rng.sample(args, 6)
        slots = {
            "fn": rng.choice(FUNC_NAMES),
            "summary": rng.choice(FUNC_NAMES).capitalize() + " the " + rng.choice(args) + ".",
            "A": a,
            "B": b,
            "dA": rng.choice(DESCRIPTIONS),
            "dB": rng.choice(DESCRIPTIONS),
        }
        out.append(
            PromptPair(
                positive=DOCSTRING_TEMPLATE.format(a=a, b=b, c=c, **slots),
                negative=DOCSTRING_TEMPLATE.format(a=a2, b=b2, c=c2, **slots),
                answer=[" " + c],
                wrong=[" " + c2],
            )
        )
    return out


GENERATORS: dict[str, Callable[..., list[PromptPair]]] = {
    "ioi": ioi_pairs,
    "greater-than": greater_than_pairs,
    "docstring": docstring_pairs,
}


def make_pairs(
    task: str, tokenizer, n: int, seed: int = 0, *, require_aligned: bool = True
) -> EncodedPairs:
    """``n`` encoded pairs of a built-in task whose answers are single tokens and whose positive
    and negative line up (pairs that do not are redrawn; too many failures raise).

    Raises:
        HeadhuntError: unknown task, or the tokenizer cannot render it.
    """
    if task not in GENERATORS:
        raise HeadhuntError(f"unknown task {task!r} (use {', '.join(TASKS)} or --task-file)")
    if n < 1:
        raise HeadhuntError(f"need at least one prompt pair, got {n}")
    gen = GENERATORS[task]
    kept: list[PromptPair] = []
    rng = random.Random(seed)
    for _attempt in range(20):
        for p in gen(tokenizer, 2 * (n - len(kept)), seed=rng.randrange(2**31)):
            try:
                encode_pairs(tokenizer, [p], require_aligned=require_aligned)
            except HeadhuntError:
                continue
            kept.append(p)
            if len(kept) == n:
                return encode_pairs(tokenizer, kept, require_aligned=require_aligned)
    raise HeadhuntError(
        f"{task}: only {len(kept)} of {n} prompt pairs render with single-token answers "
        "and equal lengths for this tokenizer"
    )


def read_task_file(path: str | Path) -> list[PromptPair]:
    """Read the user's pairs: one JSON object a line with "positive" and "negative" (strings)
    and, for patching ground truth and EAP, "answer" and "wrong" (a string or a list of them).

    Raises:
        HeadhuntError: missing file, bad JSON, missing or mistyped fields, no pairs.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise HeadhuntError(f"no task file at {path}")
    pairs = []
    for k, obj in read_rows(path, "task file ", where="{path}:{n}"):
        if not isinstance(obj, dict):
            raise HeadhuntError(f"{path}:{k}: expected a JSON object")
        for key in ("positive", "negative"):
            if not isinstance(obj.get(key), str) or not obj[key]:
                raise HeadhuntError(f"{path}:{k}: {key!r} must be a non-empty string")
        lists = []
        for key in ("answer", "wrong"):
            v = obj.get(key, [])
            v = [v] if isinstance(v, str) else v
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                raise HeadhuntError(f"{path}:{k}: {key!r} must be a string or a list of strings")
            lists.append(v)
        if bool(lists[0]) != bool(lists[1]):
            raise HeadhuntError(f"{path}:{k}: give both 'answer' and 'wrong', or neither")
        pairs.append(PromptPair(obj["positive"], obj["negative"], lists[0], lists[1]))
    if not pairs:
        raise HeadhuntError(f"{path} holds no prompt pairs")
    return pairs
