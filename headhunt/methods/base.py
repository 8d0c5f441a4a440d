"""What a method is: a name, a config dataclass, a default metric, ``run(model, config, ctx)``,
and what the dashboard shows of its runs (a head's spread over its units, its own panels).

A config is a dataclass of :func:`option` fields deriving from :class:`MethodConfig`, which gives
every method the same ``to_dict`` / ``from_dict`` / ``validate`` and lets the CLI make one flag
per field (``max_new_tokens`` -> ``--max-new-tokens``) from the field's metadata: its help, its
bounds (``min``, ``max``, ``below``: checked by ``validate`` with a one-line error that names the
flag), its ``choices``, and for a list its item type (given on the command line comma-separated).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from headhunt.errors import HeadhuntError

if TYPE_CHECKING:
    import pandas as pd

    from headhunt.engine import ModelSpec, RunContext
    from headhunt.heads.scores import HeadScores
    from headhunt.probes.hooked import HookedModel
    from headhunt.rundir import Run

# Method-specific dashboard panels (:attr:`Method.panels`): a view in headhunt/views of files
# the run writes in the format the panel reads.
# Head detail: each trial's needle and the head's argmax on it (retrieval's trials.jsonl).
NEEDLE_TRIALS = "needle trials"
# The Circuits page: AUCs against patching, ROC curves, the circuit and its edges (auc.json,
# circuit.json, edges.parquet, as circuits writes them).
CIRCUIT = "circuit"
SPREAD_COLUMNS = ["unit", "source", "metric", "value", "counted"]


def require(condition: bool, message: str) -> None:
    """Raise the one-line error ``message`` unless ``condition``."""
    if not condition:
        raise HeadhuntError(message)


def option(
    default: Any,
    help: str,
    *,
    type: Any = None,
    min: float | None = None,
    max: float | None = None,
    below: float | None = None,
    choices: tuple | None = None,
    flag: str | None = None,
    cli: bool = True,
) -> Any:
    """A config field with what the CLI and ``validate`` need to know.

    Args:
        default: the default (a list default makes a comma-separated flag).
        help: one line for ``--help``.
        type: the value's type (the item type for lists) when the default does not tell
            (``None`` defaults).
        min, max: inclusive bounds (each item of a list); ``below``: exclusive upper bound.
        choices: the allowed values.
        flag: the flag's name when it is not the field's (``--no-bos`` for ``bos``).
        cli: False for fields the command line does not set.
    """
    meta = {"help": help, "type": type, "min": min, "max": max, "below": below}
    meta.update({"choices": choices, "flag": flag, "cli": cli})
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_name(f) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def is_list(f) -> bool:
    """A field given comma-separated on the command line."""
    default = f.default_factory() if f.default is MISSING else f.default
    return isinstance(default, list) or str(f.type).startswith("list[")


def item_type(f) -> Any:
    """The type of a field's value (of its items, for a list)."""
    if f.metadata.get("type") is not None:
        return f.metadata["type"]
    default = f.default_factory() if f.default is MISSING else f.default
    if isinstance(default, list):
        return type(default[0]) if default else str
    return type(default)


@dataclass
class MethodConfig:
    """The shared base of every method's config: dict round trip and validation."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _copy(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise HeadhuntError(f"{cls.__name__} has no option {unknown[0]!r}")
        return cls(**d)

    def validate(self) -> None:
        """Check every field against its metadata; raise a one-line error naming the flag."""
        for f in fields(self):
            value, name = getattr(self, f.name), flag_name(f)
            for v in value if isinstance(value, list) else [value]:
                _check_value(f, name, v)

    def check(self) -> None:
        """Checks across fields and of input files (override); run after :meth:`validate`,
        before the model loads."""

    def to_argv(self) -> list[str]:
        """The command-line flags that give this config (``seed`` aside: it is ``--seed``)."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "seed" or not f.metadata.get("cli", True) or value is None:
                continue
            if isinstance(value, bool):
                default = f.default
                if value != default:
                    argv.append(flag_name(f))
                continue
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            argv += [flag_name(f), text]
        return argv


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def _check_value(f, name: str, v: Any) -> None:
    meta = f.metadata
    if v is None:
        return
    if isinstance(v, float) and not math.isfinite(v):
        raise HeadhuntError(f"{name} must be a finite number, got {v}")
    if meta.get("choices") is not None and v not in meta["choices"]:
        raise HeadhuntError(f"unknown {name} {v!r} (use {', '.join(map(str, meta['choices']))})")
    lo, hi, below = meta.get("min"), meta.get("max"), meta.get("below")
    if lo is not None and hi is not None and not lo <= v <= hi:
        raise HeadhuntError(f"{name} must be in [{lo}, {hi}], got {v}")
    if lo is not None and v < lo:
        raise HeadhuntError(f"{name} must be at least {lo}, got {v}")
    if hi is not None and v > hi:
        raise HeadhuntError(f"{name} must be at most {hi}, got {v}")
    if below is not None and v >= below:
        raise HeadhuntError(f"{name} must be below {below}, got {v}")


