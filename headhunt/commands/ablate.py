"""`headhunt ablate`: the causal check for retrieval heads."""

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
    require,
    seed_everything,
)

DESCRIPTION = """Mask the top-K retrieval heads of a `headhunt retrieval` run, then K random heads
(several draws, excluding the top heads and every head above the run's threshold), and compare
needle-in-a-haystack recall on fresh trials (other answers and haystack offsets than the scoring
run's). Writes ablation.json and the ranking used to scores.parquet."""


def add_parser(sub) -> None:
    p = add_command(sub, "ablate", "mask top retrieval heads vs random heads", DESCRIPTION)
    add_model_args(p)
    add_out_args(p, "runs/ablate")
    g = p.add_argument_group("ablation")
    g.add_argument(
        "--scores", required=True, help="a retrieval run directory to take the ranking from"
    )
    g.add_argument("--top-k", type=int, default=10, help="heads to mask")
    g.add_argument("--draws", type=int, default=3, help="random head sets")
    g.add_argument(
        "--mode",
        choices=["query", "output"],
        default="query",
        help="query: zero the query (uniform attention, as Wu et al.); output: zero the head's output",
    )
    g.add_argument(
        "--lengths", type=comma_list(int, "length"), default="1000,2000", help="prompt lengths"
    )
    g.add_argument(
        "--depths",
        type=comma_list(float, "depth"),
        default="0,50,100",
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
    g.add_argument("--batch-size", type=int, default=8, help="trials decoded together")
    g.add_argument(
        "--haystack", default=None, help="text file for the haystack (default: bundled essays)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from headhunt.errors import HeadhuntError
    from headhunt.heads.causal import ablation_check
    from headhunt.heads.retrieval import METRIC, RetrievalConfig, build_trials, stop_token_ids
    from headhunt.rundir import RunDir, load_run, write_json_atomic

    require(args.top_k >= 1, "--top-k must be at least 1")
    require(args.batch_size >= 1, "--batch-size must be at least 1")
    source = load_run(args.scores)
    if source.method != "retrieval":
        raise HeadhuntError(
            f"{args.scores} is a {source.method} run; --scores needs a retrieval run"
        )
    scores = source.scores()
    model_info = source.manifest.get("model")
    require(
        isinstance(model_info, dict)
        and isinstance(model_info.get("n_layers"), int)
        and isinstance(model_info.get("n_heads"), int),
        f"{source.path / 'manifest.json'} does not say which model made the run (no model "
        "n_layers/n_heads)",
    )
    if args.draws < 1:
        raise HeadhuntError("--draws must be at least 1")
    # Fresh trials: another seed stream than any scoring run's, so answers and offsets differ.
    config = RetrievalConfig(
        lengths=args.lengths,
        depths=args.depths,
        needles=args.needles,
        repeats=args.repeats,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed + 1_000_003,
        haystack=args.haystack,
    )
    config.validate()
    params = {
        **config.to_dict(),
        "model": args.model,
        "scores": str(source.path),
        "top_k": args.top_k,
        "draws": args.draws,
        "mode": args.mode,
        "batch_size": args.batch_size,
    }
    run_dir = RunDir.open(
        args.out, "ablate", resume=args.resume, force=args.force, parameters=params
    )
    if run_dir.complete:
        show(load_run(run_dir.out).json("ablation.json"))
        return 0
    seed_everything(args.seed)
    t0 = time.perf_counter()
    model = open_model(args)
    shape = (model.n_layers, model.n_heads)
    src_shape = (source.manifest["model"]["n_layers"], source.manifest["model"]["n_heads"])
    if shape != src_shape:
        raise HeadhuntError(
            f"--scores was made on a {src_shape[0]}x{src_shape[1]} model, not this {shape[0]}x{shape[1]} one"
        )
    config.validate(model)
    trials = build_trials(model, config)
    ranked = [(int(r.layer), int(r.head)) for r in scores.top(METRIC, len(scores.df)).itertuples()]
    above = scores.heads(METRIC, source.manifest["parameters"].get("threshold", 0.1))
    done = {r["condition"]: r["recall"] for r in run_dir.records()}
    t1 = time.perf_counter()
    result = ablation_check(
        model,
        trials,
        ranked,
        top_k=args.top_k,
        draws=args.draws,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        stop_ids=stop_token_ids(model.tokenizer),
        exclude=above,
        mode=args.mode,
        batch_size=args.batch_size,
        done=done,
        on_condition=lambda name, rec: run_dir.append_record({"condition": name, "recall": rec}),
    )
    write_json_atomic(run_dir.path("ablation.json"), result.to_dict())
    scores.to_parquet(run_dir.path("scores.parquet"))
    run_dir.finalize(
        model=model.describe(),
        parameters=params,
        timings={"load_model_s": t1 - t0, "ablation_s": time.perf_counter() - t1},
        extra={
            "summary": {
                "baseline": result.baseline,
                "top_masked": result.top_masked,
                "random_masked_mean": result.random_mean,
                "trials": len(trials),
            }
        },
    )
    show(result.to_dict())
    print(f"run directory: {run_dir.out}")
    return 0


def show(result: dict) -> None:
    import pandas as pd

    rows = [
        ("no heads masked", result["baseline"]),
        (f"top-{result['top_k']} heads masked", result["top_masked"]),
    ]
    rows += [
        (f"random {result['top_k']} heads, draw {i}", v)
        for i, v in enumerate(result["random_masked"])
    ]
    rows += [(f"random {result['top_k']} heads, mean", result["random_mean"])]
    print_table(
        pd.DataFrame(rows, columns=["condition", "needle recall (ROUGE-1 x100)"]),
        title="Causal check: masking retrieval heads",
    )
