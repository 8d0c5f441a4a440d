"""MQAR inputs (multi-query associative recall, Zoology): the generator and the rendering into a
pretrained model's words. Plain data: no model is run here (the recall-head analyzer is
:mod:`headhunt.heads.mqar`).

Generator (:func:`generate_mqar`), faithful to Zoology's ``multiquery_ar`` (HazyResearch/zoology,
``zoology/data/multiquery_ar.py``; Arora et al. 2023, arXiv 2312.04927):
keys come from ``[1, V/2)``, values from ``[V/2, V)``, 0 is filler. Each example draws N
distinct keys and N distinct values and lays them out as ``k1 v1 ... kN vN``; the query region
(``L - 2N`` tokens) holds every key once, key i at offset ``2 * gap_i`` with the gaps drawn
without replacement from ``p(g) ~ a * (g+1)^(a-1)`` (a = 0.01 favours short gaps). The label
at a query position is the key's value (predicted there: the next-token target), -100
elsewhere; filler zeros are replaced by random tokens of the whole vocabulary.

Rendering (:func:`render_mqar`) turns abstract examples into a pretrained model's tokens: keys,
values and filler become single-token words from three disjoint pools (the bundled corpus'
words), in one of two layouts: "zoology" (token for token) or "kv" (``key: value,`` units, see
:func:`render_mqar`). Deviations, all for a pretrained LM: filler comes from its own pool rather
than the whole vocabulary (a filler token equal to a key would plant a spurious pair), and an
optional ``prefix_gap`` of filler between the pairs and the queries makes long gaps.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from headhunt.errors import HeadhuntError


@dataclass
class MQARSpec:
    """Zoology's MQAR parameters (defaults: theirs).

    Attributes:
        vocab_size: V; keys are ``1 .. V/2 - 1``, values ``V/2 .. V-1``.
        seq_len: L, input tokens per example (even, >= 4N).
        n_pairs: N key-value pairs per example, each queried once.
        power_a: the power-law parameter a of the query gaps.
        random_non_queries: replace filler zeros with random tokens of the whole vocabulary.
        shared_vocab: not Zoology: keys and values both come from ``1 .. V-1`` (2N distinct
            tokens per example), so a token's id no longer says whether it is a key or a value.
    """

    vocab_size: int = 8192
    seq_len: int = 64
    n_pairs: int = 8
    power_a: float = 0.01
    random_non_queries: bool = True
    shared_vocab: bool = False

    def __post_init__(self) -> None:
        if self.n_pairs < 1:
            raise HeadhuntError(f"MQAR needs at least one pair, got {self.n_pairs}")
        if self.seq_len % 2:
            raise HeadhuntError(f"MQAR seq_len must be even, got {self.seq_len}")
        if 4 * self.n_pairs > self.seq_len:
            raise HeadhuntError(
                f"{self.n_pairs} pairs need seq_len >= {4 * self.n_pairs} (got {self.seq_len})"
            )
        if self.n_pairs > self.vocab_size // 2 - 1:
            raise HeadhuntError(
                f"{self.n_pairs} distinct keys need vocab_size >= {2 * (self.n_pairs + 1)}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MQARSpec:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class MQARBatch:
    """A batch of MQAR examples with the positions the analyses need.

    Attributes:
        ids: [b, n] input tokens.
        labels: [b, n] the value at each query position, -100 elsewhere (Zoology's layout).
        key_pos, value_pos: [b, pairs] positions of pair i's key and value in the context.
        query_pos: [b, pairs] position of pair i's key in the query region (where the value is
            predicted).
        target: [b, pairs] the token to predict at ``query_pos`` (pair i's value).
        value_ids: the ids values are drawn from (accuracy restricted to them), or None.
    """

    ids: Int[Tensor, "b n"]
    labels: Int[Tensor, "b n"]
    key_pos: Int[Tensor, "b pairs"]
    value_pos: Int[Tensor, "b pairs"]
    query_pos: Int[Tensor, "b pairs"]
    target: Int[Tensor, "b pairs"]
    value_ids: Int[Tensor, " values"] | None = None

    def __len__(self) -> int:
        return self.ids.shape[0]

    def slice(self, s: slice) -> MQARBatch:
        return MQARBatch(
            self.ids[s],
            self.labels[s],
            self.key_pos[s],
            self.value_pos[s],
            self.query_pos[s],
            self.target[s],
            self.value_ids,
        )

    def gaps(self) -> Int[Tensor, "b pairs"]:
        """Tokens between each value in the context and its query."""
        return self.query_pos - self.value_pos


def _gap_probs(space: int, a: float) -> np.ndarray:
    p = a * np.arange(1, space + 1, dtype=float) ** (a - 1)
    return p / p.sum()


def generate_mqar(spec: MQARSpec, n_examples: int, seed: int = 0) -> MQARBatch:
    """Zoology MQAR examples (see the module docstring), with a private random generator."""
    rng = np.random.default_rng(seed)
    V, L, N = spec.vocab_size, spec.seq_len, spec.n_pairs
    half = V // 2
    space = (L - 2 * N) // 2
    p = _gap_probs(space, spec.power_a)
    if spec.shared_vocab:
        kv = np.stack(
            [rng.choice(np.arange(1, V), 2 * N, replace=False) for _ in range(n_examples)]
        )
        keys, values = kv[:, :N], kv[:, N:]
    else:
        keys = np.stack(
            [rng.choice(np.arange(1, half), N, replace=False) for _ in range(n_examples)]
        )
        values = np.stack(
            [rng.choice(np.arange(half, V), N, replace=False) for _ in range(n_examples)]
        )
    gaps = np.stack([rng.choice(space, N, replace=False, p=p) for _ in range(n_examples)])
    ids = np.zeros((n_examples, L), dtype=np.int64)
    ids[:, 0 : 2 * N : 2] = keys
    ids[:, 1 : 2 * N : 2] = values
    rows = np.arange(n_examples)[:, None]
    query_pos = 2 * N + 2 * gaps
    ids[rows, query_pos] = keys
    labels = np.full((n_examples, L), -100, dtype=np.int64)
    labels[rows, query_pos] = values
    if spec.random_non_queries:
        filler = ids == 0
        ids[filler] = rng.integers(0, V, size=int(filler.sum()))
    key_pos = np.broadcast_to(np.arange(0, 2 * N, 2), (n_examples, N))
    t = torch.from_numpy
    return MQARBatch(
        ids=t(ids),
        labels=t(labels),
        key_pos=t(key_pos.copy()),
        value_pos=t(key_pos + 1),
        query_pos=t(query_pos),
        target=t(values),
        value_ids=None if spec.shared_vocab else torch.arange(half, V),
    )


def insert_gap(probe: MQARBatch, gap: int, vocab_size: int, *, seed: int = 0) -> MQARBatch:
    """Insert ``gap`` random tokens (of ``[0, vocab_size)``, like Zoology's filler) between the
    pairs and the query region of abstract examples; positions are shifted to match."""
    if gap < 0:
        raise HeadhuntError(f"prefix gap must be >= 0, got {gap}")
    if gap == 0:
        return probe
    ctx = int(probe.value_pos.max()) + 1
    gen = torch.Generator().manual_seed(seed)
    fill = torch.randint(vocab_size, (len(probe), gap), generator=gen)
    pad = torch.full((len(probe), gap), -100, dtype=torch.long)
    return MQARBatch(
        ids=torch.cat([probe.ids[:, :ctx], fill, probe.ids[:, ctx:]], 1),
        labels=torch.cat([probe.labels[:, :ctx], pad, probe.labels[:, ctx:]], 1),
        key_pos=probe.key_pos,
        value_pos=probe.value_pos,
        query_pos=probe.query_pos + gap,
        target=probe.target,
        value_ids=probe.value_ids,
    )


@dataclass
class WordPools:
    """Disjoint pools of single-token words (ids) for keys, values and filler."""

    keys: list[int]
    values: list[int]
    filler: list[int]

    @property
    def vocab_size(self) -> int:
        """The abstract vocabulary these pools render: V/2 - 1 keys, V/2 values."""
        return 2 * min(len(self.keys) + 1, len(self.values))


def word_pools(
    tokenizer, text: str | None = None, *, size: int | None = None, seed: int = 0
) -> WordPools:
    """Pools of ``size`` keys, ``size + 1`` values and ``2 * size`` filler words, each a single
    token with a leading space, drawn from ``text`` (default: the bundled corpus). ``size``
    defaults to 256, or fewer when the tokenizer has fewer single-token words (a word-level
    test tokenizer).

    Raises:
        HeadhuntError: the text has too few single-token words (fewer than 4 pools of 2).
    """
    from headhunt.heads.inputs.needles import default_haystack_text

    found = re.findall(r"[A-Za-z]{3,}", text or default_haystack_text())
    words = sorted({w.lower() for w in found})
    ids: list[int] = []
    for w in words:
        enc = tokenizer(" " + w, add_special_tokens=False).input_ids
        if len(enc) == 1 and enc[0] != tokenizer.unk_token_id:
            ids.append(int(enc[0]))
    ids = sorted(set(ids))
    size = min(256, (len(ids) - 1) // 4) if size is None else size
    need = 4 * size + 1
    if size < 2 or len(ids) < need:
        raise HeadhuntError(
            f"found {len(ids)} single-token words in the text; MQAR pools need {max(need, 9)}"
        )
    random.Random(seed).shuffle(ids)
    return WordPools(
        keys=ids[:size], values=ids[size : 2 * size + 1], filler=ids[2 * size + 1 : need]
    )


LAYOUTS = ("kv", "zoology")


def _single_token(tokenizer, text: str) -> int:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) != 1:
        raise HeadhuntError(f"the kv layout needs {text!r} to be one token in this tokenizer")
    return int(ids[0])


def render_mqar(
    spec: MQARSpec,
    pools: WordPools,
    n_examples: int,
    *,
    tokenizer=None,
    layout: str = "kv",
    prefix_gap: int = 0,
    bos_id: int | None = None,
    seed: int = 0,
) -> MQARBatch:
    """Zoology examples rendered into a pretrained tokenizer (see the module docstring).

    Layouts:
        "zoology": one word per abstract token, positions exactly as Zoology's: queries are
            bare keys amid filler, answers are never shown.
        "kv": the same content (pairs, query order, power-law gaps, filler) written as
            ``key: value,`` units; a query is ``key:`` (the value is predicted at the colon)
            followed by its answer and a comma, taking the query slot and the filler slot after
            it. A pretrained LM reads this as a list it has seen, so its recall is measurable;
            the query-to-value attention it needs is a 2-gram (key + colon) match.

    ``spec.vocab_size`` is set from the pools; ``prefix_gap`` filler words go between the pairs
    and the query region; ``bos_id`` is prepended when given; ``tokenizer`` is needed for "kv".
    """
    if layout not in LAYOUTS:
        raise HeadhuntError(f"unknown MQAR layout {layout!r} (use {' or '.join(LAYOUTS)})")
    if prefix_gap < 0:
        raise HeadhuntError(f"prefix gap must be >= 0, got {prefix_gap}")
    spec = MQARSpec(
        vocab_size=pools.vocab_size,
        seq_len=spec.seq_len,
        n_pairs=spec.n_pairs,
        power_a=spec.power_a,
        random_non_queries=False,
    )
    raw = generate_mqar(spec, n_examples, seed)
    half = spec.vocab_size // 2
    table = torch.zeros(spec.vocab_size, dtype=torch.long)
    table[1:half] = torch.tensor(pools.keys[: half - 1])
    table[half:] = torch.tensor(pools.values[: spec.vocab_size - half])
    gen = torch.Generator().manual_seed(seed + 1)
    filler = torch.tensor(pools.filler)
    ctx = 2 * spec.n_pairs
    if layout == "kv":
        if tokenizer is None:
            raise HeadhuntError("the kv layout needs the tokenizer")
        colon, comma = _single_token(tokenizer, ":"), _single_token(tokenizer, ",")
    rows, kpos, vpos, qpos = [], [], [], []
    for b in range(n_examples):
        x = raw.ids[b].tolist()
        is_query = set(raw.query_pos[b].tolist())
        ids: list[int] = [] if bos_id is None else [bos_id]
        pos_of: dict[int, int] = {}  # abstract position -> rendered position of its token

        def word(a: int) -> int:
            return (
                int(table[a]) if a else int(filler[torch.randint(len(filler), (1,), generator=gen)])
            )

        i = 0
        while i < len(x):
            if i == ctx:
                ids += filler[torch.randint(len(filler), (prefix_gap,), generator=gen)].tolist()
            if layout == "zoology":
                pos_of[i] = len(ids)
                ids.append(word(x[i]))
                i += 1
            elif i < ctx:  # a context pair: key: value,
                pos_of[i], pos_of[i + 1] = len(ids), len(ids) + 2
                ids += [word(x[i]), colon, word(x[i + 1]), comma]
                i += 2
            elif i in is_query:  # key: (predict here) value,
                pos_of[i] = len(ids) + 1
                value = int(raw.labels[b, i])
                ids += [word(x[i]), colon, int(table[value]), comma]
                i += 2
            else:
                pos_of[i] = len(ids)
                ids.append(word(0))
                i += 1
        rows.append(ids)
        kpos.append([pos_of[int(p)] for p in raw.key_pos[b]])
        vpos.append([pos_of[int(p)] for p in raw.value_pos[b]])
        qpos.append([pos_of[int(p)] for p in raw.query_pos[b]])
    ids_t = torch.tensor(rows, dtype=torch.long)
    q_t = torch.tensor(qpos, dtype=torch.long)
    target = table[raw.target]
    labels = torch.full_like(ids_t, -100)
    labels.scatter_(1, q_t, target)
    return MQARBatch(
        ids=ids_t,
        labels=labels,
        key_pos=torch.tensor(kpos, dtype=torch.long),
        value_pos=torch.tensor(vpos, dtype=torch.long),
        query_pos=q_t,
        target=target,
        value_ids=torch.tensor(sorted(set(pools.values[: spec.vocab_size - half]))),
    )
