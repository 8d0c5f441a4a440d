"""Pages that read runs: Runs, Heads map and Circuits (layout only; data comes from data.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from headhunt import inspect as hi
from headhunt.app import data
from headhunt.errors import HeadhuntError
from headhunt.plots import fix_head_axes, head_heatmap, layer_lines, status_map

PAGES = ["Runs", "Heads map", "Head detail", "Head view", "Interventions", "Circuits"]


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


def kept(key: str, default):
    """A page setting's value now: the session's, else ``default`` (which becomes the
    session's). Its widget gets it as its own default as well as by ``key``: a value set in
    the session reaches the browser only in that run's message, and a browser that drew the
    widget from a later run's message (fast clicks on a busy machine) took the widget's
    default instead, and sent it back."""
    return st.session_state.setdefault(key, default)


def kept_index(key: str, options: list, default: int = 0) -> int:
    """:func:`kept` for a radio or selectbox: the index of the session's value in ``options``
    (``default`` when it is not one of them; the value becomes that option)."""
    if st.session_state.get(key) not in options:
        st.session_state[key] = options[default]
    return options.index(st.session_state[key])


def go_to(page: str, **state) -> None:
    """Switch page (and set the head) from a widget callback, before widgets are drawn."""
    for k, v in state.items():
        st.session_state[k] = v
    st.session_state["page"] = page


def no_runs_message(root: str) -> None:
    problem = hi.runs_root_problem(root)
    if problem is not None:
        st.error(
            f"{problem[0].upper()}{problem[1:]}. Fix the runs folder in the sidebar (or start "
            "the app with `headhunt app --runs DIR`), or make a first run there:"
        )
        st.code(hi.HOW_TO_MAKE_A_RUN, language="bash")
        return
    st.info(f"No runs found in `{root}`. Make one with the CLI, then press **Reload runs**:")
    st.code(hi.HOW_TO_MAKE_A_RUN, language="bash")
    st.caption(
        "Every `headhunt` command writes a run directory (manifest.json, scores.parquet, ...); "
        "point the dashboard at their parent folder with `headhunt app --runs DIR`."
    )


def without_run(ctx: Context, title: str) -> bool:
    """True after saying there is no run to show (with the page's ``title``)."""
    if ctx.entry is not None:
        return False
    st.header(title)
    no_runs_message(ctx.root)
    return True


def page_scores(ctx: Context, title: str):
    """The page's header and its run's scores, or None after saying why there are none."""
    if without_run(ctx, title):
        return None
    st.header(title)
    return scores_or_error(ctx.entry)


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


def _on_runs_table(paths: list[str], key: str) -> None:
    rows = st.session_state[key]["selection"]["rows"]
    if rows and paths[rows[0]]:
        st.session_state["run"] = paths[rows[0]]


def runs_page(ctx: Context) -> None:
    st.header("Runs")
    if not ctx.entries:
        no_runs_message(ctx.root)
        return
    table = hi.run_table(ctx.entries)
    paths = [str(e.path) if e.ok else "" for e in ctx.entries]
    current = str(ctx.entry.path) if ctx.entry is not None else ""
    table.insert(0, "open", ["\u25b6" if p and p == current else "" for p in paths])
    st.caption(
        f"{len(ctx.ok_entries)} run(s) in `{ctx.root}`; select a row to open it (\u25b6 marks "
        "the open run, the one chosen in the sidebar)."
    )
    # The table's selection is keyed by the open run: when the sidebar opens another run, a
    # fresh table is drawn (no tick left on the previous run), and any row can be clicked.
    key = f"runs_table::{current}"
    st.dataframe(
        table.drop(columns=["path"]),
        hide_index=True,
        on_select=lambda: _on_runs_table(paths, key),
        selection_mode="single-row",
        key=key,
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
    _own_result(run)
    with st.expander("parameters"):
        st.json(m.get("parameters", {}))
    with st.expander("timings, versions and files"):
        st.json({k: m.get(k) for k in ("timings", "versions", "files", "command")})
    _compare(ctx)


def _own_result(run) -> None:
    """An ablate run's result, as a table (its scores are its source's ranking)."""
    try:
        table = hi.ablation_table(run)
    except HeadhuntError as e:
        st.error(str(e))
        return
    if table is None:
        return
    st.markdown("**Result: needle recall with heads masked**")
    st.dataframe(table, hide_index=True, key="ablation_result")
    st.caption(
        "needle recall = ROUGE-1 recall of the answer x 100, mean over the trials; SE = its "
        "standard error over the trials. " + (hi.scores_note(run) or "")
    )


def _compare(ctx: Context) -> None:
    others = [e for e in ctx.ok_entries if e.path != ctx.entry.path]
    if not others:
        return
    st.subheader("Compare with another run")
    names = {str(e.path): f"{e.name} ({e.method})" for e in others}
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
    views_a, views_b = hi.metric_views(sa), hi.metric_views(sb)
    if not views_a or not views_b:
        st.caption("one of the runs has no per-head scores to compare")
        return
    # Two runs of different methods still share the model's heads: each side picks its metric.
    left, right = st.columns(2)
    with left:
        va = chosen_view(ctx.entry, views_a, f"metric of {ctx.entry.name}", key="cmp_a")
    labels_b = [v.label for v in views_b]
    same = va.label if va.label in labels_b else None
    start_b = same or (hi.default_view(b.method, views_b) or views_b[0]).label
    vb = views_b[
        labels_b.index(
            right.selectbox(
                f"metric of {b.name}",
                labels_b,
                index=labels_b.index(start_b),
                key=f"cmp_b::{b.path}",
            )
        )
    ]
    try:
        df, rho = hi.compare_runs(sa, sb, va, vb)
    except HeadhuntError as e:
        st.warning(str(e))
        return
    left, right = st.columns(2)
    left.plotly_chart(head_heatmap(hi.view_matrix(sa, va), ctx.entry.name, va.label), key="cmp_ma")
    right.plotly_chart(head_heatmap(hi.view_matrix(sb, vb), b.name, vb.label), key="cmp_mb")
    shared = df.attrs["shared_top"]
    st.markdown(
        f"**Heads in both top-10 lists** ({len(shared)}): "
        + (", ".join(f"{la}-{h}" for la, h in shared) or "none")
    )
    st.caption(
        "rank correlation over heads (Spearman): "
        + ("not defined (too few varying values)" if rho is None else f"{rho:.3f}")
    )
    both = df.dropna(subset=["a", "b"]).sort_values("rank a").head(20)
    st.dataframe(
        both.rename(columns={"a": va.label, "b": vb.label + " "}), hide_index=True, key="cmp_table"
    )


# --------------------------------------------------------------------------- Heads map


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
    return fix_head_axes(fig, n_layers, n_heads)


def drawable_views(scores, views: list[hi.MetricView]) -> list[hi.MetricView]:
    """The views that are maps of heads; the others (no head has a value, or every head the
    same one) are left out of the pickers, with one line saying which and why."""
    states = {v.label: hi.view_state(scores, v) for v in views}
    shown = [v for v in views if states[v.label].kind == "map"]
    hidden = [v for v in views if states[v.label].kind != "map"]
    if hidden:
        with st.expander(f"{len(hidden)} view(s) not offered: nothing to rank"):
            st.markdown("\n".join(f"- {states[v.label].message}" for v in hidden))
    return shown


def chosen_view(
    entry: hi.RunEntry, views: list[hi.MetricView], label: str = "metric", key: str = "view"
):
    """A metric picker whose choice survives page changes (kept per run and per ``key``)."""
    labels = [v.label for v in views]
    key = f"{key}::{entry.path}"
    default = hi.default_view(entry.method, views)
    current = st.session_state.get(key, default.label if default else labels[0])
    index = labels.index(current) if current in labels else 0
    picked = st.selectbox(label, labels, index=index, key=f"w_{key}")
    st.session_state[key] = picked
    return views[labels.index(picked)]


def heads_map_page(ctx: Context) -> None:
    scores = page_scores(ctx, "Heads map")
    if scores is None:
        return
    note = hi.scores_note(ctx.entry.run)
    if note is not None:
        st.info(note)
    views = hi.metric_views(scores)
    layer_rows = hi.layer_metrics(scores)
    shown = drawable_views(scores, views)
    if not views:
        st.warning("This run has no per-head scores (only per-layer values).")
    elif not shown:
        st.info(
            "No view of this run is a map: "
            + " ".join(hi.view_state(scores, v).message for v in views[:3])
        )
    else:
        view = chosen_view(ctx.entry, shown)
        st.caption(hi.describe(view.metric))
        _head_map(ctx, scores, view)
    if len(layer_rows):
        st.markdown("**Per-layer values**")
        for metric in dict.fromkeys(layer_rows["metric"]):
            st.caption(hi.describe(metric))
        st.plotly_chart(layer_lines(layer_rows), key="layer_lines")


def _head_map(ctx: Context, scores, view: hi.MetricView) -> None:
    """The view as a clickable map and its top heads, or why it is not a map."""
    state = hi.view_state(scores, view)
    if state.kind != "map":
        st.info(state.message)
        return
    matrix = hi.view_matrix(scores, view)
    fig = clickable(head_heatmap(matrix, f"{view.label}: {ctx.entry.name}", view.metric))
    st.plotly_chart(fig, on_select=_on_heatmap, selection_mode="points", key="heatmap")
    missing = int(np.isnan(matrix).sum())
    st.caption(
        "Click a cell (or a row below) to open that head's detail."
        + (f" {missing} head(s) have no value (blank cells)." if missing else "")
    )
    top = hi.top_heads(scores, view, 15)
    st.markdown(f"**Top heads by {view.label}**")
    st.dataframe(
        top,
        hide_index=True,
        on_select=lambda: _on_top_table(top),
        selection_mode="single-row",
        key="top_table",
    )
    _ties_caption(top, "value", "heads", "Tied heads share the rank of their tie")


# --------------------------------------------------------------------------- Circuits


def circuits_page(ctx: Context) -> None:
    st.header("Circuits")
    runs = [e for e in ctx.ok_entries if hi.CIRCUIT in e.panels]
    if not runs:
        st.info("No circuits run here. Make one with:")
        st.code("headhunt circuits --task ioi --out runs/circuits", language="bash")
        if ctx.entry is not None:
            st.caption(f"The selected run `{ctx.entry.name}` is a {ctx.entry.method} run.")
        return
    names = {str(e.path): e.name for e in runs}
    paths = list(names)
    start = str(ctx.entry.path) if ctx.entry is not None else None
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
    if cv.auc or cv.curves:
        st.caption(hi.AUC_NOTE)
    for note in cv.notes:
        st.caption(note)
    rule = (cv.auc or {}).get("node_rule", "sae_node")  # the node score that ranks the circuit
    maps = dict.fromkeys((rule, "sae_edge", "patching", "eap"))
    metrics = [c for c in maps if c in cv.table.columns]
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
        _truth_vs_circuit(entry, cv)
    if cv.edges is not None and len(cv.edges):
        edges = hi.edge_table(cv.edges, 20)
        st.markdown(
            "**Best head pairs by SAE edge score** (mean over the trials that list the pair; "
            "each trial lists its best 100)"
        )
        st.dataframe(edges, hide_index=True)
        _ties_caption(
            edges,
            "mean",
            "pairs",
            "Pairs with the same mean share a rank; their order in the table is alphabetical, "
            "not a ranking",
        )
    with st.expander("every head's scores"):
        st.dataframe(cv.table, hide_index=True)
    if cv.auc:
        with st.expander("auc.json"):
            st.code(json.dumps(cv.auc, indent=1)[:20000], language="json")


def _ties_caption(table: pd.DataFrame, column: str, noun: str, lead: str) -> None:
    """Name the ties of a ranked table (its ``tied`` column counts the rows sharing a value)."""
    tied = table[table["tied"] > 1]
    if len(tied):
        counts = tied.groupby(column)["tied"].first().items()
        st.caption(
            f"{lead} (`tied` = {noun} at that value): "
            + "; ".join(f"{n} {noun} tie at {v:.6g}" for v, n in counts)
        )


def _truth_vs_circuit(entry: hi.RunEntry, cv: hi.CircuitView) -> None:
    """Which ground-truth heads the circuit found, and which of its heads are not true."""
    scores = data.scores(entry.path)
    table = hi.truth_vs_circuit(scores, cv.circuit)
    if table.empty:
        st.caption("no ground truth in this run: nothing to compare the circuit with")
        return
    shape = entry.run.manifest.get("model", {})
    n_layers = int(shape.get("n_layers") or table["layer"].max() + 1)
    n_heads = int(shape.get("n_heads") or table["head"].max() + 1)
    st.markdown(f"**Ground truth vs circuit**: {hi.overlap_summary(table)}")
    st.plotly_chart(
        status_map(table, n_layers, n_heads, "ground truth vs circuit"), key="truth_vs_circuit"
    )
    rule = (cv.auc or {}).get("truth_rule")
    if rule:
        st.caption(f"ground truth: {rule}")


def hi_label(method: str) -> str:
    for label, (metric, _) in hi.ROC_METHODS.items():
        if metric == method:
            return label
    return method
