"""Laying out a head view (:mod:`headhunt.probes.headview`) at any length: downsampled tracks
as figures (each plotted point a real position and value), one exact row, and the text around
the positions a head looks at. Nothing here computes attention; a figure never holds more than
a few thousand points, whatever the prompt's length."""

from __future__ import annotations

import html
import random
from collections.abc import Sequence

import numpy as np
import pandas as pd

from headhunt.errors import HeadhuntError
from headhunt.probes.headview import HeadView, Track, downsample

BINS = 1500  # points per track in a figure: min and max of each bin, so 3000 markers at most

TRACK_LABELS = {
    "argmax": "argmax key (position)",
    "entropy": "entropy (nats)",
    "top_prob": "weight of the argmax key",
    "col_sum": "attention received (column sum)",
}


def _points(track: Track) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each bin's min and max as two real points (position, value), in position order;
    a bin of one position gives one point."""
    pos = np.concatenate([track.at_low, track.at_high])
    val = np.concatenate([track.low, track.high])
    order = np.lexsort((val, pos))
    pos, val = pos[order], val[order]
    keep = np.ones(len(pos), bool)
    keep[1:] = pos[1:] != pos[:-1]
    span = np.concatenate([track.last - track.first + 1] * 2)[order][keep]
    return pos[keep], val[keep], span


def track_figure(view: HeadView, start: int = 0, stop: int | None = None, query: int | None = None):
    """The per-query tracks over queries ``[start, stop)``: argmax key, entropy and the argmax
    key's weight, downsampled to :data:`BINS` bins (min and max of each: every spike stays;
    hover gives a point's exact position and value, zoom in below ``BINS`` positions for every
    value). The chosen query is marked; clicking a point chooses that query."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = ["argmax", "entropy", "top_prob"]
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=[TRACK_LABELS[n] for n in names],
    )
    for i, name in enumerate(names, start=1):
        track = view.track(name, start, stop, BINS)
        x, y, span = _points(track)
        fig.add_trace(
            go.Scattergl(
                x=x,
                y=y,
                mode="markers" if name == "argmax" else "lines+markers",
                marker={"size": 3},
                line={"width": 1},
                customdata=span,
                name=name,
                showlegend=False,
                hovertemplate=f"query %{{x}}: {name} %{{y:.4g}}"
                + ("" if track.exact else " (min/max of a bin of %{customdata} queries)")
                + "<extra></extra>",
            ),
            row=i,
            col=1,
        )
        if name == "argmax":
            diag = [track.start, max(track.start, track.stop - 1)]
            fig.add_trace(
                go.Scattergl(
                    x=diag,
                    y=diag,
                    mode="lines",
                    line={"width": 1, "color": "rgba(0,0,0,0.25)", "dash": "dot"},
                    hoverinfo="skip",
                    showlegend=False,
                ),
                row=1,
                col=1,
            )
    if query is not None:
        fig.add_vline(x=query, line={"color": "#d62728", "width": 1})
    fig.update_xaxes(title_text="query position", row=3, col=1)
    fig.update_layout(height=620, margin={"t": 40, "b": 40}, clickmode="event+select")
    return fig


def _key_line(track, hover: str):
    """A figure of one downsampled track over key positions (each bin's size in its hover)."""
    import plotly.graph_objects as go

    x, y, span = _points(track)
    line = go.Scattergl(
        x=x, y=y, mode="lines+markers", marker={"size": 3}, line={"width": 1},
        customdata=span, hovertemplate=hover + "<extra></extra>",
    )  # fmt: skip
    return go.Figure(line)


def received_figure(view: HeadView, start: int = 0, stop: int | None = None):
    """The attention each key receives (column sums), downsampled like the tracks."""

    track = view.track("col_sum", start, stop, BINS)
    hover = "key %{x}: received %{y:.4g}"
    hover += "" if track.exact else " (max of a bin of %{customdata} keys)"
    fig = _key_line(track, hover)
    fig.update_layout(
        height=260,
        margin={"t": 30, "b": 40},
        title=TRACK_LABELS["col_sum"],
        xaxis_title="key position",
        yaxis_type="log" if (track.high > 0).all() else "linear",
    )
    return fig


