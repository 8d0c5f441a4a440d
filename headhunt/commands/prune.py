"""`headhunt prune`: remove heads from the weights and save a smaller Hugging Face folder."""

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

DESCRIPTION = """Structural head pruning: the dropped query heads' rows of q_proj and columns of
o_proj are removed (a KV head's k/v rows go with its last query head); uneven GQA groups are
padded with zero heads. Keep the top --keep share of heads by any metric of any run (--scores,
--metric), or drop a list (--drop-heads 14-3,20-1). Writes model/ (safetensors, tokenizer, a
config recording each layer's heads; load it with `headhunt --model DIR/model` or
headhunt.heads.pruning.load_pruned), prune.json (layout and size) and manifest.json.

With --evaluate, also prunes by the reverse ranking and at random (--draws) at --keep and every
--sweep share, and measures each pruned model: parameters, KV bytes per token, prefill time,
perplexity on the bundled essays and needle recall (fresh trials); writes prune_eval.csv."""


def add_parser(sub) -> None:
    p = add_command(sub, "prune", "structural head pruning to a smaller HF folder", DESCRIPTION)
    add_model_args(p)
    add_out_args(p, "runs/prune")
    g = p.add_argument_group("heads")
    g.add_argument("--scores", default=None, help="a run directory (or scores .parquet) to rank by")
    g.add_argument("--metric", default="retrieval_score", help="the metric of --scores")
    g.add_argument("--keep", type=float, default=None, help="share of query heads kept (top first)")
    g.add_argument("--drop-heads", default=None, help="heads to drop instead: L-H,L-H,...")
    g.add_argument(
        "--unit",
        choices=["head", "kv"],
        default="head",
        help="head: rank and drop query heads (uneven GQA groups get zero pad heads); kv: rank KV "
        "groups by their best query head and drop whole groups (k/v and the KV cache shrink)",
    )
    g = p.add_argument_group("evaluation")
    g.add_argument(
        "--evaluate", action="store_true", help="measure against reverse and random pruning"
    )
    g.add_argument(
        "--sweep", type=comma_list(float, "share"), default=None, help="more kept shares to measure"
    )
    g.add_argument("--draws", type=int, default=3, help="random head sets per share")
    g.add_argument(
        "--lengths",
        type=comma_list(int, "length"),
        default="1000,2000",
        help="needle prompt lengths",
    )
    g.add_argument(
        "--depths", type=comma_list(float, "depth"), default="0,50,100", help="needle depths (%%)"
    )
    g.add_argument("--ppl-windows", type=int, default=8, help="perplexity windows (512 tokens)")
    g.add_argument("--batch-size", type=int, default=8, help="needle trials decoded together")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from headhunt.errors import HeadhuntError
    from headhunt.export import ModelShape, check_scores, read_scores
    from headhunt.heads.pruning import (
        heads_to_drop,
        model_size,
        prune_model,
        ranked_heads,
        save_pruned,
    )
    from headhunt.heads.scores import parse_heads
    from headhunt.rundir import RunDir, load_run, write_json_atomic

    if (args.keep is None) == (args.drop_heads is None):
        raise HeadhuntError("give exactly one of --keep (with --scores) and --drop-heads")
    if args.keep is not None and args.scores is None:
        raise HeadhuntError("--keep ranks heads by a metric: give --scores RUN")
    if args.evaluate and args.scores is None:
        raise HeadhuntError("--evaluate compares rankings: give --scores RUN")
    scores = read_scores(args.scores, args.metric)[0] if args.scores else None
    params = {
        "model": args.model,
        "scores": args.scores,
        "metric": args.metric,
        "keep": args.keep,
        "drop_heads": args.drop_heads,
        "unit": args.unit,
        "evaluate": args.evaluate,
        "sweep": args.sweep,
        "draws": args.draws,
        "lengths": args.lengths,
        "depths": args.depths,
        "ppl_windows": args.ppl_windows,
        "seed": args.seed,
    }
    run_dir = RunDir.open(
        args.out, "prune", resume=args.resume, force=args.force, parameters=params
    )
    if run_dir.complete:
        show(load_run(run_dir.out).json("prune.json"))
        return 0
    seed_everything(args.seed)
    t0 = time.perf_counter()
    model = open_model(args)
    if scores is not None:
        check_scores(scores, ModelShape.of(model.describe()), f"--scores {args.scores}")
    if args.drop_heads is not None:
        drop = sorted(set(parse_heads(args.drop_heads, model.n_layers, model.n_heads)))
        if not drop:
            raise HeadhuntError("--drop-heads names no head")
    else:
        by_kv = args.unit == "kv"
        ranking = ranked_heads(
            scores, "top", args.seed, n_kv_heads=model.n_kv_heads if by_kv else None
        )
        drop = heads_to_drop(ranking, args.keep, model.group_size if by_kv else 1)
    timings = {"load_model_s": time.perf_counter() - t0}
    evaluation = None
    if args.evaluate:
        evaluation = _evaluate(model, scores, args, run_dir)
        timings["evaluate_s"] = time.perf_counter() - t0 - timings["load_model_s"]
    full = model_size(model)
    record = prune_model(model, drop)
    save_pruned(model, run_dir.path("model"))
    result = {
        "dropped": record["dropped"],
        "kept_heads": model.n_layers * model.n_heads - len(record["dropped"]),
        "full": full,
        "pruned": model_size(model),
        "layers": record["layers"],
        "evaluation": evaluation,
    }
    write_json_atomic(run_dir.path("prune.json"), result)
    run_dir.finalize(model=model.describe(), parameters=params, timings=timings)
    show(result)
    print(f"run directory: {run_dir.out} (pruned model in {run_dir.out / 'model'})")
    return 0


