"""Head scores as the files KV-cache tools read.

- ``duo``: DuoAttention's attention pattern folder (mit-han-lab/duo-attention,
  ``duo_attn/utils.py: load_attn_pattern``): ``full_attention_heads.tsv``, one row per layer and
  one tab-separated column per KV head, values read as floats and clipped to [0, 1], and
  ``config.json`` whose ``sink_size`` and ``recent_size`` are the streaming heads' sink and
  recent window. DuoAttention deploys it with ``sparsify_attention_heads(heads, sparsity=s)``:
  the KV heads below the s-quantile become streaming heads (sink + recent cache), the others keep
  the full cache.
- ``kvpress``: NVIDIA kvpress's ``DuoAttentionPress`` reads the same two files (it fetches them
  from the DuoAttention repository by model name; the folder's README says how to hand it a local
  one); its ``head_compression_ratio`` r turns the ``round(r * layers * kv_heads)`` lowest
  entries into streaming heads.
- ``lukv``: LU-KV's budget curve for kvpress's ``LUKVPress``: ``budget_curve.npy``, shape
  ``[99, layers, kv_heads]``, row ``t`` the per-head prune ratios for the global ratio
  ``(t + 1) / 100`` (:func:`headhunt.kvbudget.lukv_curve`).
- ``adakv``: per-KV-head weights (``head_weights.npy``, ``[layers, kv_heads]``, mean 1 per layer)
  that :class:`headhunt.kvpress_press.HeadWeightedPress` multiplies a token scorer's scores by
  inside kvpress's ``AdaKVPress`` (:func:`headhunt.kvbudget.head_weights`).
- ``headkv``: HeadKV (FYYFU/HeadKV, ``headkv/snapkv_utils.py``) reads a one-line JSON
  ``{"layer-head": [score, ...]}`` over every query head, layer-major, and takes each list's
  mean; a head's KV budget is ``round(share * (base // beta) * layers * heads + base - base //
  beta)`` tokens, where ``share`` is its (non-negative) score over the sum of all scores.

headhunt scores query heads; DuoAttention and kvpress decide per KV head, so a KV head gets the
max of its query heads' scores (the rule :mod:`headhunt.heads.interventions.kvcache` uses), min-max scaled to
[0, 1] (only the order matters for quantile/ratio deployment; DuoAttention's threshold 0.5 has no
meaning for these values). With ``full_fraction`` the duo file is binary instead: 1 for the
top ``full_fraction`` of KV heads, so threshold and sparsity deployments agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Float

from headhunt.atomic import write_atomic, write_file
from headhunt.errors import HeadhuntError
from headhunt.heads.interventions.kvcache import kv_scores, rank_kv_heads
from headhunt.kvbudget import (
    DEFAULT_FLOOR,
    duo_accounting,
    fold_kv,
    head_weights,
    lukv_curve,
    ranking_stability,
)

FORMATS = ("duo", "headkv", "kvpress", "lukv", "adakv")
DUO_HEADS = "full_attention_heads.tsv"
DUO_CONFIG = "config.json"
HEADKV_FILE = "retrieval_heads.json"
LUKV_FILE = "budget_curve.npy"
ADAKV_FILE = "head_weights.npy"
BUDGET_FILE = "budget.json"


@dataclass(frozen=True)
class ModelShape:
    """The counts a file must match: layers, query heads and KV heads per layer."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int | None = None  # for KV bytes; None: entries only

    @classmethod
    def of(cls, facts: dict[str, Any]) -> ModelShape:
        """From a HookedModel's ``describe()`` (or a run manifest's ``model``)."""
        d = facts.get("head_dim")
        n = (int(facts["n_layers"]), int(facts["n_heads"]), int(facts["n_kv_heads"]))
        return cls(*n, None if d is None else int(d))


