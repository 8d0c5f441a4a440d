"""Benchmark: the retrieval scorer at 32k-128k tokens on a random Llama-3-8B-shaped model
(32 layers, 32 query / 8 KV heads, d128, bf16) on one GPU, against plain greedy decoding of
the same batches.

The weights are random, so the scores and responses mean nothing: this measures time and
memory only. The tokenizer is a real one (``--tokenizer``, a saved Hugging Face tokenizer
folder; the vocabulary is sized to it) so that trials are built as in a real run, from the
haystack in ``--haystack`` (the bundled corpus holds 56k tokens; a 128k trial needs a longer
text).

    python benchmarks/bench_retrieval_long.py --tokenizer tok/ --haystack long.txt \\
        --lengths 32768,65536,131072 --depths 0,50,100 --out long.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from headhunt.heads.retrieval import (
    RetrievalConfig,
    build_trials,
    run_needle_trials,
    stop_token_ids,
)
from headhunt.probes.capture import greedy_decode
from headhunt.probes.hooked import HookedModel


def llama8b_shape(vocab_size: int, max_context: int) -> torch.nn.Module:
    """Llama-3-8B's shape with ``vocab_size`` tokens, random bf16 weights on the GPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=4096,
        intermediate_size=14_336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=max_context,
        rope_theta=500_000.0,
        attn_implementation="sdpa",
    )
    cfg.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    return model.eval()


def timed(fn) -> tuple[float, float]:
    """(seconds, peak allocated GiB) of ``fn()``."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--haystack", required=True)
    p.add_argument("--lengths", default="32768,65536,131072")
    p.add_argument("--depths", default="0,50,100")
    p.add_argument("--needles", default="passkey")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument(
        "--token-budget", type=int, default=262_144, help="prompt tokens per batch (halved on OOM)"
    )
    p.add_argument("--out", default="bench_retrieval_long.json")
    args = p.parse_args()

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    lengths = [int(x) for x in args.lengths.split(",")]
    config = RetrievalConfig(
        lengths=lengths,
        depths=[float(x) for x in args.depths.split(",")],
        needles=args.needles.split(","),
        max_new_tokens=args.max_new_tokens,
        haystack=args.haystack,
    )
    net = llama8b_shape(len(tok), max(lengths) + args.max_new_tokens + 8)
    model = HookedModel(model=net, tokenizer=tok, name="random-llama-8b-shape")
    trials = build_trials(model, config)
    stop = stop_token_ids(tok)
    name = torch.cuda.get_device_name()
    print(
        f"{len(trials)} trials on {name}, weights {torch.cuda.memory_allocated() / 2**30:.1f} GiB"
    )

    # Warm-up (kernel compilation): one short trial, both paths.
    warm = RetrievalConfig(**{**config.to_dict(), "lengths": [2048], "depths": [50.0]})
    warm_trials = build_trials(model, warm)
    run_needle_trials(model, warm_trials, warm, progress=False)
    greedy_decode(model, torch.tensor([warm_trials[0].input_ids]), max_new_tokens=4)

    rows, out_of_memory = [], []
    for length in lengths:
        queue = [t for t in trials if t.length == length]
        bs = max(1, args.token_budget // length)
        first = True
        while queue:
            batch = queue[:bs]
            try:
                s_ours, gib_ours = timed(
                    lambda batch=batch: run_needle_trials(
                        model, batch, config, progress=False, batches=[batch]
                    )
                )
            except torch.OutOfMemoryError:
                # Does not fit on this card: note it, halve the batch and go on.
                out_of_memory.append({"length": length, "trials": len(batch)})
                print(f"out of memory: {len(batch)} trials of {length} tokens", flush=True)
                torch.cuda.empty_cache()
                if bs == 1:
                    raise
                bs //= 2
                continue
            queue = queue[len(batch) :]
            row = {
                "length": length,
                "trials": len(batch),
                "headhunt_s": s_ours,
                "headhunt_peak_gib": gib_ours,
            }
            if first:  # plain greedy decoding of the same batch, once per length
                prompts = torch.tensor([t.input_ids for t in batch])
                try:
                    s_plain, gib_plain = timed(
                        lambda prompts=prompts: greedy_decode(
                            model, prompts, max_new_tokens=config.max_new_tokens, stop_ids=stop
                        )
                    )
                    row.update(plain_s=s_plain, plain_peak_gib=gib_plain)
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    row.update(plain_s=None, plain_peak_gib="out of memory")
                first = False
            rows.append(row)
            print(row, flush=True)

    total = sum(r["headhunt_s"] for r in rows)
    report = {
        "device": name,
        "torch": torch.__version__,
        "model": "random Llama-3-8B shape (32 layers, 32/8 heads, d128), bf16, vocab "
        f"{len(tok)}; scores meaningless (random weights)",
        "config": config.to_dict(),
        "token_budget": args.token_budget,
        "batches": rows,
        "out_of_memory": out_of_memory,
        "grid_trials": len(trials),
        "grid_seconds": total,
        "trials_per_s": len(trials) / total,
        "peak_gib": max(r["headhunt_peak_gib"] for r in rows),
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: v for k, v in report.items() if k != "batches"}, indent=1))


if __name__ == "__main__":
    main()
