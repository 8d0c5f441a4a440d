"""Node and edge scores from discrete codes (O'Neill & Bui 2024), and circuits cut from them.

A head's *code* on a prompt is the argmax SAE feature of its output. A head that takes part in
the task should write something on positive prompts that it never writes on negative ones, so
its positive codes include values no negative prompt produces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from jaxtyping import Float, Int

from headhunt.errors import HeadhuntError


def _check(codes_pos: np.ndarray, codes_neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p, n = np.asarray(codes_pos), np.asarray(codes_neg)
    if p.ndim != 2 or n.ndim != 2 or p.shape[1] != n.shape[1]:
        raise HeadhuntError(
            f"codes must be [examples, heads] with the same heads, got {p.shape} and {n.shape}"
        )
    if len(p) == 0 or len(n) == 0:
        raise HeadhuntError("need at least one positive and one negative example")
    return p.astype(np.int64), n.astype(np.int64)


@dataclass
class NodeScores:
    """Per-head node scores.

    Attributes:
        count: |P \\ N|, the number of distinct codes a head takes on positive prompts and never
            on negative ones (the paper's node score).
        normalised: |P \\ N| / |P ∪ N|, the share of the head's distinct codes that are
            positive-only (the paper's ``normalise=True``), in [0, 1].
        pos_only: the share of positive prompts on which the head's code is one no negative
            prompt gives it, in [0, 1] (|P \\ N| weighted by how often each code occurs).
        changed: the share of pairs on which the head's code on the positive differs from its
            code on that pair's own negative, in [0, 1] (row i of the positives and of the
            negatives must be one pair; NaN when their counts differ).
    """

    count: Float[np.ndarray, " heads"]
    normalised: Float[np.ndarray, " heads"]
    pos_only: Float[np.ndarray, " heads"]
    changed: Float[np.ndarray, " heads"]


def node_scores(
    codes_pos: Int[np.ndarray, "pos heads"], codes_neg: Int[np.ndarray, "neg heads"]
) -> NodeScores:
    """Node scores of every head from its codes on positive and negative prompts."""
    p, n = _check(codes_pos, codes_neg)
    heads = p.shape[1]
    count, norm, pos_only = np.zeros(heads), np.zeros(heads), np.zeros(heads)
    for h in range(heads):
        sp, sn = set(p[:, h].tolist()), set(n[:, h].tolist())
        only = len(sp - sn)
        count[h] = only
        norm[h] = only / len(sp | sn)
        pos_only[h] = (~np.isin(p[:, h], n[:, h])).mean()
    changed = (p != n).mean(0).astype(float) if len(p) == len(n) else np.full(heads, np.nan)
    return NodeScores(count=count, normalised=norm, pos_only=pos_only, changed=changed)


def edge_scores(
    codes_pos: Int[np.ndarray, "pos heads"], codes_neg: Int[np.ndarray, "neg heads"]
) -> Float[np.ndarray, "heads heads"]:
    """Edge score of every head pair: the number of distinct (code_i, code_j) pairs seen
    together on positive prompts and never on a negative one. Symmetric, zero diagonal."""
    p, n = _check(codes_pos, codes_neg)
    base = int(max(p.max(), n.max())) + 1
    # pair id of (i, j) on one example: code_i * base + code_j, all pairs at once: [ex, h, h]
    pid = p[:, :, None] * base + p[:, None, :]
    nid = n[:, :, None] * base + n[:, None, :]
    heads = p.shape[1]
    count = np.zeros((heads, heads), dtype=np.int64)
    for k in range(len(pid)):
        new = ~(pid[k] == pid[:k]).any(0) if k else np.ones((heads, heads), bool)
        in_neg = (pid[k] == nid).any(0)
        count += new & ~in_neg
    np.fill_diagonal(count, 0)
    return count.astype(float)


def edge_head_scores(
    edges: Float[np.ndarray, "heads heads"], top_fraction: float = 0.5
) -> Float[np.ndarray, " heads"]:
    """A head's score from edges: how many of the top ``top_fraction`` of head pairs (ranked by
    edge score) it belongs to (the paper's head score from edges).

    The reference code means to keep half of the pairs but cuts its list of pair members at
    n_heads**2 / 2 entries, two per ordered pair and both orders of each pair listed, which
    keeps about a quarter of the pairs; the default here is the intended half
    (``top_fraction=0.25`` gives the code's behaviour). It also breaks ties at the cut by array
    order; here the pairs tied at the cut all count, each with the weight that keeps the total
    number of counted pairs at the cut size, so the score does not depend on head order.
    """
    if not 0 < top_fraction <= 1:
        raise HeadhuntError(f"top_fraction must be in (0, 1], got {top_fraction}")
    heads = edges.shape[0]
    iu, ju = np.triu_indices(heads, 1)
    vals = edges[iu, ju]
    k = round(top_fraction * len(vals))
    if k == 0:
        return np.zeros(heads)
    cut = np.sort(vals)[::-1][k - 1]
    above = vals > cut
    tied = vals == cut
    weight = above.astype(float) + tied * ((k - above.sum()) / tied.sum())
    out = np.zeros(heads)
    np.add.at(out, iu, weight)
    np.add.at(out, ju, weight)
    return out


def circuit(
    scores: Float[np.ndarray, "layers heads"],
    *,
    size: int | None = None,
    threshold: float | None = None,
) -> list[tuple[int, int]]:
    """The heads of a circuit, best first: the ``size`` best heads, or every head scoring above
    ``threshold`` (exactly one of the two).

    Ties at the size cut are broken towards earlier (layer, head).
    """
    if (size is None) == (threshold is None):
        raise HeadhuntError("give a circuit size or a threshold, not both or neither")
    s = np.asarray(scores, float)
    flat = s.ravel()
    order = np.argsort(-flat, kind="stable")
    if size is not None:
        if not 0 < size <= flat.size:
            raise HeadhuntError(f"circuit size must be in 1..{flat.size}, got {size}")
        chosen = order[:size]
    else:
        chosen = [i for i in order if flat[i] > threshold]
    n_heads = s.shape[1]
    return [(int(i) // n_heads, int(i) % n_heads) for i in chosen]


def head_labels(n_layers: int, n_heads: int) -> Sequence[str]:
    """Names "L.H" of the flattened heads, in the flattening order used everywhere here."""
    return [f"{layer}.{head}" for layer in range(n_layers) for head in range(n_heads)]