def check_scores(matrix: np.ndarray, shape: ModelShape, what: str = "the scores") -> None:
    """Refuse, in one line, a score matrix whose counts differ from the model's config."""
    if matrix.shape != (shape.n_layers, shape.n_heads):
        raise HeadhuntError(
            f"{what} cover {matrix.shape[0]} layers x {matrix.shape[1]} heads; the model's config "
            f"has {shape.n_layers} x {shape.n_heads}"
        )
    if np.isnan(matrix).any():
        raise HeadhuntError(f"{what} have no value for {int(np.isnan(matrix).sum())} heads")


def duo_values(
    matrix: Float[np.ndarray, "layers heads"],
    n_kv_heads: int,
    full_fraction: float | None = None,
    seed: int = 0,
) -> Float[np.ndarray, "layers kv_heads"]:
    """Per-KV-head values in [0, 1]: min-max scaled max scores, or binary (top
    ``full_fraction`` = 1)."""
    kv = kv_scores(matrix, n_kv_heads)
    if full_fraction is not None:
        if not 0 <= full_fraction <= 1:
            raise HeadhuntError(f"--full-fraction {full_fraction} is outside 0..1")
        out = np.zeros(kv.size)
        out[rank_kv_heads(kv, seed)[: round(full_fraction * kv.size)]] = 1.0
        return out.reshape(kv.shape)
    lo, hi = float(kv.min()), float(kv.max())
    return (kv - lo) / (hi - lo) if hi > lo else np.ones_like(kv)


def write_duo(
    folder: Path,
    matrix: np.ndarray,
    shape: ModelShape,
    *,
    sink: int,
    recent: int,
    full_fraction: float | None = None,
    provenance: dict[str, Any] | None = None,
    seed: int = 0,
) -> list[Path]:
    """DuoAttention's pattern folder (``full_attention_heads.tsv`` + ``config.json``)."""
    check_scores(matrix, shape)
    if sink < 0 or recent < 1:
        raise HeadhuntError("sink must be >= 0 and recent >= 1 tokens")
    values = duo_values(matrix, shape.n_kv_heads, full_fraction, seed)
    folder.mkdir(parents=True, exist_ok=True)
    heads = folder / DUO_HEADS
    # As DuoAttention saves it.
    write_atomic(heads, lambda tmp: np.savetxt(tmp, values, fmt="%.18e", delimiter="\t"))
    config = {
        "sink_size": int(sink),
        "recent_size": int(recent),
        "num_layers": shape.n_layers,
        "num_key_value_heads": shape.n_kv_heads,
        "values": (
            f"binary: 1 = full cache for the top {full_fraction:g} of KV heads"
            if full_fraction is not None
            else "max over each KV head's query heads, min-max scaled to [0, 1]; deploy with "
            "sparsity (quantile), not a threshold"
        ),
        "budget": (
            "sparsity s: the KV heads below the s-quantile keep only sink_size + recent_size "
            "cache entries; the others keep the whole context"
        ),
        "headhunt": provenance or {},
    }
    cfg = folder / DUO_CONFIG
    write_file(cfg, json.dumps(config, indent=2) + "\n")
    return [heads, cfg]


KVPRESS_README = """# Loading this pattern into kvpress

kvpress's DuoAttentionPress reads DuoAttention's two files (config.json: sink_size, recent_size;
full_attention_heads.tsv: layers x KV heads) but downloads them by model name. Hand it this folder
by replacing its loader before the press is used:

    import numpy as np
    from kvpress import DuoAttentionPress

    def local_pattern(model, folder="{folder}"):
        import json
        cfg = json.load(open(folder + "/config.json"))
        scores = np.clip(np.loadtxt(folder + "/full_attention_heads.tsv", delimiter="\\t"), 0, 1)
        return cfg["sink_size"], cfg["recent_size"], scores

    DuoAttentionPress.load_attention_pattern = staticmethod(local_pattern)
    press = DuoAttentionPress(head_compression_ratio={ratio})

head_compression_ratio r: the round(r * {n}) lowest-scoring (layer, KV head) entries become
streaming heads (sink {sink} + recent {recent} tokens); kvpress reports its compression ratio as
r * (1 - (sink + recent) / context length).
"""


