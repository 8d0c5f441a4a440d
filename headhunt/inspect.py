"""Look at runs and heads: the small helpers the dashboard and the notebooks call.

Nothing here scores heads (the analyzers in ``heads/`` and ``sae/`` do). These functions read
run directories back into the tables a view needs (with a clear message for a corrupt or
unfinished run), and run short on-demand computations on one prompt: one head's attention,
its sink tokens, and a needle-in-a-haystack answer with heads masked or calibrated.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from headhunt.errors import HeadhuntError
from headhunt.heads.scores import COLUMNS, HeadScores
from headhunt.rundir import MANIFEST, SCORES, Run, find_runs, load_run

Head = tuple[int, int]

# The metric a run's heads map opens on, per method (any other metric can be picked).
DEFAULT_METRIC = {
    "retrieval": "retrieval_score",
    "ablate": "retrieval_score",
    "sinks": "hidden_sink_mass",
    "calibrate": "movable_sink_mass",
    "ngram": "induction",
    "mqar": "query_to_value",
    "circuits": "sae_node",
}

HOW_TO_MAKE_A_RUN = (
    "make run  # or: headhunt retrieval --lengths 500 --depths 50 --out runs/retrieval"
)


# --------------------------------------------------------------------------- run catalog


@dataclass
class RunEntry:
    """One folder under the runs root: a finished run, or one that cannot be shown (why)."""

    path: Path
    name: str
    run: Run | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.run is not None and self.problem is None

    @property
    def method(self) -> str:
        return self.run.method if self.run is not None else "?"


def scan_runs(root: str | Path) -> list[RunEntry]:
    """Every run directory at or below ``root``, newest first, each with a problem or None.

    Problems found without reading the scores: a corrupt or missing manifest, files the
    manifest lists that are gone, an unfinished ``.partial`` folder (resume it with
    ``--resume``). A missing root gives an empty list.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        return []
    entries: list[RunEntry] = []
    seen: set[Path] = set()
    for path in find_runs(root):
        seen.add(path)
        name = _relative(path, root)
        try:
            run = load_run(path)
        except HeadhuntError as e:
            entries.append(RunEntry(path, name, None, str(e)))
            continue
        listed = run.manifest.get("files") or [SCORES]
        missing = [f for f in listed if not (path / f).exists()]
        if SCORES not in listed and not (path / SCORES).exists():
            missing.append(SCORES)
        problem = f"files missing from this run: {', '.join(missing)}" if missing else None
        entries.append(RunEntry(path, name, run, problem or _parquet_problem(path / SCORES)))
    for scores in root.rglob(SCORES):
        path = scores.parent
        if path in seen or ".partial" in str(path.relative_to(root)):
            continue
        entries.append(
            RunEntry(
                path, _relative(path, root), None, f"{path} is not a finished run (no {MANIFEST})"
            )
        )
    for path in sorted(root.rglob("*.partial")):
        if path.is_dir():
            entries.append(
                RunEntry(
                    path,
                    _relative(path, root),
                    None,
                    "unfinished run: rerun its command with --resume to finish it",
                )
            )
    return entries


def _parquet_problem(path: Path) -> str | None:
    """Why a parquet file cannot be read, from its footer alone (cheap), or None."""
    import pyarrow.parquet as pq

    try:
        pq.read_metadata(path)
    except Exception as e:  # pyarrow raises several kinds of error for a damaged file
        return f"{path.name} is unreadable ({type(e).__name__}: {e})"
    return None


