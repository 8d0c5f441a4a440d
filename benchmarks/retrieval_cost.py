"""What a retrieval run costs per trial, by model size and device, on random-weight models of
the real models' shapes (SmolLM2-135M, Gemma 3 270M, Qwen2-1.5B): cost depends on the shape, not
the weights. A trial stops decoding at a newline or end of turn, which random weights reach
after an arbitrary number of tokens: the median response length is recorded with every number
(a real model answers a passkey in about 6-10 tokens).

    python benchmarks/retrieval_cost.py --device cuda --out cost_gpu.json
    taskset -c 0,1 python benchmarks/retrieval_cost.py --device cpu --shapes qwen2-1.5b ...

Every shape is timed twice over the same trials after one warm-up trial: one trial at a time
(``--batch-size 1``) and as the default run batches them (``--batch-size 0``). All shapes use
SmolLM2's tokenizer (the trials are built to a token count, so the tokenizer does not change
their cost). Nothing is downloaded: configs are written here, weights drawn at random.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from headhunt.heads.configs import RetrievalConfig
from headhunt.heads.retrieval import build_trials, run_needle_trials
from headhunt.probes.hooked import load_model

# The released models' shapes (their config.json values that set the cost).
SHAPES = {
    "smollm2-135m": dict(
        model_type="llama",
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        rope_theta=100000.0,
    ),
    "gemma3-270m": dict(
        model_type="gemma3_text",
        hidden_size=640,
        intermediate_size=2048,
        num_hidden_layers=18,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        vocab_size=262144,
        max_position_embeddings=32768,
        sliding_window=512,
        query_pre_attn_scalar=256,
        layer_types=[
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)
        ],
    ),
    "qwen2-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
    ),
}


def random_folder(name: str, tokenizer_dir: str, root: Path) -> Path:
    """A model folder of ``name``'s shape with random weights and SmolLM2's tokenizer."""
    from transformers import AutoConfig

    spec = dict(SHAPES[name])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    folder = root / name
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


def time_trials(model, config: RetrievalConfig) -> dict:
    trials = build_trials(model, config)
    run_needle_trials(model, trials[:1], config, progress=False)  # warm-up
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    out = {}
    for length in config.lengths:
        group = [t for t in trials if t.length == length]
        t0 = time.perf_counter()
        records = run_needle_trials(model, group, config, progress=False)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        tok = model.tokenizer
        new = [len(tok(r["response"], add_special_tokens=False).input_ids) for r in records]
        out[str(length)] = {
            "trials": len(group),
            "seconds": round(seconds, 3),
            "per_trial_s": round(seconds / len(group), 3),
            "response_tokens_median": statistics.median(new),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokenizer", required=True, help="a folder with SmolLM2's tokenizer")
    ap.add_argument("--lengths", default="500,2000")
    ap.add_argument("--repeats", type=int, default=2, help="trials per (length, depth) cell")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    result = {
        "device": torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "note": "random weights of the named shape; decoding runs the whole budget (upper bound)",
        "shapes": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.shapes.split(","):
            folder = random_folder(name, args.tokenizer, Path(tmp))
            t0 = time.perf_counter()
            model = load_model(str(folder), device=args.device, dtype=args.dtype)
            load_s = time.perf_counter() - t0
            row = {"load_s": round(load_s, 2), "dtype": str(model.dtype)}
            for bs in (1, 0):
                config = RetrievalConfig(
                    lengths=lengths,
                    depths=[25.0, 75.0],
                    needles=["passkey"],
                    repeats=args.repeats,
                    batch_size=bs,
                )
                row[f"batch_size_{bs}"] = time_trials(model, config)
            if args.device.startswith("cuda"):
                row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                torch.cuda.reset_peak_memory_stats()
            result["shapes"][name] = row
            print(name, json.dumps(row), flush=True)
            del model
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
