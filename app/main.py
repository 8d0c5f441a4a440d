"""The headhunt dashboard: `headhunt app --runs DIR`, or `streamlit run app/main.py -- --runs DIR`.

Pages: Runs, Heads map, Head detail, Interventions, Circuits (a sidebar radio). The chosen
page, run and head live in the sidebar (so they persist across pages) and in the URL's query
parameters (so a view can be linked to). No analysis happens here: pages lay out what
:mod:`headhunt.inspect` and the library return.
"""

from __future__ import annotations

import streamlit as st

from headhunt import inspect as hi
from headhunt.app import data
from headhunt.app.head import head_detail_page, interventions_page
from headhunt.app.headview import head_view_page
from headhunt.app.views import (
    PAGES,
    Context,
    circuits_page,
    heads_map_page,
    kept,
    kept_index,
    runs_page,
)
from headhunt.errors import HeadhuntError

RENDER = {
    "Runs": runs_page,
    "Heads map": heads_map_page,
    "Head detail": head_detail_page,
    "Head view": head_view_page,
    "Interventions": interventions_page,
    "Circuits": circuits_page,
}


# Settings of the pages' widgets, by the page that draws them. Streamlit drops a widget's
# value from the session at the end of any run that does not draw it (another page is open),
# so leaving a page would reset them; writing each value back at the start of every run on
# another page makes it the session's own, and it stays (Streamlit's documented way to keep
# widget values across pages). Not on the widget's own page: a value written back there is
# sent to the browser as set by the script, and one sent while the user changes the widget
# undid the change (settings lost now and then in the browser tests on a busy machine).
# Buttons and charts are left out: their values cannot be set.
KEPT_SETTINGS = {
    "Interventions": (
        "iv_typed",
        "iv_how",
        "iv_mode",
        "iv_beta",
        "iv_needle",
        "iv_length",
        "iv_depth",
        "iv_seed",
        "iv_control",
        "iv_top::",  # the heads picked, per run and ranking (a prefix)
    ),
    "Head detail": ("attn_prompt", "attn_sinks", "attn_query", "needle_trial_pick"),
    "Head view": (
        "hv_source",
        "hv_tokens",
        "hv_text",
        "hv_trial",
        "hv_file",
        "hv_from",
        "hv_to",
        "hv_query",
    ),
}


def _keep_settings(page: str) -> None:
    """Write back the kept settings of the pages other than ``page`` (the one drawn now)."""
    names = [k for other, keys in KEPT_SETTINGS.items() if other != page for k in keys]
    for key in list(st.session_state):
        if any(key == k or (k.endswith("::") and key.startswith(k)) for k in names):
            st.session_state[key] = st.session_state[key]


def _from_url() -> None:
    """Once per session: take page, run and head from the URL (?page=...&run=...&layer=..)."""
    if st.session_state.get("_url_read"):
        return
    st.session_state["_url_read"] = True
    qp = st.query_params
    notes = []  # what the link asked for that cannot be shown, said on the page
    if qp.get("page") in PAGES:
        st.session_state["page"] = qp["page"]
    elif qp.get("page"):
        notes.append(f"there is no page {qp['page']!r} (pages: {', '.join(PAGES)})")
    for key in ("layer", "head"):
        if str(qp.get(key, "")).isdigit():
            st.session_state[key] = int(qp[key])
            st.session_state[f"_url_{key}"] = int(qp[key])  # checked against the run's shape
        elif qp.get(key, "") != "":
            notes.append(f"{key} {qp[key]!r} is not a number")
    st.session_state["_link_notes"] = notes
    if qp.get("run"):
        st.session_state["_url_run"] = qp["run"]