def write_kvpress(
    folder: Path,
    matrix: np.ndarray,
    shape: ModelShape,
    *,
    sink: int,
    recent: int,
    full_fraction: float | None = None,
    provenance: dict[str, Any] | None = None,
    seed: int = 0,
    context: int = 4096,
    dtype_bytes: int = 2,
) -> list[Path]:
    """The DuoAttention layout with continuous values (kvpress picks the count by its ratio),
    a README on loading it, and ``budget.json``: per target ratio, the ratio kvpress reports and
    the KV bytes kept at ``context`` tokens, both as kvpress's evaluation runs the press and with
    the head ratio that removes the target share of bytes (kvpress#228)."""
    paths = write_duo(
        folder, matrix, shape, sink=sink, recent=recent, provenance=provenance, seed=seed
    )
    ratio = 0.5 if full_fraction is None else 1 - full_fraction
    readme = folder / "README.md"
    write_file(
        readme,
        KVPRESS_README.format(
            folder=folder,
            ratio=f"{ratio:g}",
            n=shape.n_layers * shape.n_kv_heads,
            sink=sink,
            recent=recent,
        ),
    )
    if context < 1:
        raise HeadhuntError(f"--context {context} must be a positive token count")
    per_entry = None if shape.head_dim is None else 2 * shape.head_dim * dtype_bytes
    rows = duo_accounting(
        fold_kv(matrix, shape.n_kv_heads),
        sink=sink,
        recent=recent,
        context=context,
        bytes_per_entry=per_entry,
    )
    budget = folder / BUDGET_FILE
    _write_json(
        budget,
        {
            "context_tokens": context,
            "sink_size": sink,
            "recent_size": recent,
            "bytes_per_entry": per_entry,
            "note": "kvpress masks evicted keys (attention_patch) and keeps them in memory: these "
            "are the bytes a cache that drops them would hold. Layers with a sliding window "
            "hold fewer entries than the context; measure those (benchmarks/kvpress).",
            "ratios": rows,
            "headhunt": provenance or {},
        },
    )
    return [*paths, readme, budget]


LUKV_README = """# Loading this budget curve into kvpress's LUKVPress

{file}: float64 array [99, {layers} layers, {kv} KV heads]; row t holds each KV head's prune
ratio for the global compression ratio (t + 1) / 100 (LUKVPress picks row
round(100 * compression_ratio) - 1). Every row's mean is its global ratio. kvpress downloads its
curves by (model name, scorer press); hand it this one before the press is used (kvpress only
downloads when `_budget_curves` is None):

    import numpy as np
    from kvpress import ExpectedAttentionPress, LUKVPress

    press = LUKVPress(ExpectedAttentionPress(epsilon=2e-2), compression_ratio=0.5)
    press._budget_curves = np.load("{folder}/{file}")

Allocation: per head, kept share min(1, a * ({floor} + s)) with s the head's min-max scaled
score and a set so the mean kept share is 1 - ratio: the best heads keep their whole cache first.
"""

ADAKV_README = """# Head weights for kvpress's AdaKVPress

{file}: float64 array [{layers} layers, {kv} KV heads], {floor} + the min-max scaled score,
divided by its layer's mean. kvpress has no file reader for AdaKV head weights; headhunt's
HeadWeightedPress (in headhunt.kvpress_press, importable where kvpress is installed) multiplies a
token scorer's (non-negative) scores by them, and AdaKVPress then evicts the lowest products
across each layer's heads:

    import numpy as np
    from kvpress import AdaKVPress, ExpectedAttentionPress
    from headhunt.kvpress_press import HeadWeightedPress

    weights = np.load("{folder}/{file}")
    press = AdaKVPress(HeadWeightedPress(press=ExpectedAttentionPress(), weights=weights))
    press.compression_ratio = 0.5
"""


