"""Per-head maps of a scores table: the views a run offers, their matrices, top heads, one
head's values and ranks, and two runs compared."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from headhunt.errors import HeadhuntError
from headhunt.methods import find
from headhunt.scores import COLUMNS, HeadScores
from headhunt.views.glossary import metric_info


@dataclass(frozen=True)
class MetricView:
    """One layer x head map of a scores table: a metric plus values of its extra key columns
    (``source="random"``, ``order=2`` for n-gram runs)."""

    metric: str
    where: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        if not self.where:
            return self.metric
        return f"{self.metric} [{', '.join(f'{k}={v}' for k, v in self.where)}]"

    @property
    def filters(self) -> dict[str, Any]:
        return dict(self.where)


def _is_head(df: pd.DataFrame) -> pd.Series:
    """Rows about one head; the others are about a whole layer: ``head`` empty (sinks'
    ``sink_eps``) or -1 (probes of a layer's residual stream)."""
    return df["head"].notna() & (df["head"] >= 0)


def per_head(scores: HeadScores) -> pd.DataFrame:
    """The rows of a scores table that belong to one head each."""
    return scores.df[_is_head(scores.df)]


def metric_views(scores: HeadScores) -> list[MetricView]:
    """Every per-head map the table holds, in the table's order (per-layer metrics, whose
    ``head`` is empty, are left to :func:`layer_metrics`)."""
    df = per_head(scores)
    extra = [c for c in df.columns if c not in COLUMNS]
    views = []
    for metric, rows in df.groupby("metric", sort=False):
        keys = [c for c in extra if rows[c].notna().any()]
        if not keys:
            views.append(MetricView(str(metric)))
            continue
        for combo in rows[keys].drop_duplicates().itertuples(index=False):
            where = tuple((k, _py(v)) for k, v in zip(keys, combo, strict=True) if _present(v))
            views.append(MetricView(str(metric), where))
    return views


def _present(v: Any) -> bool:
    return not (v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)))


def _py(v: Any) -> Any:
    """Plain Python values (hashable, picklable, and equal to what the parquet holds)."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def view_matrix(scores: HeadScores, view: MetricView) -> np.ndarray:
    """The [layers, heads] matrix of a view (NaN where a head has no value)."""
    df = per_head(scores)
    return HeadScores(df).matrix(view.metric, **view.filters)


def default_view(method: str, views: Sequence[MetricView]) -> MetricView | None:
    """The view a run opens on: its method's default metric, else the first view."""
    known = find(method)
    want = known.metric if known is not None else None
    for v in views:
        if v.metric == want:
            return v
    return views[0] if views else None


def layer_metrics(scores: HeadScores) -> pd.DataFrame:
    """Per-layer rows (``head`` empty or -1), e.g. sink runs' ``sink_eps`` and ``massive_ratio``
    or the accuracy of a probe of each layer's residual stream."""
    df = scores.df[~_is_head(scores.df)]
    return df[["layer", "metric", "value"]].reset_index(drop=True)


@dataclass(frozen=True)
class ViewState:
    """Whether a view's matrix can be read as a map of heads, and if not, why.

    Attributes:
        kind: ``"map"`` (values differ between heads), ``"empty"`` (no head has a value) or
            ``"constant"`` (every head with a value has the same one: nothing to rank).
        message: one line for the reader ("" for a map).
        value: the shared value of a constant view.
    """

    kind: Literal["map", "empty", "constant"]
    message: str = ""
    value: float | None = None


def view_state(scores: HeadScores, view: MetricView) -> ViewState:
    """Is this view a map of heads? An all-NaN or constant view is explained, not drawn."""
    m = view_matrix(scores, view)
    finite = m[np.isfinite(m)]
    info = metric_info(view.metric)
    if finite.size == 0:
        why = info.when_nan if info is not None and info.when_nan else "the run recorded none"
        return ViewState("empty", f"No head has a value for {view.label}: {why}.")
    if np.all(finite == finite[0]):
        v = float(finite[0])
        why = f": {info.when_constant}" if info is not None and info.when_constant else ""
        return ViewState(
            "constant",
            f"Every head has the same {view.label}, {v:.6g}, so no head ranks above another "
            f"and there is no map to draw{why}.",
            v,
        )
    return ViewState("map")


