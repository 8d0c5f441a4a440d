"""Linear probes per layer, with a split by text and controls chosen for the target.

A :class:`Prober` is built once per target: it checks the labels, splits the *texts* into
train and test (every position of a text falls on one side, so a probe never scores on a text
it saw), and draws the control labelings. :meth:`Prober.fit` then fits one probe on one
layer's (or one head's) states:

- standardised features (mean and scale learnt on the training texts);
- logistic regression (classification) or ridge regression (regression), its regularisation
  chosen from a grid by cross-validation over *groups of training texts*;
- the score on the held-out texts: accuracy, or R^2.

Controls, fitted the same way on the same split, each the score a probe gets on labels that
lack the property but keep something else:

- ``within_type``: every row takes the label of another row of its type (a target says what its
  types are: the token, the k-gram context, the key word...). It keeps everything the type
  alone says about the label and destroys the rest, so score - within_type is what the states
  know *beyond* the token (or context, or key). The informative control when types repeat.
- ``shuffled``: the labels permuted across rows: what a probe reaches on labels that mean
  nothing (near ``chance`` unless it overfits). The informative control when every row is its
  own type (then within_type would be the labels themselves).
- ``control``: Hewitt & Liang's control task. Every type gets one random label drawn from the
  empirical label distribution, used wherever that type occurs. It measures how well the probe
  can *memorise* types; with a few token-valued types (8 words, 7 keys) a linear probe solves it
  from token identity alone (1.0), so score - control says nothing about the property. Fitted
  only when asked.
- ``chance``: predicting the training split's majority class (accuracy) or mean (R^2).

``selectivity`` = score - the control named by ``ProbeConfig.selectivity_vs``; by default
("auto") within_type where types repeat and shuffled where they do not, the same rule by which
each target names its informative control (see :mod:`headhunt.probes.targets`). A reference
that cannot be informative (within_type on types that almost never repeat) is refused.

The controls reuse the regularisation cross-validated for the task: Hewitt & Liang compare a
task and its control at equal probe complexity (and it saves two thirds of the fitting time).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from jaxtyping import Float, Int

from headhunt.errors import HeadhuntError
from headhunt.probes.configs import ProbeConfig

RESIDUAL = -1  # the `head` (and `kv_head`) value of a whole-layer (residual stream) probe
CONTROLS = ("control", "shuffled", "within_type")


@dataclass
class ProbeResult:
    """One fitted probe.

    Attributes:
        layer: the layer probed.
        head: the head probed, or :data:`RESIDUAL` (-1) for the residual stream.
        metrics: ``accuracy``/``r2`` (test), ``train``, the fitted controls (``within_type``,
            ``shuffled``, ``control``), ``selectivity`` (score - the ``selectivity_vs``
            control), ``chance``, ``C`` (chosen inverse regularisation), ``n_train``,
            ``n_test`` (rows).
        weights: ``coef`` [outputs, features] and ``intercept`` [outputs] on standardised
            features, ``mean`` and ``scale`` [features] of the standardisation, ``classes``
            (the label of each output row; classification). Predict with
            ``((x - mean) / scale) @ coef.T + intercept`` (argmax over outputs for classes).
    """

    layer: int
    head: int
    metrics: dict[str, float]
    weights: dict[str, np.ndarray] = field(repr=False, default_factory=dict)


def _limit_threads():
    # BLAS threads fighting over a shared CPU made lbfgs fits ~15x slower in our measurements;
    # one thread per fit is the robust choice for these small problems.
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1)


class Prober:
    """Fits probes of one target on any number of layers, with one fixed split and controls.

    Args:
        labels: one label per row (class index or value).
        groups: the text each row comes from (rows of a text stay on one side of the split).
        types: the control-task type of each row.
        config: fitting options.

    Raises:
        HeadhuntError: labels with one class (or constant values), too few texts for a split,
            mismatched lengths.
    """

    def __init__(
        self,
        labels: Float[np.ndarray, " rows"],
        groups: Int[np.ndarray, " rows"],
        types: Int[np.ndarray, " rows"],
        config: ProbeConfig | None = None,
    ):
        self.config = config = config or ProbeConfig()
        if config.task not in ("classification", "regression"):
            raise HeadhuntError(f"unknown probe task {config.task!r}")
        labels, groups, types = np.asarray(labels), np.asarray(groups), np.asarray(types)
        if config.selectivity_vs == "auto":
            ref = "within_type" if _alone(types) <= 0.5 else "shuffled"
            self.config = config = replace(config, selectivity_vs=ref)
        wanted = set(config.controls) - {"none"} | ({config.selectivity_vs} - {None})
        unknown = sorted(wanted - set(CONTROLS))
        if unknown:
            raise HeadhuntError(f"unknown controls {unknown} (choose from {', '.join(CONTROLS)})")
        if not len(labels) == len(groups) == len(types):
            raise HeadhuntError("labels, groups and types must have one entry per row")
        if config.task == "classification":
            labels = labels.astype(np.int64)
        else:
            labels = labels.astype(np.float64)
        check_labels(labels, groups, config)
        self.labels, self.groups, self.types = labels, groups, types
        rng = np.random.default_rng(config.seed)
        self.train = split_by_text(labels, groups, config)
        self.controls = {
            "control": control_labels(labels, types, rng),
            "shuffled": rng.permutation(labels),
            "within_type": within_type_labels(labels, types, rng),
        }
        alone = _alone(types)
        if config.selectivity_vs == "within_type" and alone > 0.5:
            # a type's only row has no other row to take a label from: no control at all
            raise HeadhuntError(
                f"{alone:.0%} of the rows are the only row of their type, so the within_type "
                "control cannot move their labels: measure selectivity against shuffled"
            )
        self.fitted = [c for c in CONTROLS if c in wanted]

    @property
    def n_rows(self) -> int:
        return len(self.labels)

    def fit(
        self, x: Float[np.ndarray, "rows features"], layer: int, head: int = RESIDUAL
    ) -> ProbeResult:
        """Fit the task probe (and the controls) on the states ``x`` of one layer or head."""
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or len(x) != self.n_rows:
            raise HeadhuntError(
                f"expected states of shape [{self.n_rows}, features], got {x.shape}"
            )
        cfg = self.config
        with _limit_threads(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence and class-count chatter per fold
            main = _fit(x, self.labels, self.groups, self.train, cfg)
            metrics = {
                cfg.score_name: main.test,
                "train": main.train,
                "C": main.c,
                "chance": _chance(self.labels, self.train, cfg.task),
                "n_train": float(self.train.sum()),
                "n_test": float((~self.train).sum()),
            }
            for name in self.fitted:
                y = self.controls[name]
                metrics[name] = _fit(x, y, self.groups, self.train, cfg, c=main.c).test
            if cfg.selectivity_vs is not None:
                metrics["selectivity"] = metrics[cfg.score_name] - metrics[cfg.selectivity_vs]
        return ProbeResult(layer, head, metrics, main.weights)


def _alone(types: np.ndarray) -> float:
    """Share of the rows that are the only row of their type."""
    if len(types) == 0:
        return 0.0
    _, inverse, counts = np.unique(types, return_inverse=True, return_counts=True)
    return float((counts[inverse] == 1).mean())


def check_labels(labels: np.ndarray, groups: np.ndarray, config: ProbeConfig) -> tuple[int, int]:
    """Raise a one-line error when the labels cannot be probed; return (train, test) texts."""
    if config.task == "classification" and len(np.unique(labels)) < 2:
        raise HeadhuntError(
            f"all {len(labels)} labels are one class ({labels[0] if len(labels) else '-'}): "
            "a probe needs at least two"
        )
    if config.task == "regression" and (len(labels) == 0 or np.ptp(labels) == 0):
        raise HeadhuntError("all labels have the same value: nothing to regress")
    n = len(np.unique(groups))
    n_test = max(2, round(config.test_fraction * n))
    need = n_test + 2 * config.folds
    if n < need:
        raise HeadhuntError(
            f"only {n} texts: a split by text with {config.folds} folds and test fraction "
            f"{config.test_fraction} needs at least {need}"
        )
    return n - n_test, n_test


def split_by_text(labels: np.ndarray, groups: np.ndarray, config: ProbeConfig) -> np.ndarray:
    """Boolean train mask over rows; whole texts go to test (stratified by label for classes)."""
    from sklearn.model_selection import GroupShuffleSplit, StratifiedGroupKFold

    _, n_test = check_labels(labels, groups, config)
    n = len(np.unique(groups))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if config.task == "classification":
            k = max(2, round(n / n_test))
            splitter = StratifiedGroupKFold(k, shuffle=True, random_state=config.seed)
            _, test = next(splitter.split(np.zeros(len(labels)), labels, groups))
        else:
            splitter = GroupShuffleSplit(1, test_size=n_test, random_state=config.seed)
            _, test = next(splitter.split(np.zeros(len(labels)), labels, groups))
    train = np.ones(len(labels), dtype=bool)
    train[test] = False
    if config.task == "classification" and len(np.unique(labels[train])) < 2:
        raise HeadhuntError("the training texts hold only one class; add texts of other classes")
    return train


def control_labels(labels: np.ndarray, types: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Hewitt & Liang control labels: one label per type, drawn from the empirical label
    distribution (a random row's label), repeated at every row of that type."""
    uniq, inverse = np.unique(types, return_inverse=True)
    drawn = labels[rng.integers(len(labels), size=len(uniq))]
    return drawn[inverse]


