"""Probe targets: texts, the token positions to read, and one label per position.

Every builder returns a :class:`ProbeTarget`, whose :meth:`~ProbeTarget.rows` yields
(text id, position, label). Positions index the text's token ids (BOS included where the
tokenizer has one). Each row also has a *type*, the input the controls key on (see
:mod:`headhunt.probes.linear`), and each target names the control its selectivity is measured
against (``ProbeTarget.control``): the one that shows what a probe gets *without* the property.

Built-in targets:

- :func:`ngram_target`: in-context n-gram statistics (Akyürek et al. 2024). Texts are random
  walks over a small word alphabet, each text with its own sparse transition table, so the
  statistics can only be learnt in context. At position t with k-token context c (the k words
  ending at t), over the earlier occurrences of c whose next word is visible: ``argmax`` (class)
  = the word that most often followed c so far (positions with a tie or no earlier occurrence
  are skipped); ``freq`` (regression) = the share of those occurrences followed by the word
  that actually comes next at t. Type = the context c. Control: within_type.
- :func:`needle_target`: needle-in-a-haystack prompts (:mod:`headhunt.heads.inputs.needles`), read at
  the question's last token; label = depth bin of the needle in the haystack. All rows share
  one token there, so the type is the prompt itself (the control then gives each prompt a
  random label). Control: shuffled.
- :func:`mqar_target`: multi-query associative recall (Zoology's generator and rendering from
  :mod:`headhunt.heads.mqar`, ``key: value,`` lists by default); at each query position, label
  = the value bound to the queried key in this text. Type = the key word. Control: within_type.
- :func:`jsonl_target`: the user's JSONL of ``{"text", "position" | "substring", "label"}``.
  Type = the token at the position. Control: within_type when tokens repeat (most rows share
  their token with another row), else shuffled.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from jaxtyping import Float, Int

from headhunt.errors import HeadhuntError
from headhunt.reading import read_rows

Task = Literal["classification", "regression"]

# Single tokens (with a leading space) in common BPE vocabularies; checked per tokenizer.
NGRAM_WORDS = ["river", "bread", "lamp", "garden", "stone", "cloud", "horse", "apple"]
MQAR_KEYS = ["river", "bread", "lamp", "garden", "gate", "city", "park"]
MQAR_VALUES = ["red", "blue", "green", "yellow", "black", "white", "pink", "brown"]
MQAR_FILLER = ["the", "of", "and", "to", "in", "is", "was", "it", "for", "on", "that", "with"]


@dataclass
class LabeledText:
    """One text with the positions to read and a label (and control type) per position.

    Attributes:
        id: stable identifier.
        input_ids: token ids, BOS included where the tokenizer has one.
        positions: token indices to read (non-negative after building).
        labels: class index (classification) or value (regression), one per position.
        types: control-task type per position (an integer key; equal types get equal
            control labels).
    """

    id: str
    input_ids: list[int]
    positions: list[int]
    labels: list[float]
    types: list[int]


@dataclass
class ProbeTarget:
    """Texts, positions and labels for one probing task.

    Attributes:
        name: the target's name (``ngram``, ``needle``, ``mqar``, ``jsonl``).
        task: ``classification`` or ``regression``.
        texts: the labelled texts.
        classes: class names (label i is ``classes[i]``), None for regression.
        params: how it was built (for the run manifest).
        types: what the control task's types are, in words.
        control: the control selectivity is measured against (``within_type`` or
            ``shuffled``; see :mod:`headhunt.probes.linear`).
        control_why: why that control, in one sentence (printed with the results).
    """

    name: str
    task: Task
    texts: list[LabeledText]
    classes: list[str] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    types: str = "token at the position"
    control: str = "within_type"
    control_why: str = ""

    def rows(self) -> Iterator[tuple[str, int, float]]:
        """(text id, position, label) for every row, in capture order."""
        for t in self.texts:
            for p, y in zip(t.positions, t.labels, strict=True):
                yield t.id, p, y

    def arrays(
        self,
    ) -> tuple[Float[np.ndarray, " rows"], Int[np.ndarray, " rows"], Int[np.ndarray, " rows"]]:
        """(labels, groups, types) aligned with the captured rows; group = text index."""
        labels = np.asarray([y for t in self.texts for y in t.labels], dtype=float)
        groups = np.repeat(np.arange(len(self.texts)), [len(t.positions) for t in self.texts])
        types = np.asarray([c for t in self.texts for c in t.types], dtype=np.int64)
        if self.task == "classification":
            labels = labels.astype(np.int64)
        return labels, groups, types

    def frame(self):
        """One row per (text, position): text_id, position, token, label, type."""
        import pandas as pd

        recs = [
            {
                "text_id": t.id,
                "position": p,
                "token": t.input_ids[p],
                "label": y,
                "label_name": self.classes[int(y)] if self.classes else None,
                "type": c,
            }
            for t in self.texts
            for p, y, c in zip(t.positions, t.labels, t.types, strict=True)
        ]
        return pd.DataFrame(recs)


def word_ids(tokenizer, words: Sequence[str]) -> list[int]:
    """The single token id of each word (with a leading space).

    Raises:
        HeadhuntError: a word is not one ordinary token for this tokenizer.
    """
    out = []
    unk = getattr(tokenizer, "unk_token_id", None)
    for w in words:
        ids = tokenizer(" " + w, add_special_tokens=False).input_ids
        if len(ids) != 1 or (unk is not None and ids[0] == unk):
            raise HeadhuntError(
                f"the word {w!r} is not a single token for this tokenizer ({len(ids)} tokens); "
                "pass other words"
            )
        out.append(ids[0])
    if len(set(out)) != len(out):
        raise HeadhuntError("two words map to the same token; pass distinct words")
    return out


def _bos(tokenizer) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return [] if bos is None else [bos]


# ---------------------------------------------------------------------------------------------
# In-context n-gram statistics


def ngram_labels(
    seq: Sequence[int], k: int, stat: Literal["argmax", "freq"]
) -> list[tuple[int, float]]:
    """(index, label) at every index of ``seq`` where the k-gram statistic is defined.

    At index t, the context is ``seq[t-k+1 .. t]``; its earlier occurrences end at j < t with
    ``seq[j-k+1 .. j]`` equal to it (so their next token ``seq[j+1]`` is already seen).
    ``argmax``: the next token most often seen after the context (ties and never-seen contexts
    skipped). ``freq``: of those occurrences, the share followed by ``seq[t+1]`` (t must have a
    next token).
    """
    from collections import Counter, defaultdict

    follows: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    out: list[tuple[int, float]] = []
    for t in range(k - 1, len(seq)):
        ctx = tuple(seq[t - k + 1 : t + 1])
        seen = follows[ctx]
        total = sum(seen.values())
        if total:
            if stat == "argmax":
                top = seen.most_common(2)
                if len(top) == 1 or top[0][1] > top[1][1]:  # a tie has no argmax
                    out.append((t, float(top[0][0])))
            elif t + 1 < len(seq):
                out.append((t, seen[seq[t + 1]] / total))
        # The occurrence ending at t becomes visible to later positions once seq[t+1] is seen.
        if t + 1 < len(seq):
            seen[seq[t + 1]] += 1
    return out


def ngram_target(
    tokenizer,
    *,
    k: int = 1,
    stat: Literal["argmax", "freq"] = "argmax",
    n_texts: int = 300,
    length: int = 96,
    words: Sequence[str] = NGRAM_WORDS,
    branch: int = 3,
    positions_per_text: int = 8,
    seed: int = 0,
) -> ProbeTarget:
    """In-context k-gram statistics on random walks (see the module docstring).

    Each text draws its own transition table: every word gets ``branch`` successors with
    Dirichlet(1) weights, so which word follows which is knowable only from the text itself.

    Args:
        tokenizer: the model's tokenizer (each word must be one token).
        k: context length (1, 2, 3, ...).
        stat: ``argmax`` (classification over the words) or ``freq`` (regression in [0, 1]).
        n_texts: number of texts.
        length: words per text (BOS comes on top).
        words: the alphabet.
        branch: successors per word in each text's transition table.
        positions_per_text: rows drawn per text from the positions where the statistic is
            defined (all of them if fewer).
        seed: random seed.
    """
    if k < 1:
        raise HeadhuntError(f"k must be at least 1, got {k}")
    if stat not in ("argmax", "freq"):
        raise HeadhuntError(f"unknown n-gram statistic {stat!r} (use argmax or freq)")
    if len(words) < 2 or not 1 <= branch <= len(words):
        raise HeadhuntError(f"need at least 2 words and 1 <= branch <= {len(words)}")
    if length <= k + 1 or positions_per_text < 1 or n_texts < 1:
        raise HeadhuntError("length must exceed k + 1; n_texts and positions per text >= 1")
    ids = word_ids(tokenizer, words)
    bos = _bos(tokenizer)
    rng = np.random.default_rng(seed)
    a = len(words)
    type_of: dict[tuple[int, ...], int] = {}
    texts = []
    for i in range(n_texts):
        succ = np.stack([rng.choice(a, size=branch, replace=False) for _ in range(a)])
        prob = rng.dirichlet(np.ones(branch), size=a)
        seq = [int(rng.integers(a))]
        for _ in range(length - 1):
            seq.append(int(succ[seq[-1]][rng.choice(branch, p=prob[seq[-1]])]))
        found = ngram_labels(seq, k, stat)
        if not found:
            continue
        pick = sorted(
            rng.choice(len(found), size=min(positions_per_text, len(found)), replace=False)
        )
        rows = [found[j] for j in pick]
        types = [type_of.setdefault(tuple(seq[t - k + 1 : t + 1]), len(type_of)) for t, _ in rows]
        texts.append(
            LabeledText(
                id=f"ngram-{i}",
                input_ids=bos + [ids[w] for w in seq],
                positions=[t + len(bos) for t, _ in rows],
                labels=[y for _, y in rows],
                types=types,
            )
        )
    params = {
        "k": k,
        "stat": stat,
        "n_texts": n_texts,
        "length": length,
        "words": list(words),
        "branch": branch,
        "positions_per_text": positions_per_text,
        "seed": seed,
    }
    return ProbeTarget(
        name="ngram",
        task="classification" if stat == "argmax" else "regression",
        texts=texts,
        classes=list(words) if stat == "argmax" else None,
        params=params,
        types=f"the {k}-token context",
        control="within_type",
        control_why=(
            f"{len(type_of)} context types: a probe memorises a random label per context from "
            "token identity alone (the Hewitt & Liang control), while each text's own "
            "transition table makes the context alone say little about its follower; "
            "within_type keeps what the context says and removes the in-text statistic"
        ),
    )


# ---------------------------------------------------------------------------------------------
# Needle depth


def needle_target(
    tokenizer,
    *,
    n_texts: int = 200,
    length: int = 256,
    bins: int = 5,
    needles: Sequence[str] = ("passkey", "city", "magic"),
    haystack: str | Path | None = None,
    position: Literal["question", "last"] = "question",
    seed: int = 0,
) -> ProbeTarget:
    """Needle-in-a-haystack prompts labelled with the needle's depth bin.

    Prompt i aims at bin ``i % bins``; the needle then moves back to the previous sentence
    start (as in the reference), and the label is the bin of where it actually landed (the
    fraction of haystack tokens before it). A draw that lands in another bin is redrawn (up to
    20 times), so the classes are nearly balanced.

    Args:
        tokenizer: the model's tokenizer.
        n_texts: number of prompts.
        length: tokens per prompt.
        bins: number of depth bins (classes).
        needles: names from :data:`headhunt.heads.inputs.needles.NEEDLES`.
        haystack: a text file, or None for the bundled essays.
        position: ``question`` (the question's last token, its ``?``) or ``last`` (the last
            prompt token, just before the answer).
        seed: random seed.
    """
    from headhunt.heads.inputs.needles import NEEDLES, TrialBuilder, read_haystack

    if bins < 2:
        raise HeadhuntError(f"need at least 2 depth bins, got {bins}")
    unknown = [n for n in needles if n not in NEEDLES]
    if unknown or not needles:
        raise HeadhuntError(f"unknown needles {unknown} (choose from {', '.join(NEEDLES)})")
    if position not in ("question", "last"):
        raise HeadhuntError(f"unknown needle position {position!r} (use question or last)")
    builder = TrialBuilder(tokenizer, read_haystack(haystack))
    rng = random.Random(seed)
    texts = []
    for i in range(n_texts):
        needle = NEEDLES[needles[i % len(needles)]]
        b = i % bins
        # Snapping back to a sentence start moves needles to shallower bins; redraw (a few
        # times) until the needle lands in the intended bin, so the classes stay balanced.
        for _ in range(_NEEDLE_TRIES):
            trial, depth, after = _needle_trial(
                builder, tokenizer, needle, length, (b + rng.random()) / bins, rng, f"needle-{i}"
            )
            label = min(int(depth * bins), bins - 1)
            if label == b:
                break
        if position == "last":
            pos = length - 1
        else:
            marks = [j for j, t in enumerate(after) if "?" in tokenizer.decode([t])]
            if not marks:
                raise HeadhuntError("cannot find the question's '?' token in the prompt")
            pos = length - len(after) + marks[0]
        texts.append(LabeledText(trial.id, trial.input_ids, [pos], [float(label)], [i]))
    params = {
        "n_texts": n_texts,
        "length": length,
        "bins": bins,
        "needles": list(needles),
        "haystack": None if haystack is None else str(haystack),
        "position": position,
        "seed": seed,
    }
    names = [f"{100 * b // bins}-{100 * (b + 1) // bins}%" for b in range(bins)]
    return ProbeTarget(
        "needle",
        "classification",
        texts,
        names,
        params,
        types="the prompt (one token type at the read position)",
        control="shuffled",
        control_why=(
            "one row per prompt and the same token at every read position: there is no type "
            "to shuffle within, so shuffled labels show what a probe gets without the depth"
        ),
    )


_NEEDLE_TRIES = 20


def _needle_trial(builder, tokenizer, needle, length, want, rng, trial_id):
    """(trial, actual depth in [0, 1), the frame's token ids after the haystack)."""
    from headhunt.heads.inputs.needles import find_answer_span

    # Replay the trial's own draw to learn its frame (the builder draws the needle first).
    state = rng.getstate()
    sentence, question, lead, answer = needle.draw(rng)
    rng.setstate(state)
    trial = builder.build(length, want, needle, rng, trial_id)
    before, after = builder.frame(question, lead)
    needle_ids = tokenizer(" " + sentence, add_special_tokens=False).input_ids
    answer_ids = tokenizer(" " + answer, add_special_tokens=False).input_ids
    s, _ = find_answer_span(needle_ids, answer_ids)
    n_hay = length - len(before) - len(after) - len(needle_ids)
    return trial, (trial.span[0] - s - len(before)) / n_hay, after


# ---------------------------------------------------------------------------------------------
# MQAR


def mqar_target(
    tokenizer,
    *,
    n_texts: int = 300,
    n_pairs: int = 6,
    seq_len: int = 48,
    layout: Literal["kv", "zoology"] = "kv",
    keys: Sequence[str] = MQAR_KEYS,
    values: Sequence[str] = MQAR_VALUES,
    filler: Sequence[str] = MQAR_FILLER,
    seed: int = 0,
) -> ProbeTarget:
    """MQAR examples from :mod:`headhunt.heads.mqar` (Zoology's generator, rendered into
    words), read at every query position; label = the value bound to the queried key.

    The abstract vocabulary is ``2 * len(values)``: ``len(values) - 1`` keys (the first key
    words) and ``len(values)`` values; each text draws ``n_pairs`` distinct keys and values.
    In the ``kv`` layout (``key: value,`` units) the query position is the colon after the
    queried key, where the value is predicted; in ``zoology`` it is the bare key.

    Args:
        tokenizer: the model's tokenizer (every word one token; ``:`` and ``,`` too for kv).
        n_texts: number of texts.
        n_pairs: key-value pairs per text (rows per text).
        seq_len: Zoology's abstract sequence length L (>= 4 * n_pairs).
        layout: ``kv`` or ``zoology`` (see :func:`headhunt.heads.mqar.render_mqar`).
        keys, values, filler: word pools (disjoint).
        seed: random seed.
    """
    from headhunt.heads.inputs.mqar_inputs import MQARSpec, WordPools, render_mqar

    if len(values) < 2 or len(keys) < len(values) - 1:
        raise HeadhuntError(f"need at least 2 values and {len(values) - 1} key words")
    if set(keys) & set(values) or set(filler) & (set(keys) | set(values)) or not filler:
        raise HeadhuntError("key, value and filler words must be disjoint (and filler non-empty)")
    n_keys = len(values) - 1
    if not 1 <= n_pairs <= n_keys:
        raise HeadhuntError(f"n_pairs must be in 1..{n_keys} (one less than the value words)")
    pools = WordPools(
        keys=word_ids(tokenizer, keys[:n_keys]),
        values=word_ids(tokenizer, values),
        filler=word_ids(tokenizer, filler),
    )
    bos = _bos(tokenizer)
    probe = render_mqar(
        MQARSpec(seq_len=seq_len, n_pairs=n_pairs),
        pools,
        n_texts,
        tokenizer=tokenizer,
        layout=layout,
        bos_id=bos[0] if bos else None,
        seed=seed,
    )
    value_index = {v: i for i, v in enumerate(pools.values)}
    key_index = {k: i for i, k in enumerate(pools.keys)}
    texts = []
    for i in range(n_texts):
        ids = probe.ids[i].tolist()
        # Pair j's key sits at key_pos[j] in the context; its query at query_pos[j].
        texts.append(
            LabeledText(
                f"mqar-{i}",
                ids,
                probe.query_pos[i].tolist(),
                [float(value_index[int(v)]) for v in probe.target[i]],
                [key_index[ids[int(k)]] for k in probe.key_pos[i]],
            )
        )
    params = {
        "n_texts": n_texts,
        "n_pairs": n_pairs,
        "seq_len": seq_len,
        "layout": layout,
        "keys": list(keys[:n_keys]),
        "values": list(values),
        "filler": list(filler),
        "seed": seed,
    }
    return ProbeTarget(
        "mqar",
        "classification",
        texts,
        list(values),
        params,
        types="the key word",
        control="within_type",
        control_why=(
            f"{n_keys} key types: a probe memorises a random label per key from the key token "
            "alone (the Hewitt & Liang control); within_type keeps how values go with keys "
            "across texts and removes this text's binding"
        ),
    )


# ---------------------------------------------------------------------------------------------
# The user's JSONL


def read_jsonl_rows(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """The records of a :func:`jsonl_target` file with their line numbers, checked as far as
    no tokenizer is needed (so a bad file is refused before a model loads).

    Raises:
        HeadhuntError: unreadable file, bad JSON, missing keys, both or neither of
            ``position`` / ``substring``, a label that is not a string, boolean or finite
            number (JSON's NaN and Infinity included), no rows; each names the file and line.
    """
    path = Path(path)
    out = []
    for n, rec in read_rows(path, where="{path}:{n}"):
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str) or "label" not in rec:
            raise HeadhuntError(f'{path}:{n}: each line needs "text" (a string) and "label"')
        if ("position" in rec) == ("substring" in rec):
            raise HeadhuntError(f'{path}:{n}: give exactly one of "position" or "substring"')
        label = rec["label"]
        if isinstance(label, (list, dict)) or label is None:
            raise HeadhuntError(f"{path}:{n}: label must be a string, number or boolean")
        if isinstance(label, float) and not math.isfinite(label):
            raise HeadhuntError(f"{path}:{n}: label must be a finite number, got {label}")
        out.append((n, rec))
    if not out:
        raise HeadhuntError(f"{path} has no rows")
    return out


def jsonl_target(
    path: str | Path,
    tokenizer,
    *,
    task: Literal["auto", "classification", "regression"] = "auto",
) -> ProbeTarget:
    """Rows from a JSONL file: ``{"text": str, "position": int | "substring": str, "label": ...}``.

    ``position`` indexes the text's tokens with BOS in front when the tokenizer has one
    (negative counts from the end); ``substring`` reads the last token of its first occurrence
    in the text. Rows with the same text form one text (its positions are never split between
    train and test). Labels: strings, booleans or integers make classes (sorted); other numbers
    make a regression; ``task`` forces one.

    Raises:
        HeadhuntError: what :func:`read_jsonl_rows` refuses, a position outside its text, a
            substring not in its text.
    """
    path = Path(path)
    bos = _bos(tokenizer)
    by_text: dict[str, tuple[list[int], list[int], list[Any]]] = {}
    for n, rec in read_jsonl_rows(path):
        text = rec["text"]
        if text not in by_text:
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            by_text[text] = (bos + enc.input_ids, [(-1, -1)] * len(bos) + enc.offset_mapping, [])
        ids, offsets, rows = by_text[text]
        if "position" in rec:
            p = rec["position"]
            if isinstance(p, bool) or not isinstance(p, int):
                raise HeadhuntError(f"{path}:{n}: position must be an integer, got {p!r}")
            if not -len(ids) <= p < len(ids):
                raise HeadhuntError(
                    f"{path}:{n}: position {p} is outside the text's {len(ids)} tokens"
                )
            p = p % len(ids)
        else:
            sub = rec["substring"]
            start = text.find(sub) if isinstance(sub, str) and sub else -1
            if start < 0:
                raise HeadhuntError(f"{path}:{n}: substring {sub!r} is not in the text")
            end = start + len(sub)
            inside = [j for j, (a, b) in enumerate(offsets) if a < end and b > start]
            if not inside:
                raise HeadhuntError(f"{path}:{n}: substring {sub!r} covers no token")
            p = max(inside)
        rows.append((p, rec["label"]))
    all_labels = [y for _, _, rows in by_text.values() for _, y in rows]
    numeric = all(isinstance(y, (int, float)) and not isinstance(y, bool) for y in all_labels)
    if task == "auto":
        whole = numeric and all(float(y).is_integer() for y in all_labels)
        task = "regression" if numeric and not whole else "classification"
    if task == "regression" and not numeric:
        raise HeadhuntError(f"{path}: a regression needs numeric labels")
    classes = None
    if task == "classification":
        classes = sorted({_class_name(y) for y in all_labels}, key=lambda s: (_num(s), s))
        index = {c: i for i, c in enumerate(classes)}
    texts = []
    for i, (ids, _, rows) in enumerate(by_text.values()):
        labels = [
            float(index[_class_name(y)]) if classes is not None else float(y) for _, y in rows
        ]
        texts.append(
            LabeledText(f"text-{i}", ids, [p for p, _ in rows], labels, [ids[p] for p, _ in rows])
        )
    types = [c for t in texts for c in t.types]
    _, counts = np.unique(types, return_counts=True)
    shared = float(counts[counts > 1].sum()) / len(types)
    control, why = (
        (
            "within_type",
            "most rows share their token with other rows: within_type keeps what "
            "the token says and removes the rest (a random label per token is solved by token "
            "identity alone)",
        )
        if shared > 0.5
        else ("shuffled", "most rows have a token no other row has: nothing to shuffle within")
    )
    return ProbeTarget(
        "jsonl",
        task,
        texts,
        classes,
        {"data": str(path), "task": task},
        control=control,
        control_why=why,
    )


def _class_name(y: Any) -> str:
    """1 and 1.0 are one class; booleans are ``true``/``false``."""
    if isinstance(y, bool):
        return str(y).lower()
    if isinstance(y, float) and y.is_integer():
        return str(int(y))
    return str(y)


def _num(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return float("inf")
