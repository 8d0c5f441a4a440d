"""Where does a GPU retrieval run stop being reproducible? Hashes of every decoding batch
(tokens and attention argmax) and of every layer's prefill outputs, to compare between two
processes (or cards), plus the CUDA kernels one prefill and one decode step launch.

    python benchmarks/gpu_determinism.py --model M.gguf --out run_a.json
    python benchmarks/gpu_determinism.py --model M.gguf --out run_b.json
    python benchmarks/gpu_determinism.py --compare run_a.json run_b.json

In-process repeats are compared too (``repeat_mismatch``): a kernel that differs between
calls in one process is racing or atomic; one that differs only between processes depends on
something chosen at start-up (autotuning, workspace, heuristics on free memory).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch


def digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def layer_hashes(model, prompts: torch.Tensor) -> dict[str, str]:
    """Prefill (no cache): a hash of every layer's attention and MLP output, and of the logits."""
    out: dict[str, str] = {}
    handles = []
    for i, layer in enumerate(model.model.model.layers):
        for name in ("self_attn", "mlp"):

            def hook(_m, _inp, o, key=f"{i:02d}.{name}"):
                out[key] = digest(o[0] if isinstance(o, tuple) else o)

            handles.append(getattr(layer, name).register_forward_hook(hook))
    try:
        with torch.inference_mode():
            logits = model.model(prompts, use_cache=False, logits_to_keep=1).logits
        out["logits"] = digest(logits)
    finally:
        for h in handles:
            h.remove()
    return out


def kernel_names(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})


def run(args) -> dict:
    from headhunt.engine import seed_everything
    from headhunt.heads import retrieval as R
    from headhunt.probes.capture import greedy_decode
    from headhunt.probes.hooked import load_model

    seed_everything(0)
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    config = R.RetrievalConfig(
        lengths=[int(x) for x in args.lengths.split(",")],
        depths=[0, 11, 22, 33, 44, 56, 67, 78, 89, 100],
    )
    trials = R.build_trials(model, config)
    batches = R.plan_batches(model, trials, config)
    stop = R.stop_token_ids(model.tokenizer)
    result: dict = {
        "device": torch.cuda.get_device_name() if model.device.type == "cuda" else "cpu",
        "batches": [],
        "repeat_mismatch": [],
    }
    t0 = time.perf_counter()
    for bi, batch in enumerate(batches):
        prompts = torch.tensor([t.input_ids for t in batch], device=model.device)
        hashes = []
        for _ in range(args.repeats):
            d = greedy_decode(model, prompts, max_new_tokens=24, stop_ids=stop, capture_argmax=True)
            hashes.append((digest(d.tokens), digest(d.argmax)))
        if len(set(hashes)) > 1:
            result["repeat_mismatch"].append(bi)
        result["batches"].append({"ids": [t.id for t in batch], "hash": hashes[0]})
    result["decode_s"] = time.perf_counter() - t0
    longest = torch.tensor([t.input_ids for t in batches[-1]], device=model.device)
    per_layer = [layer_hashes(model, longest) for _ in range(args.repeats)]
    result["layers"] = per_layer[0]
    result["layers_repeat_mismatch"] = sorted(
        k for k in per_layer[0] if any(p[k] != per_layer[0][k] for p in per_layer[1:])
    )
    if model.device.type != "cuda":
        return result
    with torch.inference_mode():
        result["prefill_kernels"] = kernel_names(
            lambda: model.model(longest, use_cache=False, logits_to_keep=1)
        )
        result["decode_kernels"] = kernel_names(
            lambda: greedy_decode(model, longest[:, :-8], max_new_tokens=2, capture_argmax=True)
        )
    return result


def compare(a: dict, b: dict) -> dict:
    diff = [
        i
        for i, (x, y) in enumerate(zip(a["batches"], b["batches"], strict=True))
        if x["hash"] != y["hash"]
    ]
    layers = [k for k in sorted(a["layers"]) if a["layers"][k] != b["layers"].get(k)]
    return {
        "batches": len(a["batches"]),
        "batches_differ": diff,
        "first_layer_outputs_differ": layers[:4],
        "layer_outputs_differ": len(layers),
        "repeat_mismatch": (a["repeat_mismatch"], b["repeat_mismatch"]),
        "layers_repeat_mismatch": (
            a["layers_repeat_mismatch"][:4],
            b["layers_repeat_mismatch"][:4],
        ),
        "decode_s": (a["decode_s"], b["decode_s"]),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--lengths", default="2000,5600,7200")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--sdpa", choices=["flash", "efficient", "math", "cudnn"])
    p.add_argument("--out")
    p.add_argument("--compare", nargs=2)
    args = p.parse_args()
    if args.compare:
        a, b = (json.loads(Path(f).read_text()) for f in args.compare)
        print(json.dumps(compare(a, b), indent=1))
        return
    if args.sdpa:  # pin SDPA to one backend (flash, efficient, math, cudnn)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
        names |= {"math": "MATH", "cudnn": "CUDNN_ATTENTION"}
        with sdpa_kernel([getattr(SDPBackend, names[args.sdpa])]):
            res = run(args)
    else:
        res = run(args)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(
        json.dumps(
            {k: res[k] for k in ("device", "repeat_mismatch", "layers_repeat_mismatch", "decode_s")}
        )
    )


if __name__ == "__main__":
    main()
