"""Plotly figures shared by the CLI, the app and notebooks (they only draw; nothing is scored here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


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
    return fig


def write_html(fig, path: Path) -> None:
    """Self-contained HTML (plotly.js inlined: the file opens offline)."""
    tmp = path.with_name(path.name + ".tmp")
    fig.write_html(tmp, include_plotlyjs=True, full_html=True)
    tmp.replace(path)
