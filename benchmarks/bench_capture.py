"""End-to-end capture benchmark: per-head attention statistics (lse, argmax, column sums) of
every layer in one forward pass, against a plain SDPA forward of the same model and input.

    python benchmarks/bench_capture.py --model smollm2-135m --length 8192
    python benchmarks/bench_capture.py --llama8b --length 32768      # random 8B-shaped Llama, GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from headhunt.probes.capture import capture_attention_stats
from headhunt.probes.hooked import HookedModel, load_model


def llama8b(device: str) -> HookedModel:
    """A randomly initialised Llama with Llama-3-8B's shape, in bf16 on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128_256,
        hidden_size=4096,
        intermediate_size=14_336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131_072,
        rope_theta=500_000.0,
        attn_implementation="sdpa",
    )
    cfg.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)  # the same weights in every script that builds it
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    return HookedModel(model=model.eval(), tokenizer=None, name="random-llama-8b-shape")


def measure(fn, device: torch.device, repeats: int) -> dict:
    times, peaks = [], []
    for _ in range(repeats + 1):  # the first call is warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
            peaks.append((torch.cuda.max_memory_allocated() - base) / 2**30)
        times.append(time.perf_counter() - t)
    return {
        "median_s": statistics.median(times[1:]),
        "all_s": times[1:],
        "peak_extra_gib": max(peaks) if peaks else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument(
        "--llama8b", action="store_true", help="random 8B-shaped Llama instead of --model"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--length", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--eager-layer", action="store_true", help="also try one layer's dense N x N pattern"
    )
    p.add_argument("--out", default="bench_capture.json")
    args = p.parse_args()

    if args.llama8b:
        dev = "cuda" if args.device == "auto" else args.device
        model = llama8b(dev)
    else:
        model = load_model(args.model, device=args.device)
    dev = model.device
    ids = torch.randint(100, 20_000, (1, args.length), device=dev)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(
        f"{model.name} ({model.n_layers}x{model.n_heads}, {model.n_kv_heads} KV, d{model.head_dim}) "
        f"at {args.length} tokens on {name}, {model.dtype}",
        flush=True,
    )

    def plain():
        with torch.inference_mode():
            model.model(ids, use_cache=False, logits_to_keep=1)

    def stats():
        out = capture_attention_stats(model, ids)
        assert len(out) == model.n_layers and out[0].col_sum.shape[-1] == args.length

    report = {
        "model": model.name,
        "shape": model.describe(),
        "device": name,
        "length": args.length,
        "plain_sdpa_forward": measure(plain, dev, args.repeats),
        "stats_capture_forward": measure(stats, dev, args.repeats),
    }
    report["time_ratio"] = (
        report["stats_capture_forward"]["median_s"] / report["plain_sdpa_forward"]["median_s"]
    )
    if args.eager_layer:
        # What eager capture needs for ONE layer: the [heads, n, n] pattern (bf16 scores, fp32 softmax).
        try:
            q = torch.randn(
                1, model.n_heads, args.length, model.head_dim, device=dev, dtype=model.dtype
            )
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            s = q @ q.transpose(-1, -2)
            pattern = s.float().softmax(-1)
            report["eager_one_layer"] = {
                "peak_extra_gib": (torch.cuda.max_memory_allocated() - base) / 2**30
            }
            del s, pattern
        except torch.OutOfMemoryError as e:
            report["eager_one_layer"] = {"error": "OOM", "detail": str(e).splitlines()[0]}
        torch.cuda.empty_cache()
    print(json.dumps(report, indent=2))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
