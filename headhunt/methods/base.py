"""What a method is: a name, a config dataclass, a default metric, ``run(model, config, ctx)``,
and what the dashboard shows of its runs (a head's spread over its units, its own panels).

A config is a dataclass of :func:`~headhunt.config.option` fields deriving from
:class:`~headhunt.config.MethodConfig` (``headhunt/config.py``): one class per method, the
library's config and the method's at once, whose fields' metadata make the CLI's flags.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from headhunt.config import (  # noqa: F401  (a method module imports them from here)
    MethodConfig,
    default_of,
    flag_name,
    is_list,
    item_type,
    option,
)
from headhunt.errors import HeadhuntError
from headhunt.reading import read_records as read_jsonl  # noqa: F401  (methods, views)

if TYPE_CHECKING:
    import pandas as pd

    from headhunt.engine import ModelSpec, RunContext
    from headhunt.probes.hooked import HookedModel
    from headhunt.rundir import Run
    from headhunt.scores import HeadScores

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
        runs_attention_free: whether it measures a model with no attention layers (Mamba,
            RWKV, ...) from its logits alone, skipping its head parts; the other methods refuse
            such a model in one line as soon as it is loaded.
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
    runs_attention_free: ClassVar[bool] = False

    def prepare(self, config: MethodConfig) -> None:
        """Checks that need no model (files, cross-field rules): run before it loads."""
        config.validate()
        config.check()

    def load(self, spec: ModelSpec) -> HookedModel:
        """Load the model a run names (override for models of a method's own format)."""
        return spec.load()

    def for_device(self, config: MethodConfig, device: str) -> MethodConfig:
        """The config a run on ``device`` ("cpu", "cuda") uses: defaults sized to the device
        filled in (override; the run's parameters record the result)."""
        return config

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


def model_label(manifest: dict[str, Any]) -> str:
    """How a run names its model in tables: the model's own name (GGUF ``general.name``, config
    ``_name_or_path``), else the spec as typed (runs made before the manifest held a name)."""
    model = manifest.get("model") or {}
    return str(model.get("name") or model.get("spec") or "?")


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
