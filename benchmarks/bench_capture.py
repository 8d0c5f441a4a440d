"""End-to-end capture benchmark: per-head attention statistics (lse, argmax, column sums) of
every layer in one forward pass, against a plain SDPA forward of the same model and input.

Variants, each timed in the same process on the same card (median after a warm-up):

- ``plain``: the model's forward (its own SDPA kernel), nothing captured;
- ``fused_rows``: row statistics (lse, max, argmax) of every layer from the fused kernel,
  which computes each layer's attention output as well (no column pass);
- ``fused_cols``: the same plus column sums / means (one more pass over the keys);
- ``fused_cols_offload``: ``fused_cols`` with each layer's statistics copied to pinned host
  memory as they come (``StatsCapture(offload=True)``);
- ``two_pass``: the model's SDPA, then the statistics kernels on q, k (``fused=False``,
  row and column passes), the path before the fused kernel.

``--spread`` runs the plain forward once under each of SDPA's CUDA backends (flash,
memory-efficient, cuDNN) and reports how far their last-position logits (and one layer's
outputs) lie from each other: the yardstick for the fused kernel's own difference.

``--layer`` adds one attention layer of the model's shape on its own (CUDA): SDPA as the
model calls it, the fused kernel, the column pass alone, and the column pass's floor on
this card (its matrix products at the measured bf16 matmul rate, its exponentials at the
special-function units' rate), plus the fused output's largest difference from SDPA's.

    python benchmarks/bench_capture.py --model smollm2-135m --lengths 8192
    python benchmarks/bench_capture.py --llama8b --lengths 65536,131072 --layer  # 8B shape, GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

from headhunt.probes.capture import StatsCapture
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


def _bench_ms(fn) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=3, rep=30, return_mode="median"))


def _mufu_ex2_per_s(device: torch.device) -> float:
    """Peak ``ex2`` rate of the special-function units: 16 per SM per clock on Hopper
    (4 per SM sub-partition, CUDA C programming guide's arithmetic throughput table), at
    the card's maximum SM clock (nvidia-smi)."""
    props = torch.cuda.get_device_properties(device)
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits", "-i",
         str(device.index or 0)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return props.multi_processor_count * 16 * float(out.split()[0]) * 1e6


def layer_bench(model: HookedModel, n: int) -> dict:
    """One attention layer of the model's shape at ``n`` tokens, bf16, causal, with q, k, v
    laid out as the model hands them over ([b, n, heads, d] memory, viewed [b, heads, n, d])."""
    import dataclasses

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from headhunt.kernels import attention_forward, attention_stats
    from headhunt.kernels.config import fused_config
    from headhunt.kernels.launch import attention_forward_triton, prepare
    from headhunt.kernels.triton_columns import launch_columns

    dev, dt = model.device, model.dtype
    hq, hkv, d = model.n_heads, model.n_kv_heads, model.head_dim
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, n, hq, d, device=dev, dtype=dt, generator=g).transpose(1, 2)
    k = torch.randn(1, n, hkv, d, device=dev, dtype=dt, generator=g).transpose(1, 2)
    v = torch.randn(1, n, hkv, d, device=dev, dtype=dt, generator=g).transpose(1, 2)
    module = model.modules[0]
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def run_sdpa():
        return sdpa(module, q, k, v, None, dropout=0.0, scaling=module.scaling)[0]

    out = {"tokens": n}
    out["sdpa_ms"] = _bench_ms(run_sdpa)
    out["fused_rows_ms"] = _bench_ms(lambda: attention_forward(q, k, v, key_stats=False))
    # The general Triton kernel on the same call (the default is the Gluon fast path on
    # Hopper; the same kernel elsewhere).
    general = dataclasses.replace(fused_config(d, dt), fast_path=False)
    out["fused_rows_general_kernel_ms"] = _bench_ms(
        lambda: attention_forward_triton(q, k, v, key_stats=False, config=general)
    )
    out["fused_cols_ms"] = _bench_ms(lambda: attention_forward(q, k, v))
    out["two_pass_stats_ms"] = _bench_ms(lambda: attention_stats(q, k))
    fo, fst = attention_forward(q, k, v, key_stats=False)
    L = prepare(q, k, None, fused_config(d, dt)).with_bounds()
    col_sum = torch.empty(1, hq, n, device=dev)
    col_mean = torch.empty_like(col_sum)
    out["column_pass_ms"] = _bench_ms(lambda: launch_columns(L, fst.lse, col_sum, col_mean))
    ref = run_sdpa()
    diff = (fo.transpose(1, 2).float() - ref.float()).abs()
    out["fused_vs_sdpa_max_abs_diff"] = diff.max().item()
    out["fused_vs_sdpa_mean_abs_diff"] = diff.mean().item()
    out["sdpa_output_max_abs"] = ref.float().abs().max().item()
    # Floor of the column pass: a causal QK^T (2 d flops per visible score) at the measured
    # bf16 matmul rate, and one exp2 per visible score at the special-function units' rate.
    a = torch.randn(8192, 8192, device=dev, dtype=dt)
    mm_flops = 2 * 8192**3 / (_bench_ms(lambda: a @ a) * 1e-3)
    visible = hq * n * (n + 1) / 2
    qk_ms = 2 * d * visible / mm_flops * 1e3
    exp_ms = visible / _mufu_ex2_per_s(dev) * 1e3
    out["matmul_tflops_measured"] = mm_flops / 1e12
    out["column_floor"] = {
        "qk_ms": qk_ms,
        "exp_ms": exp_ms,
        "overlapped_ms": max(qk_ms, exp_ms),
        "serial_ms": qk_ms + exp_ms,
    }
    return out


