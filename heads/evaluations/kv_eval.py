"""How much KV cache do head scores save? A sweep of the share of full KV heads.

For each ranking of the KV heads (headhunt's scores, their reverse, random rankings, a
DuoAttention pattern) and each fraction f of full KV heads, the top f of the ranking keep the
full cache and the rest become streaming heads (:mod:`headhunt.heads.interventions.kvcache`: sink + recent
tokens, their cache really that small). Every condition answers the same trials (needles and
the RULER-like set of :mod:`headhunt.heads.inputs.ruler`) by greedy decoding; a trial's score is its
task's score; the KV memory is the bytes the cache holds at the end of each batch, divided by
the batch size. Fraction 0 (all streaming) and 1 (the unmodified model with transformers'
DynamicCache) are the same for every ranking and run once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from headhunt.errors import HeadhuntError
from headhunt.heads.configs import KVEvalConfig
from headhunt.heads.inputs.needles import read_haystack
from headhunt.heads.inputs.ruler import MAX_NEW_TOKENS, TaskTrial, build_ruler, from_needles
from headhunt.heads.interventions.kvcache import (
    generate_with_plan,
    kv_scores,
    plan_from_ranking,
    random_ranking,
    rank_kv_heads,
)
from headhunt.heads.retrieval import (
    FRESH_SEED_OFFSET,
    RetrievalConfig,
    build_trials,
    stop_token_ids,
)
from headhunt.probes.capture import responses
from headhunt.probes.hooked import HookedModel

FULL, STREAMING = "full cache", "all streaming"


def build_eval_trials(model: HookedModel, config: KVEvalConfig) -> list[TaskTrial]:
    """Needle trials (task ``needle``) and the RULER-like set, deterministic for a seed."""
    trials: list[TaskTrial] = []
    if config.needles:
        grid = RetrievalConfig(
            lengths=config.lengths,
            depths=config.depths,
            needles=config.needles,
            repeats=config.needle_repeats,
            max_new_tokens=MAX_NEW_TOKENS["needle"],
            seed=config.seed + FRESH_SEED_OFFSET,
            haystack=config.haystack,
        )
        trials += from_needles(build_trials(model, grid))
    if config.tasks and config.task_repeats:
        hay = read_haystack(config.haystack)
        trials += build_ruler(
            model.tokenizer, hay, config.lengths, config.tasks, config.task_repeats, config.seed
        )
    return trials


def kv_rankings(
    model: HookedModel,
    config: KVEvalConfig,
    scores: np.ndarray | None = None,
    duo: np.ndarray | None = None,
) -> dict[str, list[int]]:
    """Flat KV-head orders, best first: ``headhunt`` and ``reverse`` (from ``scores``,
    [layers, query heads], each KV head taking its best query head), ``random0..``, ``duo``
    (a DuoAttention [layers, kv_heads] pattern)."""
    n = model.n_layers * model.n_kv_heads
    out: dict[str, list[int]] = {}
    if scores is not None:
        kv = kv_scores(scores, model.n_kv_heads)
        out["headhunt"] = rank_kv_heads(kv, config.seed).tolist()
        out["reverse"] = rank_kv_heads(-kv, config.seed).tolist()
    for i in range(config.random_draws):
        out[f"random{i}"] = random_ranking(n, config.seed + 7919 * (i + 1))
    if duo is not None:
        out["duo"] = rank_kv_heads(duo, config.seed).tolist()
    if not out:
        raise HeadhuntError("no ranking to evaluate (no scores, random draws or pattern)")
    return out


def conditions(rankings: dict[str, list[int]], fractions: list[float]) -> list[tuple[str, float]]:
    """(ranking, fraction) pairs to run; fractions 0 and 1 once, under their own names."""
    out = []
    if 1.0 in fractions:
        out.append((FULL, 1.0))
    if 0.0 in fractions:
        out.append((STREAMING, 0.0))
    out += [(r, f) for f in fractions if 0 < f < 1 for r in rankings]
    return out


def run_condition(
    model: HookedModel,
    trials: list[TaskTrial],
    ranking: list[int] | None,
    fraction: float,
    config: KVEvalConfig,
) -> list[dict[str, Any]]:
    """Every trial under one plan (``ranking`` None: the unmodified model); one record each."""
    shape = (model.n_layers, model.n_kv_heads)
    plan = None
    if ranking is not None:
        plan = plan_from_ranking(ranking, shape, fraction, *config.window())
    stop = stop_token_ids(model.tokenizer)
    by_length: dict[int, list[TaskTrial]] = {}
    for t in trials:
        by_length.setdefault(t.length, []).append(t)
    records = []
    for group in by_length.values():
        for i in range(0, len(group), config.batch_size):
            batch = group[i : i + config.batch_size]
            prompts = torch.tensor([t.input_ids for t in batch])
            budget = max(MAX_NEW_TOKENS[t.task] for t in batch)
            tokens, lengths, nbytes = generate_with_plan(
                model, prompts, plan, max_new_tokens=budget, stop_ids=stop
            )
            # A row's greedy tokens do not depend on the others: cutting them at the task's
            # own budget gives what decoding with that budget gives.
            cut = [min(int(n), MAX_NEW_TOKENS[t.task]) for n, t in zip(lengths, batch, strict=True)]
            texts = responses(model.tokenizer, tokens, cut, stop)
            for t, response in zip(batch, texts, strict=True):
                records.append(
                    {
                        "trial": t.id,
                        "task": t.task,
                        "length": t.length,
                        "score": t.score(response),
                        "response": response,
                        "kv_bytes": nbytes / len(batch),
                    }
                )
    return records


def kv_eval(
    model: HookedModel,
    config: KVEvalConfig,
    rankings: dict[str, list[int]],
    trials: list[TaskTrial],
    *,
    done: dict[str, list[dict[str, Any]]] | None = None,
    on_condition: Callable[[str, list[dict[str, Any]]], None] | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Run every condition (skipping those in ``done``); returns the per-trial table with
    columns ``ranking, fraction, trial, task, length, score, response, kv_bytes``."""
    config.validate()
    results = dict(done or {})
    conds = conditions(rankings, config.fractions)
    for name, fraction in tqdm(conds, desc="kv-eval conditions", disable=not progress):
        key = condition_key(name, fraction)
        if key in results:
            continue
        results[key] = run_condition(model, trials, plan_ranking(rankings, name), fraction, config)
        if on_condition is not None:
            on_condition(key, results[key])
    return table_of(conds, results)