def row_figure(view: HeadView, query: int, start: int = 0, stop: int | None = None):
    """The exact attention row of ``query`` over keys ``[start, stop)`` (max per bin)."""

    row = view.row(query)
    track = downsample(row, start, min(query + 1, len(row) if stop is None else stop), BINS)
    fig = _key_line(track, "key %{x}: %{y:.4g}")
    fig.update_layout(
        height=240,
        margin={"t": 30, "b": 40},
        title=f"exact attention row of query {query} (from its log-sum-exp)",
        xaxis_title="key position",
    )
    return fig


def top_keys(view: HeadView, query: int, k: int = 8) -> pd.DataFrame:
    """The ``k`` keys ``query`` attends to most, with their tokens."""
    row = view.row(query)
    order = np.argsort(-row, kind="stable")[:k]
    return pd.DataFrame(
        {
            "key": order,
            "token": [repr(view.context(int(j), 0, 0)[1][0]) for j in order],
            "weight": row[order],
            "distance back": query - order,
        }
    )


def context_html(
    view: HeadView, positions: Sequence[int], weights: np.ndarray, *, around: int = 12
) -> str:
    """The text around each of ``positions``: tokens shaded by ``weights`` (scaled to their
    largest), the position itself outlined; one line per position."""
    top = float(np.max([weights[p] for p in positions])) if len(positions) else 1.0
    top = top if top > 0 else 1.0
    lines = []
    for p in positions:
        lo, toks = view.context(int(p), around, around)
        spans = []
        for i, tok in enumerate(toks, start=lo):
            a = min(1.0, max(0.0, float(weights[i]) / top))
            style = f"background: rgba(255, 120, 0, {a:.3f}); border-radius: 3px;"
            if i == p:
                style += " outline: 2px solid #1f77b4;"
            text = html.escape(tok).replace("\n", "\u21b5") or "&nbsp;"
            spans.append(
                f'<span title="position {i}: {weights[i]:.4g}" style="{style}">{text}</span>'
            )
        lines.append(
            f'<div style="margin: 2px 0;"><code style="color: #555;">{p:>7}</code> '
            + "".join(spans)
            + "</div>"
        )
    return (
        '<div class="hh-context" style="font-family: monospace; white-space: pre-wrap;">'
        + "".join(lines)
        + "</div>"
    )


def haystack_prompt(model, n_tokens: int) -> list[int]:
    """``n_tokens`` tokens of the bundled haystack corpus (BOS first), repeated if needed: a
    long natural prompt to look at a head with."""
    from headhunt.heads.inputs.needles import read_haystack

    if not 2 <= n_tokens <= model.max_context:
        raise HeadhuntError(f"choose 2 to {model.max_context} tokens for {model.name}")
    hay = model.encode(read_haystack(None), bos=False).tolist()
    bos = model.tokenizer.bos_token_id
    body = (hay * (n_tokens // max(1, len(hay)) + 1))[: n_tokens - (bos is not None)]
    return ([bos] if bos is not None else []) + body


def retrieval_trial_prompt(run, model, trial_id: str) -> tuple[list[int], tuple[int, int]]:
    """A retrieval run's trial rebuilt from the run's settings (its haystack and seed): the
    prompt's ids and the answer's span, checked against the span the run recorded."""
    from headhunt.heads.inputs.needles import NEEDLES, TrialBuilder, read_haystack
    from headhunt.methods.base import read_jsonl

    record = next((r for r in read_jsonl(run.path / "trials.jsonl") if r["id"] == trial_id), None)
    if record is None:
        raise HeadhuntError(f"run {run.path.name} has no trial {trial_id!r}")
    params = run.manifest.get("parameters", {})
    builder = TrialBuilder(model.tokenizer, read_haystack(params.get("haystack")))
    rng = random.Random(f"{params.get('seed', 0)}/{trial_id}")
    trial = builder.build(
        int(record["length"]), float(record["depth"]), NEEDLES[record["needle"]], rng, trial_id
    )
    if list(trial.span) != list(record["span"]):
        raise HeadhuntError(
            f"trial {trial_id} rebuilt with {model.name} puts the answer at {list(trial.span)}, "
            f"not at {record['span']} as the run recorded: not the run's model or haystack"
        )
    return list(trial.input_ids), tuple(trial.span)
