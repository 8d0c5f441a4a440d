"""Needle-in-a-haystack trials built at the token level.

Each trial's prompt has exactly the requested number of tokens (prefix + haystack with the
needle inserted + question), so all trials of one length batch together without padding, and
the answer's token span in the prompt is known by construction (then checked with the
reference's sliding-window rule).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from headhunt.errors import HeadhuntError

DIGITS = "0123456789"
# Tokens that end a sentence (Latin and CJK full-width marks): a needle is inserted after one.
SENTENCE_ENDS = (".", "!", "?", "\u3002", "\uff01", "\uff1f", "\u2026")
# The largest shift, as a share of the haystack stretch, from the requested depth back to the
# sentence end the needle is placed after; past it the trial would not be at its depth.
MAX_SENTENCE_SHIFT = 0.5
CITIES = [
    "Lisbon",
    "Oslo",
    "Kyoto",
    "Cairo",
    "Lima",
    "Dublin",
    "Hanoi",
    "Quito",
    "Perth",
    "Vienna",
    "Nairobi",
    "Seville",
    "Montreal",
    "Bergen",
    "Tbilisi",
    "Porto",
]
ACTIVITIES = [
    "eat a sandwich",
    "fly a kite",
    "read a novel",
    "paint the boats",
    "feed the ducks",
    "sing old songs",
    "play chess",
    "watch the ships",
    "buy fresh figs",
    "ride a bicycle",
]
PLACES = [
    "in the harbour park",
    "on the old bridge",
    "by the river",
    "under the clock tower",
    "at the flower market",
    "beside the lighthouse",
    "in the botanical garden",
    "on the hill",
]
VAULTS = ["blue", "red", "northern", "copper", "silent", "eastern", "marble", "hidden"]
MAGIC = [
    "lantern",
    "violet",
    "harbour",
    "pepper",
    "thunder",
    "marble",
    "candle",
    "meadow",
    "falcon",
    "silver",
    "orchard",
    "compass",
    "velvet",
    "glacier",
    "saffron",
    "timber",
    "crimson",
    "walnut",
    "sparrow",
    "cobalt",
]


@dataclass(frozen=True)
class Needle:
    """A needle template. ``{answer}`` and the slots in ``fill`` are drawn per trial."""

    name: str
    needle: str
    question: str
    lead: str  # the start of the assistant's answer, so the next tokens must be copied
    answer: Callable[[random.Random], str]
    fill: Callable[[random.Random], dict[str, str]]

    def draw(self, rng: random.Random) -> tuple[str, str, str, str]:
        """(needle sentence, question, answer lead, answer) with fresh random slots."""
        slots = self.fill(rng)
        answer = self.answer(rng)
        return (
            self.needle.format(answer=answer, **slots),
            self.question.format(**slots),
            self.lead.format(**slots),
            answer,
        )


NEEDLES: dict[str, Needle] = {
    "passkey": Needle(
        "passkey",
        "The secret passkey for the {vault} vault is {answer}.",
        "What is the secret passkey for the {vault} vault?",
        "The secret passkey for the {vault} vault is",
        lambda r: "".join(r.choice(DIGITS) for _ in range(6)),
        lambda r: {"vault": r.choice(VAULTS)},
    ),
    "city": Needle(
        "city",
        "The best thing to do in {city} is to {answer}.",
        "What is the best thing to do in {city}?",
        "The best thing to do in {city} is to",
        lambda r: f"{r.choice(ACTIVITIES)} {r.choice(PLACES)}",
        lambda r: {"city": r.choice(CITIES)},
    ),
    "magic": Needle(
        "magic",
        "The magic words that open the garden gate are {answer}.",
        "What are the magic words that open the garden gate?",
        "The magic words that open the garden gate are",
        lambda r: " ".join(r.sample(MAGIC, 3)),
        lambda r: {},
    ),
}


@dataclass
class NeedleTrial:
    """One needle-in-a-haystack prompt.

    Attributes:
        id: stable identifier (length, depth, needle, repeat) used to resume.
        input_ids: the whole prompt, exactly ``length`` tokens.
        span: [start, end) of the answer's tokens inside the prompt.
        answer: the string the response must contain.
    """

    id: str
    length: int
    depth: float
    needle: str
    answer: str
    input_ids: list[int]
    span: tuple[int, int]


def find_answer_span(needle_ids: Sequence[int], answer_ids: Sequence[int]) -> tuple[int, int]:
    """Where the answer's tokens sit in the needle.

    An exact match wins. Otherwise the reference's rule applies: the first window of the
    answer's token length whose token set overlaps the answer's by more than 90% (alone, that
    set rule can pick a window shifted by one when the answer repeats a token, e.g. "is 2 5 6"
    for "2 5 6 5").
    """
    n = len(answer_ids)
    for i in range(len(needle_ids) - n + 1):
        if list(needle_ids[i : i + n]) == list(answer_ids):
            return i, i + n
    want = set(answer_ids)
    for i in range(len(needle_ids) - n + 1):
        if len(set(needle_ids[i : i + n]) & want) / len(want) > 0.9:
            return i, i + n
    raise HeadhuntError("the tokenizer splits the needle so that its answer span cannot be found")


def default_haystack_text() -> str:
    """The bundled corpus: original essays written for headhunt (no third-party text)."""
    folder = resources.files("headhunt.heads") / "data" / "haystack"
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".txt")), key=lambda f: f.name)
    return "\n\n".join(f.read_text() for f in files)


# The largest haystack file read: the whole file is tokenized, so a 60 MB file took ~10 GB of
# memory for one trial; 8 MiB is well past what the longest prompt (2**20 tokens) draws from.
MAX_HAYSTACK_BYTES = 8 * 2**20


def read_haystack(path: str | Path | None) -> str:
    if path is None:
        return default_haystack_text()
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_HAYSTACK_BYTES:
            raise HeadhuntError(
                f"haystack {path} is {size / 2**20:.1f} MiB; at most "
                f"{MAX_HAYSTACK_BYTES // 2**20} MiB is read (the whole file is tokenized): cut it"
            )
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise HeadhuntError(f"cannot read haystack {path}: {e}") from None
    if not text.strip():
        raise HeadhuntError(f"haystack {path} is empty")
    return text


class TrialBuilder:
    """Builds trials for one tokenizer and haystack."""

    def __init__(self, tokenizer, haystack: str, *, chat: bool | None = None):
        self.tok = tokenizer
        self.hay = self._encode(haystack)
        vocab = sorted(set(self.hay))
        texts = {i: tokenizer.decode([i]) for i in vocab}
        ends = {i for i, t in texts.items() if _ends_sentence(t)}
        if not ends:  # unpunctuated text: paragraphs and lines are the only boundaries left
            ends = {i for i, t in texts.items() if "\n" in t}
        if not ends:
            raise HeadhuntError(
                "the haystack has no sentence ends (" + " ".join(SENTENCE_ENDS) + ") and no "
                "line breaks: a needle could only go before the first token, whatever the depth"
            )
        # Insert positions: just after a sentence end, as the reference moves the needle back to.
        self.starts = [0] + [i + 1 for i, t in enumerate(self.hay) if t in ends]
        self.chat = getattr(tokenizer, "chat_template", None) is not None if chat is None else chat

    def _encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False).input_ids

    def frame(self, question: str, lead: str) -> tuple[list[int], list[int]]:
        """Token ids before and after the haystack."""
        marker = "\u2063CONTEXT\u2063"
        user = f"Read the document and answer the question.\n\nDocument:\n{marker}\n\nQuestion: {question}"
        if self.chat:
            text = self.tok.apply_chat_template(
                [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
            )
        else:
            text = f"{user}\nAnswer: "
        before, after = text.split(marker)
        bos = (
            [self.tok.bos_token_id] if (self.tok.bos_token_id is not None and not self.chat) else []
        )
        return bos + self._encode(before), self._encode(after + lead)

    def build(
        self, length: int, depth: float, needle: Needle, rng: random.Random, trial_id: str
    ) -> NeedleTrial:
        sentence, question, lead, answer = needle.draw(rng)
        before, after = self.frame(question, lead)
        needle_ids = self._encode(" " + sentence)
        s, e = find_answer_span(needle_ids, self._encode(" " + answer))
        n_hay = length - len(before) - len(after) - len(needle_ids)
        if n_hay < 1:
            raise HeadhuntError(f"length {length} is too short for the prompt frame and needle")
        if n_hay > len(self.hay):
            raise HeadhuntError(
                f"the haystack has {len(self.hay)} tokens; a {length}-token trial needs {n_hay}: "
                "use a longer --haystack or shorter --lengths"
            )
        # A random stretch of the corpus that begins at a sentence start.
        candidates = [p for p in self.starts if p + n_hay <= len(self.hay)] or [0]
        start = rng.choice(candidates)
        hay = self.hay[start : start + n_hay]
        want = round(depth * n_hay)
        local = [p - start for p in self.starts if start <= p <= start + want]
        insert = max(local) if local else 0
        if want - insert > MAX_SENTENCE_SHIFT * n_hay:
            raise HeadhuntError(
                f"no sentence end within {MAX_SENTENCE_SHIFT:.0%} of the stretch before depth "
                f"{depth:.0%} of a {length}-token trial (the needle would sit at "
                f"{insert / n_hay:.0%}): use a haystack with shorter sentences or longer --lengths"
            )
        ids = before + hay[:insert] + needle_ids + hay[insert:] + after
        base = len(before) + insert
        return NeedleTrial(trial_id, length, depth, needle.name, answer, ids, (base + s, base + e))


def _ends_sentence(token_text: str) -> bool:
    """A short token ending in a sentence mark (a long one is a word such as "e.g.")."""
    text = token_text.strip()
    return text.endswith(SENTENCE_ENDS) and len(text) <= 3


def rouge1_recall(reference: str, response: str) -> float:
    """ROUGE-1 recall: the share of the reference's word unigrams found in the response
    (lower-cased alphanumeric words, counts clipped; no stemming)."""
    import re
    from collections import Counter

    ref = Counter(re.findall(r"[a-z0-9]+", reference.lower()))
    got = Counter(re.findall(r"[a-z0-9]+", response.lower()))
    if not ref:
        return 0.0
    return sum(min(c, got[w]) for w, c in ref.items()) / sum(ref.values())