def plan_ranking(rankings: dict[str, list[int]], name: str) -> list[int] | None:
    """The ranking a condition uses (None for the full cache: the unmodified model; any ranking
    serves for the all-streaming condition)."""
    if name == FULL:
        return None
    return rankings.get(name, rankings[next(iter(rankings))])


def table_of(
    conds: list[tuple[str, float]], results: dict[str, list[dict[str, Any]]]
) -> pd.DataFrame:
    """The per-trial table of every condition's records."""
    rows = []
    for name, fraction in conds:
        for rec in results[condition_key(name, fraction)]:
            rows.append({"ranking": name, "fraction": fraction, **rec})
    return pd.DataFrame(rows)


def condition_key(name: str, fraction: float) -> str:
    return f"{name}@{fraction:g}"


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Accuracy (mean score x 100) and measured KV memory per (ranking, fraction, task
    group), with ``kv_fraction`` = KV bytes over the full cache's on the same trials. Task
    groups: ``needle``, ``ruler`` (the RULER-like tasks together) and each task. Random
    rankings also appear averaged as ``random``. Fractions 0 and 1 are listed under every
    ranking (they are the same run).

    Paired against the full cache (every condition answers the same trials): ``change`` is the
    accuracy change in points and ``change_se`` its standard error over trials (SD of the
    per-trial score differences / sqrt(trials); for ``random``, of each trial's mean over the
    draws)."""
    df = table.copy()
    ruler = df[df["task"] != "needle"].assign(task="ruler")
    df = pd.concat([df, ruler], ignore_index=True)
    base = df[df["ranking"] == FULL]
    full = base.groupby("task")["kv_bytes"].mean()
    names = [r for r in dict.fromkeys(df["ranking"]) if r not in (FULL, STREAMING)]
    shared = df[df["ranking"].isin([FULL, STREAMING])]
    parts = [df[~df["ranking"].isin([FULL, STREAMING])]]
    parts += [shared.assign(ranking=r) for r in names] or [shared]
    df = pd.concat(parts, ignore_index=True)
    randoms = df[df["ranking"].str.match(r"random\d+$")]
    if len(randoms):
        df = pd.concat([df, randoms.assign(ranking="random")], ignore_index=True)
    out = (
        df.groupby(["ranking", "fraction", "task"], sort=False)
        .agg(accuracy=("score", "mean"), kv_bytes=("kv_bytes", "mean"), trials=("score", "size"))
        .reset_index()
    )
    out["accuracy"] *= 100
    out["kv_fraction"] = out["kv_bytes"] / out["task"].map(full) if len(full) else np.nan
    if base.empty:
        return out.assign(change=np.nan, change_se=np.nan)
    return out.merge(paired_change(df, base), on=["ranking", "fraction", "task"], how="left")


def paired_change(df: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    """Per (ranking, fraction, task) of ``df``: mean and standard error of the per-trial score
    change (x 100) against ``base`` (the full cache's rows)."""
    per_trial = (
        df.groupby(["ranking", "fraction", "task", "trial"], sort=False)["score"]
        .mean()  # ``random``: each trial's mean over the draws
        .reset_index()
        .merge(base[["task", "trial", "score"]], on=["task", "trial"], suffixes=("", "_full"))
    )
    per_trial["d"] = 100 * (per_trial["score"] - per_trial["score_full"])
    g = per_trial.groupby(["ranking", "fraction", "task"], sort=False)["d"]
    out = g.agg(change="mean", sd="std", n="size").reset_index()
    out["change_se"] = out["sd"].fillna(0.0) / np.sqrt(out["n"])
    return out[["ranking", "fraction", "task", "change", "change_se"]]


def smallest_fraction_within(
    summary: pd.DataFrame, ranking: str, task: str, points: float = 1.0
) -> float | None:
    """The smallest full-head fraction at which ``ranking`` keeps ``task`` accuracy within
    ``points`` of the full cache (and at every larger fraction), or None."""
    s = summary[(summary["task"] == task) & (summary["ranking"] == ranking)]
    if s.empty:
        return None
    full = s[s["fraction"] == 1.0]["accuracy"]
    if full.empty:
        return None
    ok = None
    for f, acc in sorted(zip(s["fraction"], s["accuracy"], strict=True), reverse=True):
        if acc < float(full.iloc[0]) - points:
            break
        ok = f
    return ok
