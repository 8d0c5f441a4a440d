"""Look at runs and heads: the helpers the dashboard and the notebooks call, in one namespace.

Nothing here scores heads (the analyzers in ``heads/`` and ``sae/`` do). The modules under
:mod:`headhunt.views` read run directories back into the tables a view needs (with a clear
message for a corrupt or unfinished run) and run short on-demand computations on one prompt:

- :mod:`~headhunt.views.runs`: the run catalog, its table, a run's scores, settings diffs;
- :mod:`~headhunt.views.metrics`: per-head maps, top heads, one head's ranks, run comparisons;
- :mod:`~headhunt.views.spread`: one head across a run's trials or texts (read by its method),
  and a retrieval run's needle trials;
- :mod:`~headhunt.views.attention`: one head's attention and sink tokens on a prompt;
- :mod:`~headhunt.views.interventions`: a needle answer with heads masked or calibrated;
- :mod:`~headhunt.views.circuits`: a circuits run's AUCs, curves, circuit and edges;
- :mod:`~headhunt.views.glossary`: what each metric means, and its unit.

Which method-specific panels a run has (:data:`NEEDLE_TRIALS`, :data:`CIRCUIT`) its method
declares: ``RunEntry.panels``.
"""

from __future__ import annotations

from headhunt.methods.base import CIRCUIT, NEEDLE_TRIALS
from headhunt.scores import Head, parse_heads
from headhunt.views.attention import (
    HeadAttention,
    SinkMarks,
    head_attention,
    shade_tokens_html,
    sink_marks,
)
from headhunt.views.circuits import (
    AUC_NOTE,
    ROC_METHODS,
    CircuitView,
    circuit_view,
    edge_table,
    overlap_summary,
    pair_label,
    truth_vs_circuit,
)
from headhunt.views.glossary import METRICS, MetricInfo, describe, metric_info
from headhunt.views.interventions import (
    Answer,
    Intervention,
    answer_needle,
    compare_answers,
    needle_trial,
    random_heads_like,
)
from headhunt.views.metrics import (
    MetricView,
    ViewState,
    compare_runs,
    default_view,
    head_table,
    layer_metrics,
    metric_views,
    top_heads,
    view_matrix,
    view_state,
)
from headhunt.views.results import ablation_table, scores_note
from headhunt.views.runs import (
    HOW_TO_MAKE_A_RUN,
    RunEntry,
    find_entry,
    parameter_diff,
    read_scores,
    run_table,
    runs_root_problem,
    scan_runs,
)
from headhunt.views.spread import head_spread, needle_trials, spread_summary

__all__ = [
    "AUC_NOTE",
    "CIRCUIT",
    "HOW_TO_MAKE_A_RUN",
    "METRICS",
    "NEEDLE_TRIALS",
    "ROC_METHODS",
    "Answer",
    "CircuitView",
    "Head",
    "HeadAttention",
    "Intervention",
    "MetricInfo",
    "MetricView",
    "RunEntry",
    "SinkMarks",
    "ViewState",
    "ablation_table",
    "answer_needle",
    "circuit_view",
    "compare_answers",
    "compare_runs",
    "default_view",
    "describe",
    "edge_table",
    "find_entry",
    "head_attention",
    "head_view",
    "head_spread",
    "head_table",
    "layer_metrics",
    "metric_info",
    "metric_views",
    "needle_trial",
    "needle_trials",
    "overlap_summary",
    "pair_label",
    "parameter_diff",
    "parse_heads",
    "random_heads_like",
    "read_scores",
    "run_table",
    "scores_note",
    "runs_root_problem",
    "scan_runs",
    "shade_tokens_html",
    "sink_marks",
    "spread_summary",
    "top_heads",
    "truth_vs_circuit",
    "view_matrix",
    "view_state",
]


def head_view(*args, **kwargs):
    """:func:`headhunt.probes.headview.head_view` (imported on use: importing headhunt.probes
    loads torch, which reading runs never needs)."""
    from headhunt.probes.headview import head_view as compute

    return compute(*args, **kwargs)


def __getattr__(name: str):
    if name == "HeadView":  # the class of a head view, from the same module, on use
        from headhunt.probes.headview import HeadView

        return HeadView
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
