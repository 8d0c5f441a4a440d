"""Is a head ranking a good pruning order? Prune by it, by its reverse and at random, and measure.

For each kept fraction, the model is pruned for real (:func:`headhunt.heads.interventions.pruning.prune_model`
on a copy) keeping the top of the ranking, the bottom (reverse ranking) or random heads (several
draws), and each pruned model is measured: parameters and their bytes, KV-cache bytes per
token, median prefill seconds, perplexity on windows of the bundled essays, and needle recall
(ROUGE-1 recall x 100 on fresh needle trials, as ``headhunt ablate``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from headhunt.config import fields_of, option
from headhunt.errors import HeadhuntError
from headhunt.heads.configs import NeedleTrialGrid, PruneMeasurement
from headhunt.heads.evaluations.causal import needle_recall
from headhunt.heads.inputs.needles import read_haystack
from headhunt.heads.interventions.masking import HeadMask
from headhunt.heads.interventions.pruning import (
    Head,
    heads_to_drop,
    model_size,
    perplexity,
    prefill_seconds,
    prune_model,
    ranked_heads,
    text_windows,
)
from headhunt.heads.retrieval import (
    FRESH_SEED_OFFSET,
    RetrievalConfig,
    build_trials,
    stop_token_ids,
)
from headhunt.probes.hooked import HookedModel


@dataclass
class PruneEvalConfig(PruneMeasurement, NeedleTrialGrid):
    """What to measure: :class:`~headhunt.heads.configs.PruneMeasurement` (the unit, random
    draws, needle lengths and depths, perplexity windows, batch size: prune's ``--evaluate``
    options) at every kept share, on fresh needle trials (:class:`NeedleTrialGrid`: another seed
    stream than a retrieval run's).

    Attributes:
        keep: shares of query heads kept, one pruned model each.
        ppl_length: tokens per perplexity window (from the bundled essays, or ``haystack``).
        speed_length: tokens of the timed prefill (batch of one; median of 3 after a warm-up).
        calibration_repeats: trials per (length, depth, needle) of the calibration set that
            :func:`masking_effect` is measured on (a third seed stream: neither the scoring
            run's nor the evaluation's trials).
    """

    keep: list[float] = option([0.9, 0.75, 0.5], "shares of query heads kept", above=0, max=1)
    ppl_length: int = option(512, "tokens per perplexity window", min=2)
    speed_length: int = option(2048, "tokens of the timed prefill", min=1)
    calibration_repeats: int = option(1, "calibration trials per needle cell", min=1)

    def validate(self, model: HookedModel | None = None) -> None:
        if not self.keep:
            raise HeadhuntError("keep lists no share of heads to measure")
        super().validate(model)


@dataclass
class Materials:
    """The fixed inputs every condition is measured on."""

    trials: list
    windows: torch.Tensor
    speed_ids: torch.Tensor
    stop: set[int]


def needle_trials(model: HookedModel, config: PruneEvalConfig, *, calibration: bool = False):
    """The evaluation's fresh needle trials, or (``calibration``) the calibration set: another
    seed stream again, so a tie-break measured on it is not fitted to the evaluation."""
    repeats = config.calibration_repeats if calibration else config.repeats
    seed = config.seed + FRESH_SEED_OFFSET * (2 if calibration else 1)
    grid = RetrievalConfig(
        **{**fields_of(config, NeedleTrialGrid), "repeats": repeats, "seed": seed}
    )
    return build_trials(model, grid)


def materials(model: HookedModel, config: PruneEvalConfig) -> Materials:
    text = read_haystack(config.haystack)
    windows = text_windows(model, text, config.ppl_windows, config.ppl_length, config.seed)
    speed = text_windows(model, text, 1, config.speed_length, config.seed + 1)
    trials = needle_trials(model, config)
    return Materials(trials, windows, speed, stop_token_ids(model.tokenizer))


def by_length(trials: list) -> dict[int, list]:
    """Trials grouped by prompt length (a batch holds prompts of one length), in order."""
    groups: dict[int, list] = {}
    for t in trials:
        groups.setdefault(t.length, []).append(t)
    return groups


@torch.inference_mode()
def answer_nll(model: HookedModel, trials: list, batch_size: int = 8) -> float:
    """Mean negative log-likelihood (nats per token) of each trial's answer tokens, fed right
    after its prompt (teacher forcing). The answer tokens are the needle's own (``span``);
    within a batch every answer is cut to the batch's shortest, so prompts stay one length."""
    total, count = 0.0, 0
    for group in by_length(trials).values():
        for i in range(0, len(group), batch_size):
            batch = group[i : i + batch_size]
            m = min(t.span[1] - t.span[0] for t in batch)
            answers = torch.tensor([t.input_ids[t.span[0] : t.span[0] + m] for t in batch])
            ids = torch.cat([torch.tensor([t.input_ids for t in batch]), answers], 1)
            out = model.model(ids.to(model.device), use_cache=False, logits_to_keep=m + 1)
            logits = out.logits[:, :-1].float()  # position p predicts token p + 1
            nll = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                answers.to(logits.device).reshape(-1),
                reduction="sum",
            )
            total, count = total + float(nll), count + answers.numel()
    return total / count


