"""KV budgets from head scores, in the shapes kvpress's head-aware presses take, with honest
accounting of what each budget keeps.

Pure numpy (no torch, no transformers): the export command, ``kv-eval`` and the kvpress
benchmark environment (which pins an older transformers) all import it.

- :func:`lukv_curve`: LU-KV's budget curve (Li et al. 2026, arXiv:2602.08585; kvpress
  ``LUKVPress``): ``[99, layers, kv_heads]`` prune ratios, entry ``t`` for the global
  compression ratio ``(t + 1) / 100``. LUKVPress keeps ``(1 - curve[t, layer, h]) * seq_len``
  tokens of KV head ``h`` (its own token scorer picks which).
- :func:`head_weights`: per-KV-head weights for AdaKV-style allocation (Feng et al. 2024,
  arXiv:2407.11550): kvpress's ``AdaKVPress`` evicts the lowest token scores across a layer's
  heads, so multiplying a head's (non-negative) token scores by its weight shifts budget to it.
- :func:`duo_accounting`: what kvpress's ``DuoAttentionPress`` reports and what it keeps
  (kvpress#228: its ``head_compression_ratio`` counts heads; the sink and recent tokens of
  streaming heads stay, so the KV bytes removed are fewer).
- :func:`ranking_stability`: how far a head ranking can be trusted at a budget: the top-k overlap
  of the rankings from two disjoint halves of the trials.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jaxtyping import Float

TARGETS = (0.25, 0.5, 0.75, 0.875)  # kvpress's leaderboard compression ratios
CURVE_STEPS = 99  # LU-KV: one row per global ratio 0.01 .. 0.99
DEFAULT_FLOOR = 0.1


def fold_kv(matrix: Float[np.ndarray, "layers heads"], n_kv_heads: int) -> np.ndarray:
    """Per-KV-head score: the max over the KV head's query heads (as
    :func:`headhunt.heads.interventions.kvcache.kv_scores`; NaN counts as -inf)."""
    layers, heads = matrix.shape
    m = np.where(np.isnan(matrix), -np.inf, matrix)
    return m.reshape(layers, n_kv_heads, heads // n_kv_heads).max(-1)


def scaled(kv: np.ndarray) -> np.ndarray:
    """Min-max scaled to [0, 1] (all equal: all 1)."""
    lo, hi = float(kv.min()), float(kv.max())
    return (kv - lo) / (hi - lo) if hi > lo else np.ones_like(kv, dtype=float)


def keep_shares(s: np.ndarray, keep: float, floor: float = DEFAULT_FLOOR) -> np.ndarray:
    """Per-head kept shares ``min(1, a * (floor + s))`` whose mean is ``keep`` (``a`` by
    bisection): the best heads keep their whole cache first, the others in proportion to
    ``floor + score``, so a zero-score head keeps ``floor``-proportional tokens, never none."""
    if keep >= 1:
        return np.ones_like(s, dtype=float)
    w = floor + s
    lo, hi = 0.0, 1.0 / max(float(w.min()), 1e-12)
    for _ in range(100):
        a = (lo + hi) / 2
        if np.minimum(1.0, a * w).mean() < keep:
            lo = a
        else:
            hi = a
    return np.minimum(1.0, (lo + hi) / 2 * w)


def lukv_curve(
    kv: Float[np.ndarray, "layers kv_heads"], floor: float = DEFAULT_FLOOR
) -> Float[np.ndarray, "99 layers kv_heads"]:
    """LU-KV's ``[99, layers, kv_heads]`` prune ratios: row ``t`` prunes ``(t + 1) / 100`` of
    all KV entries on average (to 1e-9), spread by :func:`keep_shares` of the scaled scores."""
    s = scaled(kv)
    return np.stack([1.0 - keep_shares(s, 1.0 - (t + 1) / 100, floor) for t in range(CURVE_STEPS)])


def head_weights(
    kv: Float[np.ndarray, "layers kv_heads"], floor: float = DEFAULT_FLOOR
) -> Float[np.ndarray, "layers kv_heads"]:
    """AdaKV head weights ``floor + scaled score``, normalised to mean 1 in each layer (AdaKV
    compares heads within a layer; a layer's weights only need their ratios)."""
    w = floor + scaled(kv)
    return w / w.mean(axis=1, keepdims=True)


def duo_accounting(
    kv: Float[np.ndarray, "layers kv_heads"],
    *,
    sink: int,
    recent: int,
    context: int,
    bytes_per_entry: int | None,
    targets: tuple[float, ...] = TARGETS,
) -> list[dict[str, Any]]:
    """For each target ratio c, DuoAttentionPress as kvpress's evaluation runs it
    (``head_compression_ratio = c``) and as it must run to remove c of the KV bytes.

    Per entry: the ratio kvpress reports (``streamed / n * (1 - (sink + recent) / context)``,
    negative when the context is shorter than sink + recent), the share of KV entries really
    removed (streaming heads keep ``min(context, sink + recent)``), and the KV bytes kept per
    sequence (``bytes_per_entry`` = 2 x head_dim x dtype bytes; every layer holding ``context``
    entries, as in a model without sliding-window layers). Memory actually held stays the full
    cache: kvpress masks evicted keys instead of freeing them.
    """
    n = kv.size
    per_stream = min(context, sink + recent)
    rows = []
    for c in targets:
        for how, head_ratio in (
            ("kvpress evaluate (head ratio = c)", c),
            ("head ratio for c of the bytes", c / (1 - (sink + recent) / context)),
        ):
            reachable = 0 <= head_ratio <= 1
            streamed = round(n * min(max(head_ratio, 0), 1))
            kept = (n - streamed) * context + streamed * per_stream
            rows.append(
                {
                    "target": c,
                    "run": how,
                    "head_compression_ratio": round(head_ratio, 6),
                    "reachable": reachable,
                    "streaming_kv_heads": streamed,
                    "kvpress_reported_ratio": streamed / n * (1 - (sink + recent) / context),
                    "entries_removed_share": 1 - kept / (n * context),
                    "kv_bytes_kept": None if bytes_per_entry is None else kept * bytes_per_entry,
                    "kv_bytes_full": None
                    if bytes_per_entry is None
                    else n * context * bytes_per_entry,
                }
            )
    return rows


def topk_overlap(a: np.ndarray, b: np.ndarray, k: int, seed: int = 0) -> float:
    """Share of the top-k KV heads of score array ``a`` that are also in ``b``'s top-k (ties
    broken by one seeded random order shared by both)."""
    if k <= 0:
        return 1.0
    order = np.random.default_rng(seed).permutation(a.size)
    top = [set(np.lexsort((order, -x.ravel()))[:k].tolist()) for x in (a, b)]
    return len(top[0] & top[1]) / k


def ranking_stability(
    per_trial: Float[np.ndarray, "trials layers heads"],
    n_kv_heads: int,
    full_fraction: float,
    *,
    splits: int = 20,
    seed: int = 0,
    min_overlap: float = 0.9,
) -> dict[str, Any]:
    """How stable the KV-head ranking of the mean score is at a budget of ``full_fraction`` of
    the KV heads: over ``splits`` random halvings of the trials, the overlap of the two halves'
    top-k KV heads (k = round(full_fraction x KV heads)). A half has half the trials, so this
    understates the full run's stability; it is a floor. ``warning`` is set when the mean overlap
    is under ``min_overlap`` or there are fewer than 2 trials."""
    trials = int(per_trial.shape[0])
    n = per_trial.shape[1] * n_kv_heads
    k = round(full_fraction * n)
    out: dict[str, Any] = {"trials": trials, "full_fraction": full_fraction, "top_k": k}
    if trials < 2:
        out.update(overlap=None, warning=f"the ranking rests on {trials} trial(s): no stability")
        return out
    rng = np.random.default_rng(seed)
    overlaps = []
    for i in range(splits):
        idx = rng.permutation(trials)
        halves = idx[: trials // 2], idx[trials // 2 :]
        a, b = (fold_kv(per_trial[h].mean(0), n_kv_heads) for h in halves)
        overlaps.append(topk_overlap(a, b, k, seed + i))
    mean = float(np.mean(overlaps))
    out.update(overlap=round(mean, 4), overlap_min=round(float(np.min(overlaps)), 4))
    out["splits"] = splits
    if mean < min_overlap:
        out["warning"] = (
            f"the ranking rests on {trials} trials; two halves share only {mean:.0%} of their "
            f"top {k} KV heads (under {min_overlap:.0%}): too few trials for this budget"
        )
    return out
