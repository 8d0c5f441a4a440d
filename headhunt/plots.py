"""Plotly figures shared by the CLI, the app and notebooks (they only draw; nothing is scored here)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def head_heatmap(matrix: np.ndarray, title: str, colorbar: str = "score"):
    """A layer x head heatmap with hover values."""
    import plotly.graph_objects as go

    n_layers, n_heads = matrix.shape
    fig = go.Figure(
        go.Heatmap(
            z=matrix,
            x=[str(h) for h in range(n_heads)],
            y=[str(layer) for layer in range(n_layers)],
            colorscale="Viridis",
            colorbar={"title": colorbar},
            hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=title, xaxis_title="head", yaxis_title="layer", height=max(400, 18 * n_layers)
    )
    fig.update_xaxes(dtick=1)  # heads and layers are integers: no ticks between them
    fig.update_yaxes(dtick=1)
    return fix_head_axes(fig, n_layers, n_heads)


def fix_head_axes(fig, n_layers: int, n_heads: int):
    """Axes that span exactly the model's heads and layers: autorange pads a map drawn with
    other traces on it (the app's click markers), showing layers -2, -1, n, n + 1."""
    fig.update_xaxes(range=[-0.5, n_heads - 0.5], autorange=False)
    fig.update_yaxes(range=[-0.5, n_layers - 0.5], autorange=False)
    return fig


def layer_lines(rows: pd.DataFrame):
    """Per-layer metrics (columns ``layer``, ``metric``, ``value``), one panel per metric with
    its own y axis: metrics of different scales (a ratio in the thousands, a share in 0-1)
    never share an axis. A metric spanning more than two decades of positive values gets a
    log axis."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from headhunt.views.glossary import metric_info

    metrics = list(dict.fromkeys(rows["metric"]))
    fig = make_subplots(
        rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=metrics
    )
    for i, metric in enumerate(metrics, start=1):
        part = rows[rows["metric"] == metric].sort_values("layer")
        fig.add_trace(
            go.Scatter(
                x=part["layer"],
                y=part["value"],
                mode="lines+markers",
                name=metric,
                showlegend=False,
            ),
            row=i,
            col=1,
        )
        info = metric_info(metric)
        values = part["value"].to_numpy(float)
        positive = values[np.isfinite(values) & (values > 0)]
        log = len(positive) == len(values) and positive.max() / positive.min() > 100
        fig.update_yaxes(
            title_text=info.unit if info else "value",
            type="log" if log else "linear",
            row=i,
            col=1,
        )
    fig.update_xaxes(dtick=1)
    fig.update_xaxes(title_text="layer", row=len(metrics), col=1)
    fig.update_layout(height=260 * len(metrics), margin={"t": 40})
    return fig


def status_map(table: pd.DataFrame, n_layers: int, n_heads: int, title: str):
    """A layer x head grid coloured by a category per head (``layer``, ``head``, ``status``
    columns), e.g. ground truth vs circuit: both / truth only / circuit only / neither."""
    import plotly.graph_objects as go

    colours = {
        "both": "#2ca02c",
        "truth only": "#d62728",
        "circuit only": "#ff7f0e",
        "neither": "#e8e8e8",
    }
    fig = go.Figure()
    for status, colour in colours.items():
        part = table[table["status"] == status]
        fig.add_trace(
            go.Scatter(
                x=part["head"],
                y=part["layer"],
                mode="markers",
                marker={"symbol": "square", "size": 16, "color": colour},
                name=f"{status} ({len(part)})",
                hovertemplate="head %{y}-%{x}: " + status + "<extra></extra>",
            )
        )
    fig.update_xaxes(title_text="head", dtick=1, range=[-0.5, n_heads - 0.5])
    fig.update_yaxes(title_text="layer", dtick=1, range=[-0.5, n_layers - 0.5])
    fig.update_layout(title=title, height=max(360, 20 * n_layers))
    return fig