def within_type_labels(
    labels: np.ndarray, types: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Each row gets the label of another row of its type: the type's rows in random order,
    each taking the next one's label (a type's label counts are kept). A plain permutation
    would leave a row its own label with chance 1 / (rows of its type), leaking the property
    into the control where types are small; a type's only row gets a random row's label."""
    out = labels.copy()
    order = np.argsort(types, kind="stable")
    bounds = np.flatnonzero(np.diff(types[order])) + 1
    for rows in np.split(order, bounds):
        if len(rows) == 1:
            out[rows] = labels[rng.integers(len(labels))]
            continue
        rows = rng.permutation(rows)
        out[rows] = labels[np.roll(rows, -1)]
    return out


@dataclass
class _Fit:
    test: float
    train: float
    c: float
    weights: dict[str, np.ndarray]


def _estimator(task: str, c: float, max_iter: int):
    from sklearn.linear_model import LogisticRegression, Ridge

    if task == "classification":
        return LogisticRegression(C=c, max_iter=max_iter, warm_start=True)
    return Ridge(alpha=1.0 / c)


def _score(est, x: np.ndarray, y: np.ndarray, task: str) -> float:
    if task == "classification":
        return float((est.predict(x) == y).mean())
    from sklearn.metrics import r2_score

    return float(r2_score(y, est.predict(x))) if len(y) > 1 else float("nan")


def _standardise(x: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x[rows].mean(0)
    scale = x[rows].std(0)
    scale[scale < 1e-8] = 1.0  # a constant feature carries nothing; avoid dividing by zero
    return mean, scale


def _fit(
    x: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    train: np.ndarray,
    cfg: ProbeConfig,
    c: float | None = None,
) -> _Fit:
    """Fit on the training rows and score on the rest; ``c`` fixes the regularisation,
    else it is cross-validated over groups of training texts."""
    tr = np.flatnonzero(train)
    best = _cross_validate(x, y, groups, tr, cfg) if c is None else c
    return _fit_rest(x, y, train, tr, cfg, best)


def _cross_validate(
    x: np.ndarray, y: np.ndarray, groups: np.ndarray, tr: np.ndarray, cfg: ProbeConfig
) -> float:
    """The grid value with the best mean validation score over folds of training texts."""
    from sklearn.model_selection import GroupKFold

    grid = sorted(cfg.grid)  # weakest last, so warm starts follow the path
    cv = np.zeros(len(grid))
    folds = GroupKFold(cfg.folds).split(tr, groups=groups[tr])
    for fit_rows, val_rows in folds:
        a, b = tr[fit_rows], tr[val_rows]
        if cfg.task == "classification" and len(np.unique(y[a])) < 2:
            cv += (y[b] == y[a][0]).mean()  # only a constant prediction is possible
            continue
        mean, scale = _standardise(x, a)
        xa, xb = (x[a] - mean) / scale, (x[b] - mean) / scale
        est = _estimator(cfg.task, grid[0], cfg.max_iter)
        for i, c in enumerate(grid):
            # One estimator per fold: logistic fits warm-start from the previous C.
            est.set_params(**({"C": c} if cfg.task == "classification" else {"alpha": 1 / c}))
            est.fit(xa, y[a])
            cv[i] += _score(est, xb, y[b], cfg.task)
    # Ties go to the strongest regularisation (the first maximum of an ascending grid).
    return grid[int(np.argmax(cv))]


def _fit_rest(
    x: np.ndarray, y: np.ndarray, train: np.ndarray, tr: np.ndarray, cfg: ProbeConfig, best: float
) -> _Fit:
    mean, scale = _standardise(x, tr)
    xs = (x - mean) / scale
    test = np.flatnonzero(~train)
    if cfg.task == "classification" and len(np.unique(y[tr])) < 2:
        const = y[tr][0]
        return _Fit(
            float((y[test] == const).mean()),
            1.0,
            best,
            {
                "coef": np.zeros((1, x.shape[1]), np.float32),
                "intercept": np.zeros(1, np.float32),
                "mean": mean,
                "scale": scale,
                "classes": np.asarray([const], np.int64),
            },
        )
    est = _estimator(cfg.task, best, cfg.max_iter).fit(xs[tr], y[tr])
    coef = np.atleast_2d(est.coef_).astype(np.float32)
    intercept = np.atleast_1d(est.intercept_).astype(np.float32)
    weights = {"coef": coef, "intercept": intercept, "mean": mean, "scale": scale}
    if cfg.task == "classification":
        weights["classes"] = est.classes_.astype(np.int64)
    return _Fit(
        _score(est, xs[test], y[test], cfg.task),
        _score(est, xs[tr], y[tr], cfg.task),
        best,
        {k: np.ascontiguousarray(v) for k, v in weights.items()},
    )


def _chance(y: np.ndarray, train: np.ndarray, task: str) -> float:
    if task == "classification":
        values, counts = np.unique(y[train], return_counts=True)
        return float((y[~train] == values[np.argmax(counts)]).mean())
    from sklearn.metrics import r2_score

    return float(r2_score(y[~train], np.full((~train).sum(), y[train].mean())))


# ---------------------------------------------------------------------------------------------
# Outputs


def to_scores(results: list[ProbeResult], n_heads_per_kv: int = 1):
    """A :class:`~headhunt.scores.HeadScores` table: one row per (layer, head, metric).

    Whole-layer probes have ``head`` and ``kv_head`` = -1 (:data:`RESIDUAL`), kept integer so
    the columns stay integer in parquet; per-head probes have the head and its KV head.
    """
    import pandas as pd

    from headhunt.scores import HeadScores

    recs = []
    for r in results:
        kv = RESIDUAL if r.head == RESIDUAL else r.head // n_heads_per_kv
        for m, v in r.metrics.items():
            recs.append({"layer": r.layer, "head": r.head, "kv_head": kv, "metric": m, "value": v})
    df = pd.DataFrame(recs, columns=["layer", "head", "kv_head", "metric", "value"])
    return HeadScores(df.astype({"layer": "int64", "head": "int64", "kv_head": "int64"}))


def weight_tensors(results: list[ProbeResult]) -> dict[str, np.ndarray]:
    """All probes' weights as one safetensors dict, keys ``L{layer:02d}.{name}`` for the
    residual stream and ``L{layer:02d}.H{head:02d}.{name}`` for heads."""
    tensors = {}
    for r in results:
        unit = f"L{r.layer:02d}" + ("" if r.head == RESIDUAL else f".H{r.head:02d}")
        for k, v in r.weights.items():
            tensors[f"{unit}.{k}"] = np.ascontiguousarray(v)
    return tensors


def save_weights(results: list[ProbeResult], path: str | Path) -> None:
    """All probes' weights in one safetensors file (:func:`weight_tensors`), atomically."""
    from headhunt.atomic import write_file

    write_file(path, weight_tensors(results))