def sweep(model: HookedModel, n: int, candidates: list[tuple]) -> dict:
    """Time the fused forward (row statistics only) for tile choices of the general kernel
    (block_m, block_n, warps, stages, argmax mode, TMA) and the default (the Gluon fast path
    where it applies) at one layer of ``n`` tokens laid out as the model's; install the
    fastest as the default for the rest of the run."""
    import dataclasses

    from headhunt.kernels import launch
    from headhunt.kernels.config import fused_config
    from headhunt.kernels.launch import attention_forward_triton

    dev, dt, d = model.device, model.dtype, model.head_dim
    q = torch.randn(1, n, model.n_heads, d, device=dev, dtype=dt).transpose(1, 2)
    k = torch.randn(1, n, model.n_kv_heads, d, device=dev, dtype=dt).transpose(1, 2)
    v = torch.randn_like(k)
    base = fused_config(d, dt)
    times, configs = {}, {}
    named = [("fast path (Gluon, Hopper)", base)] if base.fast_path else []
    for bm, bn, w, st, am, tma in candidates:
        cfg = dataclasses.replace(
            base, row_block_m=bm, row_block_n=bn, row_warps=w, row_stages=st, argmax_mode=am,
            row_tma=tma, fast_path=False,
        )  # fmt: skip
        named.append((f"{bm}x{bn} warps {w} stages {st} argmax {am} tma {int(tma)}", cfg))
    for name, cfg in named:
        try:
            ms = _bench_ms(
                lambda cfg=cfg: attention_forward_triton(q, k, v, key_stats=False, config=cfg)
            )
        except Exception as e:  # out of shared memory / registers: not a candidate
            print(f"{name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        times[name], configs[name] = ms, cfg
        print(f"{name}: {ms:.2f} ms", flush=True)
    best = min(times, key=times.get)
    launch.fused_config = lambda head_dim, dtype=dt: configs[best]
    return {"tokens": n, "ms": times, "chosen": best}


def end_to_end(
    model: HookedModel, ids: torch.Tensor, repeats: int, two_pass: bool, offload: bool = True
) -> dict:
    """Plain forward vs the capture variants (module docstring) on ``ids``."""
    dev = model.device
    logits = {}

    def plain():
        with torch.inference_mode():
            logits["plain"] = model.model(ids, use_cache=False, logits_to_keep=1).logits

    def capture(key_stats: bool, fused: bool, tag: str, offload: bool = False):
        def fn():
            cap = StatsCapture(fused=fused, key_stats=key_stats, offload=offload)
            with model.hooks(cap), torch.inference_mode():
                out = model.model(ids, use_cache=False, logits_to_keep=1)
            cap.finish()
            logits[tag] = out.logits
            assert len(cap.stats) == model.n_layers
            assert (cap.stats[0].col_sum is not None) == key_stats
            assert len(cap.fused_layers) == (model.n_layers if fused else 0)

        return fn

    run = {"length": ids.shape[1]}
    run["plain"] = measure(plain, dev, repeats)
    run["fused_rows"] = measure(capture(False, True, "fused"), dev, repeats)
    run["fused_cols"] = measure(capture(True, True, "fused"), dev, repeats)
    if dev.type == "cuda" and offload:
        run["fused_cols_offload"] = measure(capture(True, True, "fused", True), dev, repeats)
    if two_pass:
        run["two_pass"] = measure(capture(True, False, "two_pass"), dev, repeats)
    base = run["plain"]
    for key in ("fused_rows", "fused_cols", "fused_cols_offload", "two_pass"):
        if key in run:
            run[key]["time_ratio"] = run[key]["median_s"] / base["median_s"]
            if base["peak_extra_gib"]:
                run[key]["memory_ratio"] = run[key]["peak_extra_gib"] / base["peak_extra_gib"]
    # The last position's logits through the fused kernel vs through the model's own kernel.
    lp = logits["plain"].float()
    run["fused_logits_max_abs_diff"] = (logits["fused"].float() - lp).abs().max().item()
    run["logits_max_abs"] = lp.abs().max().item()
    if "two_pass" in logits:
        run["two_pass_logits_equal_plain"] = bool(torch.equal(logits["two_pass"], logits["plain"]))
    return run


def backend_spread(model: HookedModel, ids: torch.Tensor) -> dict:
    """Largest |difference| between SDPA's CUDA backends: the last position's logits of the
    whole model, and one layer's output (q, k, v as in :func:`layer_bench`), each backend
    against the one the model picks by default. A backend that refuses the shape is noted."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    dev, dt = model.device, model.dtype
    n, hq, hkv, d = ids.shape[1], model.n_heads, model.n_kv_heads, model.head_dim
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, n, hq, d, device=dev, dtype=dt, generator=g).transpose(1, 2)
    k = torch.randn(1, n, hkv, d, device=dev, dtype=dt, generator=g).transpose(1, 2)
    v = torch.randn(1, n, hkv, d, device=dev, dtype=dt, generator=g).transpose(1, 2)
    module, sdpa = model.modules[0], ALL_ATTENTION_FUNCTIONS["sdpa"]

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            logits = model.model(ids, use_cache=False, logits_to_keep=1).logits.float()
            layer = sdpa(module, q, k, v, None, dropout=0.0, scaling=module.scaling)[0]
        return logits, layer.float()

    default_logits, default_layer = both()
    out = {"tokens": n}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION):  # fmt: skip
        try:
            with sdpa_kernel([backend]):
                logits, layer = both()
        except RuntimeError as e:
            out[backend.name] = {"error": str(e).splitlines()[0][:200]}
            continue
        out[backend.name] = {
            "logits_max_abs_diff_vs_default": (logits - default_logits).abs().max().item(),
            "layer_max_abs_diff_vs_default": (layer - default_layer).abs().max().item(),
        }
        del logits, layer
        torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument(
        "--llama8b", action="store_true", help="random 8B-shaped Llama instead of --model"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--lengths", default="8192", help="comma-separated token counts")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--two-pass-upto", type=int, default=1 << 30,
        help="time the two-pass variant only up to this many tokens",
    )  # fmt: skip
    p.add_argument("--layer", action="store_true", help="also time one attention layer alone")
    p.add_argument(
        "--layer-only", action="store_true", help="only the one-layer timings (implies --layer)"
    )
    p.add_argument(
        "--sweep", type=int, default=0, help="first pick the fused tiles at this many tokens"
    )
    p.add_argument(
        "--no-offload", action="store_true", help="skip the offloaded variant (saves time)"
    )
    p.add_argument(
        "--spread", action="store_true", help="also compare SDPA's backends with each other"
    )
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
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    report = {"model": model.name, "shape": model.describe(), "device": name, "runs": []}
    if args.sweep:
        cands = [
            (128, 64, 8, 3, 2, False), (64, 64, 4, 3, 2, False), (64, 64, 4, 3, 3, False),
            (128, 64, 8, 3, 3, False), (128, 64, 8, 3, 2, True), (128, 64, 8, 3, 3, True),
            (64, 64, 4, 3, 3, True), (128, 128, 8, 2, 3, True), (64, 128, 4, 3, 3, True),
            (128, 64, 8, 4, 3, True),
        ]  # fmt: skip
        report["sweep"] = sweep(model, args.sweep, cands)
    for n in map(int, args.lengths.split(",")):
        ids = torch.randint(100, 20_000, (1, n), device=dev)
        print(
            f"{model.name} ({model.n_layers}x{model.n_heads}, {model.n_kv_heads} KV, "
            f"d{model.head_dim}) at {n} tokens on {name}, {model.dtype}",
            flush=True,
        )
        run = {"tokens": n}
        if not args.layer_only:
            run = end_to_end(
                model,
                ids,
                args.repeats,
                two_pass=n <= args.two_pass_upto,
                offload=not args.no_offload,
            )
        if (args.layer or args.layer_only) and dev.type == "cuda":
            run["layer"] = layer_bench(model, n)
        if args.spread and dev.type == "cuda":
            run["sdpa_backend_spread"] = backend_spread(model, ids)
        print(json.dumps(run, indent=2), flush=True)
        report["runs"].append(run)
        torch.cuda.empty_cache() if dev.type == "cuda" else None
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    if args.eager_layer and dev.type == "cuda":
        n = int(args.lengths.split(",")[-1])
        # What eager capture needs for ONE layer: the [heads, n, n] pattern (bf16 scores,
        # fp32 softmax).
        try:
            q = torch.randn(1, model.n_heads, n, model.head_dim, device=dev, dtype=model.dtype)
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
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
