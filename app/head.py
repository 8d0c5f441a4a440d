"""Pages about chosen heads: Head detail and Interventions (on-demand model computations)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from headhunt import inspect as hi
from headhunt.app import data, jobs
from headhunt.app.views import (
    Context,
    chosen_view,
    drawable_views,
    go_to,
    kept,
    kept_index,
    page_scores,
    scores_or_error,
    without_run,
)
from headhunt.errors import HeadhuntError

DEFAULT_PROMPT = (
    "The secret passkey for the blue vault is 482913. Remember it. The weather was mild and "
    "the market was busy. What is the secret passkey for the blue vault? It is"
)


def model_spec(ctx: Context) -> str:
    """The model the on-demand views load: the run's, unless the sidebar overrides it."""
    return st.session_state.get("model_override") or str(
        ctx.entry.run.manifest.get("model", {}).get("spec", "smollm2-135m")
    )


def _load_model(spec: str):
    try:
        return data.model(spec)
    except HeadhuntError as e:
        st.error(f"cannot load the model `{spec}`: {e}")
    except Exception as e:  # a model folder can fail in many ways; the page must survive it
        st.error(f"cannot load the model `{spec}`: {type(e).__name__}: {e}")
    return None


def check_shape(ctx: Context, model) -> str | None:
    """Why ``model`` cannot stand for the run's model (another layer x head shape), or None:
    a head of the run must be the same head of the model the on-demand views run."""
    shape = ctx.entry.run.manifest.get("model", {}) if ctx.entry and ctx.entry.run else {}
    want = (shape.get("n_layers"), shape.get("n_heads"))
    if None in want or (int(want[0]), int(want[1])) == (model.n_layers, model.n_heads):
        return None
    return (
        f"the model `{model.name}` has {model.n_layers} layers x {model.n_heads} heads, the run "
        f"`{ctx.entry.name}` {want[0]} x {want[1]}: its heads are not the run's heads; clear "
        "the sidebar's model override or give a model of the run's shape"
    )


def load_model_for(ctx: Context, spec: str):
    """The model of the on-demand views, refused in one line when its shape is not the run's."""
    model = _load_model(spec)
    if model is None:
        return None
    problem = check_shape(ctx, model)
    if problem is not None:
        st.error(problem)
        return None
    return model


# --------------------------------------------------------------------------- Head detail


