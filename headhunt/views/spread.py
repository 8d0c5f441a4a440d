"""One head across a run's units (trials, texts): the values its score averages."""

from __future__ import annotations

import pandas as pd

from headhunt.methods import find
from headhunt.methods.base import read_jsonl, spread_frame
from headhunt.rundir import Run


def head_spread(run: Run, layer: int, head: int) -> pd.DataFrame:
    """One head's value per trial or text, from the run's per-unit records (read by its
    method's :meth:`~headhunt.methods.base.Method.spread`).

    Columns ``unit`` (trial id, text index, sequence), ``metric``, ``value``, ``counted``
    (whether the unit enters the head's score: retrieval scores average only the trials the
    model answered right) and ``source`` (the input kind an n-gram score is computed over:
    random, planted or natural; empty for other methods). Empty when the method keeps no
    per-unit records (or the files are gone). :func:`spread_summary` condenses it the way the
    scores were computed.
    """
    method = find(run.method)
    return method.spread(run, layer, head) if method is not None else spread_frame([])


def spread_summary(spread: pd.DataFrame) -> pd.DataFrame:
    """Count, mean, std, min and max of each metric (per input kind for n-gram runs) over the
    units its score averages (``counted``): the mean is the head's score in scores.parquet."""
    counted = spread[spread["counted"]]
    keys = ["metric", "source"] if (counted["source"] != "").any() else ["metric"]
    out = counted.groupby(keys, sort=False)["value"].agg(["count", "mean", "std", "min", "max"])
    return out.reset_index()


def needle_trials(run: Run, layer: int, head: int) -> pd.DataFrame:
    """A retrieval run's trials as seen by one head (the panel of methods that declare
    :data:`~headhunt.methods.base.NEEDLE_TRIALS`): where the needle was, what the model
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
        for r in read_jsonl(run.path / "trials.jsonl")
    ]
    return pd.DataFrame(rows, columns=cols)