def _relative(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    return str(rel) if str(rel) != "." else path.name


def run_table(entries: Sequence[RunEntry]) -> pd.DataFrame:
    """One row per run: name, method, model, when, status and the parameters in short."""
    rows = []
    for e in entries:
        m = e.run.manifest if e.run is not None else {}
        model = m.get("model", {})
        rows.append(
            {
                "run": e.name,
                "method": m.get("method", "?"),
                "model": model.get("spec", "?") if isinstance(model, dict) else str(model),
                "created": str(m.get("created", ""))[:19].replace("T", " "),
                "status": "ok" if e.ok else e.problem,
                "parameters": _short_params(m.get("parameters") or {}),
                "path": str(e.path),
            }
        )
    return pd.DataFrame(
        rows, columns=["run", "method", "model", "created", "status", "parameters", "path"]
    )


def _short_params(params: dict[str, Any], limit: int = 160) -> str:
    text = ", ".join(f"{k}={_fmt(v)}" for k, v in params.items() if k != "model")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(v: Any) -> str:
    if isinstance(v, list):
        return ",".join(str(x) for x in v)
    return str(v)


def read_scores(run: Run) -> HeadScores:
    """The run's scores table; a corrupt or missing file raises a one-line HeadhuntError."""
    path = run.path / SCORES
    if not path.is_file():
        raise HeadhuntError(f"{run.path.name}: no {SCORES} in this run")
    try:
        return HeadScores.read_parquet(path)
    except Exception as e:  # pyarrow raises several kinds of error for a damaged file
        raise HeadhuntError(
            f"{run.path.name}: {SCORES} cannot be read ({type(e).__name__}: {e})"
        ) from None


def parameter_diff(a: Run, b: Run) -> pd.DataFrame:
    """The manifest entries (model and parameters) where two runs differ."""
    flat_a, flat_b = _flat(a.manifest), _flat(b.manifest)
    keys = [k for k in dict.fromkeys([*flat_a, *flat_b]) if k.startswith(("model.", "parameters."))]
    rows = [
        {"setting": k, a.path.name: _fmt(flat_a.get(k)), b.path.name + " ": _fmt(flat_b.get(k))}
        for k in keys
        if flat_a.get(k) != flat_b.get(k)
    ]
    return pd.DataFrame(rows, columns=["setting", a.path.name, b.path.name + " "])


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class MetricView:
    """One layer x head map of a scores table: a metric plus values of its extra key columns
    (``source="random"``, ``order=2`` for n-gram runs)."""

    metric: str
    where: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        if not self.where:
            return self.metric
        return f"{self.metric} [{', '.join(f'{k}={v}' for k, v in self.where)}]"

    @property
    def filters(self) -> dict[str, Any]:
        return dict(self.where)


def metric_views(scores: HeadScores) -> list[MetricView]:
    """Every per-head map the table holds, in the table's order (per-layer metrics, whose
    ``head`` is empty, are left to :func:`layer_metrics`)."""
    df = scores.df[scores.df["head"].notna()]
    extra = [c for c in df.columns if c not in COLUMNS]
    views = []
    for metric, rows in df.groupby("metric", sort=False):
        keys = [c for c in extra if rows[c].notna().any()]
        if not keys:
            views.append(MetricView(str(metric)))
            continue
        for combo in rows[keys].drop_duplicates().itertuples(index=False):
            where = tuple((k, _py(v)) for k, v in zip(keys, combo, strict=True) if _present(v))
            views.append(MetricView(str(metric), where))
    return views


def _present(v: Any) -> bool:
    return not (v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)))


def _py(v: Any) -> Any:
    """Plain Python values (hashable, picklable, and equal to what the parquet holds)."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def view_matrix(scores: HeadScores, view: MetricView) -> np.ndarray:
    """The [layers, heads] matrix of a view (NaN where a head has no value)."""
    df = scores.df[scores.df["head"].notna()]
    return HeadScores(df).matrix(view.metric, **view.filters)


def default_view(method: str, views: Sequence[MetricView]) -> MetricView | None:
    """The view a run opens on: its method's headline metric, else the first view."""
    want = DEFAULT_METRIC.get(method)
    for v in views:
        if v.metric == want:
            return v
    return views[0] if views else None


def layer_metrics(scores: HeadScores) -> pd.DataFrame:
    """Per-layer rows (``head`` empty), e.g. sink runs' ``sink_eps`` and ``massive_ratio``."""
    df = scores.df[scores.df["head"].isna()]
    return df[["layer", "metric", "value"]].reset_index(drop=True)