def curve_figure(results: list[ProbeResult], task: str, title: str = "Linear probe"):
    """A plotly figure: per-layer score, control, selectivity, shuffled and chance of the
    residual-stream probes; with per-head probes, a heatmap of their scores below."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    name = "accuracy" if task == "classification" else "r2"
    resid = sorted((r for r in results if r.head == RESIDUAL), key=lambda r: r.layer)
    heads = [r for r in results if r.head != RESIDUAL]
    fig = make_subplots(
        rows=2 if heads else 1,
        cols=1,
        subplot_titles=("residual stream", "per-head outputs") if heads else None,
        vertical_spacing=0.12,
    )
    x = [r.layer for r in resid]
    styles = {
        name: {"width": 3},
        "control": {"dash": "dash"},
        "selectivity": {"width": 2},
        "shuffled": {"dash": "dot"},
        "chance": {"dash": "dot", "color": "grey"},
    }
    for m, line in styles.items():
        if resid and m in resid[0].metrics:
            fig.add_trace(
                go.Scatter(
                    x=x, y=[r.metrics[m] for r in resid], name=m, mode="lines+markers", line=line
                ),
                row=1,
                col=1,
            )
    if heads:
        n_layers = max(r.layer for r in heads) + 1
        n_heads = max(r.head for r in heads) + 1
        z = np.full((n_heads, n_layers), np.nan)
        for r in heads:
            z[r.head, r.layer] = r.metrics[name]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=list(range(n_layers)),
                y=list(range(n_heads)),
                colorbar={"title": name, "len": 0.45, "y": 0.22},
            ),
            row=2,
            col=1,
        )
        fig.update_yaxes(title_text="head", row=2, col=1)
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text=name, row=1, col=1)
    fig.update_layout(title=title, template="plotly_white", height=800 if heads else 480)
    return fig
