"""A model split over the visible GPUs with ``--device-map auto`` (accelerate's dispatch): an
8B-shaped random Llama's all-head attention statistics (log-sum-exp, argmax, per-key column
sums) at long context, each layer's kernels on that layer's GPU, against the same model on one
GPU.

    python benchmarks/bench_device_map.py --lengths 32768,65536 --out device_map.json

Checks: the split model's statistics equal the one-GPU model's at --check-length tokens (same
weights, same input); at every length every head's column sums add up to the number of queries
(each attention row sums to 1), and every layer's statistics were computed on its own GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from bench_capture import llama8b  # benchmarks/ is on the path when run as a script

from headhunt.probes.capture import capture_attention_stats
from headhunt.probes.hooked import HookedModel, dispatch


def sync() -> None:
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)


def measure(fn, repeats: int) -> dict:
    """Median wall time over ``repeats`` after a warm-up; peak allocated above the start, per GPU."""
    times, peaks = [], []
    n = torch.cuda.device_count()
    for _ in range(repeats + 1):
        sync()
        base = [torch.cuda.memory_allocated(i) for i in range(n)]
        for i in range(n):
            torch.cuda.reset_peak_memory_stats(i)
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
        peaks.append([(torch.cuda.max_memory_allocated(i) - base[i]) / 2**30 for i in range(n)])
    return {
        "median_s": statistics.median(times[1:]),
        "all_s": times[1:],
        "peak_extra_gib_per_gpu": [max(p[i] for p in peaks) for i in range(n)],
    }


def gpu_memory() -> list[float]:
    return [torch.cuda.memory_allocated(i) / 2**30 for i in range(torch.cuda.device_count())]


def run_lengths(model: HookedModel, lengths: list[int], repeats: int, label: str) -> dict:
    out = {}
    for n in lengths:
        ids = torch.randint(100, 20_000, (1, n), device=model.device)

        def plain(ids=ids):
            with torch.inference_mode():
                model.model(ids, use_cache=False, logits_to_keep=1)

        devices: dict[int, str] = {}

        def stats(ids=ids, n=n, devices=devices):
            st = capture_attention_stats(model, ids)
            for layer, s in st.items():
                devices[layer] = str(s.col_sum.device)
            # All-head column sums, gathered on the first GPU: [layers, heads, n].
            col = torch.stack([st[i].col_sum[0].float().to(model.device) for i in sorted(st)])
            total = col.sum(-1)  # each head's column sums add up to the n queries
            assert torch.allclose(total, torch.full_like(total, n), rtol=2e-2), total
            return col

        try:
            rec = {
                "plain_sdpa_forward": measure(plain, repeats),
                "stats_capture_forward": measure(stats, repeats),
            }
            rec["time_ratio"] = (
                rec["stats_capture_forward"]["median_s"] / rec["plain_sdpa_forward"]["median_s"]
            )
            rec["stats_devices"] = sorted(set(devices.values()))
            rec["layer_devices"] = devices
        except torch.OutOfMemoryError as e:
            rec = {"error": "OOM", "detail": str(e).splitlines()[0]}
        torch.cuda.empty_cache()
        print(label, n, json.dumps({k: v for k, v in rec.items() if k != "layer_devices"}))
        out[str(n)] = rec
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lengths", default="32768,65536")
    p.add_argument("--check-length", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--device-map", default="auto")
    p.add_argument("--single", action="store_true", help="also time the unsplit model on GPU 0")
    p.add_argument("--out", default="bench_device_map.json")
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    print("GPUs:", gpus, flush=True)
    report: dict = {"gpus": gpus, "lengths": lengths}

    t = time.perf_counter()
    model = llama8b("cuda:0")
    report["build_s"] = time.perf_counter() - t
    ids = torch.randint(100, 20_000, (1, args.check_length), device="cuda:0")
    ref = {k: v for k, v in capture_attention_stats(model, ids).items()}
    ref = {k: (v.lse.cpu(), v.col_sum.cpu(), v.argmax.cpu()) for k, v in ref.items()}
    if args.single:
        report["one_gpu"] = run_lengths(model, lengths, args.repeats, "one GPU")

    t = time.perf_counter()
    split = HookedModel(
        model=dispatch(model.model, args.device_map), tokenizer=None, name=model.name
    )
    report["dispatch_s"] = time.perf_counter() - t
    dm = split.model.hf_device_map
    layers_on = {}
    for name, dev in dm.items():
        layers_on.setdefault(str(dev), []).append(name)
    report["device_map"] = {d: len(v) for d, v in layers_on.items()}
    report["device_map_modules"] = dm
    report["weights_gib_per_gpu"] = gpu_memory()
    print("device map (modules per device):", report["device_map"], flush=True)
    print("allocated GiB per GPU:", [round(x, 2) for x in report["weights_gib_per_gpu"]])

    got = capture_attention_stats(split, ids)
    same = {"lse": True, "col_sum": True, "argmax": True}
    maxdiff = {"lse": 0.0, "col_sum": 0.0}
    per_layer = {}
    for k, (lse, col, am) in ref.items():
        g = got[k]
        per_layer[k] = {
            "device": str(g.lse.device),
            "lse_max_abs_diff": (lse.float() - g.lse.cpu().float()).abs().max().item(),
            "argmax_same": torch.equal(am, g.argmax.cpu()),
        }
        same["lse"] &= torch.equal(lse, g.lse.cpu())
        same["col_sum"] &= torch.equal(col, g.col_sum.cpu())
        same["argmax"] &= torch.equal(am, g.argmax.cpu())
        maxdiff["lse"] = max(maxdiff["lse"], (lse.float() - g.lse.cpu().float()).abs().max().item())
        maxdiff["col_sum"] = max(
            maxdiff["col_sum"], (col.float() - g.col_sum.cpu().float()).abs().max().item()
        )
    report["split_equals_one_gpu"] = {
        "tokens": args.check_length,
        "identical": same,
        "max_abs_diff": maxdiff,
        "layer_devices": sorted({str(got[k].col_sum.device) for k in got}),
        "per_layer": per_layer,
    }
    summary = {k: v for k, v in report["split_equals_one_gpu"].items() if k != "per_layer"}
    print("split vs one GPU at", args.check_length, "tokens:", summary)
    print(
        "per layer (device, max |lse diff|):",
        [(v["device"][-1], round(v["lse_max_abs_diff"], 3)) for v in per_layer.values()],
    )
    del got, ref
    report["split"] = run_lengths(split, lengths, args.repeats, "split")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
