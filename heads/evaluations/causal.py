"""Causal checks: does masking the top-scoring heads hurt the behaviour more than masking as
many random heads? (Wu et al.'s check for retrieval heads, on fresh trials.)"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
from tqdm.auto import tqdm

from headhunt.errors import HeadhuntError
from headhunt.heads.inputs.needles import NeedleTrial, rouge1_recall
from headhunt.heads.interventions.masking import HeadMask, MaskMode
from headhunt.probes.capture import greedy_decode, responses
from headhunt.probes.hooked import HookedModel
from headhunt.scores import Head, check_heads

T = TypeVar("T")


def random_head_sets(
    n_layers: int | Sequence[int],
    n_heads: int,
    size: int,
    n_sets: int,
    *,
    exclude: Iterable[Sequence[int]] = (),
    seed: int | random.Random = 0,
) -> list[list[Head]]:
    """``n_sets`` sets of ``size`` heads, each drawn without replacement from the heads not in
    ``exclude`` and sorted; ``seed`` may be a ``random.Random`` to go on with its stream.

    (Wu et al. meant to exclude their top heads from the random control but never did; here
    the exclusion is applied.) ``n_layers`` may instead list the layers to draw from (a
    hybrid model's attention layers: ``HookedModel.attention_layers``).
    """
    bad = {(int(layer), int(head)) for layer, head in exclude}
    layers = range(n_layers) if isinstance(n_layers, int) else n_layers
    pool = [(la, h) for la in layers for h in range(n_heads) if (la, h) not in bad]
    if n_sets and size > len(pool):
        raise HeadhuntError(
            f"cannot draw {size} random heads: only {len(pool)} heads remain after exclusion"
        )
    rng = seed if isinstance(seed, random.Random) else random.Random(seed)
    return [sorted(rng.sample(pool, size)) for _ in range(n_sets)]


@dataclass
class MaskingCheck:
    """Masking ``heads`` against random sets of as many other heads (Wu et al. 2024's causal
    check): if the heads matter, masking them hurts the behaviour more than masking random ones.

    The one implementation of the check; callers bring the measurement (needle recall, MQAR
    accuracy, ...) as a function of the heads masked.

    Attributes:
        heads: the heads under test (the ``top`` condition).
        random_sets: the controls, each as many heads drawn outside ``heads`` and any excluded.
    """

    heads: list[Head]
    random_sets: list[list[Head]]

    @classmethod
    def draw(
        cls,
        model: HookedModel,
        heads: Iterable[Sequence[int]],
        n_random: int,
        *,
        seed: int | random.Random = 0,
        exclude: Iterable[Sequence[int]] = (),
    ) -> MaskingCheck:
        """Check ``heads`` (inside the model, at least one) and draw ``n_random`` control sets
        from the heads outside ``heads`` and ``exclude``."""
        heads = check_heads(heads, model.n_layers, model.n_heads)
        if not heads:
            raise HeadhuntError("no heads to mask")
        layers = getattr(model, "attention_layers", None) or list(range(model.n_layers))
        outside = sorted({layer for layer, _ in heads} - set(layers))
        if outside:  # a hybrid's recurrent / convolution layers have no heads
            raise HeadhuntError(f"layer {outside[0]} is not an attention layer ({layers})")
        sets = random_head_sets(
            layers,
            model.n_heads,
            len(heads),
            n_random,
            exclude=[*heads, *exclude],
            seed=seed,
        )
        return cls(heads, sets)

    def conditions(self, baseline: bool = True) -> dict[str, list[Head]]:
        """Condition name -> heads masked, in run order: ``baseline`` (none; left out when the
        caller has measured it already), ``top`` (the heads under test), ``random0``,
        ``random1``, ... The one unit plan of the check: the library runs it with :meth:`run`,
        a method deals it over its ranks with ``RunContext.run_conditions``."""
        return {
            **({"baseline": []} if baseline else {}),
            "top": self.heads,
            **{f"random{i}": s for i, s in enumerate(self.random_sets)},
        }

    def random_names(self) -> list[str]:
        """The control conditions' names, in order."""
        return [f"random{i}" for i in range(len(self.random_sets))]

    def run(
        self,
        measure: Callable[[list[Head]], T],
        *,
        done: Mapping[str, T] | None = None,
        on_condition: Callable[[str, T], None] | None = None,
        progress: bool = True,
    ) -> dict[str, T]:
        """``measure(heads)`` (the behaviour with those heads masked) for each condition not in
        ``done`` (results of an interrupted run), in order; ``on_condition(name, result)`` after
        each one (to save it)."""
        results = dict(done or {})
        conditions = self.conditions().items()
        for name, heads in tqdm(conditions, desc="masking", unit="cond", disable=not progress):
            if name in results:
                continue
            results[name] = measure(heads)
            if on_condition is not None:
                on_condition(name, results[name])
        return results


def needle_recall(
    model: HookedModel,
    trials: Sequence[NeedleTrial],
    *,
    max_new_tokens: int,
    stop_ids: set[int],
    heads: Sequence[Head] = (),
    mode: MaskMode = "query",
    batch_size: int = 8,
) -> list[float]:
    """ROUGE-1 recall of each trial's answer in the greedy response, with ``heads`` masked."""
    hooks = (HeadMask(heads, mode),) if heads else ()
    out = [0.0] * len(trials)
    # A batch holds prompts of one length (one tensor); a grid whose trials per length are not
    # a multiple of the batch size would otherwise mix two lengths in one batch.
    by_length: dict[int, list[int]] = {}
    for i, t in enumerate(trials):
        by_length.setdefault(len(t.input_ids), []).append(i)
    for indices in by_length.values():
        for j in range(0, len(indices), batch_size):
            batch = [trials[i] for i in indices[j : j + batch_size]]
            prompts = torch.tensor([t.input_ids for t in batch])
            dec = greedy_decode(
                model, prompts, max_new_tokens=max_new_tokens, stop_ids=stop_ids, hooks=hooks
            )
            texts = responses(model.tokenizer, dec.tokens, dec.lengths.tolist(), stop_ids)
            for i, t, text in zip(indices[j : j + batch_size], batch, texts, strict=True):
                out[i] = rouge1_recall(t.answer, text)
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

    @classmethod
    def of(cls, check: MaskingCheck, recall: Mapping[str, list[float]]) -> AblationResult:
        """The result of ``check`` from each condition's per-trial recall."""

        def pct(name: str) -> float:
            return 100 * float(np.mean(recall[name]))

        return cls(
            top_k=len(check.heads),
            top_heads=[list(h) for h in check.heads],
            baseline=pct("baseline"),
            top_masked=pct("top"),
            random_masked=[pct(n) for n in check.random_names()],
            random_heads=[[list(h) for h in s] for s in check.random_sets],
            per_trial=dict(recall),
        )

    @property
    def random_mean(self) -> float:
        return float(np.mean(self.random_masked)) if self.random_masked else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "random_mean": self.random_mean}


def ablation_check(
    model: HookedModel,
    trials: Sequence[NeedleTrial],
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
    check = MaskingCheck.draw(model, ranked_heads[:top_k], draws, seed=seed, exclude=exclude)

    def recall(heads: list[Head]) -> list[float]:
        return needle_recall(
            model,
            trials,
            max_new_tokens=max_new_tokens,
            stop_ids=stop_ids,
            heads=heads,
            mode=mode,
            batch_size=batch_size,
        )

    return AblationResult.of(check, check.run(recall, done=done, on_condition=on_condition))