def top_heads(scores: HeadScores, view: MetricView, k: int = 10) -> pd.DataFrame:
    """The k highest-valued heads of a view: layer, head, kv_head, value and ``rank`` (1 =
    highest; heads with equal values share the lowest rank of their tie, ``tied`` counts
    the heads of the whole map sharing that value)."""
    df = per_head(scores)
    rows = df[df["metric"] == view.metric]
    for col, v in view.where:
        rows = rows[rows[col] == v]
    rows = rows.dropna(subset=["value"])
    ranks = rows["value"].rank(ascending=False, method="min").astype(int)
    ties = rows.groupby("value")["value"].transform("count").astype(int)
    out = rows.assign(rank=ranks, tied=ties).sort_values(["rank", "layer", "head"]).head(k)
    out = out[["layer", "head", "kv_head", "value", "rank", "tied"]].copy()
    out[["layer", "head", "kv_head"]] = out[["layer", "head", "kv_head"]].astype(int)
    return out.reset_index(drop=True)


def head_table(scores: HeadScores, layer: int, head: int) -> pd.DataFrame:
    """Every value the table holds for one head, with its rank among all heads (1 = highest;
    ties share their lowest rank) for the same metric and keys, how many heads share its
    value (``tied``), and the metric's unit. A metric whose heads all share one value (a
    run-level count) has no rank."""
    df = per_head(scores).copy()
    extra = [c for c in df.columns if c not in COLUMNS]
    group = ["metric", *extra]
    by = df.groupby(group, dropna=False)["value"]  # dropna=False: rows with empty keys group too
    df["rank"] = by.rank(ascending=False, method="min")
    df["of"] = by.transform("count")
    df["tied"] = df.groupby([*group, "value"], dropna=False)["value"].transform("size")
    constant = by.transform("nunique") <= 1
    df.loc[constant, "rank"] = np.nan
    mine = df[(df["layer"] == layer) & (df["head"] == head)].copy()
    mine.loc[mine["value"].isna(), "tied"] = np.nan
    mine["unit"] = [getattr(metric_info(m), "unit", "") for m in mine["metric"]]
    cols = ["metric", *[c for c in extra if mine[c].notna().any()], "value", "unit"]
    out = mine[[*cols, "rank", "of", "tied"]].reset_index(drop=True)
    out["rank"] = out["rank"].astype("Int64")
    out["tied"] = out["tied"].astype("Int64")
    return out


def compare_runs(
    a: HeadScores,
    b: HeadScores,
    view: MetricView,
    view_b: MetricView | None = None,
    *,
    k: int = 10,
) -> tuple[pd.DataFrame, float | None]:
    """A view of run ``a`` against a view of run ``b`` (the same one by default; runs of
    different methods compare any two metrics) on the heads of one model shape: per head both
    values and both ranks, and their rank correlation (Spearman; None when fewer than 3 heads
    have both values or either side is constant). ``df.attrs["shared_top"]`` lists the heads
    in both top-``k`` lists."""
    ma, mb = view_matrix(a, view), view_matrix(b, view_b or view)
    if ma.shape != mb.shape:
        raise HeadhuntError(
            f"the runs have different shapes ({ma.shape[0]}x{ma.shape[1]} vs "
            f"{mb.shape[0]}x{mb.shape[1]} heads): they share no heads to compare"
        )
    layer, head = np.meshgrid(np.arange(ma.shape[0]), np.arange(ma.shape[1]), indexing="ij")
    df = pd.DataFrame(
        {"layer": layer.ravel(), "head": head.ravel(), "a": ma.ravel(), "b": mb.ravel()}
    )
    df["rank a"] = df["a"].rank(ascending=False, method="min").astype("Int64")
    df["rank b"] = df["b"].rank(ascending=False, method="min").astype("Int64")
    top_a = set(df[df["rank a"] <= k].index)
    top_b = set(df[df["rank b"] <= k].index)
    df.attrs["shared_top"] = [
        (int(df.loc[i, "layer"]), int(df.loc[i, "head"])) for i in sorted(top_a & top_b)
    ]
    both = df.dropna(subset=["a", "b"])
    if len(both) < 3 or both["a"].nunique() < 2 or both["b"].nunique() < 2:
        return df, None
    rho = both["a"].rank().corr(both["b"].rank())
    return df, float(rho)
