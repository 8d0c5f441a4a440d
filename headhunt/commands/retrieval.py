"""`headhunt retrieval`: score a model's retrieval heads on needle-in-a-haystack trials."""

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

DESCRIPTION = """Score every attention head's retrieval behaviour (Wu et al. 2024).

Each trial hides a needle sentence with a random answer in a haystack, asks for it, and decodes
greedily. A head scores when its attention argmax lies on the answer and the token there is the
one just produced; trials count only when the answer is right (ROUGE-1 recall > 0.5). Writes
manifest.json, scores.parquet, retrieval_heads.json (the reference's format), trials.jsonl,
duo_attention.tsv (layers x KV heads) and retrieval_heatmap.html."""

TRIALS = "trials.jsonl"


def add_parser(sub) -> None:
    p = add_command(sub, "retrieval", "score retrieval heads (needle in a haystack)", DESCRIPTION)
    add_model_args(p)
    add_out_args(p, "runs/retrieval")
    g = p.add_argument_group("trials")
    g.add_argument(
        "--lengths",
        type=comma_list(int, "length"),
        default="500,1000,2000",
        help="prompt lengths in tokens",
    )
    g.add_argument(
        "--depths",
        type=comma_list(float, "depth"),
        default="0,25,50,75,100",
        help="needle depths in percent",
    )
    g.add_argument(
        "--needles",
        type=comma_list(str, "needle"),
        default="passkey,city,magic",
        help="needle templates",
    )
    g.add_argument("--repeats", type=int, default=1, help="trials per (length, depth, needle)")
    g.add_argument("--max-new-tokens", type=int, default=24, help="decoding budget per trial")
    g.add_argument("--batch-size", type=int, default=0, help="trials decoded together (0: auto)")
    g.add_argument(
        "--haystack", default=None, help="text file for the haystack (default: bundled essays)"
    )
    g.add_argument(
        "--threshold", type=float, default=0.1, help="score above which a head is a retrieval head"
    )
    g.add_argument(
        "--kv-aggregate",
        choices=["max", "mean"],
        default="max",
        help="how duo_attention.tsv folds query heads into their KV head",
    )
    g.add_argument("--top", type=int, default=20, help="rows of the printed table")
    g.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes (one model replica each, one GPU each when there are GPUs); "
        "also works under torchrun",
    )
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from headhunt.heads.retrieval import RetrievalConfig

    return RetrievalConfig(
        lengths=args.lengths,
        depths=args.depths,
        needles=args.needles,
        repeats=args.repeats,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        haystack=args.haystack,
        threshold=args.threshold,
    )


def run(args: argparse.Namespace) -> int:
    from headhunt import distributed

    return distributed.main(args, _run)


def _run(args: argparse.Namespace, dist) -> int:
    import json

    import numpy as np

    from headhunt import distributed
    from headhunt.heads import retrieval as R
    from headhunt.heads.needles import read_haystack
    from headhunt.plots import head_heatmap, write_html
    from headhunt.rundir import load_run

    config = config_from_args(args)
    config.validate()
    read_haystack(config.haystack)  # fail on a bad haystack before loading the model
    params = {**config.to_dict(), "model": args.model, "kv_aggregate": args.kv_aggregate}
    run_dir = distributed.open_run(
        dist, args.out, "retrieval", resume=args.resume, force=args.force, parameters=params
    )
    if run_dir.complete:
        if dist.is_main:
            done = load_run(run_dir.out)
            show(done.scores(), done.manifest, args.top, args.threshold)
        return 0

    seed_everything(args.seed)
    t0 = time.perf_counter()
    model = open_model(args)
    t_load = time.perf_counter() - t0
    config.validate(model)
    trials = R.build_trials(model, config)
    # Whole decoding batches are dealt round-robin over the ranks; each keeps its finished
    # trials in its own shard.
    done = {r["id"] for r in distributed.shard_records(run_dir, TRIALS)}
    mine = [
        [t for t in b if t.id not in done]
        for b in dist.share(R.plan_batches(model, trials, config))
    ]
    mine = [b for b in mine if b]
    if done and dist.is_main:
        print(f"resuming: {len(done)} of {len(trials)} trials already done")
    shard = distributed.shard_name(dist, TRIALS)
    t1 = time.perf_counter()
    R.run_trials(
        model,
        [],
        config,
        batches=mine,
        progress=dist.is_main,
        on_record=lambda r: run_dir.append_record(r, shard),
    )
    # The slowest process sets the wall time; gathering also waits for every rank's shard.
    t_trials = max(dist.gather(time.perf_counter() - t1))
    if not dist.is_main:
        return 0

    by_id = {r["id"]: r for r in distributed.shard_records(run_dir, TRIALS)}
    records = [by_id[t.id] for t in trials]
    # One file, in trial order, however the work was split or resumed.
    distributed.merge_records(run_dir, TRIALS, records)
    scores = R.aggregate(records, model)
    scores.to_parquet(run_dir.path("scores.parquet"))
    run_dir.path("retrieval_heads.json").write_text(
        json.dumps(R.reference_json(records, model.n_layers, model.n_heads))
    )
    mean = scores.matrix(R.METRIC)
    kv = R.kv_group_table(mean, model.n_kv_heads, args.kv_aggregate)
    np.savetxt(run_dir.path("duo_attention.tsv"), kv, delimiter="\t", fmt="%.6f")
    write_html(
        head_heatmap(mean, f"Retrieval score: {model.name}", "retrieval score"),
        run_dir.path("retrieval_heatmap.html"),
    )
    counted = sum(r["counted"] for r in records)
    out = run_dir.finalize(
        model=model.describe(),
        parameters=params,
        timings={
            "load_model_s": t_load,
            "trials_s": t_trials,
            "trials_per_s": len(trials) / max(t_trials, 1e-9),
        },
        extra={
            "processes": dist.world,
            "summary": {
                "trials": len(records),
                "counted_trials": counted,
                "retrieval_heads": int((mean > config.threshold).sum()),
                "heads": int(mean.size),
            },
            "interchange": {
                "retrieval_heads.json": 'reference format {"layer-head": [score per counted trial]}, 0-based, query heads',
                "duo_attention.tsv": f"layers x KV heads, tab separated, {args.kv_aggregate} over each KV group's query heads",
            },
        },
    )
    run_ = load_run(out)
    show(run_.scores(), run_.manifest, args.top, args.threshold)
    print(f"run directory: {out}")
    return 0


def show(scores, manifest, top: int, threshold: float) -> None:
    s = manifest.get("summary", {})
    table = scores.top("retrieval_score", top)[["layer", "head", "kv_head", "value"]]
    table = table.rename(columns={"value": "retrieval_score"})
    print_table(table, title=f"Top {top} retrieval heads: {manifest['model'].get('spec')}")
    if s:
        pct = 100 * s["retrieval_heads"] / max(s["heads"], 1)
        print(
            f"{s['retrieval_heads']} of {s['heads']} heads ({pct:.1f}%) score above {threshold}; "
            f"{s['counted_trials']} of {s['trials']} trials answered correctly and counted"
        )
