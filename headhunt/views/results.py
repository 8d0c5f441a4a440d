"""A run's own result where its per-head table is not its own: an ablate run's scores.parquet
is the ranking it read from its retrieval run, its result is ablation.json (needle recall with
no heads, the top heads and random heads masked)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from headhunt.errors import HeadhuntError
from headhunt.rundir import Run

ABLATION = "ablation.json"


def ablation_table(run: Run) -> pd.DataFrame | None:
    """Needle recall (ROUGE-1 recall x 100, mean over the trials) per condition of an ablate
    run, with its standard error over the trials and their count; None for other runs."""
    path = run.path / ABLATION
    if not path.is_file():
        return None
    try:
        r = json.loads(path.read_text())
        k = int(r["top_k"])
        rows = [("no heads masked", "baseline", r["baseline"], [])]
        rows.append((f"top-{k} heads masked", "top", r["top_masked"], r["top_heads"]))
        rows += [
            (f"random {k} heads, draw {i}", f"random{i}", v, heads)
            for i, (v, heads) in enumerate(zip(r["random_masked"], r["random_heads"], strict=True))
        ]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HeadhuntError(f"{path} is unreadable ({type(e).__name__}: {e})") from None
    per_trial = r.get("per_trial") or {}
    out = []
    for label, name, value, heads in rows:
        trials = np.asarray(per_trial.get(name, []), float)
        se = 100 * trials.std(ddof=1) / np.sqrt(len(trials)) if len(trials) > 1 else np.nan
        out.append(
            {
                "condition": label,
                "needle recall (x100)": float(value),
                "SE": float(se),
                "trials": len(trials) or None,
                "heads masked": ", ".join(f"{a}-{b}" for a, b in heads) or "none",
            }
        )
    return pd.DataFrame(out)


def scores_note(run: Run) -> str | None:
    """Why a run's per-head scores are not its own result (None when they are)."""
    if run.method != "ablate":
        return None
    source = run.manifest.get("parameters", {}).get("scores", "?")
    return (
        f"This ablate run's per-head scores are the ranking it read from the retrieval run "
        f"`{source}`, not a result of its own; its own result (needle recall with the top heads "
        "and random heads masked) is on the Runs page."
    )