def top_heads(scores: HeadScores, view: MetricView, k: int = 10) -> pd.DataFrame:
    """The k highest-valued heads of a view: layer, head, kv_head, value."""
    df = scores.df[scores.df["head"].notna()]
    top = HeadScores(df).top(view.metric, k, **view.filters).dropna(subset=["value"])
    out = top[["layer", "head", "kv_head", "value"]].copy()
    out[["layer", "head", "kv_head"]] = out[["layer", "head", "kv_head"]].astype(int)
    return out.reset_index(drop=True)


def head_table(scores: HeadScores, layer: int, head: int) -> pd.DataFrame:
    """Every value the table holds for one head, with its rank among all heads (1 = highest)
    for the same metric and keys."""
    df = scores.df[scores.df["head"].notna()].copy()
    extra = [c for c in df.columns if c not in COLUMNS]
    group = ["metric", *extra]
    by = df.groupby(group, dropna=False)["value"]  # dropna=False: rows with empty keys group too
    df["rank"] = by.rank(ascending=False, method="min")
    df["of"] = by.transform("count")
    mine = df[(df["layer"] == layer) & (df["head"] == head)]
    cols = ["metric", *[c for c in extra if mine[c].notna().any()], "value", "rank", "of"]
    out = mine[cols].reset_index(drop=True)
    out["rank"] = out["rank"].astype("Int64")
    return out


def compare_runs(
    a: HeadScores, b: HeadScores, view: MetricView
) -> tuple[pd.DataFrame, float | None]:
    """One view in two runs of the same model shape: per head both values, and their rank
    correlation (Spearman; None when fewer than 3 heads have both values)."""
    ma, mb = view_matrix(a, view), view_matrix(b, view)
    if ma.shape != mb.shape:
        raise HeadhuntError(
            f"the runs have different shapes ({ma.shape[0]}x{ma.shape[1]} vs "
            f"{mb.shape[0]}x{mb.shape[1]} heads)"
        )
    layer, head = np.meshgrid(np.arange(ma.shape[0]), np.arange(ma.shape[1]), indexing="ij")
    df = pd.DataFrame(
        {"layer": layer.ravel(), "head": head.ravel(), "a": ma.ravel(), "b": mb.ravel()}
    )
    both = df.dropna()
    if len(both) < 3 or both["a"].nunique() < 2 or both["b"].nunique() < 2:
        return df, None
    rho = both["a"].rank().corr(both["b"].rank())
    return df, float(rho)


# --------------------------------------------------------------------------- spread of one head


def head_spread(run: Run, layer: int, head: int) -> pd.DataFrame:
    """One head's value per trial or text, from the run's per-unit records.

    Columns ``unit`` (trial id, text index, sequence), ``metric``, ``value`` and, when the
    records say, ``counted`` (retrieval trials that enter the mean). Empty when the method
    keeps no per-unit records (or the files are gone).
    """
    rows: list[dict[str, Any]] = []
    method = run.method
    if method == "retrieval":
        for r in _jsonl(run.path / "trials.jsonl"):
            for metric in ("scores", "on_needle"):
                rows.append(
                    {
                        "unit": r["id"],
                        "metric": "retrieval_score" if metric == "scores" else "needle_attention",
                        "value": float(r[metric][layer][head]),
                        "counted": bool(r.get("counted", True)),
                    }
                )
        if not rows and (run.path / "retrieval_heads.json").is_file():
            per = json.loads((run.path / "retrieval_heads.json").read_text()).get(
                f"{layer}-{head}", []
            )
            rows = [
                {"unit": f"counted trial {i}", "metric": "retrieval_score", "value": float(v)}
                for i, v in enumerate(per)
            ]
    elif method == "sinks":
        for r in _jsonl(run.path / "texts.jsonl"):
            for metric, key in (
                ("first_sink_mass", "s0"),
                ("hidden_sink_mass", "hidden_mass"),
                ("hidden_sink_count", "hidden_count"),
            ):
                rows.append(
                    {
                        "unit": f"text {r['text']}",
                        "metric": metric,
                        "value": float(r[key][layer][head]),
                    }
                )
    elif method == "ngram":
        for path in sorted(run.path.glob("records-*.jsonl")):
            source = path.stem.removeprefix("records-")
            for i, r in enumerate(_jsonl(path)):
                for metric, key in (
                    ("prev_token", "tl_prev"),
                    ("duplicate_token", "tl_dup"),
                    ("induction", "tl_ind"),
                ):
                    rows.append(
                        {
                            "unit": f"{source} {i}",
                            "metric": metric,
                            "value": float(np.asarray(r[key])[layer, head]),
                        }
                    )
    elif method == "circuits":
        n_heads = int(run.manifest.get("model", {}).get("n_heads", 0))
        for r in _jsonl(run.path / "trials.jsonl"):
            for metric, key in (
                ("sae_node", "node"),
                ("sae_node_norm", "node_norm"),
                ("sae_edge", "edge"),
            ):
                if key in r and n_heads:
                    rows.append(
                        {
                            "unit": f"trial {r['index']}",
                            "metric": metric,
                            "value": float(r[key][layer * n_heads + head]),
                        }
                    )
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["unit", "metric", "value"])