@dataclass(frozen=True)
class MetricInfo:
    """A metric's one-line definition, its unit, why it can be empty (NaN) for a head, and why
    every head can have the same value (the dashboard shows them next to the metric)."""

    definition: str
    unit: str
    when_nan: str = ""
    when_constant: str = ""  # why every head can have the same value


class Method:
    """One analysis, as the engine runs it. Subclasses set the class attributes and implement
    :meth:`parameters`, :meth:`run` and :meth:`show`; :meth:`spread`, :attr:`panels` and
    :attr:`glossary` when the dashboard has more to show of their runs than the scores.

    Attributes:
        name: the subcommand and the run directory's ``method``.
        Config: its config dataclass (a :class:`MethodConfig`).
        metric: the default metric of its scores (the dashboard's heads map opens on it).
        help, description: one line, and the paragraph ``--help`` prints.
        units: what ``--nproc`` deals out over processes (e.g. "trials"); None when the method
            has no units of work to share.
        top: rows of the printed tables by default.
        panels: the method-specific dashboard panels its runs have (:data:`NEEDLE_TRIALS`,
            :data:`CIRCUIT`).
        glossary: what its own metrics mean (name -> :class:`MetricInfo`), for metrics that
            ``headhunt.views.glossary`` does not define.
    """

    name: ClassVar[str]
    Config: ClassVar[type[MethodConfig]]
    metric: ClassVar[str]
    help: ClassVar[str]
    description: ClassVar[str]
    units: ClassVar[str | None] = None
    top: ClassVar[int] = 15
    panels: ClassVar[frozenset[str]] = frozenset()
    glossary: ClassVar[dict[str, MetricInfo]] = {}

    def prepare(self, config: MethodConfig) -> None:
        """Checks that need no model (files, cross-field rules): run before it loads."""
        config.validate()
        config.check()

    def load(self, spec: ModelSpec) -> HookedModel:
        """Load the model a run names (override for models of a method's own format)."""
        return spec.load()

    def parameters(self, config: MethodConfig, model: str) -> dict[str, Any]:
        """What decides the numbers of a run (``parameters.json``; a resume must match)."""
        return {**config.to_dict(), "model": model}

    def run_parameters(
        self, config: MethodConfig, model: str, spec: ModelSpec | None
    ) -> dict[str, Any]:
        """``parameters.json`` of a run of ``model`` (loaded by ``spec``, or None for a model in
        memory): :meth:`parameters`, unless a method also keeps a loading option there."""
        return self.parameters(config, model)

    def run(self, model: HookedModel, config: MethodConfig, ctx: RunContext) -> HeadScores | None:
        """Compute into ``ctx``; return the scores (rank 0) or None (other ranks)."""
        raise NotImplementedError

    def show(self, run: Run, top: int) -> None:
        """Print a finished run (after it is made, and when a finished run is resumed)."""
        raise NotImplementedError

    def spread(self, run: Run, layer: int, head: int) -> pd.DataFrame:
        """One head's value per unit of work (trial, text), read from the run's per-unit
        records: the values its score averages, as :func:`spread_frame` rows. Empty (the
        default) when the method keeps no per-unit records."""
        return spread_frame([])


def spread_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """A head's spread: columns ``unit`` (trial id, text index, sequence), ``metric``,
    ``value``, ``counted`` (whether the unit enters the head's score; default True) and
    ``source`` (the input kind a score is computed over, e.g. n-gram's random, planted or
    natural; default "")."""
    import pandas as pd

    rows = [{"source": "", "counted": True, **r} for r in rows]
    return pd.DataFrame(rows, columns=SPREAD_COLUMNS).astype({"source": str, "counted": bool})


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a finished run's JSONL file; [] when it is gone (a line cut by a crash ends
    the list, as in ``RunDir.records``)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def print_table(df, title: str | None = None, floatfmt: str = "{:.3f}") -> None:
    """Print a DataFrame as a rich table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in df.columns:
        table.add_column(str(col), justify="right")
    for row in df.itertuples(index=False):
        table.add_row(*[floatfmt.format(v) if isinstance(v, float) else str(v) for v in row])
    console = Console()
    if not console.is_terminal:  # a log or a pipe: print the whole table, not 80 columns of it
        wide = console.options.update_width(100_000)
        console = Console(width=max(80, console.measure(table, options=wide).maximum))
    console.print(table)
