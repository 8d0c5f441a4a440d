"""KV-cache head pruning as a method: sweep the share of full KV heads (DuoAttention-style
streaming heads for the rest) for several head rankings, on needles and RULER-like tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from headhunt.errors import HeadhuntError
from headhunt.heads.configs import KVEvalConfig
from headhunt.methods.base import Method, print_table

RECORDS = "conditions.jsonl"


class KVEval(Method):
    name = "kv-eval"
    Config = KVEvalConfig
    metric = "kv_score"
    help = "KV-cache head pruning sweep (streaming heads)"
    description = """Sweep the share of KV heads that keep the full cache; the others become
streaming heads that keep only the first --sink and the last --recent tokens (their cache really
that small). KV heads are ranked by a run's metric (each KV head takes its best query head's
score), by its reverse, at random (--random-draws) and, with --duo-pattern, by a DuoAttention
pattern folder. Every condition answers the same needle trials and RULER-like tasks (multi-key
and multi-value needles, variable tracking, common words) built from the bundled essays.
Writes kv_eval.parquet (per trial), summary.csv (accuracy x100 and measured KV bytes per
ranking, fraction and task), kv_eval.html, and the ranking's per-head KV score (kv_score) to
scores.parquet."""
    units = "conditions"

    def prepare(self, config: KVEvalConfig) -> None:
        from headhunt.export import read_scores, streaming_window

        super().prepare(config)
        if config.duo_pattern is not None and not Path(config.duo_pattern).is_dir():
            raise HeadhuntError(f"--duo-pattern {config.duo_pattern} is not a folder")
        if not config.window_from:  # resolved once, before parameters.json records the sizes
            config.sink, config.recent, config.window_from = streaming_window(
                config.sink, config.recent, config.sinks, config.duo_pattern
            )
        if config.scores is not None:
            read_scores(config.scores, config.metric)
        if config.scores is None and config.duo_pattern is None and not config.random_draws:
            raise HeadhuntError(
                "nothing to rank by: give --scores, --duo-pattern or --random-draws"
            )

    def run(self, model, config: KVEvalConfig, ctx):
        from headhunt.export import ModelShape, check_scores, read_duo, read_scores
        from headhunt.heads.evaluations import kv_eval as kv
        from headhunt.scores import HeadScores

        shape = ModelShape.of(model.describe())
        scores = read_scores(config.scores, config.metric)[0] if config.scores else None
        if scores is not None:
            check_scores(scores, shape, f"--scores {config.scores}")
        duo = read_duo(config.duo_pattern, shape)[0] if config.duo_pattern else None
        sweep = config
        rankings = kv.kv_rankings(model, sweep, scores, duo)
        trials = kv.build_eval_trials(model, sweep)
        conds = kv.conditions(rankings, sweep.fractions)
        plan = {kv.condition_key(n, f): (n, f) for n, f in conds}

        def measure(cond: tuple[str, float]) -> dict[str, Any]:
            ranking = kv.plan_ranking(rankings, cond[0])
            return {"records": kv.run_condition(model, trials, ranking, cond[1], sweep)}

        collected = ctx.run_conditions(RECORDS, plan, measure, timing="sweep_s")
        if collected is None:
            return None
        table = kv.table_of(conds, {k: r["records"] for k, r in collected.items()})
        ctx.write("kv_eval.parquet", table)
        summary = kv.summarize(table)
        ctx.write("summary.csv", summary)
        ctx.write("kv_eval.html", figure(summary, model.name))
        ctx.extra["summary"] = {
            "trials": len(trials),
            "rankings": list(rankings),
            "window": {
                "sink": config.sink,
                "recent": config.recent,
                "from": config.window_from,
            },
        }
        if scores is not None:
            ranking = ranking_report(
                config.scores, config.metric, shape.n_kv_heads, sweep.fractions
            )
            ctx.extra["summary"]["ranking"] = ranking
            for warning in ranking["warnings"]:
                ctx.say(f"warning: {warning}")
            per_kv = kv.kv_scores(scores, model.n_kv_heads)
        elif duo is not None:
            per_kv = duo
        else:
            per_kv = np.full((model.n_layers, model.n_kv_heads), np.nan)
        per_head = np.repeat(per_kv, model.group_size, axis=1)
        return HeadScores.from_matrix(self.metric, per_head, n_kv_heads=model.n_kv_heads)

    def show(self, run, top: int) -> None:
        import pandas as pd

        show_summary(pd.read_csv(run.path / "summary.csv"))


def show_summary(summary) -> None:
    """Accuracy per ranking and fraction for the needle and RULER-like groups, with the
    measured KV share."""
    groups = summary["task"].isin(["needle", "ruler"])
    keep = summary[groups & ~summary["ranking"].str.match(r"random\d")]
    wide = keep.pivot_table(
        index=["ranking", "fraction"], columns="task", values="accuracy", sort=False
    )
    kv = keep.groupby(["ranking", "fraction"], sort=False)["kv_fraction"].mean()
    wide = wide.assign(kv_share=kv).reset_index()
    print_table(
        wide,
        title="kv-eval: accuracy (x100) by share of full KV heads; kv_share = KV bytes / full cache",
    )


def figure(summary, name: str) -> Any:
    """Accuracy against measured KV share, one line per ranking, needles and RULER-like tasks."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    groups = [g for g in ("needle", "ruler") if g in set(summary["task"])]
    fig = make_subplots(rows=1, cols=len(groups), subplot_titles=groups, shared_yaxes=True)
    names = [r for r in dict.fromkeys(summary["ranking"]) if not r[-1].isdigit()]
    for col, g in enumerate(groups, start=1):
        for i, r in enumerate(names):
            s = summary[(summary["task"] == g) & (summary["ranking"] == r)].sort_values("fraction")
            fig.add_trace(
                go.Scatter(
                    x=s["kv_fraction"],
                    y=s["accuracy"],
                    mode="lines+markers",
                    name=r,
                    legendgroup=r,
                    showlegend=col == 1,
                    line={"color": f"hsl({int(360 * i / max(1, len(names)))},60%,45%)"},
                    customdata=s["fraction"],
                    hovertemplate=f"{r}: full KV heads %{{customdata:.0%}}<br>KV share %{{x:.2f}}"
                    "<br>accuracy %{y:.1f}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="measured KV cache / full cache", row=1, col=col)
    fig.update_yaxes(title_text="accuracy (x100)", row=1, col=1)
    fig.update_layout(title=f"KV-cache head pruning: {name}", height=450)
    return fig


def ranking_report(
    scores: str, metric: str, n_kv_heads: int, fractions: list[float], seed: int = 0
) -> dict[str, Any]:
    """How many trials the ranking of ``metric`` in run ``scores`` rests on and how stable its
    top-k KV heads are at each swept share strictly between 0 and 1 (top-k overlap of two
    halves of the trials: :func:`headhunt.export.stability_report`); ``warnings`` lists the
    shares the trials are too few for. Here, not in the analyzer: it reads a run directory."""
    from headhunt.export import stability_report

    shares = sorted({f for f in fractions if 0 < f < 1}, reverse=True)
    return stability_report(scores, metric, n_kv_heads, shares, seed)
