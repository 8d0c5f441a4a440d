"""N-gram heads and the induction family: previous-token, duplicate-token, induction and k-gram.

Definitions (TransformerLens ``head_detector``; Akyürek et al. 2024, arXiv 2401.12973):

- **Previous-token, duplicate-token, induction** follow TransformerLens' ``head_detector``:
  detection patterns D (previous: ``D[t, t-1]``; duplicate: ``D[t, j] = 1`` for ``j < t`` with
  ``x[j] == x[t]``; induction: the duplicate pattern shifted one key to the right, so
  ``D[t, j] = 1`` for ``1 <= j <= t`` with ``x[j-1] == x[t]``) and the "mul" score
  ``sum(A * D) / sum(A)`` per sequence, averaged over sequences. ``exclude_bos`` zeroes key 0 of
  A, ``exclude_current_token`` its diagonal, before both sums (as TransformerLens does).
- **k-gram match set** (Akyürek et al.'s static n-gram layer): query t matches key j < t when
  the k tokens ending at t equal the k tokens before j: ``x[t-i] == x[j-1-i]`` for
  ``i = 0..k-1``. k = 1 is the classic induction target. The **(k-1)-only set** holds the keys
  whose preceding k-1 tokens match but not the k-th (for k = 1: every key ``1 <= j < t`` that
  does not follow an occurrence of ``x[t]``).

Scores of a head for order k (all in [0, 1] except the contrast):

- ``kgram_mass``: mean, over queries with at least one full k-gram match, of the attention mass
  on the matched keys. An order-k head (Akyürek's static layer) scores ~1.
- ``kgram_only_mass``: mean, over queries having both kinds of keys, of the mass on the
  (k-1)-only keys.
- ``kgram_contrast``: over the same queries, ``(F - O) / (F + O)`` where F and O are the mean
  attention per full-match key and per (k-1)-only key. +1: the head attends only to full
  k-gram matches; 0: it does not tell them apart (a head of order k-1 or lower); -1: it
  prefers the partial matches. A head of order k has contrast ~1 for every order <= k and ~0
  at k + 1, so its **best order** is the largest k whose contrast and mass pass the thresholds.

Everything is computed from each layer's post-rotary q and k inside the forward pass: the
per-query log-sum-exp from :func:`headhunt.kernels.attention_stats` and exact probabilities at
the matched (query, key) pairs from :func:`headhunt.kernels.attention_probs_at`, so memory
grows with n x (number of matches), never n^2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.heads.configs import K_LIMIT, NgramConfig  # noqa: F401  (its config)
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel
from headhunt.scores import HeadScores


@dataclass
class MatchPairs:
    """The equal-token pairs of one sequence, with their k-gram match lengths.

    Attributes:
        n: sequence length.
        t, p: every pair ``p < t`` with ``x[p] == x[t]`` (the duplicate-token pairs); the
            induction / k-gram key of the pair is ``j = p + 1``.
        length: for each pair, the number of tokens matched backwards from (t, p), i.e. the
            largest L <= k_max with ``x[t-i] == x[p-i]`` for ``i < L`` (always >= 1).
    """

    n: int
    t: np.ndarray
    p: np.ndarray
    length: np.ndarray

    @property
    def n_pairs(self) -> int:
        return len(self.t)


def match_pairs(ids: Sequence[int] | np.ndarray | Tensor, k_max: int) -> MatchPairs:
    """All equal-token pairs of ``ids`` and their backward match lengths (capped at ``k_max``).

    Vectorised: tokens are sorted by (id, position); each token pairs with the earlier members
    of its group, so the cost is O(n log n + pairs).
    """
    x = torch.as_tensor(ids).cpu().numpy().astype(np.int64).ravel()
    n = len(x)
    order = np.lexsort((np.arange(n), x))
    xs = x[order]
    starts = np.r_[True, xs[1:] != xs[:-1]] if n else np.zeros(0, bool)
    group = np.cumsum(starts) - 1
    group_start = np.flatnonzero(starts)
    rank = np.arange(n) - group_start[group]  # how many earlier tokens equal this one
    total = int(rank.sum())
    later = np.repeat(np.arange(n), rank)
    first = np.repeat(group_start[group], rank)
    within = np.arange(total) - np.repeat(np.cumsum(rank) - rank, rank)
    t = order[later]
    p = order[first + within]
    length = np.ones(total, dtype=np.int64)
    alive = np.ones(total, dtype=bool)
    for i in range(1, k_max):
        ok = alive & (p - i >= 0)
        idx = np.flatnonzero(ok)
        ok[idx] = x[t[idx] - i] == x[p[idx] - i]
        length += ok
        alive = ok
    return MatchPairs(n=n, t=t, p=p, length=length)


def _probs(
    q: Tensor, k: Tensor, lse: Tensor, qi: Tensor, ki: Tensor, kw: dict, chunk: int
) -> Float[Tensor, "hq m"]:
    """Exact attention probabilities of pairs (qi, ki) for one batch row, in chunks; ``kw``
    describes the layer's attention (:meth:`AttentionCall.kernel_kwargs`)."""
    from headhunt.kernels import attention_probs_at

    out = []
    for s in range(0, len(qi), chunk):
        out.append(attention_probs_at(q, k, lse, qi[s : s + chunk], ki[s : s + chunk], **kw)[0])
    if not out:
        return torch.zeros(q.shape[1], 0)
    return torch.cat(out, 1).cpu()


