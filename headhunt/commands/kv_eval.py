"""`headhunt kv-eval`: how much KV cache a head ranking saves (DuoAttention-style streaming heads)."""

from __future__ import annotations

import argparse
import time

from headhunt.commands.common import (
    add_command,
    add_model_args,
    add_out_args,
    comma_list,
    open_model,
    print_table,
    seed_everything,
)

DESCRIPTION = """Sweep the share of KV heads that keep the full cache; the others become
streaming heads that keep only the first --sink and the last --recent tokens (their cache really
that small). KV heads are ranked by a run's metric (each KV head takes its best query head's
score), by its reverse, at random (--random-draws) and, with --duo-pattern, by a DuoAttention
pattern folder. Every condition answers the same needle trials and RULER-like tasks (multi-key
and multi-value needles, variable tracking, common words) built from the bundled essays.
Writes kv_eval.parquet (per trial), summary.csv (accuracy x100 and measured KV bytes per
ranking, fraction and task), kv_eval.html and manifest.json."""

RECORDS = "conditions.jsonl"


def add_parser(sub) -> None:
    p = add_command(sub, "kv-eval", "KV-cache head pruning sweep (streaming heads)", DESCRIPTION)
    add_model_args(p)
    add_out_args(p, "runs/kv-eval")
    g = p.add_argument_group("rankings")
    g.add_argument("--scores", default=None, help="a run directory (or scores .parquet) to rank by")
    g.add_argument("--metric", default="retrieval_score", help="the metric of --scores")
    g.add_argument("--duo-pattern", default=None, help="a DuoAttention pattern folder to compare")
    g.add_argument("--random-draws", type=int, default=3, help="random rankings")
    g = p.add_argument_group("sweep")
    g.add_argument(
        "--fractions",
        type=comma_list(float, "fraction"),
        default="0,0.1,0.25,0.5,0.75,1",
        help="shares of KV heads with the full cache",
    )
    g.add_argument("--sink", type=int, default=4, help="leading tokens a streaming head keeps")
    g.add_argument("--recent", type=int, default=256, help="trailing tokens a streaming head keeps")
    g.add_argument(
        "--lengths", type=comma_list(int, "length"), default="1000,2000", help="prompt lengths"
    )
    g.add_argument(
        "--depths",
        type=comma_list(float, "depth"),
        default="0,25,50,75,100",
        help="needle depths (%%)",
    )
    g.add_argument(
        "--needles", type=comma_list(str, "needle"), default="passkey,city,magic", help="needles"
    )
    g.add_argument(
        "--tasks",
        type=comma_list(str, "task"),
        default="mk_niah,mv_niah,vt,cwe",
        help="RULER-like tasks",
    )
    g.add_argument("--task-repeats", type=int, default=2, help="trials per (task, length)")
    g.add_argument("--batch-size", type=int, default=8, help="trials decoded together")
    g.add_argument("--haystack", default=None, help="text file (default: the bundled essays)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from headhunt.errors import HeadhuntError
    from headhunt.export import ModelShape, check_scores, read_duo, read_scores
    from headhunt.heads.kv_eval import (
        KVEvalConfig,
        build_eval_trials,
        kv_eval,
        kv_rankings,
        summarize,
    )
    from headhunt.plots import write_html
    from headhunt.rundir import RunDir, load_run

    config = KVEvalConfig(
        fractions=args.fractions,
        lengths=args.lengths,
        depths=args.depths,
        needles=args.needles,
        tasks=args.tasks,
        task_repeats=args.task_repeats,
        random_draws=args.random_draws,
        sink=args.sink,
        recent=args.recent,
        batch_size=args.batch_size,
        seed=args.seed,
        haystack=args.haystack,
    )
    config.validate()
    scores = read_scores(args.scores, args.metric)[0] if args.scores else None
    params = {
        **config.to_dict(),
        "model": args.model,
        "scores": args.scores,
        "metric": args.metric,
        "duo_pattern": args.duo_pattern,
    }
    run_dir = RunDir.open(
        args.out, "kv-eval", resume=args.resume, force=args.force, parameters=params
    )
    if run_dir.complete:
        show(pd.read_csv(load_run(run_dir.out).path / "summary.csv"))
        return 0
    seed_everything(args.seed)
    t0 = time.perf_counter()
    model = open_model(args)
    shape = ModelShape.of(model.describe())
    if scores is not None:
        check_scores(scores, shape, f"--scores {args.scores}")
    duo = read_duo(args.duo_pattern, shape)[0] if args.duo_pattern else None
    if scores is None and duo is None and not config.random_draws:
        raise HeadhuntError("nothing to rank by: give --scores, --duo-pattern or --random-draws")
    rankings = kv_rankings(model, config, scores, duo)
    trials = build_eval_trials(model, config)
    done = {r["condition"]: r["records"] for r in run_dir.records(RECORDS)}
    t1 = time.perf_counter()
    table = kv_eval(
        model,
        config,
        rankings,
        trials,
        done=done,
        on_condition=lambda k, recs: run_dir.append_record(
            {"condition": k, "records": recs}, RECORDS
        ),
    )
    table.to_parquet(run_dir.path("kv_eval.parquet"), index=False)
    summary = summarize(table)
    summary.to_csv(run_dir.path("summary.csv"), index=False)
    write_html(figure(summary, model.name), run_dir.path("kv_eval.html"))
    run_dir.finalize(
        model=model.describe(),
        parameters=params,
        timings={"load_model_s": t1 - t0, "sweep_s": time.perf_counter() - t1},
        extra={"trials": len(trials), "rankings": list(rankings)},
    )
    show(summary)
    print(f"run directory: {run_dir.out}")
    return 0


def show(summary) -> None:
    """Accuracy per ranking and fraction for the needle and RULER-like groups, with the
    measured KV share."""
    keep = summary[
        summary["task"].isin(["needle", "ruler"]) & ~summary["ranking"].str.match(r"random\d")
    ]
    wide = keep.pivot_table(
        index=["ranking", "fraction"], columns="task", values="accuracy", sort=False
    )
    kv = keep.groupby(["ranking", "fraction"], sort=False)["kv_fraction"].mean()
    wide = wide.assign(kv_share=kv).reset_index()
    print_table(
        wide,
        title="kv-eval: accuracy (x100) by share of full KV heads; kv_share = KV bytes / full cache",
    )


def figure(summary, name: str):
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