def masking_effect(
    model: HookedModel, trials: list, batch_size: int = 8, *, progress: bool = False
) -> Float[np.ndarray, "layers heads"]:
    """Each head's masking effect: how much zeroing its output alone (``mode="output"``, what
    pruning it does) raises :func:`answer_nll` on ``trials`` (nats per answer token; higher =
    the head matters more for recalling needles)."""
    base = answer_nll(model, trials, batch_size)
    out = np.zeros((model.n_layers, model.n_heads))
    for layer in tqdm(range(model.n_layers), desc="masking effect", disable=not progress):
        for head in range(model.n_heads):
            with model.hooks(HeadMask([(layer, head)], "output")):
                out[layer, head] = answer_nll(model, trials, batch_size) - base
    return out


def measure(model: HookedModel, m: Materials, config: PruneEvalConfig) -> dict[str, Any]:
    """Size, speed, perplexity and needle recall of one (pruned or full) model; ``recall``
    holds each trial's ROUGE-1 recall (x 100), in trial order, for paired comparisons."""
    groups = by_length(m.trials)
    recall = [
        r
        for group in groups.values()
        for r in needle_recall(
            model,
            group,
            max_new_tokens=config.max_new_tokens,
            stop_ids=m.stop,
            batch_size=config.batch_size,
        )
    ]
    by_id = dict(zip([t.id for g in groups.values() for t in g], recall, strict=True))
    return {
        **model_size(model),
        "prefill_s": prefill_seconds(model, m.speed_ids),
        "perplexity": perplexity(model, m.windows),
        "needle_recall": 100 * float(np.mean(recall)),
        "recall": [100 * by_id[t.id] for t in m.trials],
    }


def pruning_orders(
    matrix: np.ndarray,
    config: PruneEvalConfig,
    n_kv_heads: int | None = None,
    secondary: np.ndarray | None = None,
) -> dict[str, list[Head]]:
    """``headhunt`` (highest score kept first), ``reverse`` and ``random0..`` (by KV group
    when ``n_kv_heads`` is given); ``secondary`` orders heads of equal score (see
    :func:`ranked_heads`)."""
    kw = {"n_kv_heads": n_kv_heads, "secondary": secondary}
    out = {
        "headhunt": ranked_heads(matrix, "top", config.seed, **kw),
        "reverse": ranked_heads(matrix, "reverse", config.seed, **kw),
    }
    for i in range(config.draws):
        seed = config.seed + 7919 * (i + 1)
        out[f"random{i}"] = ranked_heads(matrix, "random", seed, n_kv_heads=n_kv_heads)
    return out


