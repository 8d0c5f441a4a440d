"""The whole method and its check: SAE codes -> node / edge scores, against activation patching
and attribution patching on the same prompt pairs.

One call of :func:`run_sae_trials` does, for ``N`` prompt pairs:

1. capture every head's output on the 2N prompts (one forward pass per batch);
2. optionally, the ground truth (per-head activation patching on all N pairs) and EAP (one
   score matrix per pair);
3. ``trials`` times, with seed ``seed + t``: draw a subset of the pairs (``subsample``), train a
   fresh SAE on ``sae_examples`` prompts drawn from that subset's positives and negatives
   (default: all of them; the paper trains on ~10), take every head's code on the subset, and
   score heads by node and edge scores (``node_rule`` names the node score a run ranks by);
   EAP's score for the trial is its mean over the same subset. Each method's ROC AUC against
   the binarised ground truth is recorded per trial.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from jaxtyping import Float

from headhunt.errors import HeadhuntError
from headhunt.sae import roc, scoring
from headhunt.sae.configs import HEAD_NORMS, NODE_RULES, CircuitConfig  # noqa: F401
from headhunt.sae.discrete import DiscreteSAE, train_sae

RULES = ("pos_only", "changed")  # node rules beyond the paper's two


def normalize_heads(
    x: Float[torch.Tensor, "examples heads d_model"], mode: str
) -> Float[torch.Tensor, "examples heads d_model"]:
    """Per-head centring / standardising over the examples (see ``CircuitConfig.head_norm``)."""
    if mode == "none":
        return x
    x = x - x.mean(0, keepdim=True)
    if mode == "standardize":
        x = x / x.norm(dim=-1).mean(0).clamp_min(1e-8)[None, :, None]
    return x


@dataclass
class SAETrial:
    """One trial's scores ([layers * heads], flattened layer-major) and AUCs.

    Attributes:
        node, node_norm: SAE node scores |P \\ N| and |P \\ N| / |P ∪ N|.
        pos_only, changed: the other node rules of :class:`~headhunt.sae.scoring.NodeScores`.
        edge: head score derived from SAE edge scores (zeros when a trial skips edges).
        eap: |EAP| over the trial's pairs (None without EAP).
        auc: method -> ROC AUC against the ground truth (empty without it).
        seconds: time of this trial's SAE training and of its scoring.
        final_loss: the SAE's training loss at the end.
        n_codes: distinct codes over the trial's prompts and heads.
        top_edges: the best head pairs (flat head a, flat head b, edge score), at most 100.
        sae: the trained SAE (not serialised in :meth:`record`).
    """

    index: int
    pairs: list[int]
    train_examples: list[int]
    node: Float[np.ndarray, " heads"]
    node_norm: Float[np.ndarray, " heads"]
    pos_only: Float[np.ndarray, " heads"]
    changed: Float[np.ndarray, " heads"]
    edge: Float[np.ndarray, " heads"]
    eap: Float[np.ndarray, " heads"] | None
    auc: dict[str, float]
    seconds: dict[str, float]
    final_loss: float
    n_codes: int
    top_edges: list[tuple[int, int, float]]
    sae: DiscreteSAE | None = None

    def record(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sae"}
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in d.items()}

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> SAETrial:
        arr = {k: np.asarray(r[k], float) for k in ("node", "node_norm", "edge")}
        # Records written before these rules existed have no values for them.
        arr |= {k: np.asarray(r.get(k, np.full(len(arr["node"]), np.nan)), float) for k in RULES}
        eap = None if r.get("eap") is None else np.asarray(r["eap"], float)
        rest = {k: r[k] for k in ("index", "pairs", "train_examples", "auc", "seconds")}
        edges = [(int(a), int(b), float(v)) for a, b, v in r["top_edges"]]
        return cls(
            **rest,
            **arr,
            eap=eap,
            final_loss=r["final_loss"],
            n_codes=r["n_codes"],
            top_edges=edges,
        )


def run_trial(
    t: int,
    acts: Float[torch.Tensor, "examples heads d_model"],
    config: CircuitConfig,
    *,
    eap_pairs: Float[np.ndarray, "pairs heads"] | None = None,
    truth: np.ndarray | None = None,
    edges: bool = True,
) -> SAETrial:
    """One trial (see the module docstring). ``acts`` holds N positives then N negatives; the
    SAE trains on their device. ``edges=False`` skips the edge scores (the costliest part)."""
    n = acts.shape[0] // 2
    seed = config.seed + t
    rng = np.random.default_rng(seed)
    k = max(1, round(config.subsample * n))
    subset = np.sort(rng.choice(n, size=k, replace=False))
    prompts = np.concatenate([subset, subset + n])
    n_train = min(config.sae_examples or len(prompts), len(prompts))
    train_at = np.sort(rng.choice(len(prompts), size=n_train, replace=False))
    t0 = time.perf_counter()
    x = normalize_heads(acts[torch.as_tensor(prompts, device=acts.device)], config.head_norm)
    x_train = x[torch.as_tensor(train_at, device=acts.device)].reshape(-1, acts.shape[-1])
    result = train_sae(x_train, config.sae_config(acts.shape[-1], seed))
    t1 = time.perf_counter()
    codes = result.sae.codes(x).cpu().numpy()
    pos, neg = codes[:k], codes[k:]
    ns = scoring.node_scores(pos, neg)
    top_edges: list[tuple[int, int, float]] = []
    edge = np.zeros(codes.shape[1])
    if edges:
        pair_scores = scoring.edge_scores(pos, neg)
        edge = scoring.edge_head_scores(pair_scores, config.edge_top_fraction)
        iu, ju = np.triu_indices(len(pair_scores), 1)
        best = np.argsort(-pair_scores[iu, ju], kind="stable")[:100]
        top_edges = [
            (int(iu[b]), int(ju[b]), float(pair_scores[iu[b], ju[b]]))
            for b in best
            if pair_scores[iu[b], ju[b]] > 0
        ]
    t2 = time.perf_counter()
    eap = None if eap_pairs is None else np.abs(eap_pairs[subset].mean(0))
    auc: dict[str, float] = {}
    if truth is not None:
        auc = {
            "sae_node": roc.roc_auc(ns.count, truth),
            "sae_node_norm": roc.roc_auc(ns.normalised, truth),
            "sae_pos_only": roc.roc_auc(ns.pos_only, truth),
            "sae_changed": roc.roc_auc(ns.changed, truth),
        }
        if edges:
            auc["sae_edge"] = roc.roc_auc(edge, truth)
        if eap is not None:
            auc["eap"] = roc.roc_auc(eap, truth)
    return SAETrial(
        index=t,
        pairs=subset.tolist(),
        train_examples=prompts[train_at].tolist(),
        node=ns.count,
        node_norm=ns.normalised,
        pos_only=ns.pos_only,
        changed=ns.changed,
        edge=edge,
        eap=eap,
        auc=auc,
        seconds={"sae_train": t1 - t0, "sae_score": t2 - t1},
        final_loss=result.losses[-1],
        n_codes=len(np.unique(codes)),
        top_edges=top_edges,
        sae=result.sae,
    )


def run_sae_trials(
    acts: Float[torch.Tensor, "examples heads d_model"],
    config: CircuitConfig,
    *,
    eap_pairs: Float[np.ndarray, "pairs heads"] | None = None,
    truth: np.ndarray | None = None,
    done: list[SAETrial] | None = None,
    on_trial: Callable[[SAETrial], None] | None = None,
    progress: bool = True,
) -> list[SAETrial]:
    """All trials, skipping those in ``done`` (a resumed run); ``on_trial`` sees each new one."""
    from tqdm.auto import tqdm

    if acts.shape[0] % 2 or acts.shape[0] < 2:
        raise HeadhuntError("activations must hold N positives then N negatives")
    trials = {t.index: t for t in (done or [])}
    todo = [t for t in range(config.trials) if t not in trials]
    for t in tqdm(todo, desc="SAE trials", disable=not progress, leave=False):
        trial = run_trial(t, acts, config, eap_pairs=eap_pairs, truth=truth)
        trials[t] = trial
        if on_trial is not None:
            on_trial(trial)
    return [trials[t] for t in range(config.trials)]


def summarize(trials: list[SAETrial]) -> dict[str, dict[str, Any]]:
    """Per method: mean and sample std (ddof=1, over trials; 0 for one trial) of ROC AUC, and
    the per-trial values."""
    out: dict[str, dict[str, Any]] = {}
    for name in trials[0].auc:
        vals = [t.auc[name] for t in trials]
        std = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        out[name] = {"mean": float(np.mean(vals)), "std": std, "trials": vals}
    return out