def write_curve_format(
    fmt: str,
    folder: Path,
    matrix: np.ndarray,
    shape: ModelShape,
    *,
    provenance: dict[str, Any] | None = None,
    floor: float = DEFAULT_FLOOR,
) -> list[Path]:
    """``lukv`` (LU-KV budget curve) or ``adakv`` (head weights): the array, a README on
    loading it into kvpress, and ``budget.json`` (what the values mean, provenance)."""
    check_scores(matrix, shape)
    if floor <= 0:
        raise HeadhuntError(f"--floor {floor} must be positive (a zero-score head keeps nothing)")
    kv = fold_kv(matrix, shape.n_kv_heads)
    array, name, readme = (
        (lukv_curve(kv, floor), LUKV_FILE, LUKV_README)
        if fmt == "lukv"
        else (head_weights(kv, floor), ADAKV_FILE, ADAKV_README)
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    write_atomic(path, lambda tmp: _save_npy(tmp, array))
    text = readme.format(
        file=name, folder=folder, layers=shape.n_layers, kv=shape.n_kv_heads, floor=floor
    )
    write_file(folder / "README.md", text)
    info = {"format": fmt, "shape": list(array.shape), "floor": floor, "headhunt": provenance}
    if fmt == "lukv":
        info["mean_prune_ratio_per_row"] = [round(float(r.mean()), 6) for r in array]
    _write_json(folder / BUDGET_FILE, info)
    return [path, folder / "README.md", folder / BUDGET_FILE]


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_file(path, json.dumps(data, indent=2) + "\n")


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:  # np.save would add ".npy" to a temporary's name
        np.save(f, array, allow_pickle=False)


def write_headkv(
    folder: Path,
    matrix: np.ndarray,
    shape: ModelShape,
    *,
    provenance: dict[str, Any] | None = None,
    base_capacity: int = 128,
    beta: float = 1.2,
) -> list[Path]:
    """HeadKV's one-line JSON over every query head, and ``budget.json`` with the per-head
    capacities HeadKV would give for ``base_capacity`` and ``beta`` (temperature 1)."""
    check_scores(matrix, shape)
    if (matrix < 0).any():
        raise HeadhuntError(
            f"HeadKV needs non-negative scores (the lowest is {matrix.min():.3g}); pick another metric"
        )
    if matrix.sum() <= 0:
        raise HeadhuntError("HeadKV needs at least one positive score (all are zero)")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / HEADKV_FILE
    data = {
        f"{layer}-{head}": [float(matrix[layer, head])]
        for layer in range(shape.n_layers)
        for head in range(shape.n_heads)
    }
    write_file(path, json.dumps(data) + "\n")  # HeadKV reads the first line only
    share = matrix / matrix.sum()
    pool = (base_capacity // beta) * shape.n_layers * shape.n_heads
    capacity = np.round(share * pool + base_capacity - base_capacity // beta).astype(int)
    budget = folder / "budget.json"
    write_file(
        budget,
        json.dumps(
            {
                "formula": "capacity = round(share * (base // beta) * layers * heads + base - "
                "base // beta); share = score / sum of scores",
                "base_capacity": base_capacity,
                "beta": beta,
                "capacity_min": int(capacity.min()),
                "capacity_max": int(capacity.max()),
                "capacity_total": int(capacity.sum()),
                "uniform_total": base_capacity * shape.n_layers * shape.n_heads,
                "where": "HeadKV reads Important_Head/head_score/<model>_retrieval_heads.json: "
                f"copy {HEADKV_FILE} there",
                "headhunt": provenance or {},
            },
            indent=2,
        )
        + "\n",
    )
    return [path, budget]


def export(
    fmt: str,
    folder: str | Path,
    matrix: np.ndarray,
    shape: ModelShape,
    *,
    sink: int = 4,
    recent: int = 256,
    full_fraction: float | None = None,
    provenance: dict[str, Any] | None = None,
    seed: int = 0,
    context: int = 4096,
    floor: float = DEFAULT_FLOOR,
) -> list[Path]:
    """Write ``matrix`` ([layers, query heads] scores) in ``fmt``; returns the files written."""
    folder = Path(folder)
    if full_fraction is not None and not 0 <= full_fraction <= 1:  # before any file is written
        raise HeadhuntError(f"--full-fraction {full_fraction:g} is outside 0..1")
    kw = {"sink": sink, "recent": recent, "full_fraction": full_fraction, "seed": seed}
    if fmt == "duo":
        return write_duo(folder, matrix, shape, provenance=provenance, **kw)
    if fmt == "kvpress":
        return write_kvpress(folder, matrix, shape, provenance=provenance, context=context, **kw)
    if fmt in ("lukv", "adakv"):
        return write_curve_format(fmt, folder, matrix, shape, provenance=provenance, floor=floor)
    if fmt == "headkv":
        return write_headkv(folder, matrix, shape, provenance=provenance)
    raise HeadhuntError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")


def read_duo_config(folder: str | Path) -> dict[str, Any]:
    """A DuoAttention pattern's ``config.json`` (the training arguments; DuoAttention's loader
    reads ``sink_size`` and ``recent_size`` from it), checked for those two."""
    path = Path(folder) / DUO_CONFIG
    try:
        config = json.loads(path.read_text())
        int(config["sink_size"]), int(config["recent_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HeadhuntError(f"{path}: not a DuoAttention pattern config ({e})") from None
    return config


def read_duo(folder: str | Path, shape: ModelShape) -> tuple[np.ndarray, int, int]:
    """A DuoAttention pattern folder as DuoAttention reads it: ([layers, kv_heads] values
    clipped to [0, 1], sink_size, recent_size), checked against the model's counts."""
    folder = Path(folder)
    config = read_duo_config(folder)
    try:
        values = np.loadtxt(folder / DUO_HEADS, dtype=float, delimiter="\t", ndmin=2)
    except (OSError, ValueError) as e:
        raise HeadhuntError(f"{folder} is not a DuoAttention pattern folder ({e})") from None
    sink, recent = int(config["sink_size"]), int(config["recent_size"])
    if values.shape != (shape.n_layers, shape.n_kv_heads):
        raise HeadhuntError(
            f"{folder / DUO_HEADS} has {values.shape[0]} layers x {values.shape[1]} KV heads; "
            f"the model has {shape.n_layers} x {shape.n_kv_heads}"
        )
    return np.clip(values, 0, 1), sink, recent


DEFAULT_SINK, DEFAULT_RECENT = 4, 256


def sink_size_from_run(path: str | Path) -> tuple[int, str]:
    """The sink size S of streaming heads from a ``headhunt sinks`` run, and where it came from.

    S keeps token 0 (the first-token sink) and every hidden sink the run found within its texts'
    first T tokens (T = the run's ``eps_tokens``, Gu et al.'s prefix, 64 by default): S = 1 +
    the last such position over all texts and heads. Hidden sinks further in (content words
    mid-text) move with the text, so no fixed prefix keeps them; they are not counted. A sinks
    run says nothing about recency: the recent window W stays a flag.
    """
    import pandas as pd

    from headhunt.rundir import load_run

    run = load_run(path)
    if run.method != "sinks":
        raise HeadhuntError(f"{path} is a {run.method} run, not a sinks run")
    t = int((run.manifest.get("parameters") or {}).get("eps_tokens", 64))
    try:
        sinks = pd.read_parquet(run.path / "sinks.parquet", columns=["position"])
    except Exception as e:  # missing, truncated or not the sinks table
        raise HeadhuntError(f"{run.path / 'sinks.parquet'} is unreadable ({e})") from None
    leading = sorted({int(p) for p in sinks["position"] if p < t})
    size = 1 + leading[-1] if leading else 1
    note = f"sinks run {path}: token 0" + (
        f" and hidden sinks at positions {leading} (of the first {t} tokens)" if leading else ""
    )
    return size, note


def streaming_window(
    sink: int | None,
    recent: int | None,
    sinks_run: str | None = None,
    duo_pattern: str | Path | None = None,
) -> tuple[int, int, str]:
    """(S, W, where they came from): flags first; else S from a sinks run
    (:func:`sink_size_from_run`); else both from a DuoAttention pattern's ``config.json``;
    else S = 4, W = 256 (StreamingLLM's four sink tokens)."""
    notes = []
    if sink is None and sinks_run is not None:
        sink, note = sink_size_from_run(sinks_run)
        notes.append(f"sink {sink} from the {note}")
    if duo_pattern is not None and (sink is None or recent is None):
        cfg = read_duo_config(duo_pattern)
        if sink is None:
            sink = int(cfg["sink_size"])
            notes.append(f"sink {sink} from {duo_pattern}")
        if recent is None:
            recent = int(cfg["recent_size"])
            notes.append(f"recent {recent} from {duo_pattern}")
    if sink is None:
        sink = DEFAULT_SINK
        notes.append(f"sink {sink} (default)")
    if recent is None:
        recent = DEFAULT_RECENT
        notes.append(f"recent {recent} (default)")
    return sink, recent, "; ".join(notes) or "flags"


def read_scores(path: str | Path, metric: str) -> tuple[np.ndarray, dict[str, Any] | None]:
    """The [layers, heads] matrix of ``metric`` from a run directory (or a ``scores.parquet``
    file), and the model facts of the run's manifest (None for a bare parquet file)."""
    from headhunt.rundir import load_run
    from headhunt.scores import HeadScores

    path = Path(path).expanduser()
    facts = None
    if path.is_dir():
        run = load_run(path)
        scores, facts = run.scores(), run.manifest.get("model")
    elif path.suffix == ".parquet" and path.is_file():
        scores = HeadScores.read_parquet(path)
    else:
        raise HeadhuntError(f"{path} is neither a run directory nor a scores .parquet file")
    try:
        return scores.matrix(metric), facts
    except KeyError:
        raise HeadhuntError(f"{path} has no metric {metric!r} (it has {scores.metrics})") from None
    except ValueError as e:
        raise HeadhuntError(f"{path}: {e}") from None


def per_trial_scores(path: str | Path, metric: str) -> np.ndarray | None:
    """[trials, layers, heads] per-trial values of ``metric`` where the run keeps them (a
    retrieval run's ``retrieval_heads.json``: one score per counted trial and query head), else
    None."""
    from headhunt.rundir import load_run

    path = Path(path).expanduser()
    if not path.is_dir():
        return None
    run = load_run(path)
    ref = run.path / HEADKV_FILE
    if run.method != "retrieval" or metric != "retrieval_score" or not ref.is_file():
        return None
    data = json.loads(ref.read_text())
    keys = [tuple(map(int, k.split("-"))) for k in data]
    layers, heads = max(k[0] for k in keys) + 1, max(k[1] for k in keys) + 1
    trials = len(next(iter(data.values())))
    out = np.zeros((trials, layers, heads))
    for (layer, head), values in zip(keys, data.values(), strict=True):
        out[:, layer, head] = values
    return out


def stability_report(
    path: str | Path, metric: str, n_kv_heads: int, full_fractions: list[float], seed: int = 0
) -> dict[str, Any]:
    """What the ranking of ``metric`` in run ``path`` rests on: per budget (share of full KV
    heads), the trials and the top-k overlap of two halves of them
    (:func:`headhunt.kvbudget.ranking_stability`); ``warnings`` lists the budgets too small for
    the trials. Runs without per-trial scores say so."""
    per_trial = per_trial_scores(path, metric)
    if per_trial is None:
        return {
            "trials": None,
            "note": f"no per-trial {metric} in {path} to measure the ranking's stability (a "
            "retrieval run's retrieval_score has them)",
            "warnings": [],
        }
    budgets = [ranking_stability(per_trial, n_kv_heads, f, seed=seed) for f in full_fractions]
    return {
        "trials": int(per_trial.shape[0]),
        "budgets": budgets,
        "warnings": [b["warning"] for b in budgets if "warning" in b],
    }
