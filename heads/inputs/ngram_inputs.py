"""Probe inputs for n-gram and induction heads.

Three kinds, all returned as token-id sequences:

- :func:`repeated_random`: random tokens repeated (TransformerLens' induction convention: 50
  random tokens repeated twice, BOS in front or not).
- :func:`planted_kgrams`: random tokens with planted k-gram repeats and distractors that share
  only the last k-1 tokens, so every order k = 1..k_max has queries where a full k-gram match
  and a (k-1)-only match coexist: the situation that tells an order-k head from a lower one.
- :func:`natural_chunks`: consecutive chunks of a text (the bundled corpus or a user's file).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from headhunt.errors import HeadhuntError


def token_pool(tokenizer, vocab_size: int | None = None) -> np.ndarray:
    """Token ids safe to draw at random: the vocabulary minus the tokenizer's special tokens."""
    n = int(vocab_size or len(tokenizer))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    pool = np.array([i for i in range(n) if i not in special], dtype=np.int64)
    if len(pool) < 2:
        raise HeadhuntError("the tokenizer has fewer than two ordinary tokens to draw from")
    return pool


def _with_bos(rows: np.ndarray, bos_id: int | None) -> Tensor:
    if bos_id is not None:
        rows = np.concatenate([np.full((rows.shape[0], 1), bos_id, dtype=np.int64), rows], 1)
    return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))


def repeated_random(
    pool: Sequence[int] | np.ndarray,
    *,
    n_seqs: int = 8,
    length: int = 50,
    repeats: int = 2,
    bos_id: int | None = None,
    seed: int = 0,
) -> Int[Tensor, "b n"]:
    """``n_seqs`` sequences of ``length`` random tokens repeated ``repeats`` times.

    Tokens inside one block are distinct (drawn without replacement), so the only duplicates
    are the repeats and the induction target of every second-block query is unique.
    """
    pool = np.asarray(pool, dtype=np.int64)
    if length < 2 or repeats < 2:
        raise HeadhuntError("repeated random tokens need length >= 2 and repeats >= 2")
    if length > len(pool):
        raise HeadhuntError(f"cannot draw {length} distinct tokens from a pool of {len(pool)}")
    rng = np.random.default_rng(seed)
    blocks = np.stack([rng.choice(pool, size=length, replace=False) for _ in range(n_seqs)])
    return _with_bos(np.tile(blocks, (1, repeats)), bos_id)


def planted_kgrams(
    pool: Sequence[int] | np.ndarray,
    *,
    n_seqs: int = 8,
    length: int = 256,
    k_max: int = 4,
    filler: tuple[int, int] = (2, 6),
    bos_id: int | None = None,
    seed: int = 0,
) -> Int[Tensor, "b n"]:
    """Random-token sequences made of episodes with planted k-gram repeats and distractors.

    One episode draws a fresh context ``c = c_1 .. c_K`` (K = ``k_max``) and writes, in a random
    order and separated by random filler, one full occurrence ``c_1 .. c_K y`` and, for every
    m = 0 .. K-1, a distractor ``d c_{K-m+1} .. c_K y_m`` whose token ``d`` differs from
    ``c_{K-m}``: it shares exactly the last m tokens of the context. Then the context occurs
    again (the query). At the query, the positions after the full occurrence match the last k
    tokens for every k <= K, and the position after distractor m matches exactly m tokens, so
    for every order k both a full k-gram match and a (k-1)-only match exist. No token equals
    its predecessor (so a query is never its own k-gram match).

    Args:
        pool: token ids to draw from (contexts, distractors, filler).
        n_seqs: number of sequences.
        length: tokens per sequence (BOS excluded).
        k_max: the longest context planted.
        filler: (min, max) number of random tokens between planted pieces.
        bos_id: prepended when given.
        seed: random seed.
    """
    pool = np.asarray(pool, dtype=np.int64)
    if not 1 <= k_max <= 8:
        raise HeadhuntError(f"k_max must be in 1..8, got {k_max}")
    if len(pool) < k_max + 3:
        raise HeadhuntError(f"a pool of {len(pool)} tokens is too small for k_max={k_max}")
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_seqs):
        out: list[int] = []
        while len(out) < length:
            ep = _episode(rng, pool, k_max, filler)
            if out and ep[0] == out[-1]:
                ep[0] = next(t for t in pool.tolist() if t not in (out[-1], ep[1]))
            out.extend(ep)
        rows.append(out[:length])
    return _with_bos(np.array(rows, dtype=np.int64), bos_id)


