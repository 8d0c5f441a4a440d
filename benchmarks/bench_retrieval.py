"""Benchmark: headhunt's retrieval scorer vs a faithful re-implementation of the reference's
per-head loop, and vs plain greedy generation, on the same trials and device, in one run.

The reference (Retrieval_Head's retrieval_head_detection.py) decodes one trial at a time with
eager attention, and at every generated token loops in Python over every layer and head, calling
topk and .item() on each: a host-device sync per head per token. Its prefill here uses SDPA (as
generous to it as possible). Ours batches the trials of one length, decodes with SDPA and takes
every head's argmax in one operation per layer.

    python benchmarks/bench_retrieval.py --lengths 1000,2000 --repeats 3 --out bench.json

``per_layer`` times headhunt with the decode argmax taken one layer at a time through
``attention_stats`` (the path before the many-layer kernel; on the CPU both are the same);
``all_rows`` with the argmax also taken for rows that already stopped (the path before
``skip_stopped_rows``; its records must equal headhunt's).
On a big grid, ``--reference-every N`` runs the reference loop on every N-th trial only: its
cost is per trial (no batching), so its trials/s on an even sample of the grid stands for
the whole grid; agreement is then checked on those trials. ``--once`` times the methods it
names in the first repeat only (checks, and the slow reference loop).

Every timed method first runs over the whole grid once (warm-up: Triton compiles shape
specialisations, the allocator grows); then, in each repeat, the methods take turns on each
batch, the first one rotating from batch to batch.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import threading
import time
from contextlib import contextmanager, nullcontext
from functools import partial

import numpy as np
import torch

from headhunt.heads import retrieval
from headhunt.heads.retrieval import (
    RetrievalConfig,
    build_trials,
    plan_batches,
    run_needle_trials,
    stop_token_ids,
)
from headhunt.probes import capture
from headhunt.probes.capture import _cache, greedy_decode
from headhunt.probes.hooked import load_model


def reference_trial(
    model, trial, max_new_tokens: int, stop_ids: set[int]
) -> tuple[np.ndarray, list[int]]:
    """One trial the reference's way; returns its [layers, heads] score and its tokens."""
    dev = model.device
    prompt = torch.tensor(trial.input_ids, device=dev)
    s, e = trial.span
    scores = np.zeros((model.n_layers, model.n_heads))
    tokens = []
    with torch.inference_mode():
        out = model.model(prompt[None, :-1], None, None, None, use_cache=True, logits_to_keep=1)
        past, inp = _cache(out), prompt[-1]
        for m in model.modules:
            m.headhunt_base = "eager"  # output_attentions needs eager decoding
        try:
            for _ in range(max_new_tokens):
                out = model.model(
                    inp.view(1, 1), None, None, past, use_cache=True, output_attentions=True
                )
                past = _cache(out)
                inp = out.logits[0, -1].argmax()
                tokens.append(inp.item())
                for layer in range(model.n_layers):
                    for head in range(model.n_heads):
                        values, idx = out.attentions[layer][0][head][-1].topk(1)
                        for _v, i in zip(values, idx, strict=True):
                            if s <= i < e and inp.item() == prompt[i].item():
                                scores[layer][head] += 1 / (e - s)
                if inp.item() in stop_ids:
                    break
        finally:
            for m in model.modules:
                m.headhunt_base = "sdpa"
    return scores, tokens


@contextmanager
def every_row_scored():
    """headhunt with the argmax taken for rows that already stopped, too."""
    real = retrieval.greedy_decode

    def decode(*args, **kwargs):
        return real(*args, **{**kwargs, "skip_stopped_rows": False})

    retrieval.greedy_decode = decode
    try:
        yield
    finally:
        retrieval.greedy_decode = real


@contextmanager
def per_layer_path():
    """headhunt with the decode argmax taken one layer at a time (attention_stats)."""
    batched = capture.DecodeArgmax._batched_ok
    capture.DecodeArgmax._batched_ok = lambda self, call: False
    try:
        yield
    finally:
        capture.DecodeArgmax._batched_ok = batched