def _evaluate(model, scores, args, run_dir) -> list[dict]:
    from headhunt.heads.prune_eval import PruneEvalConfig, prune_sweep, summarize

    keep = sorted({args.keep or 1.0, *(args.sweep or [])} - {1.0}, reverse=True)
    config = PruneEvalConfig(
        keep=keep or [1.0],
        draws=args.draws,
        lengths=args.lengths,
        depths=args.depths,
        ppl_windows=args.ppl_windows,
        batch_size=args.batch_size,
        seed=args.seed,
        unit=args.unit,
    )
    done = {r["condition"]: r["result"] for r in run_dir.records()}
    table = prune_sweep(
        model,
        scores,
        config,
        done=done,
        on_condition=lambda k, r: run_dir.append_record({"condition": k, "result": r}),
    )
    summary = summarize(table)
    summary.to_csv(run_dir.path("prune_eval.csv"), index=False)
    return summary.to_dict(orient="records")


def show(result: dict) -> None:
    import pandas as pd

    rows = [
        ("heads kept", result["kept_heads"]),
        ("heads dropped", len(result["dropped"])),
        ("parameters", f"{result['full']['parameters']:,} -> {result['pruned']['parameters']:,}"),
        (
            "KV bytes per token",
            f"{result['full']['kv_bytes_per_token']:,} -> {result['pruned']['kv_bytes_per_token']:,}",
        ),
        ("zero pad heads (uneven GQA groups)", result["pruned"]["pad_heads"]),
    ]
    print_table(pd.DataFrame(rows, columns=["", "value"]), title="Structural pruning")
    if result.get("evaluation"):
        df = pd.DataFrame(result["evaluation"])
        df = df[~df["order"].str.match(r"random\d")]
        cols = [
            "order",
            "keep",
            "parameters",
            "kv_bytes_per_token",
            "prefill_s",
            "perplexity",
            "needle_recall",
        ]
        print_table(
            df[cols], title="Pruning by ranking, reverse and random (random: mean of draws)"
        )