@dataclass
class SeqRecord:
    """Per-sequence sums of one scored sequence (added over sequences to give the scores).

    Arrays are ``[layers, heads]`` or ``[k_max, layers, heads]``; counts are per order.
    """

    n: int
    tl_prev: np.ndarray
    tl_dup: np.ndarray
    tl_ind: np.ndarray
    full_sum: np.ndarray
    n_full: np.ndarray
    only_sum: np.ndarray
    full_pp_sum: np.ndarray
    only_pp_sum: np.ndarray
    n_both: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        return {f.name: np.asarray(getattr(self, f.name)).tolist() for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SeqRecord:
        return cls(**{f.name: np.asarray(d[f.name], dtype=float) for f in fields(cls)})


class NgramHook(AttentionHook):
    """Scores every head of every layer it sees for a batch of sequences, inside the forward.

    Set :attr:`pairs` (one :class:`MatchPairs` per batch row) before each forward; the hook
    keeps only per-head sums (``results[row][layer]``), never a layer's q/k or an n x n matrix.
    """

    def __init__(self, cfg: NgramConfig):
        self.cfg = cfg
        self.pairs: list[MatchPairs] = []
        self.results: list[dict[int, dict[str, Tensor]]] = []

    def set_pairs(self, pairs: list[MatchPairs]) -> None:
        self.pairs = pairs
        self.results = [{} for _ in pairs]

    @torch.inference_mode()
    def before(self, call: AttentionCall) -> None:
        from headhunt.kernels import attention_stats

        q, k = call.query, call.key
        if q.shape[2] != k.shape[2]:
            raise HeadhuntError("n-gram scoring needs a full forward pass (no KV cache)")
        lse = attention_stats(q, k, **call.kernel_kwargs(), key_stats=False).lse
        for b, mp in enumerate(self.pairs):
            self.results[b][call.layer] = _score_row(
                q[b : b + 1], k[b : b + 1], lse[b : b + 1], mp, call.kernel_kwargs(b), self.cfg
            )


def _score_row(
    q: Float[Tensor, "1 hq n d"],
    k: Float[Tensor, "1 hkv n d"],
    lse: Float[Tensor, "1 hq n"],
    mp: MatchPairs,
    kw: dict,
    cfg: NgramConfig,
) -> dict[str, Tensor]:
    n, hq, K, dev = mp.n, q.shape[1], cfg.k_max, q.device
    ar = torch.arange(n, device=dev)
    zero = torch.zeros_like(ar)
    a_diag = _probs(q, k, lse, ar, ar, kw, cfg.chunk_pairs)  # [hq, n]
    a_bos = _probs(q, k, lse, ar, zero, kw, cfg.chunk_pairs)
    a_prev = _probs(q, k, lse, ar[1:], ar[:-1], kw, cfg.chunk_pairs)  # query t = 1..n-1
    t = torch.from_numpy(mp.t)
    p = torch.from_numpy(mp.p)
    a_dup = _probs(q, k, lse, t.to(dev), p.to(dev), kw, cfg.chunk_pairs)  # [hq, m]
    a_ind = _probs(q, k, lse, t.to(dev), (p + 1).to(dev), kw, cfg.chunk_pairs)

    # TransformerLens "mul": sum(A' * D) / sum(A'), A' = A with the excluded keys zeroed.
    row = torch.ones(hq, n)  # each query's attention mass over the keys
    if kw.get("sinks") is not None:  # learned sinks take exp(sink - lse) of every row
        row -= torch.exp(kw["sinks"].float()[:, None] - lse[0].float()).cpu()
    if kw.get("row_sinks") is not None:  # a sink logit per query row (Inkling 2)
        row -= torch.exp(kw["row_sinks"][0].float() - lse[0].float()).cpu()
    if cfg.exclude_bos:
        row -= a_bos
    if cfg.exclude_current_token:
        row -= a_diag
        if cfg.exclude_bos:
            row[:, 0] += a_diag[:, 0]  # key 0 of query 0 is both: zeroed once
    total = row.sum(1)
    prev = a_prev[:, 1:].sum(1) if cfg.exclude_bos else a_prev.sum(1)
    dup = a_dup[:, p != 0].sum(1) if cfg.exclude_bos else a_dup.sum(1)
    keep = (p + 1 != t) if cfg.exclude_current_token else torch.ones_like(t, dtype=torch.bool)
    ind = a_ind[:, keep].sum(1)

    # k-gram sets (Akyürek: key j = p + 1 strictly before the query).
    aky = p + 1 < t
    length = torch.from_numpy(mp.length)
    full_sum = torch.zeros(K, hq)
    only_sum = torch.zeros(K, hq)
    full_pp = torch.zeros(K, hq)
    only_pp = torch.zeros(K, hq)
    n_full = torch.zeros(K)
    n_both = torch.zeros(K)
    tq = ar.cpu()
    for order in range(1, K + 1):
        sel = aky & (length >= order)
        full = torch.zeros(hq, n).index_add_(1, t[sel], a_ind[:, sel])
        c_full = torch.bincount(t[sel], minlength=n).float()
        if order == 1:
            # (k-1)-only set for k = 1: keys 1..t-1 that are not 1-gram matches.
            seen = (1 - a_bos - a_diag).clamp_min(0)
            seen[:, 0] = 0
            only = (seen - full).clamp_min(0)
            c_only = (tq - 1).clamp_min(0).float() - c_full
        else:
            sel_o = aky & (length == order - 1)
            only = torch.zeros(hq, n).index_add_(1, t[sel_o], a_ind[:, sel_o])
            c_only = torch.bincount(t[sel_o], minlength=n).float()
        has = c_full > 0
        both = has & (c_only > 0)
        full_sum[order - 1] = full[:, has].sum(1)
        n_full[order - 1] = has.sum()
        only_sum[order - 1] = only[:, both].sum(1)
        full_pp[order - 1] = (full[:, both] / c_full[both]).sum(1)
        only_pp[order - 1] = (only[:, both] / c_only[both]).sum(1)
        n_both[order - 1] = both.sum()
    return {
        "tl_prev": prev / total,
        "tl_dup": dup / total,
        "tl_ind": ind / total,
        "full_sum": full_sum,
        "n_full": n_full,
        "only_sum": only_sum,
        "full_pp_sum": full_pp,
        "only_pp_sum": only_pp,
        "n_both": n_both,
    }


def _record(
    n: int, per_layer: dict[int, dict[str, Tensor]], n_layers: int, attention: list[int]
) -> SeqRecord:
    """One sequence's scores over the model's layers: a layer that is not attention (a
    hybrid's recurrent or convolution layer, ``attention`` lists the others) scores NaN."""
    missing = [i for i in attention if i not in per_layer]
    if missing:
        raise HeadhuntError(f"no attention call was seen for layers {missing}")
    first = per_layer[attention[0]]
    nan = {k: torch.full_like(v, float("nan")) for k, v in first.items()}
    layers = [per_layer.get(i, nan) for i in range(n_layers)]

    def stack(name: str, axis: int) -> np.ndarray:
        return torch.stack([lay[name] for lay in layers], axis).numpy().astype(float)

    return SeqRecord(
        n=n,
        tl_prev=stack("tl_prev", 0),
        tl_dup=stack("tl_dup", 0),
        tl_ind=stack("tl_ind", 0),
        full_sum=stack("full_sum", 1),
        n_full=first["n_full"].numpy().astype(float),
        only_sum=stack("only_sum", 1),
        full_pp_sum=stack("full_pp_sum", 1),
        only_pp_sum=stack("only_pp_sum", 1),
        n_both=first["n_both"].numpy().astype(float),
    )


def check_sequences(model: HookedModel, seqs: Iterable[Tensor]) -> list[Tensor]:
    """1-D long tensors that fit the model's context (else a one-line HeadhuntError); for a
    model that reads several token rows per sequence (MusicGen Melody's codebooks), [codebooks,
    n] tensors, the model's own rows of one sequence."""
    out = []
    rows = getattr(model, "codebooks", 1)
    for s in seqs:
        s = torch.as_tensor(s, dtype=torch.long)
        if rows > 1 and (s.dim() != 2 or s.shape[0] != rows):
            raise HeadhuntError(
                f"{type(model.model).__name__} reads {rows} codebook rows per sequence: each "
                f"probe sequence must be [{rows}, n] (one row per codebook), not "
                f"{list(s.shape)}"
            )
        s = s if rows > 1 else s.reshape(-1)
        if s.shape[-1] < 2:
            raise HeadhuntError("every probe sequence needs at least 2 tokens")
        if s.shape[-1] > model.max_context:
            raise HeadhuntError(
                f"a probe sequence has {s.shape[-1]} tokens, longer than the model's context "
                f"({model.max_context})"
            )
        out.append(s)
    return out


def tuple_ids(seq: Int[Tensor, "codebooks n"]) -> Int[Tensor, " n"]:
    """One id per position of a sequence of several codebook rows, equal where the tuples of
    codes are equal: a token of a codebook model is the tuple of its position's codes (the
    same code in one codebook with another in the next is another token)."""
    return torch.unique(seq.T, dim=0, return_inverse=True)[1]


@torch.inference_mode()
def plan_batches(seqs: Sequence[Tensor], batch_size: int) -> list[list[int]]:
    """The forwards of :func:`score_sequences`: runs of up to ``batch_size`` equal-length
    neighbours, as index lists. Sharing whole batches over processes scores every sequence in
    the same batch as one process does."""
    out, i = [], 0
    while i < len(seqs):
        j = i + 1
        while j < len(seqs) and j - i < batch_size and seqs[j].shape[-1] == seqs[i].shape[-1]:
            j += 1
        out.append(list(range(i, j)))
        i = j
    return out


def score_sequences(
    model: HookedModel,
    seqs: Sequence[Tensor] | Tensor,
    cfg: NgramConfig | None = None,
    *,
    batch_size: int = 8,
    progress: bool = False,
    on_record: Callable[[int, SeqRecord], None] | None = None,
    desc: str = "ngram",
) -> list[SeqRecord]:
    """Score every head on each sequence; one :class:`SeqRecord` per sequence.

    Equal-length neighbours are batched (``batch_size`` rows per forward, see
    :func:`plan_batches`). ``on_record(i, r)`` is called as each sequence finishes (a run
    directory appends it, for resuming).
    """
    from tqdm.auto import tqdm

    cfg = cfg or NgramConfig()
    seqs = check_sequences(model, list(seqs))
    hook = NgramHook(cfg)
    out: list[SeqRecord] = []
    bar = tqdm(total=len(seqs), desc=desc, disable=not progress, unit="seq")
    with model.hooks(hook):
        for idx in plan_batches(seqs, batch_size):
            batch = torch.stack([seqs[i] for i in idx])  # [b, n] (or [b, codebooks, n])
            tokens = batch if batch.dim() == 2 else torch.stack([tuple_ids(s) for s in batch])
            hook.set_pairs([match_pairs(s, cfg.k_max) for s in tokens])
            # Only attention is scored: skip the [n, vocab] logits (1.6 GB at 8k tokens).
            n = batch.shape[-1]
            model.forward(batch.reshape(-1, n), use_cache=False, logits_to_keep=1)
            for b, i in enumerate(idx):
                rec = _record(n, hook.results[b], model.n_layers, model.attention_layers)
                out.append(rec)
                if on_record is not None:
                    on_record(i, rec)
            bar.update(len(idx))
    bar.close()
    return out


def _div(a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.asarray(b) > 0, a / np.where(np.asarray(b) > 0, b, 1), np.nan)


def summarize(
    records: Sequence[SeqRecord],
    cfg: NgramConfig,
    *,
    n_kv_heads: int | None = None,
    source: str = "probe",
) -> HeadScores:
    """Head scores from per-sequence records (one ``source``: random / planted / natural).

    Metrics: ``prev_token``, ``duplicate_token``, ``induction`` (TransformerLens "mul", mean
    over sequences); per order k (column ``order``): ``kgram_mass``, ``kgram_only_mass``,
    ``kgram_contrast``, and the query counts ``kgram_queries`` / ``kgram_both_queries``; per
    head: ``ngram_order`` (0 = none), ``ngram_contrast``, ``ngram_mass`` at that order and
    ``ngram_next_contrast`` (the contrast one order up: ~0 for a true order-k head).

    Raises:
        HeadhuntError: no records, or no query in them has a repeated 1-gram.
    """
    if not records:
        raise HeadhuntError(f"no {source} sequences were scored")
    K = cfg.k_max
    tl = {
        "prev_token": np.mean([r.tl_prev for r in records], 0),
        "duplicate_token": np.mean([r.tl_dup for r in records], 0),
        "induction": np.mean([r.tl_ind for r in records], 0),
    }
    full_sum = sum(r.full_sum for r in records)
    only_sum = sum(r.only_sum for r in records)
    fpp = sum(r.full_pp_sum for r in records)
    opp = sum(r.only_pp_sum for r in records)
    n_full = sum(r.n_full for r in records)
    n_both = sum(r.n_both for r in records)
    if n_full[0] == 0:
        raise HeadhuntError(
            f"the {source} texts are too short to contain any repeated token: no query has a "
            "k-gram match (use longer or more texts)"
        )
    mass = np.stack([_div(full_sum[i], n_full[i]) for i in range(K)])
    only = np.stack([_div(only_sum[i], n_both[i]) for i in range(K)])
    contrast = np.stack(
        [
            _div(fpp[i] - opp[i], fpp[i] + opp[i])
            if n_both[i] >= cfg.min_queries
            else np.full_like(fpp[i], np.nan)
            for i in range(K)
        ]
    )
    tables = [
        HeadScores.from_matrix(m, v, n_kv_heads=n_kv_heads, source=source) for m, v in tl.items()
    ]
    L, H = mass.shape[1:]
    for i in range(K):
        extra = {"source": source, "order": i + 1}
        tables += [
            HeadScores.from_matrix("kgram_mass", mass[i], n_kv_heads=n_kv_heads, **extra),
            HeadScores.from_matrix("kgram_only_mass", only[i], n_kv_heads=n_kv_heads, **extra),
            HeadScores.from_matrix("kgram_contrast", contrast[i], n_kv_heads=n_kv_heads, **extra),
            HeadScores.from_matrix(
                "kgram_queries", np.full((L, H), n_full[i]), n_kv_heads=n_kv_heads, **extra
            ),
            HeadScores.from_matrix(
                "kgram_both_queries", np.full((L, H), n_both[i]), n_kv_heads=n_kv_heads, **extra
            ),
        ]
    order, best_c, best_m, next_c = best_orders(mass, contrast, cfg)
    for name, v in [
        ("ngram_order", order),
        ("ngram_contrast", best_c),
        ("ngram_mass", best_m),
        ("ngram_next_contrast", next_c),
    ]:
        tables.append(HeadScores.from_matrix(name, v, n_kv_heads=n_kv_heads, source=source))
    return HeadScores.concat(tables)


def best_orders(
    mass: Float[np.ndarray, "orders layers heads"],
    contrast: Float[np.ndarray, "orders layers heads"],
    cfg: NgramConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each head's best order: the largest k whose contrast >= ``order_contrast`` and whose
    mass >= ``order_mass`` (0 when no order passes), with its contrast, its mass and the
    contrast one order up (NaN at k_max or for order 0)."""
    K = mass.shape[0]
    ok = (np.nan_to_num(contrast, nan=-2) >= cfg.order_contrast) & (
        np.nan_to_num(mass, nan=0) >= cfg.order_mass
    )
    order = np.zeros(mass.shape[1:], dtype=float)
    for i in range(K):
        order = np.where(ok[i], i + 1, order)
    idx = np.maximum(order.astype(int) - 1, 0)
    pick = np.take_along_axis
    best_c = np.where(order > 0, pick(contrast, idx[None], 0)[0], np.nan)
    best_m = np.where(order > 0, pick(mass, idx[None], 0)[0], np.nan)
    nxt = np.minimum(idx + 1, K - 1)
    next_c = np.where((order > 0) & (order < K), pick(contrast, nxt[None], 0)[0], np.nan)
    return order, best_c, best_m, next_c


def score_ngrams(
    model: HookedModel,
    inputs: dict[str, Sequence[Tensor] | Tensor],
    cfg: NgramConfig | None = None,
    *,
    batch_size: int = 8,
    progress: bool = False,
) -> HeadScores:
    """Score every head on each named input set (e.g. ``{"random": ..., "natural": ...}``)."""
    cfg = cfg or NgramConfig()
    tables = []
    for source, seqs in inputs.items():
        recs = score_sequences(
            model, seqs, cfg, batch_size=batch_size, progress=progress, desc=source
        )
        tables.append(summarize(recs, cfg, n_kv_heads=model.score_kv_heads(), source=source))
    return HeadScores.concat(tables)


def order_table(scores: HeadScores, source: str, *, min_order: int = 1) -> pd.DataFrame:
    """Heads of best order >= ``min_order`` on ``source``: layer, head, order, contrast, mass,
    next_contrast, sorted by order then contrast."""
    df = scores.df[scores.df["source"] == source]
    wide = df[df["metric"].str.startswith("ngram_")].pivot_table(
        index=["layer", "head"], columns="metric", values="value", dropna=False
    )
    wide = wide.rename(columns=lambda c: c.removeprefix("ngram_")).reset_index()
    wide = wide[wide["order"] >= min_order]
    wide["order"] = wide["order"].astype(int)
    cols = ["layer", "head", "order", "contrast", "mass", "next_contrast"]
    return wide[cols].sort_values(["order", "contrast"], ascending=False).reset_index(drop=True)


def dense_reference(
    attn: Float[Tensor, "heads n n"], ids: Int[Tensor, " n"], cfg: NgramConfig
) -> dict[str, np.ndarray]:
    """The same per-sequence quantities from a full attention matrix (tests only: n^2 memory).

    Returns ``tl_prev``, ``tl_dup``, ``tl_ind`` [heads] and ``mass``, ``contrast`` [k, heads]
    for this one sequence.
    """
    x = ids.tolist()
    n = len(x)
    A = attn.double().clone()
    Ap = A.clone()
    if cfg.exclude_bos:
        Ap[:, :, 0] = 0
    if cfg.exclude_current_token:
        Ap[:, torch.arange(n), torch.arange(n)] = 0
    D_prev = torch.zeros(n, n, dtype=torch.double)
    D_dup = torch.zeros(n, n, dtype=torch.double)
    D_ind = torch.zeros(n, n, dtype=torch.double)
    for t in range(n):
        if t:
            D_prev[t, t - 1] = 1
        for j in range(t):
            D_dup[t, j] = float(x[j] == x[t])
        for j in range(1, t + 1):
            D_ind[t, j] = float(x[j - 1] == x[t])
    tot = Ap.sum((1, 2))
    res = {
        "tl_prev": ((Ap * D_prev).sum((1, 2)) / tot).numpy(),
        "tl_dup": ((Ap * D_dup).sum((1, 2)) / tot).numpy(),
        "tl_ind": ((Ap * D_ind).sum((1, 2)) / tot).numpy(),
    }
    masses, contrasts = [], []
    for order in range(1, cfg.k_max + 1):
        fsum, fpp, opp, nf, nb = 0.0, 0.0, 0.0, 0, 0
        for t in range(n):

            def matched(j: int, kk: int, t: int = t) -> bool:
                return all(j - 1 - i >= 0 and x[t - i] == x[j - 1 - i] for i in range(kk))

            full = [j for j in range(1, t) if matched(j, order)]
            only = [j for j in range(1, t) if matched(j, order - 1) and j not in full]
            if full:
                fsum = fsum + A[:, t, full].sum(1)
                nf += 1
            if full and only:
                fpp = fpp + A[:, t, full].sum(1) / len(full)
                opp = opp + A[:, t, only].sum(1) / len(only)
                nb += 1
        masses.append((fsum / nf).numpy() if nf else np.full(A.shape[0], np.nan))
        contrasts.append(((fpp - opp) / (fpp + opp)).numpy() if nb else np.full(A.shape[0], np.nan))
    res["mass"] = np.stack(masses)
    res["contrast"] = np.stack(contrasts)
    return res
