"""One head over a long prompt, with no ``N x N`` attention matrix anywhere.

:func:`head_view` runs the model up to one layer and hands that head's post-rotary queries and
keys to :func:`headhunt.kernels.attention_stats`, which gives every query's log-sum-exp, argmax
key and entropy and every key's received attention (column sums) in memory linear in the
length. Exact attention rows of chosen queries then come from the log-sum-exp through
:func:`headhunt.kernels.attention_probs_at` (``p_ij = exp(s_ij - lse_i)``), one row at a time.
At 128k tokens a view is a handful of 128k-long arrays (a few MB), which is what a dashboard or
a notebook can lay out; :meth:`HeadView.track` downsamples a track for plotting (min and max
per bin, each with the position it came from, so a plotted point is a real value).

The forward pass stops after the chosen layer: later layers cannot change its attention.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from headhunt.errors import HeadhuntError

if TYPE_CHECKING:  # torch is imported where a view is computed: reading one never pays for it
    from jaxtyping import Float, Int
    from torch import Tensor

    from headhunt.probes.attention import AttentionCall

# Per-query and per-key arrays a view holds (all of length n), in the order they are saved.
TRACKS = ("argmax", "top_prob", "entropy", "col_sum", "col_mean", "lse")
_ROW_CHUNK = 32_768  # keys per attention_probs_at call: O(chunk * head_dim) memory
# (query, key) pairs one attention_stats call may score: its largest temporary is about this
# many floats (4 MiB on a CPU, 1 GiB on a GPU).
_BLOCK_SCORES_CPU = 1 << 20
_BLOCK_SCORES = 1 << 28


@dataclass
class Track:
    """A track downsampled to bins: each bin's first and last position, its smallest and
    largest value and where each sits (a bin of one position is that position's exact value).

    Attributes:
        name: the track's name (one of :data:`TRACKS`).
        start, stop: the positions covered, ``[start, stop)``.
        first, last: [bins] first and last position of each bin.
        low, high: [bins] the smallest and largest value in the bin.
        at_low, at_high: [bins] the position holding ``low`` / ``high``.
        exact: whether every bin holds one position (no downsampling).
    """

    name: str
    start: int
    stop: int
    first: np.ndarray
    last: np.ndarray
    low: np.ndarray
    high: np.ndarray
    at_low: np.ndarray
    at_high: np.ndarray

    @property
    def exact(self) -> bool:
        return bool(len(self.first) == 0 or (self.first == self.last).all())


@dataclass
class _Source:
    """What more exact rows need: the head's queries and keys and the layer's mask options
    (kept in the process that computed the view; a saved view keeps only its rows)."""

    q: Float[Tensor, "1 1 n d"]
    k: Float[Tensor, "1 1 n d"]
    lse: Float[Tensor, "1 1 n"]
    kwargs: dict[str, Any]


@dataclass
class HeadView:
    """One head's attention over one prompt, as arrays of length ``n`` (no ``n x n``).

    Attributes:
        layer, head: the head (query head index).
        model: the model's name.
        ids: [n] the prompt's token ids.
        argmax: [n] for each query, the key it attends to most (lowest index on ties; -1 for a
            query that sees no key).
        top_prob: [n] that key's attention probability (1 = all of the row on one key).
        entropy: [n] each query's attention entropy in nats (0 = one key; ln(i + 1) = uniform
            over the i + 1 keys a causal query sees).
        col_sum: [n] the attention each key receives, summed over all queries.
        col_mean: [n] ``col_sum`` over the number of queries that see the key (the sinks
            analyzer's ``s_j``).
        lse: [n] each query's log-sum-exp, from which any exact row is recomputed.
        rows: exact attention rows of chosen queries ({query: [n] probabilities, 0 where the
            query cannot see the key}).
        tokens: each token decoded on its own (empty when the model has no tokenizer).
        notes: how it was computed (device, dtype, backend), for a reader of a saved view.
    """

    layer: int
    head: int
    model: str
    ids: np.ndarray
    argmax: np.ndarray
    top_prob: np.ndarray
    entropy: np.ndarray
    col_sum: np.ndarray
    col_mean: np.ndarray
    lse: np.ndarray
    rows: dict[int, np.ndarray] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    _source: _Source | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return len(self.ids)

    def row(self, query: int) -> np.ndarray:
        """The exact attention row of ``query`` over all ``n`` keys (float32; 0 for keys it
        cannot see), from the log-sum-exp: computed once, then kept in ``rows``."""
        query = int(query)
        if not 0 <= query < self.n:
            raise HeadhuntError(f"query {query} is outside the prompt (0..{self.n - 1})")
        if query not in self.rows:
            if self._source is None:
                kept = ", ".join(map(str, sorted(self.rows))) or "none"
                raise HeadhuntError(
                    f"this head view was loaded from a file and keeps exact rows only for "
                    f"queries {kept}; recompute it with the model for query {query}"
                )
            self.rows[query] = _exact_row(self._source, query)
        return self.rows[query]

    def track(self, name: str, start: int = 0, stop: int | None = None, bins: int = 2000) -> Track:
        """``name`` over positions ``[start, stop)`` in at most ``bins`` bins (exact values
        once the range holds no more than ``bins`` positions)."""
        if name not in TRACKS:
            raise HeadhuntError(f"unknown track {name!r} (choose from {', '.join(TRACKS)})")
        return downsample(getattr(self, name), start, stop, bins, name=name)

    def looked_at(self, k: int = 10) -> np.ndarray:
        """The ``k`` keys receiving the most attention (by ``col_sum``), highest first."""
        order = np.argsort(-self.col_sum, kind="stable")
        return order[: max(0, k)]

    def context(self, position: int, before: int = 8, after: int = 8) -> tuple[int, list[str]]:
        """The tokens around ``position``: (first position shown, its tokens)."""
        lo = max(0, int(position) - before)
        hi = min(self.n, int(position) + after + 1)
        toks = self.tokens[lo:hi] if self.tokens else [f"<{int(i)}>" for i in self.ids[lo:hi]]
        return lo, list(toks)

    # ------------------------------------------------------------------ saving

    def save(self, path: str | Path) -> Path:
        """Write the view to one ``.npz`` (its arrays, kept rows, tokens and notes): the
        arrays a GPU computed at 128k can be opened where no GPU is (the dashboard's Head
        view page reads it). Written to a temporary name, then renamed."""
        path = Path(path)
        arrays = {name: getattr(self, name) for name in TRACKS}
        arrays["argmax"] = arrays["argmax"].astype(np.int32)  # positions < 2**31: half the bytes
        queries = np.array(sorted(self.rows), dtype=np.int64)
        rows = (
            np.stack([self.rows[int(q)] for q in queries]).astype(np.float32)
            if len(queries)
            else np.zeros((0, self.n), np.float32)
        )
        meta = {
            "layer": self.layer,
            "head": self.head,
            "model": self.model,
            "notes": self.notes,
            "tokens": self.tokens,
        }
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez_compressed(
                f,
                ids=self.ids.astype(np.int64 if self.ids.max(initial=0) >= 2**31 else np.int32),
                row_queries=queries,
                rows=rows,
                meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                **arrays,
            )
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> HeadView:
        """A view written by :meth:`save` (one-line HeadhuntError for anything else)."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                arrays = {name: z[name] for name in TRACKS}
                arrays["argmax"] = arrays["argmax"].astype(np.int64)
                ids, queries, rows = z["ids"].astype(np.int64), z["row_queries"], z["rows"]
        except FileNotFoundError:
            raise HeadhuntError(f"no head view file at {path}") from None
        except Exception as e:
            raise HeadhuntError(
                f"{path} is not a head view file ({type(e).__name__}: {str(e)[:120]})"
            ) from None
        n = len(ids)
        if any(len(a) != n for a in arrays.values()) or rows.shape[1:] not in ((n,), (0,)):
            raise HeadhuntError(f"{path}: its arrays disagree on the prompt's length")
        return cls(
            layer=int(meta["layer"]),
            head=int(meta["head"]),
            model=str(meta["model"]),
            ids=ids,
            rows={int(q): r for q, r in zip(queries.tolist(), rows, strict=True)},
            tokens=list(meta.get("tokens") or []),
            notes=dict(meta.get("notes") or {}),
            **arrays,
        )


def downsample(
    values: np.ndarray, start: int = 0, stop: int | None = None, bins: int = 2000, name: str = ""
) -> Track:
    """Min and max of ``values[start:stop]`` per bin (equal bins of consecutive positions),
    with the position of each: what a plot needs to show every spike of a 128k-long track in
    a few thousand points."""
    n = len(values)
    stop = n if stop is None else min(int(stop), n)
    start = max(0, min(int(start), stop))
    bins = max(1, int(bins))
    m = stop - start
    width = max(1, -(-m // bins))  # ceil: every bin but the last holds `width` positions
    k = -(-m // width) if m else 0
    v = np.asarray(values[start:stop], dtype=np.float64)
    pad = k * width - m
    lo_v = np.concatenate([v, np.full(pad, np.inf)]).reshape(k, width)
    hi_v = np.concatenate([v, np.full(pad, -np.inf)]).reshape(k, width)
    i_lo, i_hi = lo_v.argmin(1), hi_v.argmax(1)
    base = start + np.arange(k) * width
    return Track(
        name=name,
        start=start,
        stop=stop,
        first=base,
        last=np.minimum(base + width, stop) - 1,
        low=lo_v[np.arange(k), i_lo],
        high=hi_v[np.arange(k), i_hi],
        at_low=base + i_lo,
        at_high=base + i_hi,
    )


class _Stop(Exception):
    """Raised by the capture once its layer is done: the later layers are not needed."""


def _head_capture(head: int, rows: Sequence[int], backend: str):
    """A hook keeping one head's statistics (built lazily: torch is imported here)."""
    import torch

    from headhunt.probes.attention import AttentionHook

    class HeadCapture(AttentionHook):
        """One head's statistics from the layer's post-rotary q and k (the call's own options)."""

        def __init__(self, head: int, rows: Sequence[int], backend: str):
            self.head, self.want, self.backend = head, list(rows), backend
            self.view: dict[str, Any] | None = None

        def before(self, call: AttentionCall) -> None:
            if call.query.shape[0] != 1:
                raise HeadhuntError("the head view takes one prompt at a time")
            hq, hkv = call.query.shape[1], call.key.shape[1]
            h, kv = self.head, self.head // (hq // hkv)
            # Clones of one head's slices: the layer's full q/k are not kept alive.
            q = call.query[:, h : h + 1].detach().clone()
            k = call.key[:, kv : kv + 1].detach().clone()
            kw = call.kernel_kwargs(batch=0)
            for per_head in ("sinks", "alibi_slopes"):
                if kw.get(per_head) is not None:
                    kw[per_head] = kw[per_head][h : h + 1]
            if kw.get("row_sinks") is not None:  # one per query row: this head's
                kw["row_sinks"] = kw["row_sinks"][:, h : h + 1].clone()
            if kw.get("bias") is not None:  # the model's bias: this head's [n, n] kept
                bias = kw["bias"]
                kw["bias"] = (bias[:, h : h + 1] if bias.shape[1] > 1 else bias).clone()
            stats = _stats_by_query_blocks(q, k, kw, self.backend)
            counts = call.key_counts()[0].to(stats["col_sum"].device)
            src = _Source(q, k, stats["lse"][None, None], kw)
            top = torch.exp(stats["max_score"] - stats["lse"]).nan_to_num(0.0)
            self.view = {
                "argmax": stats["argmax"],
                "top_prob": top,
                "entropy": stats["entropy"],
                "col_sum": stats["col_sum"],
                "col_mean": torch.where(counts > 0, stats["col_sum"] / counts.clamp_min(1), 0.0),
                "lse": stats["lse"],
                "source": src,
                "rows": {int(i): _exact_row(src, int(i)) for i in self.want},
                "backend": self.backend,
                "dtype": str(call.query.dtype).removeprefix("torch."),
                "device": str(call.query.device),
            }
            raise _Stop

    return HeadCapture(head, rows, backend)


def _stats_by_query_blocks(
    q: Float[Tensor, "1 1 n d"], k: Float[Tensor, "1 1 n d"], kw: dict[str, Any], backend: str
) -> dict[str, Tensor]:
    """:func:`headhunt.kernels.attention_stats` over blocks of queries, so no call scores
    more than about ``_BLOCK_SCORES`` (query, key) pairs whatever the backend does inside (the
    blocked PyTorch reference sizes its first block by the first query's few keys, which on a
    causal prompt under 16k tokens is the whole ``n x n``). Row statistics are per query and
    column sums add up over blocks of queries."""
    import torch

    from headhunt.kernels import attention_stats

    n = q.shape[2]
    budget = _BLOCK_SCORES if q.is_cuda else _BLOCK_SCORES_CPU
    rows = max(16, budget // max(1, k.shape[2]))
    offset = int(kw.get("q_offset", k.shape[2] - n))
    parts: dict[str, list[Tensor]] = {"lse": [], "max_score": [], "argmax": [], "entropy": []}
    col_sum = torch.zeros(k.shape[2], dtype=torch.float32, device=q.device)
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        part = dict(kw, q_offset=offset + i0)
        for name in ("key_lo", "key_hi"):
            if kw.get(name) is not None:
                part[name] = kw[name][:, i0:i1]
        if kw.get("bias") is not None:
            part["bias"] = kw["bias"][:, :, i0:i1]
        if kw.get("row_sinks") is not None:
            part["row_sinks"] = kw["row_sinks"][:, :, i0:i1]
        s = attention_stats(
            q[:, :, i0:i1], k, key_stats=True, entropy=True, backend=backend, **part
        )
        for name in parts:
            parts[name].append(getattr(s, name)[0, 0])
        col_sum += s.col_sum[0, 0]
    return {name: torch.cat(v) for name, v in parts.items()} | {"col_sum": col_sum}


def _exact_row(src: _Source, query: int) -> np.ndarray:
    """``p(query, j)`` for every key ``j`` from the log-sum-exp, in chunks of keys."""
    import torch

    from headhunt.kernels import attention_probs_at

    n = src.k.shape[2]
    out = np.zeros(n, dtype=np.float32)
    dev = src.q.device
    for lo in range(0, n, _ROW_CHUNK):
        keys = torch.arange(lo, min(n, lo + _ROW_CHUNK), device=dev)
        queries = torch.full_like(keys, query)
        p = attention_probs_at(src.q, src.k, src.lse, queries, keys, **src.kwargs)
        out[lo : lo + len(keys)] = p[0, 0].float().cpu().numpy()
    return out


def head_view(
    model,
    prompt: str | Sequence[int] | Int[Tensor, " n"],
    layer: int,
    head: int,
    *,
    rows: Sequence[int] = (),
    bos: bool = True,
    backend: str = "auto",
    tokens: bool = True,
) -> HeadView:
    """One head's attention over ``prompt`` (text, encoded with BOS unless ``bos=False``, or
    token ids as they are), at any length the model takes, with no ``n x n`` matrix.

    Args:
        model: a :class:`headhunt.probes.HookedModel`.
        prompt: the text or token ids.
        layer, head: the head (query head index; its KV head follows the model's grouping).
        rows: queries whose exact attention rows are computed now (more later with
            :meth:`HeadView.row`; the last query's row is always included).
        backend: :func:`headhunt.kernels.attention_stats`'s backend ("auto": Triton on CUDA).
        tokens: decode every token for the text panels (skip for a model without tokenizer).

    Returns:
        A :class:`HeadView`; its statistics are those of the layer's own attention (scale,
        mask, window, softcap, sinks, as :meth:`AttentionCall.kernel_kwargs` reads them).
    """
    import torch

    if not (0 <= layer < model.n_layers and 0 <= head < model.n_heads):
        raise HeadhuntError(
            f"head {layer}-{head} is outside the model ({model.n_layers} layers x "
            f"{model.n_heads} heads)"
        )
    if isinstance(prompt, str):
        ids = model.encode(prompt, bos=bos)
    else:
        ids = (
            prompt.detach().cpu().long().flatten()
            if isinstance(prompt, torch.Tensor)
            else torch.as_tensor(np.asarray(prompt, dtype=np.int64)).flatten()
        )
    n = len(ids)
    if n < 1:
        raise HeadhuntError("the prompt is empty")
    if n > model.max_context:
        raise HeadhuntError(
            f"the prompt has {n} tokens; {model.name} takes at most {model.max_context}"
        )
    wanted = sorted({int(r) for r in rows} | {n - 1})
    bad = [r for r in wanted if not 0 <= r < n]
    if bad:
        raise HeadhuntError(f"rows {bad} are outside the prompt (0..{n - 1})")
    cap = _head_capture(head, wanted, backend)
    # _Stop is raised once the layer is done: the later layers are not run.
    with torch.inference_mode(), model.hooks(cap, layers=[layer]), contextlib.suppress(_Stop):
        model.forward(ids, use_cache=False, logits_to_keep=1)
    if cap.view is None:
        raise HeadhuntError(f"layer {layer} of {model.name} made no attention call")
    got = cap.view
    tok = getattr(model, "tokenizer", None)
    id_list = ids.tolist()
    texts = [tok.decode([i]) for i in id_list] if (tokens and tok is not None) else []
    host = {
        name: got[name].float().cpu().numpy() if name != "argmax" else got[name].cpu().numpy()
        for name in TRACKS
    }
    return HeadView(
        layer=layer,
        head=head,
        model=model.name,
        ids=np.asarray(id_list, dtype=np.int64),
        rows=got["rows"],
        tokens=texts,
        notes={k: got[k] for k in ("backend", "dtype", "device")} | {"tokens": n},
        _source=got["source"],
        **host,
    )
