"""Pages that read runs: Runs, Heads map and Circuits (layout only; data comes from data.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from headhunt import inspect as hi
from headhunt.app import data
from headhunt.errors import HeadhuntError
from headhunt.plots import head_heatmap

PAGES = ["Runs", "Heads map", "Head detail", "Interventions", "Circuits"]


@dataclass
class Context:
    """What every page gets: the runs root, the catalog, the chosen run and head."""

    root: str
    entries: list[hi.RunEntry]
    entry: hi.RunEntry | None
    layer: int
    head: int

    @property
    def ok_entries(self) -> list[hi.RunEntry]:
        return [e for e in self.entries if e.ok]


def go_to(page: str, **state) -> None:
    """Switch page (and set the head) from a widget callback, before widgets are drawn."""
    for k, v in state.items():
        st.session_state[k] = v
    st.session_state["page"] = page


def no_runs_message(root: str) -> None:
    st.info(f"No runs found in `{root}`. Make one with the CLI, then press **Reload runs**:")
    st.code(hi.HOW_TO_MAKE_A_RUN, language="bash")
    st.caption(
        "Every `headhunt` command writes a run directory (manifest.json, scores.parquet, ...); "
        "point the dashboard at their parent folder with `headhunt app --runs DIR`."
    )


def scores_or_error(entry: hi.RunEntry):
    """The run's scores, or None after showing why they cannot be read."""
    if not entry.ok:
        st.error(f"Run `{entry.name}` cannot be shown: {entry.problem}")
        return None
    try:
        return data.scores(entry.path)
    except HeadhuntError as e:
        st.error(f"This run cannot be shown: {e}")
        return None


# --------------------------------------------------------------------------- Runs


def _on_runs_table(paths: list[str]) -> None:
    rows = st.session_state["runs_table"]["selection"]["rows"]
    if rows and paths[rows[0]]:
        st.session_state["run"] = paths[rows[0]]


def runs_page(ctx: Context) -> None:
    st.header("Runs")
    if not ctx.entries:
        no_runs_message(ctx.root)
        return
    table = hi.run_table(ctx.entries)
    paths = [str(e.path) if e.ok else "" for e in ctx.entries]
    st.caption(f"{len(ctx.ok_entries)} run(s) in `{ctx.root}`; select a row to open it.")
    st.dataframe(
        table.drop(columns=["path"]),
        hide_index=True,
        on_select=lambda: _on_runs_table(paths),
        selection_mode="single-row",
        key="runs_table",
    )
    for e in ctx.entries:
        if not e.ok:
            st.warning(f"`{e.name}`: {e.problem}")
    if ctx.entry is None:
        return
    run = ctx.entry.run
    st.subheader(f"Run `{ctx.entry.name}`")
    m = run.manifest
    model = m.get("model", {})
    c1, c2, c3 = st.columns(3)
    c1.metric("method", run.method)
    c2.metric("model", str(model.get("spec", "?")))
    c3.metric("heads", f"{model.get('n_layers', '?')} x {model.get('n_heads', '?')}")
    st.caption(f"created {m.get('created', '?')}, finished {m.get('finished', '?')}; {run.path}")
    if m.get("summary"):
        with st.expander("summary", expanded=True):
            st.json(m["summary"])
    with st.expander("parameters"):
        st.json(m.get("parameters", {}))
    with st.expander("timings, versions and files"):
        st.json({k: m.get(k) for k in ("timings", "versions", "files", "command")})
    _compare(ctx)