def profile_decoding(model, trials, config, stop) -> dict[str, str]:
    """cProfile of decoding the first length's first batch: plain, headhunt, per layer."""
    group = [t for t in trials if t.length == trials[0].length]
    prompts = torch.tensor([t.input_ids for t in group[: config.batch_size or len(group)]])
    out = {}
    for label, cap, path in [
        ("plain_greedy", False, nullcontext),
        ("headhunt", True, nullcontext),
        ("per_layer", True, per_layer_path),
    ]:
        prof = cProfile.Profile()
        with path():
            prof.enable()
            greedy_decode(model, prompts, max_new_tokens=config.max_new_tokens, capture_argmax=cap)
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        out[label] = text.getvalue()
    return out


class PeakRSS:
    """Samples the process's resident memory (CPU runs) every 10 ms."""

    def __enter__(self):
        import psutil

        self.proc, self.peak, self.stop = psutil.Process(), 0, False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self.stop:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()


def timed(fn, device: torch.device) -> tuple[float, float, object]:
    """(seconds, peak memory in GiB, result): CUDA peak allocated on GPU, peak RSS on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t, torch.cuda.max_memory_allocated() / 2**30, result
    with PeakRSS() as rss:
        t = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t
    return dt, rss.peak / 2**30, result


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--methods", default="headhunt,plain_greedy,reference_loop")
    p.add_argument("--reference-every", type=int, default=1)
    p.add_argument("--once", default="", help="methods timed in the first repeat only")
    p.add_argument("--profile", action="store_true", help="cProfile one batch's decoding")
    p.add_argument("--lengths", default="1000,2000")
    p.add_argument("--depths", default="0,50,100")
    p.add_argument("--needles", default="passkey,city,magic")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=0)
    p.add_argument("--out", default="bench_retrieval.json")
    args = p.parse_args()

    model = load_model(args.model, device=args.device, dtype=args.dtype)
    dev = model.device
    config = RetrievalConfig(
        lengths=[int(x) for x in args.lengths.split(",")],
        depths=[float(x) for x in args.depths.split(",")],
        needles=args.needles.split(","),
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
    )
    trials = build_trials(model, config)
    stop = stop_token_ids(model.tokenizer)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"{len(trials)} trials on {name}, {model.dtype}, lengths {config.lengths}")

    batches = plan_batches(model, trials, config)
    sample = list(range(0, len(trials), args.reference_every))
    sampled = {trials[i].id for i in sample}

    def ours(batch):
        return run_needle_trials(model, trials, config, progress=False, batches=[batch])

    def all_rows(batch):
        # The scorer with the argmax taken for every row at every step (stopped rows too).
        with every_row_scored():
            return ours(batch)

    def per_layer(batch):
        with per_layer_path():
            return ours(batch)

    def plain(batch):
        prompts = torch.tensor([t.input_ids for t in batch])
        greedy_decode(model, prompts, max_new_tokens=config.max_new_tokens, stop_ids=stop)

    def reference(batch):
        return [
            reference_trial(model, t, config.max_new_tokens, stop) for t in batch if t.id in sampled
        ]

    known = {
        "headhunt": ours,
        "all_rows": all_rows,
        "per_layer": per_layer,
        "plain_greedy": plain,
        "reference_loop": reference,
    }
    methods = {m: known[m] for m in args.methods.split(",")}
    once = set(args.once.split(",")) if args.once else set()
    # Warm-up (kernels compiled for every shape the grid meets, allocator, caches): the
    # timed methods over every batch of the grid; the others on the first batch (their
    # kernels do not specialise on length), the reference loop on a short decode.
    for label, fn in methods.items():
        if label == "reference_loop":
            reference_trial(model, trials[0], 4, stop)
        else:
            for batch in batches if label not in once else batches[:1]:
                fn(batch)

    # Methods take turns on each batch, the first one rotating from batch to batch, so a
    # drift of the card's clocks or of the host reaches every method alike; a method's
    # time for one repeat is the sum over the grid's batches.
    results, outputs = {}, {}
    labels = list(methods)
    for rep in range(args.repeats):
        active = [m for m in labels if rep == 0 or m not in once]
        per_batch = {m: [] for m in active}
        records = {m: [] for m in active}
        for i, batch in enumerate(batches):
            k = (i + rep) % len(active)
            for label in active[k:] + active[:k]:
                dt, mem, out = timed(partial(methods[label], batch), dev)
                per_batch[label].append(dt)
                r = results.setdefault(label, {"seconds": [], "peak_gib": [], "batch_seconds": []})
                r["peak_gib"].append(mem)
                if out is not None:
                    records[label].extend(out)
        for label in active:
            results[label]["seconds"].append(sum(per_batch[label]))
            results[label]["batch_seconds"].append(per_batch[label])
            outputs[label] = records[label]
        print(
            f"repeat {rep}: " + ", ".join(f"{m} {sum(per_batch[m]):.2f} s" for m in active),
            flush=True,
        )

    summary = {}
    for label, r in results.items():
        med = statistics.median(r["seconds"])
        n = len(sample) if label == "reference_loop" else len(trials)
        summary[label] = {
            "trials": n,
            "median_s": med,
            "trials_per_s": n / med,
            "peak_gib": max(r["peak_gib"]),
            "repeats": len(r["seconds"]),
            "all_seconds": r["seconds"],
            "spread_s": [min(r["seconds"]), max(r["seconds"])],
            "batch_lengths": [b[0].length for b in batches],
            "batch_seconds": r["batch_seconds"],
        }
    ours_med = summary["headhunt"]["median_s"]
    check = {}
    if "reference_loop" in outputs:
        ours_s = [r for r in outputs["headhunt"] if r["id"] in sampled]
        a = np.array([r["scores"] for r in ours_s])
        b = np.array([scores for scores, _ in outputs["reference_loop"]])
        diff = np.abs(a - b).max((1, 2))
        # A differing trial whose two decoders wrote different responses differs for that
        # reason alone (other tokens to copy, other steps).
        responses = [
            model.tokenizer.decode([x for x in toks if x not in stop], skip_special_tokens=True)
            for _, toks in outputs["reference_loop"]
        ]
        same = [r["response"] == x for r, x in zip(ours_s, responses, strict=True)]
        check = {
            "trials": len(sample),
            "max_abs_diff": float(diff.max()),
            "identical_trials": int((diff < 1e-6).sum()),
            "same_responses": sum(same),
            "differing": [
                {"id": r["id"], "max_diff": float(d), "same_response": ok}
                for r, d, ok in zip(ours_s, diff, same, strict=True)
                if d >= 1e-6
            ],
        }
        summary["speedup_vs_reference"] = (
            summary["headhunt"]["trials_per_s"] / summary["reference_loop"]["trials_per_s"]
        )
    if "per_layer" in outputs:
        a = np.array([r["scores"] for r in outputs["headhunt"]])
        b = np.array([r["scores"] for r in outputs["per_layer"]])
        check["per_layer_identical_trials"] = int((np.abs(a - b).max((1, 2)) < 1e-6).sum())
        check["per_layer_max_abs_diff"] = float(np.abs(a - b).max())
        summary["speedup_vs_per_layer"] = summary["per_layer"]["median_s"] / ours_med
    if "all_rows" in outputs:
        # Skipping the argmax of stopped rows must leave every record as it was.
        check["all_rows_identical_records"] = outputs["all_rows"] == outputs["headhunt"]
    if "plain_greedy" in summary:
        summary["overhead_vs_plain"] = ours_med / summary["plain_greedy"]["median_s"] - 1
        # Repeat by repeat (the two took turns on every batch of that repeat).
        hh_s, plain_s = results["headhunt"]["seconds"], results["plain_greedy"]["seconds"]
        if len(hh_s) == len(plain_s):
            summary["overhead_per_repeat"] = [a / b - 1 for a, b in zip(hh_s, plain_s, strict=True)]
    report = {
        "device": name,
        "dtype": str(model.dtype),
        "torch": torch.__version__,
        "trials": len(trials),
        "config": config.to_dict(),
        "results": summary,
        "agreement_with_reference": check,
        "counted_trials": sum(r["counted"] for r in outputs["headhunt"]),
    }
    if args.profile:
        report["profile"] = profile_decoding(model, trials, config, stop)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print("| method | median s | trials/s | peak GiB |")
    print("|---|---|---|---|")
    for label in methods:
        r = summary[label]
        print(f"| {label} | {r['median_s']:.2f} | {r['trials_per_s']:.2f} | {r['peak_gib']:.2f} |")
    print({k: v for k, v in summary.items() if not isinstance(v, dict)}, check)


if __name__ == "__main__":
    main()