def _sidebar() -> Context:
    # Each widget also gets the session's value as its default (views.kept says why): without
    # it, a link's page and run were lost now and then on a busy machine.
    sb = st.sidebar
    sb.title("headhunt")
    root = sb.text_input(
        "runs folder", kept("runs_root", data.default_runs_root()), key="runs_root"
    )
    if sb.button("Reload runs"):
        data.scan.clear()
    entries = data.scan(root)
    ok = [e for e in entries if e.ok]
    paths = [str(e.path) for e in ok]
    names = {str(e.path): e.name for e in ok}
    wanted = st.session_state.pop("_url_run", None)
    if wanted is not None:
        found, problem = hi.find_entry(entries, wanted)
        st.session_state["run"] = str(found.path) if found is not None else None
        if problem is not None:
            fallback = paths[0] if paths else None
            st.session_state["_link_problem"] = (problem, fallback)
    if not paths:
        st.session_state["run"] = None
    path = sb.selectbox(
        "run",
        paths,
        index=kept_index("run", paths) if paths else None,  # else the first run
        format_func=lambda p: f"{names[p]} ({next(e.method for e in ok if str(e.path) == p)})",
        key="run",
    )
    problem = hi.runs_root_problem(root)
    if problem is not None:
        sb.error(problem)
    bad = len(entries) - len(ok)
    if bad:
        sb.caption(f"{bad} run folder(s) cannot be shown: see the Runs page.")
    page = sb.radio("page", PAGES, kept_index("page", PAGES), key="page")
    entry = next((e for e in ok if str(e.path) == path), None)
    layer = head = 0
    if entry is not None:
        model = entry.run.manifest.get("model", {})
        n_layers, n_heads = int(model.get("n_layers") or 1), int(model.get("n_heads") or 1)
        for key, n in (("layer", n_layers), ("head", n_heads)):
            asked = st.session_state.pop(f"_url_{key}", None)
            if asked is not None and not 0 <= asked < n:
                st.session_state.setdefault("_link_notes", []).append(
                    f"{key} {asked} is outside run `{entry.name}`'s model ({n_layers} layers x "
                    f"{n_heads} heads)"
                )
            if not 0 <= int(st.session_state.get(key, 0)) < n:
                st.session_state[key] = 0
        c1, c2 = sb.columns(2)
        layer = c1.number_input("layer", 0, n_layers - 1, kept("layer", 0), 1, key="layer")
        head = c2.number_input("head", 0, n_heads - 1, kept("head", 0), 1, key="head")
        sb.text_input(
            "model for on-demand views",
            key="model_override",
            placeholder=str(model.get("spec", "")),
            help="leave empty to use the run's model",
        )
        st.query_params.update(page=page, run=entry.name, layer=str(layer), head=str(head))
    else:
        st.query_params.update(page=page)
    return Context(root=root, entries=entries, entry=entry, layer=int(layer), head=int(head))


def _link_warning(ctx: Context) -> None:
    """A link that named a missing or broken run, page, layer or head says so (the first
    page drawn from it, and until the user picks something else)."""
    notes = st.session_state.get("_link_notes")
    if notes:
        shown = (st.session_state.get("page"), ctx.layer, ctx.head)
        first = st.session_state.setdefault("_link_notes_state", shown)
        if first == shown:
            st.warning(
                "The link asked for what cannot be shown: " + "; ".join(notes) + ". Showing "
                f"{shown[0]}, layer {ctx.layer}, head {ctx.head} instead."
            )
        else:  # the user moved on: the link no longer matters
            del st.session_state["_link_notes"]
    got = st.session_state.get("_link_problem")
    if got is None:
        return
    problem, fallback = got
    shown = str(ctx.entry.path) if ctx.entry is not None else None
    if shown != fallback:  # the user picked a run: the link no longer matters
        del st.session_state["_link_problem"]
        return
    instead = f" Showing `{ctx.entry.name}` instead." if ctx.entry is not None else ""
    st.warning(f"The link asked for a run that cannot be opened: {problem}.{instead}")


def main() -> None:
    st.set_page_config(page_title="headhunt", page_icon=":mag:", layout="wide")
    _from_url()
    _keep_settings(st.session_state.get("page", PAGES[0]))
    ctx = _sidebar()
    page = st.session_state.get("page", PAGES[0])
    _link_warning(ctx)
    try:
        RENDER[page](ctx)
    except HeadhuntError as e:
        st.error(str(e))
    except Exception as e:  # one broken file must not take the dashboard down
        st.error(f"This view failed: {type(e).__name__}: {e}")
        with st.expander("details"):
            st.exception(e)


main()
