"""The numbers of docs/kv.md, on one GPU: structural pruning and KV-cache head pruning of the
embedded model ranked by its retrieval scores (benchmarks/results/smollm2_h200/scores.parquet),
and the KV memory of an 8B-shaped Llama (random weights) at 32k tokens.

    python3 benchmarks/kv_results.py --model /tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from headhunt.heads.scores import HeadScores

SCORES = Path(__file__).parent / "results" / "smollm2_h200" / "scores.parquet"


def prune_part(model, scores: np.ndarray, out: Path, unit: str) -> None:
    from headhunt.heads.prune_eval import PruneEvalConfig, prune_sweep, summarize

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
    from headhunt.heads.kv_eval import (
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


def llama8b_part(out: Path, length: int) -> None:
    """KV bytes and peak GPU memory of prefill + 8 decoded tokens at ``length`` tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from headhunt.heads.kvcache import generate_with_plan, plan_from_ranking, random_ranking
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
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    if {"prune", "kv"} & set(parts):
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
        del model
    if "8b" in parts:
        llama8b_part(out, args.length_8b)


if __name__ == "__main__":
    main()
