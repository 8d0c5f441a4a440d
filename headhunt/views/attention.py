"""One head on one short prompt: its attention rows, its sink tokens, and the tokens shaded
by a row of weights (short on-demand computations for the dashboard and notebooks)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from headhunt.errors import HeadhuntError


@dataclass
class HeadAttention:
    """One head's attention on a short prompt.

    Attributes:
        layer, head: the head (query head index).
        ids: the prompt's token ids; tokens: each decoded on its own.
        probs: [n, n] the model's attention probabilities, row = query, column = key, zero
            where the model's mask hides a key (the future; outside a sliding window or a
            chunk). A row sums to 1, or to less with learned attention sinks (gpt-oss), whose
            slot takes the rest.
    """

    layer: int
    head: int
    ids: list[int]
    tokens: list[str]
    probs: np.ndarray

    def row(self, query: int = -1) -> np.ndarray:
        """The attention of one query (default: the last token) over the keys."""
        return self.probs[query]


def _head_probs_capture(head: int):
    """A hook keeping one query head's attention rows, as the layer's kernel computes them
    (torch imported lazily, so reading runs never pays for it)."""
    from headhunt.probes.attention import AttentionHook

    class HeadProbs(AttentionHook):
        probs = None

        def before(self, call) -> None:
            # The call knows the model's scale, softcap, window, chunk, learned sinks and
            # mask: its probabilities are the kernel's, on every attention variant.
            self.probs = call.probs(heads=[head])[0, 0].detach()

    return HeadProbs()


def head_attention(
    model,
    prompt: str | Sequence[int],
    layer: int,
    head: int,
    *,
    max_tokens: int = 512,
    bos: bool = True,
) -> HeadAttention:
    """Attention probabilities of one head on ``prompt`` (a text, encoded with BOS unless
    ``bos=False``, or token ids taken as they are), at most ``max_tokens`` tokens.

    The full [n, n] map of one head is cheap for a short prompt; it comes from the attention
    call itself (:meth:`headhunt.probes.attention.AttentionCall.probs`), so sliding windows,
    chunks, logit softcapping and learned sinks are applied as the model applies them.
    """
    import torch

    _check_head(model, layer, head)
    if isinstance(prompt, str):
        ids = model.encode(prompt, bos=bos)
    else:
        ids = torch.as_tensor(list(prompt), dtype=torch.long)
    if len(ids) < 1:
        raise HeadhuntError("the prompt is empty")
    if len(ids) > max_tokens:
        raise HeadhuntError(
            f"the prompt has {len(ids)} tokens; keep it under {max_tokens} for this view"
        )
    cap = _head_probs_capture(head)
    with model.hooks(cap, layers=[layer]):
        model.forward(ids, use_cache=False, logits_to_keep=1)
    probs = cap.probs.float().cpu().numpy()
    tok = model.tokenizer
    tokens = [tok.decode([int(i)]) if tok is not None else f"<{int(i)}>" for i in ids.tolist()]
    return HeadAttention(layer, head, ids.tolist(), tokens, probs)


def _check_head(model, layer: int, head: int) -> None:
    if not (0 <= layer < model.n_layers and 0 <= head < model.n_heads):
        raise HeadhuntError(
            f"head {layer}-{head} is outside the model ({model.n_layers} layers x "
            f"{model.n_heads} heads)"
        )


@dataclass
class SinkMarks:
    """Sink tokens of one head on one prompt (see :mod:`headhunt.heads.sinks`).

    Attributes:
        first_sink_mass: ``s_0``, the mean attention the first token receives.
        positions: hidden sinks (positions >= 1 whose ``s_j`` exceeds ``tau``).
        s: ``s_j`` of each hidden sink.
        min_queries: the number of queries a key needed behind it to be judged here.
        tau: the sink threshold.
    """

    first_sink_mass: float
    positions: list[int]
    s: dict[int, float] = field(default_factory=dict)
    min_queries: int = 32
    tau: float = 0.1


def sink_marks(model, ids: Sequence[int], layer: int, head: int, config=None) -> SinkMarks:
    """Which tokens of a prompt are sinks of one head, by the sinks analyzer's rule.

    The analyzer judges a key only when ``min_queries`` (32) queries see it; on a prompt
    shorter than 64 tokens that is lowered to half the prompt, so its first half can still
    be judged (the last keys of any prompt stay unjudged: seen by few queries, they pass the
    threshold trivially).
    """
    import torch

    from headhunt.heads.sinks import SinksConfig, analyze_text

    _check_head(model, layer, head)
    cfg = config or SinksConfig()
    n = len(ids)
    if n < 2:
        raise HeadhuntError("need at least 2 tokens to look for sinks")
    if n < 2 * cfg.min_queries:
        cfg = SinksConfig(**{**cfg.to_dict(), "min_queries": max(1, n // 2)})
    found = analyze_text(model, torch.as_tensor(list(ids)), cfg)
    mine = {
        int(p): float(s) for la, h, p, s, *_ in found.sinks if int(la) == layer and int(h) == head
    }
    return SinkMarks(
        first_sink_mass=float(found.s0[layer][head]),
        positions=sorted(mine),
        s=mine,
        min_queries=cfg.min_queries,
        tau=cfg.tau,
    )


def shade_tokens_html(
    tokens: Sequence[str],
    weights: Sequence[float],
    *,
    query: int | None = None,
    sinks: Iterable[int] = (),
    first_sink: bool = False,
) -> str:
    """Tokens as HTML spans shaded by weight (scaled to the largest), the query outlined,
    sink tokens underlined in red (the first token too when ``first_sink``). Hover shows the
    position and the weight."""
    w = np.asarray(weights, float)
    top = float(np.nanmax(w)) if len(w) and np.nanmax(w) > 0 else 1.0
    sinks = set(sinks) | ({0} if first_sink else set())
    spans = []
    for i, tok in enumerate(tokens):
        a = 0.0 if i >= len(w) or not np.isfinite(w[i]) else float(w[i]) / top
        # A faint outline per token keeps word-level tokens (no leading spaces) apart.
        style = (
            f"background: rgba(255, 120, 0, {a:.3f}); padding: 1px 1px; margin-right: 1px;"
            " border-radius: 3px; box-shadow: inset 0 0 0 1px rgba(0, 0, 0, 0.08);"
        )
        if i == query:
            style += " outline: 2px solid #1f77b4;"
        if i in sinks:
            style += " border-bottom: 3px solid #d62728;"
        weight = float(w[i]) if i < len(w) else float("nan")
        text = html.escape(tok).replace("\n", "\u21b5<br>") or "&nbsp;"
        title = f"position {i}: {weight:.4f}" + (" (sink)" if i in sinks else "")
        spans.append(f'<span title="{title}" style="{style}">{text}</span>')
    return (
        '<div style="font-family: monospace; line-height: 1.9; white-space: pre-wrap;">'
        + "".join(spans)
        + "</div>"
        + _shading_legend(top, query is not None, bool(sinks))
    )


def _shading_legend(top: float, has_query: bool, has_sinks: bool) -> str:
    """What the shading means: a white-to-orange bar from 0 to the row's largest weight."""
    bar = (
        '<span style="display: inline-block; width: 160px; height: 12px; vertical-align: middle;'
        " border: 1px solid rgba(0, 0, 0, 0.2); background: linear-gradient(to right,"
        ' rgba(255, 120, 0, 0), rgba(255, 120, 0, 1));"></span>'
    )
    parts = [
        f"attention weight: 0 {bar} {top:.3g} (the row's largest; shading is linear, "
        "scaled to it; hover a token for its weight)"
    ]
    if has_query:
        parts.append('<span style="outline: 2px solid #1f77b4;">query</span>')
    if has_sinks:
        parts.append('<span style="border-bottom: 3px solid #d62728;">sink token</span>')
    return (
        '<div class="hh-legend" style="font-size: 0.85em; color: #555; margin-top: 6px;">'
        + " &nbsp;·&nbsp; ".join(parts)
        + "</div>"
    )
