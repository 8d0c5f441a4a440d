"""One head across a run's units (trials, texts): the values its score averages."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from headhunt.rundir import Run
from headhunt.views.runs import _jsonl


def head_spread(run: Run, layer: int, head: int) -> pd.DataFrame:
    """One head's value per trial or text, from the run's per-unit records.

    Columns ``unit`` (trial id, text index, sequence), ``metric``, ``value``, ``counted``
    (whether the unit enters the head's score: retrieval scores average only the trials the
    model answered right) and ``source`` (the input kind an n-gram score is computed over:
    random, planted or natural; empty for other methods). Empty when the method keeps no
    per-unit records (or the files are gone). :func:`spread_summary` condenses it the way the
    scores were computed.
    """
    rows: list[dict[str, Any]] = []
    method = run.method
    if method == "retrieval":
        for r in _jsonl(run.path / "trials.jsonl"):
            for metric in ("scores", "on_needle"):
                rows.append(
                    {
                        "unit": r["id"],
                        "metric": "retrieval_score" if metric == "scores" else "needle_attention",
                        "value": float(r[metric][layer][head]),
                        "counted": bool(r.get("counted", True)),
                    }
                )
        if not rows and (run.path / "retrieval_heads.json").is_file():
            per = json.loads((run.path / "retrieval_heads.json").read_text()).get(
                f"{layer}-{head}", []
            )
            rows = [
                {
                    "unit": f"counted trial {i}",
                    "metric": "retrieval_score",
                    "value": float(v),
                    "counted": True,
                }
                for i, v in enumerate(per)
            ]
    elif method == "sinks":
        for r in _jsonl(run.path / "texts.jsonl"):
            for metric, key in (
                ("first_sink_mass", "s0"),
                ("hidden_sink_mass", "hidden_mass"),
                ("hidden_sink_count", "hidden_count"),
            ):
                rows.append(
                    {
                        "unit": f"text {r['text']}",
                        "metric": metric,
                        "value": float(r[key][layer][head]),
                    }
                )
    elif method == "ngram":
        for path in sorted(run.path.glob("records-*.jsonl")):
            source = path.stem.removeprefix("records-")
            for i, r in enumerate(_jsonl(path)):
                for metric, key in (
                    ("prev_token", "tl_prev"),
                    ("duplicate_token", "tl_dup"),
                    ("induction", "tl_ind"),
                ):
                    rows.append(
                        {
                            "unit": f"{source} {i}",
                            "source": source,
                            "metric": metric,
                            "value": float(np.asarray(r[key])[layer, head]),
                        }
                    )
    elif method == "circuits":
        n_heads = int(run.manifest.get("model", {}).get("n_heads", 0))
        for r in _jsonl(run.path / "trials.jsonl"):
            for metric, key in (
                ("sae_node", "node"),
                ("sae_node_norm", "node_norm"),
                ("sae_edge", "edge"),
            ):
                if key in r and n_heads:
                    rows.append(
                        {
                            "unit": f"trial {r['index']}",
                            "metric": metric,
                            "value": float(r[key][layer * n_heads + head]),
                        }
                    )
    rows = [{"source": "", "counted": True, **r} for r in rows]  # the defaults of other methods
    return pd.DataFrame(rows, columns=["unit", "source", "metric", "value", "counted"]).astype(
        {"source": str, "counted": bool}
    )


def spread_summary(spread: pd.DataFrame) -> pd.DataFrame:
    """Count, mean, std, min and max of each metric (per input kind for n-gram runs) over the
    units its score averages (``counted``): the mean is the head's score in scores.parquet."""
    counted = spread[spread["counted"]]
    keys = ["metric", "source"] if (counted["source"] != "").any() else ["metric"]
    out = counted.groupby(keys, sort=False)["value"].agg(["count", "mean", "std", "min", "max"])
    return out.reset_index()


def needle_trials(run: Run, layer: int, head: int) -> pd.DataFrame:
    """A retrieval run's trials as seen by one head: where the needle was, what the model
    answered, and the head's score and share of decode steps whose argmax key lay on the
    answer span (``on_needle``)."""
    cols = [
        "trial",
        "length",
        "depth %",
        "needle",
        "answer",
        "response",
        "counted",
        "score",
        "on_needle",
    ]
    rows = [
        {
            "trial": r["id"],
            "length": r["length"],
            "depth %": round(100 * float(r["depth"]), 2),  # trials store a fraction
            "needle": r["needle"],
            "answer": r["answer"],
            "response": r["response"],
            "counted": r["counted"],
            "score": float(r["scores"][layer][head]),
            "on_needle": float(r["on_needle"][layer][head]),
        }
        for r in _jsonl(run.path / "trials.jsonl")
    ]
    return pd.DataFrame(rows, columns=cols)