def needle_trials(run: Run, layer: int, head: int) -> pd.DataFrame:
    """A retrieval run's trials as seen by one head: where the needle was, what the model
    answered, and the head's score and share of decode steps whose argmax key lay on the
    answer span (``on_needle``)."""
    cols = [
        "trial",
        "length",
        "depth %",
        "needle",
        "answer",
        "response",
        "counted",
        "score",
        "on_needle",
    ]
    rows = [
        {
            "trial": r["id"],
            "length": r["length"],
            "depth %": round(100 * float(r["depth"]), 2),  # trials store a fraction
            "needle": r["needle"],
            "answer": r["answer"],
            "response": r["response"],
            "counted": r["counted"],
            "score": float(r["scores"][layer][head]),
            "on_needle": float(r["on_needle"][layer][head]),
        }
        for r in _jsonl(run.path / "trials.jsonl")
    ]
    return pd.DataFrame(rows, columns=cols)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file (a line cut by a crash ends the list, as in RunDir.records)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


# --------------------------------------------------------------------------- one head on a prompt


@dataclass
class HeadAttention:
    """One head's attention on a short prompt.

    Attributes:
        layer, head: the head (query head index).
        ids: the prompt's token ids; tokens: each decoded on its own.
        probs: [n, n] attention probabilities, row = query, column = key (causal: zero above
            the diagonal); every row sums to 1.
    """

    layer: int
    head: int
    ids: list[int]
    tokens: list[str]
    probs: np.ndarray

    def row(self, query: int = -1) -> np.ndarray:
        """The attention of one query (default: the last token) over the keys."""
        return self.probs[query]


