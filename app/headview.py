"""The Head view page: one head over a long prompt (up to the model's limit), laid out from a
:class:`headhunt.probes.headview.HeadView` (the library computes it; this page only draws).

The browser gets downsampled tracks (a few thousand points per figure), never a per-token
array of the whole prompt nor an N x N matrix, so a 128k-token view stays small in the page.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import streamlit as st

from headhunt import inspect as hi
from headhunt.app import data
from headhunt.app.head import DEFAULT_PROMPT, load_model_for, model_spec
from headhunt.app.views import Context, kept, kept_index, without_run
from headhunt.errors import HeadhuntError
from headhunt.probes.headview import HeadView
from headhunt.views import headview as hv

SOURCES = {
    "haystack": "the bundled haystack text, N tokens",
    "text": "my text",
    "trial": "a needle trial of this retrieval run",
    "file": "a saved head view (.npz)",
}


def head_view_page(ctx: Context) -> None:
    if without_run(ctx, "Head view"):
        return
    layer, head = ctx.layer, ctx.head
    saved = st.session_state.get("hv_source") == "file"
    st.header(
        "Head view: a saved view"
        if saved
        else f"Head view {layer}-{head}: one head over a long prompt"
    )
    st.caption(
        "Every query's argmax key, entropy and top weight, and the attention each key "
        "receives, from the kernels' row and column statistics (no N x N matrix, up to the "
        "model's context); exact rows of chosen queries from their log-sum-exp. Tracks are "
        "drawn as the min and max of each bin, each point a real position: hover for its "
        "value, narrow the range below for every value."
    )
    sources = [s for s in SOURCES if s != "trial" or hi.NEEDLE_TRIALS in ctx.entry.panels]
    at = kept_index("hv_source", sources)
    source = st.radio(
        "prompt", sources, at, format_func=SOURCES.get, key="hv_source", horizontal=True
    )
    spec = model_spec(ctx)
    key = _request(ctx, source, spec, layer, head)
    if key is None:
        return
    got = st.session_state.get("hv_view")
    if got is None or got[0] != key:
        st.caption(f"Computed on demand with `{spec}` when you press the button.")
        return
    _show(got[1], got[2])


def _request(ctx: Context, source: str, spec: str, layer: int, head: int):
    """The widgets of the chosen source and the Compute button; the key of the view they ask
    for (None when the page cannot go on)."""
    if source == "file":
        path = st.text_input("head view file (.npz)", kept("hv_file", ""), key="hv_file")
        if st.button("Open this head view", key="hv_open_go") and path:
            try:
                view = HeadView.load(Path(path).expanduser())
            except HeadhuntError as e:
                st.error(str(e))
                return None
            st.session_state["hv_view"] = (("file", path), view, None)
        return ("file", path)
    if source == "haystack":
        n = st.number_input("tokens", 2, 1_000_000, kept("hv_tokens", 2000), 500, key="hv_tokens")
        what = ("haystack", int(n))
    elif source == "text":
        text = st.text_area("prompt", kept("hv_text", DEFAULT_PROMPT), key="hv_text", height=120)
        what = ("text", text)
    else:
        trials = data.needle_trials(ctx.entry.path, layer, head)
        ids = list(trials["trial"]) if len(trials) else []
        if not ids:
            st.info("This run keeps no trials.")
            return None
        trial = st.selectbox("trial", ids, kept_index("hv_trial", ids), key="hv_trial")
        what = ("trial", str(ctx.entry.path), trial)
    key = (spec, layer, head, *what)
    if st.button(f"Compute the head view of {layer}-{head}", key="hv_go"):
        model = load_model_for(ctx, spec)
        if model is None:
            return None
        try:
            with st.spinner("one forward pass up to the layer ..."), data.model_lock(spec):
                span = None
                if what[0] == "haystack":
                    prompt = hv.haystack_prompt(model, what[1])
                elif what[0] == "trial":
                    prompt, span = hv.retrieval_trial_prompt(ctx.entry.run, model, what[2])
                else:
                    prompt = what[1]
                view = hi.head_view(model, prompt, layer, head)
        except HeadhuntError as e:
            st.error(str(e))
            return None
        st.session_state["hv_view"] = (key, view, span)
    return key


def _show(view: HeadView, span: tuple[int, int] | None) -> None:
    n = view.n
    st.markdown(
        f"**{n:,} tokens**, head {view.layer}-{view.head} of `{view.model}`"
        + (f"; the needle's answer at positions {span[0]}..{span[1] - 1}" if span else "")
        + (f" ({', '.join(f'{k}: {v}' for k, v in view.notes.items())})" if view.notes else "")
    )
    # A kept range or query from a longer view is brought inside this one.
    state = st.session_state
    if state.get("hv_shown") != (view.model, view.layer, view.head, n):
        state["hv_shown"] = (view.model, view.layer, view.head, n)
        state["hv_from"], state["hv_to"], state["hv_query"] = 0, n, n - 1
    for key, low, high in (("hv_from", 0, n - 1), ("hv_to", 1, n), ("hv_query", 0, n - 1)):
        inside = min(high, max(low, int(state.get(key, high))))
        if state.get(key) != inside:  # written only when it moves (see main.KEPT_SETTINGS)
            state[key] = inside
    c1, c2, c3 = st.columns(3)
    start = int(c1.number_input("from query / key", 0, n - 1, state["hv_from"], key="hv_from"))
    stop = int(c2.number_input("to (exclusive)", 1, n, state["hv_to"], key="hv_to"))
    if stop <= start:
        st.error(f"the range {start}..{stop} is empty: 'to' must exceed 'from'")
        return
    query = int(c3.number_input("query (exact row)", 0, n - 1, state["hv_query"], key="hv_query"))
    st.caption(
        f"{stop - start:,} positions shown in at most {hv.BINS} bins"
        + (" (exact: one position per point)" if stop - start <= hv.BINS else "")
        + "; click a point of a track to choose its query."
    )
    st.plotly_chart(
        hv.track_figure(view, start, stop, query),
        key="hv_tracks",
        on_select=_on_track_click,
        selection_mode="points",
    )
    st.plotly_chart(hv.received_figure(view, start, stop), key="hv_received")
    st.subheader(f"Query {query}: where it looks")
    try:
        row = view.row(query)
    except HeadhuntError as e:
        st.warning(str(e))
        return
    st.plotly_chart(hv.row_figure(view, query, start, stop), key="hv_row")
    top = hv.top_keys(view, query)
    st.dataframe(top, hide_index=True)
    st.markdown("**The text around the keys it attends to most** (shaded by its weights)")
    st.html(hv.context_html(view, list(top["key"][:5]), row))
    looked = view.looked_at(5)
    st.markdown("**The text around the keys this head attends to most over the whole prompt**")
    received = view.col_sum / max(float(view.col_sum.max()), 1e-30)
    st.html(hv.context_html(view, list(looked), received))
    st.caption(
        "Shading: white = 0, full orange = the largest weight among the lines shown; the "
        "position itself is outlined. Column sums add every query's weight on a key."
    )


def _on_track_click() -> None:
    points = st.session_state["hv_tracks"]["selection"]["points"]
    if points and np.isfinite(points[0].get("x", np.nan)):
        st.session_state["hv_query"] = int(points[0]["x"])
