"""A circuits run read back for viewing: AUCs, ROC curves, the circuit and its edges."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from headhunt.errors import HeadhuntError
from headhunt.rundir import Run
from headhunt.scores import HeadScores
from headhunt.views.runs import read_scores


@dataclass
class CircuitView:
    """What a circuits run holds, ready to draw.

    Attributes:
        auc: ``auc.json`` (per method ROC AUC mean/std/per trial, the ground-truth rule), or None.
        curves: method -> ROC curve of its trial-mean score against the ``truth`` heads
            (empty without a ground truth, or when ``headhunt.sae`` is not installed).
        table: one row per head, one column per metric of ``scores.parquet``.
        edges: ``edges.parquet`` (each trial's best head pairs), or None.
        circuit: ``circuit.json`` (the chosen heads and the rule), or None.
        notes: what could not be shown and why.
    """

    auc: dict[str, Any] | None
    curves: dict[str, Any]
    table: pd.DataFrame
    edges: pd.DataFrame | None
    circuit: dict[str, Any] | None
    notes: list[str]


# Curves drawn from a circuits run's scores: label -> (metric, take |value|).
ROC_METHODS = {
    "SAE node |P\\N|": ("sae_node", False),
    "SAE node, normalised": ("sae_node_norm", False),
    "SAE node, positive-only share": ("sae_pos_only", False),
    "SAE node, changed share": ("sae_changed", False),
    "SAE edge": ("sae_edge", False),
    "EAP |score|": ("eap", True),
}


def circuit_view(run: Run, scores: HeadScores | None = None) -> CircuitView:
    """Read a circuits run (whatever of it exists) for the circuits page."""
    notes: list[str] = []
    scores = scores if scores is not None else read_scores(run)
    wide = scores.df[scores.df["head"].notna()].pivot_table(
        index=["layer", "head"], columns="metric", values="value"
    )
    wide = wide.reset_index()
    auc = _json_or_none(run, "auc.json", notes)
    circuit = _json_or_none(run, "circuit.json", notes)
    edges = None
    if (run.path / "edges.parquet").is_file():
        try:
            edges = pd.read_parquet(run.path / "edges.parquet")
        except Exception as e:
            notes.append(f"edges.parquet cannot be read ({type(e).__name__})")
    curves: dict[str, Any] = {}
    if "truth" not in scores.metrics:
        notes.append("no ground truth in this run (made with --no-truth): no ROC curves")
    else:
        try:
            from headhunt.sae.roc import roc_curve
        except ImportError:
            notes.append("headhunt.sae is not installed here: ROC curves cannot be drawn")
        else:
            truth = scores.matrix("truth") > 0.5
            for label, (metric, absolute) in ROC_METHODS.items():
                if metric not in scores.metrics:
                    continue
                s = scores.matrix(metric)
                try:
                    curves[label] = roc_curve(np.abs(s) if absolute else s, truth)
                except HeadhuntError as e:
                    notes.append(f"{label}: {e}")
    return CircuitView(auc, curves, wide, edges, circuit, notes)


def _json_or_none(run: Run, name: str, notes: list[str]) -> dict[str, Any] | None:
    path = run.path / name
    if not path.is_file():
        notes.append(f"{name} is not in this run")
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        notes.append(f"{name} is corrupt ({e})")
        return None


# The ROC legend and the AUC table average differently; said next to both.
AUC_NOTE = (
    "The table's ROC AUC is the mean of the per-trial AUCs (each SAE trial's scores against "
    "the truth); a curve's AUC (legend) is that of the trial-mean score, one curve per method. "
    "Averaging scores before ranking smooths trial noise, so the two differ."
)


def pair_label(head: str) -> str:
    """``"10.0"`` (layer.head, as edges.parquet stores a head) -> ``"10-0"``."""
    layer, _, h = str(head).partition(".")
    return f"{layer}-{h}" if h else str(head)


def edge_table(edges: pd.DataFrame, k: int = 20) -> pd.DataFrame:
    """The best head pairs by mean SAE edge score over the trials that list them: ``pair``
    ("L-H & L-H"), ``mean``, ``trials``, ``rank`` (1 = best; tied pairs share a rank) and
    ``tied`` (how many pairs share that mean). Every pair tied with the k-th is kept, so a
    tie is never cut in the middle."""
    g = edges.groupby(["head_a", "head_b"])["edge"].agg(mean="mean", trials="count").reset_index()
    g["pair"] = [
        f"{pair_label(a)} & {pair_label(b)}" for a, b in zip(g.head_a, g.head_b, strict=True)
    ]
    g["rank"] = g["mean"].rank(ascending=False, method="min").astype(int)
    g["tied"] = g.groupby("mean")["mean"].transform("count").astype(int)
    g = g.sort_values(["rank", "pair"]).reset_index(drop=True)
    if len(g) > k:
        g = g[g["rank"] <= g.loc[k - 1, "rank"]]
    return g[["pair", "mean", "trials", "rank", "tied"]]


def truth_vs_circuit(scores: HeadScores, circuit: dict[str, Any] | None) -> pd.DataFrame:
    """Each head's place in the ground truth (``truth`` metric) and in the chosen circuit:
    ``layer``, ``head``, ``truth``, ``circuit``, ``status`` (both / truth only / circuit
    only / neither). Empty when the run has no ground truth or no circuit."""
    if circuit is None or "truth" not in scores.metrics:
        return pd.DataFrame(columns=["layer", "head", "truth", "circuit", "status"])
    truth = scores.matrix("truth") > 0.5
    chosen = np.zeros_like(truth)
    for layer, head in circuit.get("heads", []):
        chosen[int(layer), int(head)] = True
    layer, head = np.nonzero(np.ones_like(truth))
    t, c = truth[layer, head], chosen[layer, head]
    status = np.select(
        [t & c, t & ~c, ~t & c], ["both", "truth only", "circuit only"], default="neither"
    )
    return pd.DataFrame({"layer": layer, "head": head, "truth": t, "circuit": c, "status": status})


def overlap_summary(table: pd.DataFrame) -> str:
    """One line: how many truth heads the circuit found, and how many of its heads are true."""
    t, c = int(table["truth"].sum()), int(table["circuit"].sum())
    both = int((table["truth"] & table["circuit"]).sum())
    recall = f"{both}/{t} ground-truth heads are in the circuit" if t else "no ground-truth heads"
    precision = f"{both}/{c} circuit heads are ground truth" if c else "the circuit is empty"
    return f"{recall}; {precision}."