def head_detail_page(ctx: Context) -> None:
    if without_run(ctx, "Head detail"):
        return
    layer, head = ctx.layer, ctx.head
    shape = ctx.entry.run.manifest.get("model", {}) if ctx.entry.run else {}
    group = max(1, int(shape.get("n_heads", 1)) // max(1, int(shape.get("n_kv_heads", 1) or 1)))
    st.header(f"Head {layer}-{head}")
    st.caption(
        f"layer {layer}, query head {head}, KV head {head // group} of run `{ctx.entry.name}` "
        f"({ctx.entry.method}); pick another head in the sidebar or on the Heads map."
    )
    scores = scores_or_error(ctx.entry)
    if scores is None:
        return
    note = hi.scores_note(ctx.entry.run)
    if note is not None:
        st.info(note)
    table = hi.head_table(scores, layer, head)
    if table.empty:
        st.warning(f"Run `{ctx.entry.name}` holds no scores for head {layer}-{head}.")
    else:
        st.subheader("Scores")
        st.dataframe(table, hide_index=True)
        st.caption(
            "rank: among all heads for the same metric and keys (1 = highest; tied heads share "
            "a rank, `tied` counts them); no rank where every head has the same value."
        )
        with st.expander("what these metrics mean"):
            st.markdown("\n".join(f"- {hi.describe(m)}" for m in dict.fromkeys(table["metric"])))
    _spread(ctx, layer, head)
    if hi.NEEDLE_TRIALS in ctx.entry.panels:
        _needle(ctx, layer, head)
    _attention(ctx, layer, head)


def _spread(ctx: Context, layer: int, head: int) -> None:
    import plotly.express as px

    df = data.spread(ctx.entry.path, layer, head)
    if df.empty:
        st.caption("This run keeps no per-trial or per-text records for a spread.")
        return
    st.subheader("Spread across trials / texts")
    left_out = int((~df["counted"]).sum() // max(1, df["metric"].nunique()))
    by_source = (df["source"] != "").any()
    st.caption(
        "Each point is one unit the head's score averages; the table's mean is the score. "
        + (
            f"{left_out} trial(s) the model answered wrong get a box of their own and are left "
            "out of the table, as they are left out of the score."
            if left_out
            else ""
        )
        + (" N-gram scores are computed per input kind: one box each." if by_source else "")
    )
    shown = df.assign(kind=np.where(df["counted"], "counted", "not counted (wrong answer)"))
    fig = px.box(
        shown,
        x="source" if by_source else ("kind" if left_out else None),
        y="value",
        facet_col="metric",
        points="all",
        hover_data=["unit"],
    )
    fig.update_yaxes(matches=None, showticklabels=True)
    fig.for_each_annotation(lambda a: a.update(text=a.text.removeprefix("metric=")))
    fig.update_layout(height=360)
    st.plotly_chart(fig, key="spread")
    st.dataframe(hi.spread_summary(df), hide_index=True)


def _needle(ctx: Context, layer: int, head: int) -> None:
    import plotly.express as px

    trials = data.needle_trials(ctx.entry.path, layer, head)
    if trials.empty:
        return
    st.subheader("Where its argmax landed: the needle")
    st.caption(
        "on_needle = share of the trial's decoding steps whose attention argmax key lay on "
        "the answer span; score = the retrieval score (argmax on the answer and copied)."
    )
    fig = px.bar(
        trials,
        x="trial",
        y="on_needle",
        color="counted",
        hover_data=["depth %", "length", "answer", "response", "score"],
    )
    fig.update_layout(height=320, yaxis_range=[0, 1])
    st.plotly_chart(fig, key="needle_bars")
    st.dataframe(trials, hide_index=True)
    c1, c2 = st.columns([3, 2])
    ids = list(trials["trial"])
    pick = kept_index("needle_trial_pick", ids)
    trial = c1.selectbox("trial", ids, pick, key="needle_trial_pick")
    c2.button(
        "Open this trial in the Head view",
        key="needle_to_head_view",
        on_click=go_to,
        args=("Head view",),
        kwargs={"hv_source": "trial", "hv_trial": trial},
    )


def _attention(ctx: Context, layer: int, head: int) -> None:
    st.subheader("Attention on a prompt")
    spec = model_spec(ctx)
    prompt = kept("attn_prompt", DEFAULT_PROMPT)
    text = st.text_area("prompt (short: at most 512 tokens)", prompt, key="attn_prompt")
    st.caption("A long prompt (up to the model's context): the Head view page.")
    marks = st.checkbox(
        "mark sink tokens (sinks analyzer)", kept("attn_sinks", True), key="attn_sinks"
    )
    if st.button("Compute attention", key="attn_go"):
        model = load_model_for(ctx, spec)
        if model is None:
            return
        try:
            with st.spinner("one forward pass ..."), data.model_lock(spec):
                att = hi.head_attention(model, text, layer, head)
                sinks = hi.sink_marks(model, att.ids, layer, head) if marks else None
        except HeadhuntError as e:
            st.error(str(e))
            return
        st.session_state["attention"] = ((spec, layer, head, text), att, sinks)
    got = st.session_state.get("attention")
    if got is None or got[0] != (spec, layer, head, text):
        st.caption(f"Computed on demand with `{spec}` when you press the button.")
        return
    _, att, sinks = got
    n = len(att.tokens)
    if not 0 <= st.session_state.get("attn_query", n - 1) < n:  # kept from a longer prompt
        st.session_state["attn_query"] = n - 1
    at = kept("attn_query", n - 1)
    query = st.slider("query position", 0, n - 1, at, key="attn_query") if n > 1 else 0
    row = att.row(query)
    st.markdown(
        f"Attention of query {query} (`{att.tokens[query]!r}`) over the keys; the query is "
        "outlined" + (", sink tokens underlined in red" if sinks is not None else "") + "."
    )
    sink_pos = sinks.positions if sinks is not None else []
    first = sinks is not None and sinks.first_sink_mass > sinks.tau
    st.html(hi.shade_tokens_html(att.tokens, row, query=query, sinks=sink_pos, first_sink=first))
    order = row.argsort()[::-1][:8]
    st.dataframe(
        pd.DataFrame(
            {
                "position": order,
                "token": [repr(att.tokens[i]) for i in order],
                "attention": row[order],
            }
        ),
        hide_index=True,
    )
    if sinks is not None:
        st.caption(
            f"first-token sink mass s_0 = {sinks.first_sink_mass:.3f}; hidden sinks (s_j > "
            f"{sinks.tau}, seen by >= {sinks.min_queries} queries): "
            + (", ".join(f"{p} ({att.tokens[p]!r})" for p in sinks.positions) or "none")
        )


# --------------------------------------------------------------------------- Interventions


def interventions_page(ctx: Context) -> None:
    scores = page_scores(ctx, "Interventions")
    if scores is None:
        return
    shape = ctx.entry.run.manifest.get("model", {})
    n_layers = int(shape.get("n_layers") or scores.df["layer"].max() + 1)
    n_heads = int(shape.get("n_heads") or scores.df["head"].max() + 1)
    st.caption(
        "Mask heads (zero their query: uniform attention, or zero their output) or calibrate "
        "them with ACT, and compare the model's answer to a needle-in-a-haystack prompt."
    )
    options: list[str] = []
    values: dict[str, float] = {}
    views = drawable_views(scores, hi.metric_views(scores))
    if views:
        view = chosen_view(ctx.entry, views, "rank heads by")
        top = hi.top_heads(scores, view, 20)
        options = [f"{r.layer}-{r.head}" for r in top.itertuples()]
        values = {f"{r.layer}-{r.head}": r.value for r in top.itertuples()}
    run_key = str(ctx.entry.path)
    # One picker per run and ranking: another run's heads never carry over, and a new ranking
    # starts from its own top heads (a value outside the new options would be dropped).
    pick_key = f"iv_top::{run_key}::{view.label if views else ''}"
    picked = st.multiselect(
        "heads from the run's top heads",
        options,
        default=kept(pick_key, options[: min(3, len(options))]),
        format_func=lambda h: f"{h} ({values[h]:.3g})",
        key=pick_key,
    )
    typed = st.text_input(
        "or type heads (LAYER-HEAD, comma separated)", kept("iv_typed", ""), key="iv_typed"
    )
    try:
        heads = list(dict.fromkeys(hi.parse_heads(",".join([*picked, typed]), n_layers, n_heads)))
    except HeadhuntError as e:
        st.error(str(e))
        return
    c1, c2, c3 = st.columns(3)
    hows, modes = ["mask", "act"], ["query", "output"]
    how = c1.radio(
        "intervention", hows, kept_index("iv_how", hows), format_func=_how_label, key="iv_how"
    )
    mode = c2.selectbox(
        "mask mode", modes, kept_index("iv_mode", modes), key="iv_mode", disabled=how != "mask"
    )
    beta = c3.slider(
        "ACT beta", 0.0, 1.0, kept("iv_beta", 0.4), 0.05, key="iv_beta", disabled=how != "act"
    )
    from headhunt.heads.inputs.needles import NEEDLES

    c1, c2, c3, c4 = st.columns(4)
    needles = list(NEEDLES)
    needle = c1.selectbox("needle", needles, kept_index("iv_needle", needles), key="iv_needle")
    length = c2.number_input("prompt tokens", 64, 2000, kept("iv_length", 400), 50, key="iv_length")
    depth = c3.slider("needle depth %", 0, 100, kept("iv_depth", 50), 5, key="iv_depth")
    seed = c4.number_input("seed", 0, 10_000, kept("iv_seed", 0), key="iv_seed")
    control = st.checkbox(
        "also intervene on as many random heads (a control: does any set of heads do this?)",
        kept("iv_control", False),
        key="iv_control",
    )
    spec = model_spec(ctx)
    label = ", ".join(f"{a}-{b}" for a, b in heads) or "no heads"
    request = Request(
        run=run_key,
        spec=spec,
        heads=tuple(heads),
        how=how,
        mode=mode if how == "mask" else None,  # a setting the intervention ignores is no key
        beta=float(beta) if how == "act" else None,
        needle=needle,
        length=int(length),
        depth=float(depth),
        seed=int(seed),
        control=bool(control),
    )
    if st.button(f"Answer before and after ({label})", key="iv_go", disabled=not heads):
        model = load_model_for(ctx, spec)
        if model is None:
            return
        jobs.start(
            "intervention", request, request.steps(), lambda job: _answer(model, request, job)
        )
    _show_intervention(request)


@dataclass(frozen=True)
class Request:
    """Everything an intervention's result depends on: its key in the session's jobs."""

    run: str
    spec: str
    heads: tuple[tuple[int, int], ...]
    how: str
    mode: str | None
    beta: float | None
    needle: str
    length: int
    depth: float
    seed: int
    control: bool

    def steps(self) -> list[str]:
        names = ["waiting for the model", "answer before", f"answer after ({self.how})"]
        return names + (["answer with random heads (control)"] if self.control else [])


def _answer(model, r: Request, job: jobs.Job) -> tuple:
    """The job's work (in a background thread): build the trial, decode before, after and
    the control, marking each step."""
    kw = {"mask_mode": r.mode or "query", "act_beta": r.beta if r.beta is not None else 0.4}
    with data.model_lock(r.spec):
        job.step()
        trial = hi.needle_trial(model, length=r.length, depth=r.depth, needle=r.needle, seed=r.seed)
        answers = [hi.answer_needle(model, trial, **kw)]
        job.step()
        answers.append(hi.answer_needle(model, trial, heads=r.heads, how=r.how, **kw))
        job.step()
        if r.control:
            rand = hi.random_heads_like(model, r.heads, seed=r.seed)
            answers.append(hi.answer_needle(model, trial, heads=rand, how=r.how, **kw))
            job.step()
    tail = model.tokenizer.decode(trial.input_ids[-40:])
    return trial.id, trial.answer, tail, answers


def _show_intervention(request: Request) -> None:
    job = jobs.find("intervention", request)
    if job is None:
        other = jobs.running_elsewhere("intervention", request)
        if other is not None:
            _running_elsewhere(other)
        st.caption(
            f"Runs `{request.spec}` on demand (greedy decoding) when you press the button; a "
            "result is shown only for the settings that produced it."
        )
        return
    if job.running:
        _wait(job)
        return
    if job.error is not None:
        st.error(job.error)
        return
    tid, answer, tail, answers = job.result
    st.markdown(
        f"**Trial** `{tid}` on `{request.spec}`; the needle's answer: `{answer}` ({job.status})"
    )
    titles = ["Before", "After", "Control: random heads"]
    for col, a, title in zip(st.columns(len(answers)), answers, titles, strict=False):
        col.markdown(f"#### {title}: {a.condition}")
        col.caption("heads " + (", ".join(f"{x}-{y}" for x, y in a.heads) or "none"))
        col.code(a.text or "(empty answer)", language=None, wrap_lines=True)
        verdict = ":green[correct]" if a.correct else ":red[wrong]"
        col.markdown(f"answer recall (ROUGE-1) **{a.recall:.2f}**: {verdict}")
    with st.expander("end of the prompt"):
        st.code(tail, language=None, wrap_lines=True)


@st.fragment(run_every=1.0)
def _running_elsewhere(other: jobs.Job) -> None:
    """The notice of an intervention running for other settings, redrawn every second (its
    step and seconds move; it says when it is done)."""
    if other.running:
        st.info(
            "An intervention for other settings (run, heads or prompt) is still running "
            f"({other.status}); its result is kept for those settings."
        )
    else:
        st.info(
            f"The intervention for other settings is done ({other.status}); its result is "
            "kept for those settings: go back to them to see it."
        )


@st.fragment(run_every=1.0)
def _wait(job: jobs.Job) -> None:
    """Progress of a running job, redrawn every second; the whole page reruns when it ends."""
    if not job.running:
        st.rerun()
    st.progress(job.done / len(job.steps), text=job.status)
    st.caption("You can leave this page: the computation goes on and its result waits here.")


def _how_label(how: str) -> str:
    return {"mask": "mask heads", "act": "ACT calibration"}[how]
