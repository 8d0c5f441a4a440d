"""The core types every layer shares: a head, head lists as users type them, and the one
table type for every analyzer's per-head results.

Imported by analyzers, the run directory, the CLI and the app alike; it imports nothing of
headhunt but the error type, so any layer may use it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from jaxtyping import Float

from headhunt.errors import HeadhuntError

Head = tuple[int, int]
"""A head as (layer, query head), both 0-based; written ``LAYER-HEAD`` (``14-3``) in text."""


def parse_heads(text: str, n_layers: int | None = None, n_heads: int | None = None) -> list[Head]:
    """``"14-3, 20-1"`` (commas, semicolons or newlines between pairs) -> [(14, 3), (20, 1)],
    checked against the model's shape when ``n_layers`` and ``n_heads`` are given."""
    heads = []
    for part in text.replace(";", ",").replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            layer, head = part.split("-")
            heads.append((int(layer), int(head)))
        except ValueError:
            raise HeadhuntError(f"bad head {part!r}: use LAYER-HEAD, e.g. 14-3") from None
    if n_layers is not None and n_heads is not None:
        heads = check_heads(heads, n_layers, n_heads)
    return heads


def check_heads(heads: Iterable[Sequence[int]], n_layers: int, n_heads: int) -> list[Head]:
    """``heads`` as (layer, head) int pairs, each inside a ``n_layers`` x ``n_heads`` model.

    Raises:
        HeadhuntError: a head outside the model (one line naming it and the model's shape).
    """
    out = [(int(layer), int(head)) for layer, head in heads]
    for layer, head in out:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise HeadhuntError(
                f"head {layer}-{head} is outside the model ({n_layers} layers x {n_heads} heads)"
            )
    return out


COLUMNS = ["layer", "head", "kv_head", "metric", "value"]


@dataclass
class HeadScores:
    """A tidy table of per-head scores: one row per (layer, head, metric[, extra keys]).

    Columns ``layer``, ``head`` (0-based query head), ``kv_head`` (the KV head its keys and
    values come from under GQA), ``metric`` and ``value``; analyzers may add key columns such
    as ``trial`` or ``order``. Per-layer results (probes) leave ``head`` and ``kv_head`` empty.
    """

    df: pd.DataFrame

    def __post_init__(self) -> None:
        missing = [c for c in COLUMNS if c not in self.df.columns]
        if missing:
            raise ValueError(f"HeadScores needs columns {missing}")

    @classmethod
    def from_matrix(
        cls,
        metric: str,
        values: Float[np.ndarray, "layers heads"] | Any,
        *,
        n_kv_heads: int | Sequence[int] | None = None,
        **extra: Any,
    ) -> HeadScores:
        """Build rows from a [layers, heads] matrix; ``kv_head`` is ``head // group``, with
        one group size, or each layer's where ``n_kv_heads`` lists a count per layer (Gemma 4
        with ``attention_k_eq_v``)."""
        values = np.asarray(values, dtype=float)
        n_layers, n_heads = values.shape
        counts = np.broadcast_to(np.asarray(n_kv_heads or n_heads), (n_layers,))
        group = n_heads // np.where(counts > 0, counts, n_heads)  # 0: a layer with no heads
        layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
        df = pd.DataFrame(
            {
                "layer": layer.ravel(),
                "head": head.ravel(),
                "kv_head": (head // group[:, None]).ravel(),
                "metric": metric,
                "value": values.ravel(),
            }
        )
        for k, v in extra.items():
            df[k] = v
        return cls(df)

    @classmethod
    def concat(cls, tables: Iterable[HeadScores]) -> HeadScores:
        return cls(pd.concat([t.df for t in tables], ignore_index=True))

    @classmethod
    def read_parquet(cls, path: str | os.PathLike) -> HeadScores:
        return cls(pd.read_parquet(path))

    def to_parquet(self, path: str | os.PathLike) -> None:
        """Write the table atomically (a temporary file, then a rename)."""
        from headhunt.atomic import write_file

        write_file(path, self)

    @property
    def metrics(self) -> list[str]:
        return list(dict.fromkeys(self.df["metric"]))

    def matrix(self, metric: str, **where: Any) -> Float[np.ndarray, "layers heads"]:
        """The [layers, heads] matrix of one metric (NaN where a head has no value).

        Raises:
            ValueError: the metric is per layer (no head), or a (layer, head) has several rows
                (pass the extra key columns, e.g. ``source="random"``, to pick one).
        """
        df = self._select(metric, where)
        if (df["head"] < 0).any() or df["head"].isna().any():
            raise ValueError(f"{metric!r} is a per-layer metric; read it from .df")
        if df.duplicated(["layer", "head"]).any():
            keys = [c for c in self.df.columns if c not in COLUMNS]
            raise ValueError(f"{metric!r} has several rows per head; choose one with {keys}")
        n_layers = int(self.df["layer"].max()) + 1
        n_heads = int(self.df["head"].max()) + 1
        out = np.full((n_layers, n_heads), np.nan)
        out[df["layer"].astype(int), df["head"].astype(int)] = df["value"].to_numpy(float)
        return out

    def top(
        self, metric: str, k: int = 10, *, ascending: bool = False, **where: Any
    ) -> pd.DataFrame:
        """The k best heads by ``metric`` (highest first unless ``ascending``)."""
        df = self._select(metric, where)
        return (
            df.sort_values("value", ascending=ascending, kind="stable")
            .head(k)
            .reset_index(drop=True)
        )

    def heads(self, metric: str, threshold: float, **where: Any) -> list[Head]:
        """(layer, head) pairs whose ``metric`` exceeds ``threshold``, best first."""
        df = self.top(metric, len(self.df), **where)
        df = df[df["value"] > threshold]
        return [(int(r.layer), int(r.head)) for r in df.itertuples()]

    def _select(self, metric: str, where: Mapping[str, Any]) -> pd.DataFrame:
        if metric not in self.metrics:
            raise KeyError(f"no metric {metric!r}; this table has {self.metrics}")
        df = self.df[self.df["metric"] == metric]
        for k, v in where.items():
            df = df[df[k] == v]
        return df

    def __len__(self) -> int:
        return len(self.df)