def _compare(ctx: Context) -> None:
    others = [e for e in ctx.ok_entries if e.path != ctx.entry.path]
    if not others:
        return
    st.subheader("Compare with another run")
    names = {str(e.path): e.name for e in others}
    other = st.selectbox(
        "second run",
        [None, *names],
        format_func=lambda p: "(none)" if p is None else names[p],
        key="compare_with",
    )
    if other is None:
        return
    b = next(e for e in others if str(e.path) == other)
    diff = hi.parameter_diff(ctx.entry.run, b.run)
    st.markdown("**Settings that differ**")
    if len(diff):
        st.dataframe(diff, hide_index=True)
    else:
        st.caption("same model and parameters")
    sa, sb = scores_or_error(ctx.entry), scores_or_error(b)
    if sa is None or sb is None:
        return
    common = {v.label: v for v in hi.metric_views(sa)}
    common = {k: v for k, v in common.items() if k in {w.label for w in hi.metric_views(sb)}}
    if not common:
        st.caption("the two runs share no metric")
        return
    label = st.selectbox("metric to compare", list(common), key="compare_metric")
    try:
        df, rho = hi.compare_runs(sa, sb, common[label])
    except HeadhuntError as e:
        st.warning(str(e))
        return
    left, right = st.columns(2)
    left.plotly_chart(head_heatmap(hi.view_matrix(sa, common[label]), ctx.entry.name, label))
    right.plotly_chart(head_heatmap(hi.view_matrix(sb, common[label]), b.name, label))
    st.caption(
        "rank correlation over heads (Spearman): "
        + ("not defined (too few varying values)" if rho is None else f"{rho:.3f}")
    )


# --------------------------------------------------------------------------- Heads map


def _view_key(entry: hi.RunEntry) -> str:
    return f"view::{entry.path}"


def _on_heatmap() -> None:
    points = st.session_state["heatmap"]["selection"]["points"]
    if points:
        p = points[0]
        go_to("Head detail", layer=int(p["y"]), head=int(p["x"]))


def _on_top_table(top: pd.DataFrame) -> None:
    rows = st.session_state["top_table"]["selection"]["rows"]
    if rows:
        r = top.iloc[rows[0]]
        go_to("Head detail", layer=int(r["layer"]), head=int(r["head"]))


def clickable(fig):
    """Plotly reports no selection for heatmap cells, so lay an invisible marker on every
    cell: a click selects that marker, and its x/y are the head and the layer."""
    import plotly.graph_objects as go

    z = fig.data[0].z
    n_layers, n_heads = len(z), len(z[0])
    xs = [str(h) for _ in range(n_layers) for h in range(n_heads)]
    ys = [str(la) for la in range(n_layers) for _ in range(n_heads)]
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="markers",
            marker={"symbol": "square", "size": 14, "opacity": 0.0},
            customdata=[v for row in z for v in row],
            hovertemplate="layer %{y}, head %{x}: %{customdata:.3f}<extra></extra>",
            showlegend=False,
        )
    )
    fig.update_layout(height=max(460, 22 * n_layers), clickmode="event+select")
    return fig


def chosen_view(entry: hi.RunEntry, views: list[hi.MetricView], label: str = "metric"):
    """A metric picker whose choice survives page changes (kept per run)."""
    labels = [v.label for v in views]
    key = _view_key(entry)
    default = hi.default_view(entry.method, views)
    current = st.session_state.get(key, default.label if default else labels[0])
    index = labels.index(current) if current in labels else 0
    picked = st.selectbox(label, labels, index=index, key=f"w_{key}")
    st.session_state[key] = picked
    return views[labels.index(picked)]


def heads_map_page(ctx: Context) -> None:
    st.header("Heads map")
    if ctx.entry is None:
        no_runs_message(ctx.root)
        return
    scores = scores_or_error(ctx.entry)
    if scores is None:
        return
    views = hi.metric_views(scores)
    layer_rows = hi.layer_metrics(scores)
    if not views:
        st.warning("This run has no per-head scores (only per-layer values).")
    else:
        view = chosen_view(ctx.entry, views)
        matrix = hi.view_matrix(scores, view)
        fig = clickable(head_heatmap(matrix, f"{view.label}: {ctx.entry.name}", view.metric))
        st.plotly_chart(
            fig,
            on_select=_on_heatmap,
            selection_mode="points",
            key="heatmap",
        )
        st.caption("Click a cell (or a row below) to open that head's detail.")
        top = hi.top_heads(scores, view, 15)
        st.markdown(f"**Top heads by {view.label}**")
        st.dataframe(
            top,
            hide_index=True,
            on_select=lambda: _on_top_table(top),
            selection_mode="single-row",
            key="top_table",
        )
    if len(layer_rows):
        st.markdown("**Per-layer values**")
        wide = layer_rows.pivot_table(index="layer", columns="metric", values="value")
        st.line_chart(wide)


