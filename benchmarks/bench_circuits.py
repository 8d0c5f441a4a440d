"""Time the discrete-SAE circuit method against its ground truth on one model and task.

Measures, in one process on one device: head-output capture of the task's prompts, one SAE
trial (training on ``--sae-examples`` prompts, then codes and node/edge scores), per-head
activation patching over all heads (the ground truth) and attribution patching (EAP). The SAE
method's time is capture + one trial (median over ``--trials``); patching and EAP are timed
``--repeats`` times after one warm-up call on GPUs.

    python benchmarks/bench_circuits.py --task ioi --pairs 24 --out bench_circuits.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from headhunt.probes import load_model
from headhunt.sae import activations, patching, tasks
from headhunt.sae.circuits import CircuitConfig, run_sae_trials


def timed(fn, device: str) -> tuple[object, float]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="auto")
    p.add_argument("--task", default="ioi")
    p.add_argument("--pairs", type=int, default=24)
    p.add_argument("--trials", type=int, default=3, help="SAE trials timed (median)")
    p.add_argument("--repeats", type=int, default=1, help="timed patching / EAP calls")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model = load_model(a.model, device=a.device)
    device = str(model.device)
    pairs = tasks.make_pairs(a.task, model.tokenizer, a.pairs, seed=0, require_aligned=True)
    seqs = pairs.positive + pairs.negative
    warm = device.startswith("cuda")
    if warm:  # compile/cuBLAS warm-up, not timed
        activations.head_outputs(model, seqs, progress=False)
        patching.activation_patching(model, pairs, progress=False)
        patching.attribution_patching(model, pairs)
    acts, capture_s = timed(lambda: activations.head_outputs(model, seqs, progress=False), device)
    cfg = CircuitConfig(trials=a.trials)
    trials = run_sae_trials(acts, cfg, progress=False)
    trial_s = [t.seconds["sae_train"] + t.seconds["sae_score"] for t in trials]
    patch_s = [
        timed(lambda: patching.activation_patching(model, pairs, progress=False), device)[1]
        for _ in range(a.repeats)
    ]
    eap_s = [
        timed(lambda: patching.attribution_patching(model, pairs), device)[1]
        for _ in range(a.repeats)
    ]
    sae_method = capture_s + statistics.median(trial_s)
    res = {
        "model": model.describe(),
        "device": torch.cuda.get_device_name() if warm else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "task": a.task,
        "pairs": a.pairs,
        "capture_s": capture_s,
        "sae_trial_s": trial_s,
        "sae_method_s": sae_method,
        "patching_s": patch_s,
        "eap_s": eap_s,
        "patching_over_sae": statistics.median(patch_s) / sae_method,
        "eap_over_sae": statistics.median(eap_s) / sae_method,
    }
    print(json.dumps(res, indent=2))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
