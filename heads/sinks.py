"""Attention sinks: first-token sinks, hidden sinks, Sink_eps and massive activations.

Every number comes from :func:`headhunt.probes.capture.capture_attention_stats` (the
``headhunt.kernels`` column statistics, computed inside the forward, layer by layer), never
from an N x N attention matrix, so a text can be as long as the model's context.

Definitions (per text, per layer and query head):

- ``s_j`` (importance of key j): the mean attention key j receives from the queries that can
  see it, ``sum_i A[i, j] / (N - j)`` (ACT / Gu et al.; the kernels' ``col_mean``).
- sink: a key with ``s_j > tau`` (default 0.1) **and** seen by at least
  ``max(min_queries, min_query_share * N)`` queries (defaults 32 and 0.1). The second
  condition is ours: with the ``N - j`` normalisation the last keys, seen by a handful of
  queries, pass ``tau`` in most heads just because a row's recent tokens take a share of its
  attention; on the embedded model that made every text's last words look like sinks. With 32 queries alone, content words in the last ~50 positions of a
  1k-token text (the current topic, e.g. " ovens") still passed in a few heads; the 10%
  share removes them. The price: keys in the last 10% of a text (at least 31 positions)
  are never judged.
- first-token sink mass: ``s_0``, the mean attention the first token (BOS) receives.
- hidden sinks: sinks at positions >= 1. Hidden-sink mass: the attention on a head's hidden
  sinks, averaged over all of the text's queries (``sum_{j in hidden} col_sum_j / N``).
- Sink_eps (Gu et al.): the share of (text, head) pairs of a layer whose ``s_0`` exceeds eps
  (0.3), measured on the text's first T = 64 tokens as in their setup.
- massive activations (Sun et al.): per layer, the largest |hidden state value| of the
  layer's output over the text, divided by the median |value|.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.heads.configs import SinksConfig
from headhunt.probes.capture import capture_attention_stats, capture_stats_and_counts
from headhunt.probes.hooked import HookedModel
from headhunt.scores import HeadScores


@dataclass
class TextSinks:
    """What one text shows; also the resumable record of a run (``to_dict``/``from_dict``).

    Attributes:
        text: index of the text.
        token_ids: the text's tokens.
        s0: [layers][heads] first-token sink mass ``s_0`` over the whole text.
        s0_prefix: [layers][heads] ``s_0`` on the first ``eps_tokens`` tokens.
        hidden_count: [layers][heads] number of hidden sinks.
        hidden_mass: [layers][heads] attention on hidden sinks, averaged over all queries.
        sinks: hidden sinks as ``[layer, head, position, s_j, queries]`` rows (``queries``:
            how many queries see the key; rows written before it was kept have four items).
        massive: per layer ``[top |value| ..., median |value|, top position, top channel]``.
    """

    text: int
    token_ids: list[int]
    s0: list[list[float]]
    s0_prefix: list[list[float]]
    hidden_count: list[list[int]]
    hidden_mass: list[list[float]]
    sinks: list[list[float]] = field(default_factory=list)
    massive: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TextSinks:
        return cls(**{f.name: d[f.name] for f in fields(cls)})


@dataclass
class SinkResult:
    """The sink analysis of a set of texts.

    Attributes:
        scores: per-head metrics ``first_sink_mass`` (mean ``s_0``), ``first_sink_mass_T``
            (mean ``s_0`` on the T-token prefixes), ``hidden_sink_count`` (mean number of
            hidden sinks per text), ``hidden_sink_mass`` (mean attention on hidden sinks), and
            per-layer metrics (``head`` empty) ``sink_eps`` and ``massive_ratio``.
        sinks: one row per hidden sink: text, layer, head, kv_head, position, token, s,
            queries (how many queries see it).
        tokens: which tokens become hidden sinks: per token string, ``sink_calls`` (head x
            position events), ``positions`` (distinct text positions that are a sink in at
            least one head), ``occurrences`` (positions holding that token that could be
            judged), ``rate`` = positions / occurrences and ``heads`` (distinct heads).
        layers: per layer: Sink_eps, top |activation|, median, ratio, its position/channel.
        summary: headline numbers (see :func:`summarize`).
    """

    scores: HeadScores
    sinks: pd.DataFrame
    tokens: pd.DataFrame
    layers: pd.DataFrame
    summary: dict[str, Any]


class _MassiveActivations:
    """Forward hooks on the decoder layers keeping top |value| and median |value| per layer."""

    def __init__(self, model: HookedModel, top: int):
        self.layers = list(model.blocks)
        self.top = top
        self.rows: list[list[float]] = [[] for _ in self.layers]
        self.handles: list[Any] = []

    def __enter__(self) -> _MassiveActivations:
        for i, layer in enumerate(self.layers):
            self.handles.append(layer.register_forward_hook(self._hook(i)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _hook(self, i: int) -> Callable:
        def hook(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            a = h.detach()[0].abs().float()  # [n, d_model]
            vals, idx = a.flatten().topk(min(self.top, a.numel()))
            pos, chan = divmod(int(idx[0]), a.shape[1])
            self.rows[i] = [*vals.tolist(), float(a.median()), float(pos), float(chan)]

        return hook


@contextlib.contextmanager
def _last_position_logits(model: HookedModel) -> Iterator[None]:
    """Feed only the last position to the LM head: the analysis never reads logits, and at
    8k tokens the full [n, vocab] logits (1.6 GB for the embedded model) would dominate the
    memory of the pass."""
    head = model.model.get_output_embeddings()
    if head is None:
        yield
        return
    handle = head.register_forward_pre_hook(lambda mod, args: (args[0][:, -1:], *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def analyze_text(
    model: HookedModel,
    ids: Int[Tensor, " n"],
    config: SinksConfig | None = None,
    index: int = 0,
) -> TextSinks:
    """Sinks of one text: one statistics forward over the text, one over its T-prefix."""
    cfg = config or SinksConfig()
    ids = ids.reshape(-1)
    n = int(ids.numel())
    if n < 2:
        raise HeadhuntError(f"text {index} has {n} token(s); need at least 2")
    if n > model.max_context:
        raise HeadhuntError(
            f"text {index} has {n} tokens, more than the model's context ({model.max_context})"
        )
    massive = _MassiveActivations(model, cfg.massive_top)
    with massive, _last_position_logits(model):
        stats, counts = capture_stats_and_counts(model, ids[None], key_stats=True)
    s0, hidden_count, hidden_mass, sinks = [], [], [], []
    for layer in range(model.n_layers):
        st = stats[layer]
        # Queries that see key j: n - j, or fewer on a sliding-window layer.
        count = counts[layer][0].cpu()
        judged = count >= cfg.min_count(n)
        col_mean = st.col_mean[0].float().cpu()  # [heads, n]
        col_sum = st.col_sum[0].float().cpu()
        is_sink = (col_mean > cfg.tau) & judged
        is_sink[:, 0] = False  # hidden sinks only; the first token is reported as s_0
        s0.append(col_mean[:, 0].tolist())
        hidden_count.append(is_sink.sum(-1).tolist())
        hidden_mass.append((torch.where(is_sink, col_sum, 0.0).sum(-1) / n).tolist())
        for head, pos in is_sink.nonzero().tolist():
            sinks.append([layer, head, pos, float(col_mean[head, pos]), int(count[pos])])
    del stats
    t = min(cfg.eps_tokens, n)
    with _last_position_logits(model):
        prefix = capture_attention_stats(model, ids[None, :t], key_stats=True)
    s0_prefix = [prefix[layer].col_mean[0, :, 0].float().cpu().tolist() for layer in prefix]
    return TextSinks(
        text=index,
        token_ids=ids.tolist(),
        s0=s0,
        s0_prefix=s0_prefix,
        hidden_count=hidden_count,
        hidden_mass=hidden_mass,
        sinks=sinks,
        massive=massive.rows,
    )


def summarize(
    texts: Sequence[TextSinks],
    model: HookedModel,
    config: SinksConfig | None = None,
) -> SinkResult:
    """Aggregate per-text findings into the scores table, sink and token tables, summary."""
    cfg = config or SinksConfig()
    if not texts:
        raise HeadhuntError("no texts to summarise")
    n_layers, _n_heads, n_kv = model.n_layers, model.n_heads, model.n_kv_heads
    s0 = np.array([t.s0 for t in texts])  # [texts, layers, heads]
    s0p = np.array([t.s0_prefix for t in texts])
    count = np.array([t.hidden_count for t in texts], dtype=float)
    mass = np.array([t.hidden_mass for t in texts])
    massive = np.array([t.massive for t in texts])  # [texts, layers, top + 3]
    k = cfg.massive_top
    ratio = massive[:, :, 0] / np.maximum(massive[:, :, k], 1e-12)
    sink_eps = (s0p > cfg.eps).mean(axis=(0, 2))  # per layer
    per_head = [
        HeadScores.from_matrix("first_sink_mass", s0.mean(0), n_kv_heads=n_kv),
        HeadScores.from_matrix(f"first_sink_mass_T{cfg.eps_tokens}", s0p.mean(0), n_kv_heads=n_kv),
        HeadScores.from_matrix("hidden_sink_count", count.mean(0), n_kv_heads=n_kv),
        HeadScores.from_matrix("hidden_sink_mass", mass.mean(0), n_kv_heads=n_kv),
    ]
    per_layer = pd.DataFrame(
        {
            "layer": np.tile(np.arange(n_layers), 2),
            "head": pd.array([pd.NA] * 2 * n_layers, dtype="Int64"),
            "kv_head": pd.array([pd.NA] * 2 * n_layers, dtype="Int64"),
            "metric": ["sink_eps"] * n_layers + ["massive_ratio"] * n_layers,
            "value": np.concatenate([sink_eps, ratio.mean(0)]),
        }
    )
    scores = HeadScores.concat([*per_head, HeadScores(per_layer)])
    scores.df["head"] = scores.df["head"].astype("Int64")
    scores.df["kv_head"] = scores.df["kv_head"].astype("Int64")

    decode = _token_decoder(model.tokenizer)
    sink_rows = []
    for t in texts:
        n = len(t.token_ids)
        for layer, head, pos, s, *seen in t.sinks:
            layer, head, pos = int(layer), int(head), int(pos)
            sink_rows.append(
                {
                    "text": t.text,
                    "layer": layer,
                    "head": head,
                    "kv_head": head // model.group_size,
                    "position": pos,
                    "token": decode(t.token_ids[pos]),
                    "s": float(s),
                    "queries": int(seen[0]) if seen else n - pos,
                }
            )
    sinks = pd.DataFrame(
        sink_rows,
        columns=["text", "layer", "head", "kv_head", "position", "token", "s", "queries"],
    )
    tokens = _token_summary(texts, sinks, decode, cfg)
    top = massive[:, :, :k].mean(0)
    layers = pd.DataFrame(
        {
            "layer": np.arange(n_layers),
            "sink_eps": sink_eps,
            "massive_top1": top[:, 0],
            "massive_median": massive[:, :, k].mean(0),
            "massive_ratio": ratio.mean(0),
            # Where the largest value sits, in the first text (positions differ per text).
            "massive_position": massive[0, :, k + 1].astype(int),
            "massive_channel": massive[0, :, k + 2].astype(int),
        }
    )
    positions = sinks.groupby(["text", "position"]).size() if len(sinks) else pd.Series()
    summary = {
        "texts": len(texts),
        "tokens_per_text": [len(t.token_ids) for t in texts],
        "first_sink_mean_s0": float(s0.mean()),
        "first_sink_share_of_heads": float((s0 > cfg.tau).mean()),
        "sink_eps_overall": float((s0p > cfg.eps).mean()),
        "heads_with_hidden_sinks": float((count > 0).mean()),
        "hidden_sinks_per_head": float(count.mean()),
        "hidden_sink_positions": len(positions),
        "top_hidden_sink_tokens": tokens.head(10)[["token", "sink_calls", "rate"]].to_dict(
            "records"
        ),
        "massive_ratio_max": float(ratio.mean(0).max()),
        "massive_ratio_max_layer": int(ratio.mean(0).argmax()),
    }
    return SinkResult(scores=scores, sinks=sinks, tokens=tokens, layers=layers, summary=summary)


def _token_decoder(tokenizer) -> Callable[[int], str]:
    cache: dict[int, str] = {}

    def decode(i: int) -> str:
        if i not in cache:
            cache[i] = tokenizer.decode([int(i)])
        return cache[i]

    return decode


_GA: dict[str, Any] = {"include_groups": False}  # groupby.apply without the key columns


def _token_summary(
    texts: Sequence[TextSinks], sinks: pd.DataFrame, decode: Callable[[int], str], cfg: SinksConfig
) -> pd.DataFrame:
    occurrences: dict[str, int] = {}
    for t in texts:
        n = len(t.token_ids)
        for pos in range(1, max(1, n - cfg.min_count(n) + 1)):  # positions that can be judged
            tok = decode(t.token_ids[pos])
            occurrences[tok] = occurrences.get(tok, 0) + 1
    cols = ["token", "sink_calls", "positions", "occurrences", "rate", "heads"]
    if sinks.empty:
        return pd.DataFrame(columns=cols)
    g = sinks.groupby("token")
    df = pd.DataFrame(
        {
            "sink_calls": g.size(),
            "positions": g.apply(
                lambda d: len(set(zip(d["text"], d["position"], strict=False))), **_GA
            ),
            "heads": g.apply(lambda d: len(set(zip(d["layer"], d["head"], strict=False))), **_GA),
        }
    ).reset_index()
    df["occurrences"] = df["token"].map(occurrences).fillna(0).astype(int)
    df["rate"] = df["positions"] / df["occurrences"].clip(lower=1)
    return df.sort_values(["sink_calls", "token"], ascending=[False, True])[cols].reset_index(
        drop=True
    )


def plot(result: SinkResult, title: str = "Attention sinks"):
    """A plotly figure: s_0 and hidden-sink heatmaps, top sink tokens, massive ratios."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=(
            "first-token sink mass s_0 (layer x head)",
            "hidden-sink mass (layer x head)",
            "tokens that become hidden sinks (head x position events)",
            "massive activations: top |value| / median, per layer",
        ),
    )
    for col, metric in ((1, "first_sink_mass"), (2, "hidden_sink_mass")):
        fig.add_trace(
            go.Heatmap(
                z=result.scores.matrix(metric),
                colorscale="Viridis",
                showscale=col == 2,
                hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="head", row=1, col=col)
        fig.update_yaxes(title_text="layer", row=1, col=col)
    top = result.tokens.head(20)
    fig.add_trace(
        go.Bar(x=[repr(t) for t in top["token"]], y=top["sink_calls"], name="sink calls"),
        row=2,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=result.layers["layer"], y=result.layers["massive_ratio"], mode="lines+markers"
        ),
        row=2,
        col=2,
    )
    fig.update_yaxes(type="log", row=2, col=2)
    fig.update_layout(height=900, width=1200, showlegend=False, title=title)
    return fig
