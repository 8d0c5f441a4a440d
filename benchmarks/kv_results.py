"""The numbers of docs/kv.md, on one GPU: structural pruning and KV-cache head pruning of the
embedded model ranked by its retrieval scores (benchmarks/results/smollm2_h200/scores.parquet),
and the KV memory of an 8B-shaped Llama (random weights) at 32k tokens.

    python3 benchmarks/kv_results.py --model /tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from headhunt.scores import HeadScores

SCORES = Path(__file__).parent / "results" / "smollm2_h200" / "scores.parquet"


def prune_part(model, scores: np.ndarray, out: Path, unit: str) -> None:
    from headhunt.heads.evaluations.prune_eval import PruneEvalConfig, prune_sweep, summarize

    cfg = PruneEvalConfig(
        keep=[0.95, 0.9, 0.85, 0.8, 0.7, 0.5],
        draws=3,
        lengths=[1000, 2000],
        depths=[0.0, 25.0, 50.0, 75.0, 100.0],
        batch_size=32,
        unit=unit,
    )
    t0 = time.perf_counter()
    table = summarize(prune_sweep(model, scores, cfg, progress=False))
    table.to_csv(out / f"prune_eval_{unit}.csv", index=False)
    print(f"prune sweep: {len(table)} rows in {time.perf_counter() - t0:.1f} s", flush=True)


def kv_part(
    model, scores: np.ndarray, out: Path, lengths: list[int], fractions: list[float], repeats: int
) -> None:
    from headhunt.heads.evaluations.kv_eval import (
        KVEvalConfig,
        build_eval_trials,
        kv_eval,
        kv_rankings,
        summarize,
    )

    cfg = KVEvalConfig(
        fractions=fractions, lengths=lengths, task_repeats=repeats, random_draws=3, batch_size=32
    )
    trials = build_eval_trials(model, cfg)
    t0 = time.perf_counter()
    table = kv_eval(model, cfg, kv_rankings(model, cfg, scores), trials, progress=False)
    table.to_parquet(out / "kv_eval.parquet", index=False)
    summarize(table).to_csv(out / "kv_summary.csv", index=False)
    print(f"kv-eval: {len(trials)} trials x {table['ranking'].nunique()} rankings in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip


def prune_bar_part(
    model,
    scores: np.ndarray,
    out: Path,
    lengths: list[int],
    repeats: int,
    deadline: float,
    drop_counts: list[int],
    effect_file: str | None = None,
    random_at: list[int] | None = None,
) -> None:
    """The pruning bar: the most heads dropped with needle recall within 2 points of the full
    model. Heads go lowest retrieval score first; heads of equal score (159 of 270 score 0)
    in order of their masking effect on a calibration set (:func:`masking_effect`), least
    first. Drop counts grow until two in a row miss the bar (or time runs out); then random
    draws (and the ranking with random tie-breaks, the old order) at the largest count that
    held. Every condition answers the same trials: changes are paired, with standard errors."""
    import copy

    from headhunt.heads.evaluations.prune_eval import (
        PruneEvalConfig,
        masking_effect,
        materials,
        measure,
        needle_trials,
        summarize,
    )
    from headhunt.heads.interventions.pruning import prune_model, ranked_heads

    cfg = PruneEvalConfig(
        lengths=lengths, depths=[0.0, 25.0, 50.0, 75.0, 100.0], repeats=repeats,
        calibration_repeats=2, batch_size=256,
    )  # fmt: skip
    t0 = time.perf_counter()
    if effect_file:  # a masking effect measured earlier (same model, same calibration trials)
        effect = np.load(effect_file)
    else:
        effect = masking_effect(model, needle_trials(model, cfg, calibration=True), batch_size=32)
        np.save(out / "masking_effect.npy", effect)
        print(f"masking effect of {effect.size} heads in {time.perf_counter() - t0:.1f} s")
    m = materials(model, cfg)
    n = effect.size
    orders = {
        "headhunt": ranked_heads(scores, "top", 0, secondary=effect),
        "headhunt_random_ties": ranked_heads(scores, "top", 0),
    }
    for i in range(5):
        orders[f"random{i}"] = ranked_heads(scores, "random", 7919 * (i + 1))
    rows = [{"order": "none", "keep": 1.0, "dropped": 0, **measure(model, m, cfg)}]
    full = np.asarray(rows[0]["recall"])
    print(f"full model: recall {full.mean():.2f} on {full.size} trials", flush=True)

    def condition(order: str, k: int) -> float:
        pruned = copy.deepcopy(model)
        prune_model(pruned, sorted(orders[order][n - k :]))
        row = {"order": order, "keep": (n - k) / n, "dropped": k, **measure(pruned, m, cfg)}
        rows.append(row)
        d = np.asarray(row["recall"]) - full
        se = d.std(ddof=1) / np.sqrt(d.size)
        print(f"{order} -{k}: recall {row['needle_recall']:.2f} change {d.mean():+.2f} "
              f"(SE {se:.2f}) ppl {row['perplexity']:.2f} [{time.perf_counter() - t0:.0f} s]",
              flush=True)  # fmt: skip
        return float(d.mean())

    best, misses = 0, 0
    for k in drop_counts:
        if k >= n:
            break
        if time.perf_counter() > deadline:
            print("prune bar: out of time", flush=True)
            break
        if condition("headhunt", k) >= -2.0:
            best, misses = (k if misses == 0 else best), 0
        else:
            misses += 1
            if misses == 2:
                break
    for at in random_at or [best or 3]:
        for order in ["headhunt_random_ties", *[o for o in orders if o.startswith("random")]]:
            if time.perf_counter() > deadline + 60:
                break
            condition(order, at)
    (out / "prune_bar.json").write_text(json.dumps({"budget_dropped": best, "rows": rows}) + "\n")
    summarize(pd.DataFrame(rows)).to_csv(out / "prune_bar.csv", index=False)


def kv_bar_part(
    model,
    scores: np.ndarray,
    out: Path,
    lengths: list[int],
    needle_repeats: int,
    task_repeats: int,
    deadline: float,
    sinks_sink: int | None = None,
) -> None:
    """The kv-eval bar: the smallest share of full KV heads (headhunt's ranking) keeping both
    needle and RULER-like accuracy within 1 point of the full cache, found by lowering the
    share until two in a row miss; then random draws at that share. Paired trials."""
    from headhunt.heads.evaluations import kv_eval as kv

    cfg = kv.KVEvalConfig(
        fractions=[1.0], lengths=lengths, needle_repeats=needle_repeats,
        task_repeats=task_repeats, random_draws=3, batch_size=256,
    )  # fmt: skip
    trials = kv.build_eval_trials(model, cfg)
    rankings = kv.kv_rankings(model, cfg, scores)
    t0 = time.perf_counter()
    results = {kv.condition_key(kv.FULL, 1.0): kv.run_condition(model, trials, None, 1.0, cfg)}
    conds = [(kv.FULL, 1.0)]

    def run(name: str, f: float, config=cfg) -> tuple[float, float]:
        ranking = rankings[name.removesuffix(f"_s{config.sink}")]
        results[kv.condition_key(name, f)] = kv.run_condition(model, trials, ranking, f, config)
        conds.append((name, f))
        s = kv.summarize(kv.table_of(conds, results))
        s = s[(s["ranking"] == name) & (s["fraction"] == f)].set_index("task")
        print(f"{name} {f:g}: " + ", ".join(
            f"{t} {s.loc[t, 'accuracy']:.2f} ({s.loc[t, 'change']:+.2f} SE {s.loc[t, 'change_se']:.2f})"
            for t in ("needle", "ruler")) + f" [{time.perf_counter() - t0:.0f} s]", flush=True)  # fmt: skip
        return float(s.loc["needle", "change"]), float(s.loc["ruler", "change"])

    best, misses = None, 0
    for f in (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5):
        if time.perf_counter() > deadline:
            print("kv bar: out of time", flush=True)
            break
        if min(run("headhunt", f)) >= -1.0:
            best, misses = (f if misses == 0 else best), 0
        else:
            misses += 1
            if misses == 2:
                break
    at = best if best is not None else 0.9
    for i in range(cfg.random_draws):
        if time.perf_counter() > deadline + 60:
            break
        run(f"random{i}", at)
    if sinks_sink is not None:  # the sink size a sinks run gives, at the shares tried above
        bigger = dataclasses.replace(cfg, sink=sinks_sink)
        for f in sorted({f for name, f in conds if name == "headhunt"}, reverse=True):
            if time.perf_counter() > deadline + 90:
                break
            run(f"headhunt_s{sinks_sink}", f, bigger)
    table = kv.table_of(conds, results)
    table.to_parquet(out / "kv_bar.parquet", index=False)
    summary = kv.summarize(table)
    summary.to_csv(out / "kv_bar_summary.csv", index=False)
    (out / "kv_bar.json").write_text(
        json.dumps({"smallest_fraction_within": best, "random_at": at, "trials": len(trials)})
        + "\n"
    )


def llama8b_part(out: Path, length: int) -> None:
    """KV bytes and peak GPU memory of prefill + 8 decoded tokens at ``length`` tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from headhunt.heads.interventions.kvcache import (
        generate_with_plan,
        plan_from_ranking,
        random_ranking,
    )
    from headhunt.probes.hooked import HookedModel

    cfg = LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=False,
    )  # fmt: skip
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        hf = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model = HookedModel(model=hf.eval(), tokenizer=None, name="llama-3-8b-shaped (random weights)")
    ids = torch.randint(0, 128000, (1, length))
    rows = []
    order = random_ranking(32 * 8, 0)
    for fraction in (1.0, 0.5, 0.25, 0.0):
        plan = None if fraction == 1.0 else plan_from_ranking(order, (32, 8), fraction, 128, 256)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        _, _, nbytes = generate_with_plan(model, ids, plan, max_new_tokens=8)
        torch.cuda.synchronize()
        rows.append(
            {
                "full_kv_fraction": fraction,
                "cache": "transformers DynamicCache" if plan is None else "headhunt SplitCache",
                "kv_bytes": nbytes,
                "peak_above_weights_bytes": torch.cuda.max_memory_allocated() - base,
                "seconds": time.perf_counter() - t0,
            }
        )
        print(rows[-1], flush=True)
    info = {
        "model": model.name,
        "context_tokens": length,
        "decoded_tokens": 8,
        "sink": 128,
        "recent": 256,
        "card": torch.cuda.get_device_name(),
        "rows": rows,
    }
    (out / "kv_llama8b.json").write_text(json.dumps(info, indent=2) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--parts", default="prune,kv,8b")
    p.add_argument("--unit", default="head", help="structural pruning unit: head or kv")
    p.add_argument("--kv-lengths", default="2000,4000")
    p.add_argument("--length-8b", type=int, default=32768)
    p.add_argument("--kv-fractions", default="0,0.1,0.25,0.5,0.75,1")
    p.add_argument(
        "--kv-repeats", type=int, default=3, help="RULER-like trials per task and length"
    )
    p.add_argument(
        "--scores", default=str(SCORES), help="retrieval scores: .parquet or .npy matrix"
    )
    p.add_argument("--sinks-sink", type=int, default=None, help="kv-bar: also this sink size")
    p.add_argument("--needle-repeats", type=int, default=5, help="kv-bar: needle trials per cell")
    p.add_argument("--drop-counts", default="3,6,9,12,15,18,21,24,30,36,45,54,72,90")
    p.add_argument("--random-at", default=None, help="prune-bar: drop counts for random draws")
    p.add_argument("--masking-effect", default=None, help="prune-bar: a saved masking_effect.npy")
    p.add_argument("--prune-lengths", default="1000,2000", help="prune-bar: needle lengths")
    p.add_argument("--prune-repeats", type=int, default=10, help="prune-bar: trials per cell")
    p.add_argument("--seconds", type=float, default=520, help="prune-bar + kv-bar time budget")
    args = p.parse_args()
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    if {"prune", "kv", "prune-bar", "kv-bar"} & set(parts):
        from headhunt.probes.hooked import load_model

        model = load_model(args.model)
        print(model.describe(), torch.cuda.get_device_name(), flush=True)
        if args.scores.endswith(".npy"):  # a [layers, heads] matrix (no pyarrow needed)
            scores = np.load(args.scores)
        else:
            scores = HeadScores.read_parquet(args.scores).matrix("retrieval_score")
        if "kv" in parts:
            lengths = [int(x) for x in args.kv_lengths.split(",")]
            fractions = [float(x) for x in args.kv_fractions.split(",")]
            kv_part(model, scores, out, lengths, fractions, args.kv_repeats)
        if "prune" in parts:
            prune_part(model, scores, out, args.unit)
        if "prune-bar" in parts:
            share = 0.45 if "kv-bar" in parts else 0.85
            lengths = [int(x) for x in args.prune_lengths.split(",")]
            prune_bar_part(
                model, scores, out, lengths, args.prune_repeats, start + share * args.seconds,
                [int(x) for x in args.drop_counts.split(",")], args.masking_effect,
                [int(x) for x in args.random_at.split(",")] if args.random_at else None,
            )  # fmt: skip
        if "kv-bar" in parts:
            kv_bar_part(
                model, scores, out, [int(x) for x in args.kv_lengths.split(",")],
                args.needle_repeats, args.kv_repeats,
                start + 0.8 * args.seconds, args.sinks_sink,
            )  # fmt: skip
        del model
    if "8b" in parts:
        llama8b_part(out, args.length_8b)


if __name__ == "__main__":
    main()