# --------------------------------------------------------------------------- Circuits


def circuits_page(ctx: Context) -> None:
    st.header("Circuits")
    runs = [e for e in ctx.ok_entries if e.method == "circuits"]
    if not runs:
        st.info("No circuits run here. Make one with:")
        st.code("headhunt circuits --task ioi --out runs/circuits", language="bash")
        if ctx.entry is not None:
            st.caption(f"The selected run `{ctx.entry.name}` is a {ctx.entry.method} run.")
        return
    names = {str(e.path): e.name for e in runs}
    start = (
        str(ctx.entry.path) if ctx.entry is not None and ctx.entry.method == "circuits" else None
    )
    paths = list(names)
    path = st.selectbox(
        "circuits run",
        paths,
        index=paths.index(start) if start in paths else 0,
        format_func=names.get,
        key="circuits_run",
    )
    entry = next(e for e in runs if str(e.path) == path)
    if scores_or_error(entry) is None:
        return
    cv = data.circuit(entry.path)
    m = entry.run.manifest
    params = m.get("parameters", {})
    st.caption(
        f"task {params.get('task') or params.get('task_file')}, "
        f"{m.get('n_pairs', params.get('pairs'))} pairs, {params.get('trials')} SAE trials"
    )
    if cv.auc and cv.auc.get("methods"):
        rows = [
            {
                "method": hi_label(k),
                "ROC AUC mean": v.get("mean"),
                "std": v.get("std"),
                "per trial": ", ".join(f"{x:.3f}" for x in v.get("per_trial", v.get("trials", []))),
                "spearman vs |effect|": cv.auc.get("spearman_vs_abs_effect", {}).get(k),
            }
            for k, v in cv.auc["methods"].items()
        ]
        st.markdown(
            f"**ROC AUC against the patching ground truth** ({cv.auc.get('truth_rule')}, "
            f"{len(cv.auc.get('truth_heads', []))} heads)"
        )
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    if cv.curves:
        from headhunt.sae.roc import roc_figure

        st.plotly_chart(roc_figure(cv.curves, "ROC of each method's trial-mean head score"))
    for note in cv.notes:
        st.caption(note)
    metrics = [c for c in ("sae_node", "sae_edge", "patching", "eap") if c in cv.table.columns]
    if metrics:
        cols = st.columns(min(2, len(metrics)))
        scores = data.scores(entry.path)
        for i, metric in enumerate(metrics):
            cols[i % len(cols)].plotly_chart(
                head_heatmap(scores.matrix(metric), metric, metric), key=f"circ_{metric}"
            )
    if cv.circuit:
        heads = ", ".join(f"{a}-{b}" for a, b in cv.circuit.get("heads", []))
        st.markdown(f"**Circuit** ({cv.circuit.get('rule')}): {heads or 'none'}")
    if cv.edges is not None and len(cv.edges):
        st.markdown("**Best head pairs by SAE edge score** (mean over trials)")
        edges = (
            cv.edges.groupby(["head_a", "head_b"])["edge"]
            .agg(["mean", "count"])
            .sort_values("mean", ascending=False)
            .head(20)
            .reset_index()
        )
        st.dataframe(edges, hide_index=True)
    with st.expander("every head's scores"):
        st.dataframe(cv.table, hide_index=True)
    if cv.auc:
        with st.expander("auc.json"):
            st.code(json.dumps(cv.auc, indent=1)[:20000], language="json")


def hi_label(method: str) -> str:
    for label, (metric, _) in hi.ROC_METHODS.items():
        if metric == method:
            return label
    return method