def prune_sweep(
    model: HookedModel,
    matrix: np.ndarray,
    config: PruneEvalConfig,
    *,
    done: dict[str, dict[str, Any]] | None = None,
    on_condition: Callable[[str, dict[str, Any]], None] | None = None,
    progress: bool = True,
    secondary: np.ndarray | None = None,
) -> pd.DataFrame:
    """One row per condition: the full model (``order`` "none", keep 1) and every (order,
    keep) pair, with :func:`measure`'s columns and the dropped heads; ``secondary`` breaks
    ties of ``matrix`` (e.g. :func:`masking_effect`)."""
    config.validate()
    if matrix.shape != (model.n_layers, model.n_heads):
        raise HeadhuntError(
            f"the scores cover {matrix.shape[0]}x{matrix.shape[1]} heads; the model has "
            f"{model.n_layers}x{model.n_heads}"
        )
    results = dict(done or {})
    m = materials(model, config)
    kv = model.n_kv_heads if config.unit == "kv" else None
    orders = pruning_orders(matrix, config, kv, secondary)
    conds = prune_conditions(orders, config)
    for order, keep in tqdm(conds, desc="pruning conditions", disable=not progress):
        key = f"{order}@{keep:g}"
        if key in results:
            continue
        results[key] = measure_condition(model, orders, order, keep, m, config)
        if on_condition is not None:
            on_condition(key, results[key])
    return pd.DataFrame([results[f"{o}@{k:g}"] for o, k in conds])


def prune_conditions(
    orders: dict[str, list[Head]], config: PruneEvalConfig
) -> list[tuple[str, float]]:
    """The full model (``none``, keep 1), then every (order, keep)."""
    return [("none", 1.0)] + [(o, k) for k in config.keep for o in orders]


def measure_condition(
    model: HookedModel,
    orders: dict[str, list[Head]],
    order: str,
    keep: float,
    m: Materials,
    config: PruneEvalConfig,
) -> dict[str, Any]:
    """Prune a copy of ``model`` by ``order`` to ``keep`` and :func:`measure` it."""
    group = model.group_size if config.unit == "kv" else 1
    drop = [] if order == "none" else heads_to_drop(orders[order], keep, group)
    pruned = model
    if drop:
        pruned = copy.deepcopy(model)
        prune_model(pruned, drop)
    return {"order": order, "keep": keep, "dropped": len(drop), **measure(pruned, m, config)}


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per (order, keep): the table with random draws averaged into ``random`` (and kept),
    and, with per-trial ``recall`` lists, the paired change of needle recall against the full
    model (``recall_change``, points) and its standard error over trials
    (``recall_change_se``: the SD of the per-trial differences / sqrt(trials); for
    ``random``, of the per-trial mean over draws). The lists themselves are dropped."""
    table = table.copy()
    randoms = table[table["order"].str.match(r"random\d+$")]
    if not randoms.empty:
        cols = [c for c in table.columns if c not in ("order", "keep", "recall")]
        mean = randoms.groupby("keep", as_index=False)[cols].mean().assign(order="random")
        if "recall" in table:
            per_trial = randoms.groupby("keep")["recall"].apply(lambda r: np.mean(list(r), 0))
            mean["recall"] = mean["keep"].map(per_trial)
        table = pd.concat([table, mean[table.columns]], ignore_index=True)
    if "recall" in table:
        full = np.asarray(table[table["order"] == "none"]["recall"].iloc[0])
        diffs = [np.asarray(r) - full for r in table["recall"]]
        table["recall_change"] = [float(d.mean()) for d in diffs]
        table["recall_change_se"] = [float(d.std(ddof=1) / np.sqrt(d.size)) for d in diffs]
        table = table.drop(columns="recall")
    return table


def largest_budget_within(summary: pd.DataFrame, order: str, points: float = 2.0) -> float | None:
    """The smallest kept fraction (most heads pruned) at which ``order`` keeps needle recall
    within ``points`` of the full model, at that and every larger kept fraction; or None."""
    base = float(summary[summary["order"] == "none"]["needle_recall"].iloc[0])
    s = summary[summary["order"] == order].sort_values("keep", ascending=False)
    ok = None
    for keep, recall in zip(s["keep"], s["needle_recall"], strict=True):
        if recall < base - points:
            break
        ok = float(keep)
    return ok