def _qk_capture():
    """A hook keeping one layer's post-rotary q, k and softmax scale (torch imported lazily,
    so reading runs never pays for it)."""
    from headhunt.probes.attention import AttentionHook

    class QKScale(AttentionHook):
        q = k = None
        scaling = 1.0

        def before(self, call) -> None:
            self.q, self.k, self.scaling = call.query.detach(), call.key.detach(), call.scaling

    return QKScale()


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

    The full [n, n] map of one head is cheap for a short prompt; it is computed from the
    post-rotary q and k seen by the attention hook and the model's own softmax scale, which
    is what SDPA computes for a causal, unpadded prompt.
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
    cap = _qk_capture()
    with model.hooks(cap, layers=[layer]):
        model.forward(ids, use_cache=False, logits_to_keep=1)
    q = cap.q[0, head].float()  # [n, d]
    k = cap.k[0, model.kv_head(head)].float()
    scores = (q @ k.T) * cap.scaling
    n = scores.shape[0]
    future = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(-1).cpu().numpy()
    tokens = [model.tokenizer.decode([int(i)]) for i in ids.tolist()]
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

    from headhunt.heads.sinks import SinkConfig, analyze_text

    _check_head(model, layer, head)
    cfg = config or SinkConfig()
    n = len(ids)
    if n < 2:
        raise HeadhuntError("need at least 2 tokens to look for sinks")
    if n < 2 * cfg.min_queries:
        cfg = SinkConfig(**{**cfg.to_dict(), "min_queries": max(1, n // 2)})
    found = analyze_text(model, torch.as_tensor(list(ids)), cfg)
    mine = {int(p): float(s) for la, h, p, s in found.sinks if int(la) == layer and int(h) == head}
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
    )


# --------------------------------------------------------------------------- interventions


def needle_trial(
    model,
    *,
    length: int = 400,
    depth: float = 50.0,
    needle: str = "passkey",
    seed: int = 0,
    haystack: str | None = None,
):
    """One needle-in-a-haystack prompt of exactly ``length`` tokens, built as the retrieval
    analyzer builds its trials (a :class:`headhunt.heads.needles.Trial`)."""
    from headhunt.heads.needles import NEEDLES, TrialBuilder, read_haystack

    if needle not in NEEDLES:
        raise HeadhuntError(f"unknown needle {needle!r} (choose from {', '.join(NEEDLES)})")
    if not 0 <= depth <= 100:
        raise HeadhuntError(f"depth {depth} is outside 0..100 (percent)")
    if not 64 <= length <= model.max_context - 32:  # room for the answer's tokens
        raise HeadhuntError(
            f"a needle prompt needs 64 to {model.max_context - 32} tokens on this model, "
            f"not {length}"
        )
    builder = TrialBuilder(model.tokenizer, read_haystack(haystack))
    tid = f"L{length}-D{depth:g}-{needle}-s{seed}"
    return builder.build(length, depth / 100, NEEDLES[needle], random.Random(f"{seed}/{tid}"), tid)


@dataclass
class Answer:
    """The model's greedy answer to a needle prompt under one condition."""

    condition: str
    text: str
    recall: float  # ROUGE-1 recall of the needle's answer in the response
    heads: list[Head]

    @property
    def correct(self) -> bool:
        return self.recall > 0.5  # the retrieval analyzer's rule for a counted trial


Intervention = Literal["none", "mask", "act"]


def answer_needle(
    model,
    trial,
    *,
    heads: Sequence[Head] = (),
    how: Intervention = "none",
    mask_mode: str = "query",
    act_beta: float = 0.4,
    max_new_tokens: int = 24,
) -> Answer:
    """Greedy answer to ``trial`` with ``heads`` masked (:func:`headhunt.heads.masking.mask_heads`)
    or calibrated (:func:`headhunt.heads.act.act_calibration`), or untouched (``how="none"``)."""
    import torch

    from headhunt.heads.needles import rouge1_recall
    from headhunt.heads.retrieval import stop_token_ids
    from headhunt.probes.capture import greedy_decode

    heads = [(int(la), int(h)) for la, h in heads]
    if how not in ("none", "mask", "act"):
        raise HeadhuntError(f"unknown intervention {how!r} (use none, mask or act)")
    if how != "none" and not heads:
        raise HeadhuntError("choose at least one head to intervene on")
    stop = stop_token_ids(model.tokenizer)
    with _intervention(model, heads, how, mask_mode, act_beta):
        dec = greedy_decode(
            model, torch.tensor([trial.input_ids]), max_new_tokens=max_new_tokens, stop_ids=stop
        )
    ids = [x for x in dec.tokens[0, : int(dec.lengths[0])].tolist() if x not in stop]
    text = model.tokenizer.decode(ids, skip_special_tokens=True)
    label = {"none": "unchanged", "mask": f"{mask_mode} mask", "act": f"ACT beta={act_beta:g}"}
    return Answer(
        label[how], text, rouge1_recall(trial.answer, text), heads if how != "none" else []
    )


@contextlib.contextmanager
def _intervention(model, heads: list[Head], how: str, mask_mode: str, act_beta: float):
    if how == "mask":
        from headhunt.heads.masking import mask_heads

        with mask_heads(model, heads, mode=mask_mode):  # type: ignore[arg-type]
            yield
    elif how == "act":
        from headhunt.heads.act import ActConfig, act_calibration

        with act_calibration(model, heads, ActConfig(beta=act_beta)):
            yield
    else:
        yield


def compare_answers(
    model, trial, heads: Sequence[Head], how: Intervention, **kw
) -> tuple[Answer, Answer]:
    """The answer before (no intervention) and after masking or calibrating ``heads``."""
    return answer_needle(model, trial, **kw), answer_needle(
        model, trial, heads=heads, how=how, **kw
    )


def random_heads_like(model, heads: Sequence[Head], seed: int = 0) -> list[Head]:
    """As many random heads as ``heads``, none of them (the control of a masking check)."""
    from headhunt.heads.causal import random_heads

    return random_heads(model.n_layers, model.n_heads, len(heads), list(heads), random.Random(seed))


def parse_heads(text: str, n_layers: int | None = None, n_heads: int | None = None) -> list[Head]:
    """``"14-3, 20-1"`` -> [(14, 3), (20, 1)], checked against the model's shape when given."""
    from headhunt.heads.act import parse_heads as _parse

    heads = _parse(text)
    if n_layers is not None and n_heads is not None:
        for layer, head in heads:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise HeadhuntError(
                    f"head {layer}-{head} is outside the model ({n_layers} layers x {n_heads} heads)"
                )
    return heads


# --------------------------------------------------------------------------- circuits


@dataclass
class CircuitView:
    """What a circuits run holds, ready to draw.

    Attributes:
        auc: ``auc.json`` (per method ROC AUC mean/std/per trial, the ground-truth rule), or None.
        curves: method -> ROC curve of its trial-mean score against the ``truth`` heads
            (empty without a ground truth, or when ``headhunt.sae`` is not installed).
        table: one row per head, one column per metric of ``scores.parquet``.
        edges: ``edges.parquet`` (each trial's best head pairs), or None.
        circuit: ``circuit.json`` (the chosen heads and the rule), or None.
        notes: what could not be shown and why.
    """

    auc: dict[str, Any] | None
    curves: dict[str, Any]
    table: pd.DataFrame
    edges: pd.DataFrame | None
    circuit: dict[str, Any] | None
    notes: list[str]


# Curves drawn from a circuits run's scores: label -> (metric, take |value|).
ROC_METHODS = {
    "SAE node |P\\N|": ("sae_node", False),
    "SAE node, normalised": ("sae_node_norm", False),
    "SAE edge": ("sae_edge", False),
    "EAP |score|": ("eap", True),
}


def circuit_view(run: Run, scores: HeadScores | None = None) -> CircuitView:
    """Read a circuits run (whatever of it exists) for the circuits page."""
    notes: list[str] = []
    scores = scores if scores is not None else read_scores(run)
    wide = scores.df[scores.df["head"].notna()].pivot_table(
        index=["layer", "head"], columns="metric", values="value"
    )
    wide = wide.reset_index()
    auc = _json_or_none(run, "auc.json", notes)
    circuit = _json_or_none(run, "circuit.json", notes)
    edges = None
    if (run.path / "edges.parquet").is_file():
        try:
            edges = pd.read_parquet(run.path / "edges.parquet")
        except Exception as e:
            notes.append(f"edges.parquet cannot be read ({type(e).__name__})")
    curves: dict[str, Any] = {}
    if "truth" not in scores.metrics:
        notes.append("no ground truth in this run (made with --no-truth): no ROC curves")
    else:
        try:
            from headhunt.sae.roc import roc_curve
        except ImportError:
            notes.append("headhunt.sae is not installed here: ROC curves cannot be drawn")
        else:
            truth = scores.matrix("truth") > 0.5
            for label, (metric, absolute) in ROC_METHODS.items():
                if metric not in scores.metrics:
                    continue
                s = scores.matrix(metric)
                try:
                    curves[label] = roc_curve(np.abs(s) if absolute else s, truth)
                except HeadhuntError as e:
                    notes.append(f"{label}: {e}")
    return CircuitView(auc, curves, wide, edges, circuit, notes)


def _json_or_none(run: Run, name: str, notes: list[str]) -> dict[str, Any] | None:
    path = run.path / name
    if not path.is_file():
        notes.append(f"{name} is not in this run")
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        notes.append(f"{name} is corrupt ({e})")
        return None
