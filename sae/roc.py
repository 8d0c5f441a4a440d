"""How right a head ranking is: ROC AUC against a binarised ground truth, and ROC curve plots."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from jaxtyping import Bool, Float

from headhunt.errors import HeadhuntError


def binarize_truth(
    effect: Float[np.ndarray, ...], *, share: float | None = None, top: int | None = None
) -> Bool[np.ndarray, ...]:
    """The ground-truth circuit from per-head patching effects.

    Heads are ranked by |effect|. With ``share``, the circuit is the smallest set of top heads
    whose |effect| adds up to at least that share of the total |effect| over all heads (a rule
    that adapts to how concentrated the task is). With ``top``, it is the ``top`` heads.
    Give at most one of the two (default: ``share=0.5``).
    """
    if share is not None and top is not None:
        raise HeadhuntError("binarise the ground truth by a share or a top count, not both")
    if share is None and top is None:
        share = 0.5
    a = np.abs(np.asarray(effect, float))
    flat = a.ravel()
    order = np.argsort(-flat, kind="stable")
    if top is not None:
        if not 0 < top < flat.size:
            raise HeadhuntError(f"ground-truth size must be in 1..{flat.size - 1}, got {top}")
        k = top
    else:
        if not 0 < share < 1:
            raise HeadhuntError(f"ground-truth share must be in (0, 1), got {share}")
        total = flat.sum()
        if total <= 0:
            raise HeadhuntError("every head has zero patching effect: no ground truth")
        k = int(np.searchsorted(np.cumsum(flat[order]) / total, share)) + 1
        k = min(k, flat.size - 1)
    truth = np.zeros(flat.size, bool)
    truth[order[:k]] = True
    return truth.reshape(a.shape)


def roc_auc(scores: Float[np.ndarray, ...], truth: Bool[np.ndarray, ...]) -> float:
    """Area under the ROC curve of ``scores`` for finding the ``truth`` heads: the chance that
    a random circuit head scores above a random other head (ties count one half)."""
    from sklearn.metrics import roc_auc_score

    t = np.asarray(truth, bool).ravel()
    if t.all() or not t.any():
        raise HeadhuntError("the ground truth needs both circuit and non-circuit heads")
    return float(roc_auc_score(t, np.asarray(scores, float).ravel()))


@dataclass
class Curve:
    """One ROC curve: false and true positive rates, and its AUC."""

    fpr: Float[np.ndarray, " points"]
    tpr: Float[np.ndarray, " points"]
    auc: float


def roc_curve(scores: Float[np.ndarray, ...], truth: Bool[np.ndarray, ...]) -> Curve:
    from sklearn.metrics import roc_curve as sk_roc

    t = np.asarray(truth, bool).ravel()
    fpr, tpr, _ = sk_roc(t, np.asarray(scores, float).ravel())
    return Curve(fpr=fpr, tpr=tpr, auc=roc_auc(scores, truth))


def roc_figure(curves: Mapping[str, Curve], title: str):
    """A plotly figure with one ROC curve per method and the chance diagonal."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, c in curves.items():
        fig.add_trace(go.Scatter(x=c.fpr, y=c.tpr, mode="lines", name=f"{name} (AUC {c.auc:.3f})"))
    fig.add_trace(
        go.Scatter(
            x=[0, 1], y=[0, 1], mode="lines", name="chance", line={"dash": "dot", "color": "gray"}
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title="false positive rate",
        yaxis_title="true positive rate",
        width=640,
        height=560,
        template="plotly_white",
    )
    return fig


def write_figure(fig, html: Path, png: Path | None = None) -> str | None:
    """Write the figure as HTML, and as PNG via kaleido when it works here.

    Returns:
        None when everything was written, else why the PNG was not.
    """
    from headhunt.atomic import write_file

    write_file(html, fig)  # self-contained (plotly.js inlined): opens offline
    if png is None:
        return None
    try:
        write_file(png, fig)
    except Exception as e:  # kaleido needs a Chrome it can start; the HTML is enough without
        return f"PNG not written ({type(e).__name__}: {e})"
    return None
