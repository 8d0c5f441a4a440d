"""The run catalog: which run folders exist under a root, which can be shown (and why not),
their table, their scores and how two runs' settings differ."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from headhunt.errors import HeadhuntError
from headhunt.methods import find
from headhunt.rundir import MANIFEST, SCORES, Run, find_runs, load_run
from headhunt.scores import HeadScores

HOW_TO_MAKE_A_RUN = (
    "make run  # or: headhunt retrieval --lengths 500 --depths 50 --out runs/retrieval"
)


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

    @property
    def panels(self) -> frozenset[str]:
        """The method-specific panels its method declares (none for a method not registered)."""
        method = find(self.method)
        return method.panels if method is not None else frozenset()


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
        bad = manifest_problem(run.manifest)
        if bad is not None:
            entries.append(RunEntry(path, name, None, f"{MANIFEST} {bad}"))
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


# The manifest entries the views read, and the types they must have.
_SHAPE_KEYS = ("n_layers", "n_heads", "n_kv_heads")


def manifest_problem(manifest: dict[str, Any]) -> str | None:
    """What in a manifest has a type the views cannot read ("has model.n_layers 'many', not a
    whole number"), or None."""
    if not isinstance(manifest.get("method"), str):
        return f"has method {manifest.get('method')!r}, not a name"
    for key, kind in (("model", dict), ("parameters", dict), ("files", list)):
        if key in manifest and not isinstance(manifest[key], kind):
            return (
                f"has {key} {_short(manifest[key])}, not a {'list' if kind is list else 'mapping'}"
            )
    model = manifest.get("model") or {}
    for key in _SHAPE_KEYS:
        v = model.get(key)
        # 0 heads: a model with no attention layers (an MQAR run of Mamba, RWKV, ...)
        least = 1 if key == "n_layers" else 0
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and v >= least):
            what = "positive" if least else "non-negative"
            return f"has model.{key} {_short(v)}, not a {what} whole number"
    if not all(isinstance(f, str) for f in manifest.get("files") or []):
        return "lists files that are not names"
    return None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def runs_root_problem(root: str | Path) -> str | None:
    """Why ``root`` cannot hold runs (missing, not a folder, unreadable), or None: an empty
    catalog then means "no runs yet", not "wrong folder"."""
    path = Path(root).expanduser()
    if not path.exists():
        return f"the runs folder {path} does not exist"
    if not path.is_dir():
        return f"{path} is a file, not a runs folder"
    try:
        next(path.iterdir(), None)
    except OSError as e:
        return f"the runs folder {path} cannot be read ({e.strerror or e})"
    return None


def find_entry(entries: Sequence[RunEntry], name: str) -> tuple[RunEntry | None, str | None]:
    """The entry a link names (by its name under the root) and, when it cannot be opened,
    why: not in the catalog, or listed with a problem."""
    entry = next((e for e in entries if e.name == name), None)
    if entry is None:
        return None, f"there is no run `{name}` in this runs folder"
    if not entry.ok:
        return None, f"run `{name}` cannot be shown: {entry.problem}"
    return entry, None


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
