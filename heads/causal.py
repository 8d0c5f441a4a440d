"""Causal checks: does masking the top-scoring heads hurt the behaviour more than masking as
many random heads? (Wu et al.'s check for retrieval heads, on fresh trials.)"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from headhunt.errors import HeadhuntError
from headhunt.heads.masking import HeadMask, MaskMode
from headhunt.heads.needles import Trial, rouge1_recall
from headhunt.probes.capture import greedy_decode
from headhunt.probes.hooked import HookedModel

Head = tuple[int, int]


def random_heads(
    n_layers: int, n_heads: int, k: int, exclude: Sequence[Head], rng: random.Random
) -> list[Head]:
    """k heads drawn without replacement from all heads not in ``exclude``.

    (The reference meant to exclude its top-100 heads from the random draw but never did; here
    the exclusion is applied.)
    """
    pool = [
        (layer, h)
        for layer in range(n_layers)
        for h in range(n_heads)
        if (layer, h) not in set(exclude)
    ]
    if k > len(pool):
        raise HeadhuntError(
            f"cannot draw {k} random heads: only {len(pool)} heads remain after exclusion"
        )
    return sorted(rng.sample(pool, k))


def needle_recall(
    model: HookedModel,
    trials: Sequence[Trial],
    *,
    max_new_tokens: int,
    stop_ids: set[int],
    heads: Sequence[Head] = (),
    mode: MaskMode = "query",
    batch_size: int = 8,
) -> list[float]:
    """ROUGE-1 recall of each trial's answer in the greedy response, with ``heads`` masked."""
    hooks = (HeadMask(heads, mode),) if heads else ()
    out = []
    for i in range(0, len(trials), batch_size):
        batch = trials[i : i + batch_size]
        prompts = torch.tensor([t.input_ids for t in batch])
        dec = greedy_decode(
            model, prompts, max_new_tokens=max_new_tokens, stop_ids=stop_ids, hooks=hooks
        )
        for j, t in enumerate(batch):
            ids = [x for x in dec.tokens[j, : int(dec.lengths[j])].tolist() if x not in stop_ids]
            out.append(
                rouge1_recall(t.answer, model.tokenizer.decode(ids, skip_special_tokens=True))
            )
    return out


@dataclass
class AblationResult:
    """Needle-in-a-haystack recall (ROUGE-1 recall x 100, mean over trials) per condition."""

    top_k: int
    top_heads: list[Head]
    baseline: float
    top_masked: float
    random_masked: list[float]
    random_heads: list[list[Head]]
    per_trial: dict[str, list[float]] = field(default_factory=dict)

    @property
    def random_mean(self) -> float:
        return float(np.mean(self.random_masked)) if self.random_masked else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "random_mean": self.random_mean}


def ablation_check(
    model: HookedModel,
    trials: Sequence[Trial],
    ranked_heads: Sequence[Head],
    *,
    top_k: int,
    draws: int,
    seed: int,
    max_new_tokens: int,
    stop_ids: set[int],
    exclude: Sequence[Head] = (),
    mode: MaskMode = "query",
    batch_size: int = 8,
    on_condition: Callable[[str, list[float]], None] | None = None,
    done: dict[str, list[float]] | None = None,
) -> AblationResult:
    """Recall with no mask, with the top-k heads masked, and with ``draws`` sets of k random
    heads masked (drawn from heads outside the top-k and ``exclude``).

    ``done`` holds per-condition results of an interrupted run; ``on_condition`` is called
    after each finished condition (to save it).
    """
    if top_k < 1 or top_k > len(ranked_heads):
        raise HeadhuntError(f"--top-k must be between 1 and {len(ranked_heads)}")
    top = [tuple(h) for h in ranked_heads[:top_k]]
    rng = random.Random(seed)
    excl = list({*top, *map(tuple, exclude)})
    rand_sets = [
        random_heads(model.n_layers, model.n_heads, top_k, excl, rng) for _ in range(draws)
    ]
    conditions = {"baseline": [], "top": top, **{f"random{i}": s for i, s in enumerate(rand_sets)}}
    results = dict(done or {})
    for name, heads in tqdm(conditions.items(), desc="ablation conditions", unit="cond"):
        if name in results:
            continue
        results[name] = needle_recall(
            model,
            trials,
            max_new_tokens=max_new_tokens,
            stop_ids=stop_ids,
            heads=heads,
            mode=mode,
            batch_size=batch_size,
        )
        if on_condition is not None:
            on_condition(name, results[name])

    def pct(name: str) -> float:
        return 100 * float(np.mean(results[name]))

    return AblationResult(
        top_k=top_k,
        top_heads=[list(h) for h in top],
        baseline=pct("baseline"),
        top_masked=pct("top"),
        random_masked=[pct(f"random{i}") for i in range(draws)],
        random_heads=[[list(h) for h in s] for s in rand_sets],
        per_trial=results,
    )