def _episode(
    rng: np.random.Generator, pool: np.ndarray, k: int, filler: tuple[int, int]
) -> list[int]:
    ctx = rng.choice(pool, size=k, replace=False).tolist()
    # (token, free): free tokens (filler, continuations) may be redrawn to break repeats.
    pieces = [[*[(c, False) for c in ctx], (int(rng.choice(pool)), True)]]
    for m in range(k):
        # The token before the shared suffix must differ from the context's, so that the
        # distractor matches exactly m tokens (not more), and from its right neighbour.
        bad = {ctx[k - m - 1], *ctx[k - m : k - m + 1]}
        d = int(rng.choice(pool))
        while d in bad:
            d = int(rng.choice(pool))
        pieces.append(
            [(d, False), *[(c, False) for c in ctx[k - m :]], (int(rng.choice(pool)), True)]
        )
    out: list[tuple[int, bool]] = []
    for i in [*rng.permutation(len(pieces)).tolist(), None]:
        n_fill = int(rng.integers(max(1, filler[0]), max(1, filler[1]), endpoint=True))
        out.extend((int(t), True) for t in rng.choice(pool, size=n_fill))
        out.extend(pieces[i] if i is not None else [(c, False) for c in ctx])  # None: the query
    return _no_immediate_repeats(rng, pool, out)


def _no_immediate_repeats(
    rng: np.random.Generator, pool: np.ndarray, seq: list[tuple[int, bool]]
) -> list[int]:
    """Redraw free tokens so that no token equals its predecessor.

    With ``x[t] == x[t-1]`` the key j = t would be a k-gram match of its own query, which
    Akyürek's definition (j < t) excludes; avoiding it keeps planted ground truth exact.
    Every fixed run is flanked by free filler, so a free token is always at hand.
    """
    x = [t for t, _ in seq]
    free = [f for _, f in seq]
    for i in range(1, len(x)):
        if x[i] != x[i - 1]:
            continue
        j = i if free[i] else i - 1
        avoid = {x[j - 1] if j > 0 else None, x[j + 1] if j + 1 < len(x) else None}
        while x[j] in avoid:
            x[j] = int(rng.choice(pool))
    return x


def natural_chunks(
    tokenizer,
    texts: Sequence[str],
    *,
    n_tokens: int = 512,
    n_chunks: int = 8,
    bos_id: int | None = None,
) -> list[Int[Tensor, " n"]]:
    """Up to ``n_chunks`` consecutive chunks of ``n_tokens`` tokens (BOS excluded) from ``texts``.

    Texts are tokenized one by one and their tokens concatenated; a last chunk shorter than
    ``n_tokens`` is kept only when no full chunk exists (a short text still gives one chunk).
    """
    if n_tokens < 2:
        raise HeadhuntError(f"chunks need at least 2 tokens, got {n_tokens}")
    ids: list[int] = []
    for t in texts:
        ids.extend(tokenizer(t, add_special_tokens=False).input_ids)
    if len(ids) < 2:
        raise HeadhuntError("the texts hold fewer than 2 tokens")
    chunks = [ids[i : i + n_tokens] for i in range(0, len(ids), n_tokens)]
    full = [c for c in chunks if len(c) == n_tokens]
    chunks = (full or chunks[:1])[:n_chunks]
    pre = [bos_id] if bos_id is not None else []
    return [torch.tensor(pre + c, dtype=torch.long) for c in chunks]
