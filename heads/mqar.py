"""Multi-query associative recall (MQAR, Zoology): recall heads and masking.

The examples come from :mod:`headhunt.heads.inputs.mqar_inputs` (the generator and the rendering into
a pretrained model's words; its names are importable from here too).

Recall heads (:func:`score_recall_heads`): for each query, the attention from the query
position to the position of its key's value in the context (``query_to_value``, what an
induction head reads) and to the key itself (``query_to_key``); and, inside the context, the
attention from each value to its own key (``value_to_key``, what a previous-token head does in
the zoology layout). All from per-query log-sum-exp and exact probabilities at those pairs
(``headhunt.kernels``), never an n x n matrix.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.heads.evaluations.causal import MaskingCheck
from headhunt.heads.inputs.mqar_inputs import (  # the generator's names, importable from here too
    LAYOUTS,
    MQARBatch,
    MQARSpec,
    WordPools,
    generate_mqar,
    insert_gap,
    render_mqar,
    word_pools,
)
from headhunt.heads.interventions.masking import HeadMask
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel
from headhunt.scores import Head, HeadScores

__all__ = [
    "LAYOUTS",
    "RECALL_METRICS",
    "MQARBatch",
    "MQARResult",
    "MQARSpec",
    "RecallHook",
    "WordPools",
    "generate_mqar",
    "insert_gap",
    "masking_check",
    "masking_curve",
    "recall_scores",
    "render_mqar",
    "run_mqar",
    "score_recall_heads",
    "word_pools",
]


RECALL_METRICS = ["query_to_value", "query_to_key", "value_to_key"]


class RecallHook(AttentionHook):
    """Per layer and head, the summed attention query -> value, query -> key, value -> key."""

    def __init__(self, probe: MQARBatch):
        self.probe = probe
        self.sums: dict[int, Float[Tensor, "3 heads"]] = {}

    def before(self, call: AttentionCall) -> None:
        from headhunt.kernels import attention_probs_at, attention_stats

        q, k = call.query, call.key
        if q.shape[2] != k.shape[2]:
            raise HeadhuntError("recall-head scoring needs a full forward pass (no KV cache)")
        kw = call.kernel_kwargs()  # the layer's mask, window, softcap and sinks
        lse = attention_stats(q, k, **kw, key_stats=False).lse
        b, hq = q.shape[:2]
        pr = self.probe

        def at(qi: Tensor, ki: Tensor) -> Tensor:
            idx = lambda x: x.to(q.device)[:, None, :].expand(b, hq, -1)  # noqa: E731
            return attention_probs_at(q, k, lse, idx(qi), idx(ki), **kw)

        s = torch.stack(
            [
                at(pr.query_pos, pr.value_pos).sum((0, 2)),
                at(pr.query_pos, pr.key_pos).sum((0, 2)),
                at(pr.value_pos, pr.key_pos).sum((0, 2)),
            ]
        ).cpu()
        self.sums[call.layer] = self.sums.get(call.layer, 0) + s


@dataclass
class MQARResult:
    """Accuracy and (optionally) recall-head sums of one probe.

    Attributes:
        correct: [b, pairs] argmax over the whole vocabulary equals the value.
        correct_pool: [b, pairs] argmax over the value pool equals the value.
        gaps: [b, pairs] tokens between each value in the context and its query.
        recall: [3, layers, heads] summed attention (query->value, query->key, value->key),
            or None when not scored.
    """

    correct: Bool[Tensor, "b pairs"]
    correct_pool: Bool[Tensor, "b pairs"]
    gaps: Int[Tensor, "b pairs"]
    recall: Float[Tensor, "3 layers heads"] | None

    @property
    def accuracy(self) -> float:
        return float(self.correct.float().mean())

    @property
    def accuracy_pool(self) -> float:
        return float(self.correct_pool.float().mean())


@torch.inference_mode()
def run_mqar(
    model: HookedModel,
    probe: MQARBatch,
    *,
    batch_size: int = 8,
    score_heads: bool = False,
    hooks: Sequence[AttentionHook] = (),
) -> MQARResult:
    """Recall accuracy of ``model`` on ``probe`` (teacher-free: one forward per batch), and with
    ``score_heads`` the recall-head attention sums. ``hooks`` (e.g. a head mask) stay
    installed. Logits are computed only at the query positions."""
    if probe.ids.shape[1] > model.max_context:
        raise HeadhuntError(
            f"MQAR examples have {probe.ids.shape[1]} tokens, longer than the model's context "
            f"({model.max_context})"
        )
    correct, correct_pool = [], []
    recall = None
    vocab = probe.value_ids
    for s in range(0, len(probe), batch_size):
        pr = probe.slice(slice(s, s + batch_size))
        keep = torch.unique(pr.query_pos)
        extra: list[AttentionHook] = list(hooks)
        rec = RecallHook(pr) if score_heads else None
        if rec is not None:
            extra.append(rec)
        with model.hooks(*extra):
            # A list, not a tensor: accelerate would move a tensor to the first GPU, while under
            # --device-map the last hidden state it indexes sits on the last layer's GPU.
            out = model.forward(pr.ids, use_cache=False, logits_to_keep=keep.tolist())
        dev = out.logits.device
        col = torch.searchsorted(keep, pr.query_pos).to(dev)
        logits = out.logits.gather(
            1, col[..., None].expand(-1, -1, out.logits.shape[-1])
        )  # [b, N, vocab]
        tgt = pr.target.to(dev)
        correct.append((logits.argmax(-1) == tgt).cpu())
        if vocab is not None:
            vocab = vocab.to(dev)
            sub = logits[..., vocab]
            correct_pool.append((vocab[sub.argmax(-1)] == tgt).cpu())
        else:
            correct_pool.append(correct[-1])
        if rec is not None:
            # a hybrid's layers that are not attention score NaN
            like = rec.sums[model.attention_layers[0]]
            nan = torch.full_like(like, float("nan"))
            layer_sums = torch.stack([rec.sums.get(i, nan) for i in range(model.n_layers)], 1)
            recall = layer_sums if recall is None else recall + layer_sums
    return MQARResult(
        correct=torch.cat(correct),
        correct_pool=torch.cat(correct_pool),
        gaps=probe.gaps(),
        recall=recall,
    )


def recall_scores(
    recall: Float[Tensor, "3 layers heads"],
    n_queries: int,
    *,
    n_kv_heads: int | None = None,
    **extra: Any,
) -> HeadScores:
    """Mean attention per query: ``query_to_value`` (query -> its key's value in the context,
    what an induction head reads), ``query_to_key`` (query -> the key itself) and
    ``value_to_key`` (each context value -> its own key: a previous-token head in the zoology
    layout)."""
    means = (recall / max(n_queries, 1)).numpy()
    return HeadScores.concat(
        HeadScores.from_matrix(name, means[i], n_kv_heads=n_kv_heads, **extra)
        for i, name in enumerate(RECALL_METRICS)
    )


def score_recall_heads(
    model: HookedModel, probe: MQARBatch, *, batch_size: int = 8
) -> tuple[HeadScores, MQARResult]:
    """Recall-head scores and accuracy of ``model`` on ``probe`` (one pass)."""
    res = run_mqar(model, probe, batch_size=batch_size, score_heads=True)
    assert res.recall is not None
    n = probe.query_pos.numel()
    return recall_scores(res.recall, n, n_kv_heads=model.score_kv_heads()), res


def masking_check(
    model: HookedModel,
    probe: MQARBatch,
    heads: Sequence[Head],
    *,
    n_random: int = 5,
    mode: str = "query",
    seed: int = 0,
    batch_size: int = 8,
    exclude: Sequence[Head] | None = None,
) -> dict[str, Any]:
    """Accuracy with ``heads`` masked against ``n_random`` sets of as many other heads, drawn
    from the heads outside ``exclude`` (default: outside ``heads``).

    Returns a dict: ``baseline``, ``masked`` (accuracy with the heads masked), ``random``
    (one accuracy per random set), ``random_mean``, ``heads`` and ``random_sets``, plus the
    same three accuracies over the value pool (``*_pool``).
    """
    check = MaskingCheck.draw(model, heads, n_random, seed=seed, exclude=exclude or ())

    def acc(hs: list[Head]) -> MQARResult:
        hooks = [HeadMask(hs, mode)] if hs else []  # type: ignore[arg-type]
        return run_mqar(model, probe, batch_size=batch_size, hooks=hooks)

    res = check.run(acc, progress=False)
    base, masked = res["baseline"], res["top"]
    rand = [res[f"random{i}"] for i in range(n_random)]
    heads, sets = check.heads, check.random_sets
    return {
        "heads": heads,
        "mode": mode,
        "baseline": base.accuracy,
        "masked": masked.accuracy,
        "random": [r.accuracy for r in rand],
        "random_mean": float(np.mean([r.accuracy for r in rand])) if rand else float("nan"),
        "baseline_pool": base.accuracy_pool,
        "masked_pool": masked.accuracy_pool,
        "random_pool": [r.accuracy_pool for r in rand],
        "random_sets": sets,
    }


def masking_curve(
    model: HookedModel,
    probe: MQARBatch,
    ranked: Sequence[Head],
    ks: Sequence[int],
    *,
    n_random: int = 20,
    mode: str = "query",
    seed: int = 0,
    batch_size: int = 8,
) -> dict[str, Any]:
    """Graded masking: accuracy with the top ``k`` of ``ranked`` masked, for each ``k`` in
    ``ks``, against random sets of ``k`` heads drawn from *every* attention head (the ranked ones
    included: the control is "as many heads, any of them", so at ``k`` = all heads both are the
    same set). Where there are at most ``n_random`` sets of ``k`` heads, every one is measured
    (the exact mean over sets); otherwise ``n_random`` distinct sets are drawn.

    Returns a dict: ``baseline``, ``ks``, ``n_heads`` (the attention heads drawn from), and
    per k: ``top`` (accuracy), ``top_sets``, ``random`` (one accuracy per set),
    ``random_sets``, ``random_mean``, ``random_sd`` (the spread over sets), ``random_se`` (the
    standard error of the mean over sets; 0 when every set was measured, since that mean is
    then exact) and ``exhaustive`` (every set measured). Each distinct set is run once.
    """
    pool = [(la, h) for la in model.attention_layers for h in range(model.n_heads)]
    ranked = [(int(la), int(h)) for la, h in ranked]
    if any(h not in pool for h in ranked):
        raise HeadhuntError(f"ranked heads must be attention heads of the model ({ranked})")
    if not ks or any(k < 1 or k > len(ranked) for k in ks):
        raise HeadhuntError(f"each k must be 1..{len(ranked)} (the heads ranked); got {list(ks)}")
    rng = random.Random(seed)
    measured: dict[tuple[Head, ...], float] = {}

    def acc(heads: Sequence[Head]) -> float:
        key = tuple(sorted(heads))
        if key not in measured:
            hooks = [HeadMask(key, mode)] if key else []  # type: ignore[arg-type]
            measured[key] = run_mqar(model, probe, batch_size=batch_size, hooks=hooks).accuracy
        return measured[key]

    out: dict[str, Any] = {"baseline": acc([]), "ks": list(ks), "n_heads": len(pool), "mode": mode}
    for name in ("top", "top_sets", "random", "random_sets", "random_mean", "random_sd"):
        out[name] = []
    out["random_se"], out["exhaustive"] = [], []
    for k in ks:
        top = sorted(ranked[:k])
        if math.comb(len(pool), k) <= n_random:
            sets = [list(c) for c in combinations(pool, k)]
        else:
            seen: set[tuple[Head, ...]] = set()
            while len(seen) < n_random:
                seen.add(tuple(sorted(rng.sample(pool, k))))
            sets = [list(s) for s in sorted(seen)]
        accs = [acc(s) for s in sets]
        exhaustive = len(sets) == math.comb(len(pool), k)
        sd = float(np.std(accs, ddof=1)) if len(accs) > 1 else float("nan")
        se = 0.0 if exhaustive else sd / math.sqrt(len(accs))
        out["top"].append(acc(top))
        out["top_sets"].append(top)
        out["random"].append(accs)
        out["random_sets"].append(sets)
        out["random_mean"].append(float(np.mean(accs)))
        out["random_sd"].append(sd)
        out["random_se"].append(se)
        out["exhaustive"].append(exhaustive)
    return out
