"""Why are discrete-SAE node scores weak, and which settings fix that? (docs/circuits.md)

Two steps, so that the model-heavy part runs once and the sweep can run anywhere:

``prepare`` (needs the model): for each item, capture every head's pre-projection output
``z`` on its prompt pairs, reduced over positions both ways ("mean" and "last"), and write one
``.npz`` per item plus the model's W_O. An item is either a finished ``headhunt circuits`` run
(its pairs, patching ground truth and EAP are reused, never recomputed) or ``task:seed:pairs``
(EAP is computed and the truth is then binarised |mean EAP|, for when patching is too dear):

    python benchmarks/circuits_sweep.py prepare --out runs/exp/acts \
        --runs ioi:2:32 greater-than:2:32 docstring:2:32 ioi:1:32 greater-than:1:32 docstring:1:32

``sweep`` (no model; CPU or GPU): rebuild the head outputs ``z @ W_O`` and run SAE trials with
headhunt's own code (``headhunt.sae.circuits.run_trial``) stage by stage on the *selection*
split, pick the (setting, node rule) with the best mean AUC over tasks, then report it, the
same setting with an untrained SAE and the old defaults on the *held-out* split:

    python benchmarks/circuits_sweep.py sweep --acts runs/exp/acts --select s2 --heldout s1 \
        --trials 3 --heldout-trials 10 --budget-s 150 --out sweep.json

Every AUC is against the item's binarised truth (share 0.5, as the CLI).
Every node rule of ``headhunt.sae.scoring.NodeScores`` is scored (|P \\ N|, normalised, the
share of positive prompts with a positive-only code, the share of pairs whose code changes),
edge scores on the held-out runs only (they cost most), EAP on the same pairs as each trial.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
import torch

KEYS = ("dict_size", "sae_examples", "position", "head_norm", "subsample", "l1", "epochs")


def prepare(a: argparse.Namespace) -> None:
    from safetensors.torch import load_file

    from headhunt.probes import load_model
    from headhunt.probes.hooked import HookedModel
    from headhunt.sae import activations, patching, tasks
    from headhunt.sae.activations import HeadOutputCapture

    class BothPositions(HeadOutputCapture):
        """Keeps z reduced both ways ("mean", "last") in one forward pass."""

        def __init__(self, skip_first: bool):
            self.parts = {p: HeadOutputCapture(p, skip_first) for p in ("mean", "last")}
            self.z = {p: c.z for p, c in self.parts.items()}

        def after(self, call, output):
            for c in self.parts.values():
                c.after(call, output)
            return output

    model: HookedModel = load_model(a.model, device=a.device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    w_o = torch.stack(
        [activations.output_projection(model, i).detach().float() for i in range(model.n_layers)]
    )
    np.save(out / "w_o.npy", w_o.numpy().astype(np.float16))
    bos = model.tokenizer.bos_token_id
    for item in a.runs:
        run = Path(item)
        if run.is_dir():  # a finished `headhunt circuits` run: its pairs, truth and EAP
            lines = (run / "pairs.jsonl").read_text().splitlines()
            pairs = tasks.encode_pairs(
                model.tokenizer,
                [tasks.PromptPair(**json.loads(line)) for line in lines],
                require_aligned=True,
            )
            patch = json.loads((run / "patching.json").read_text())
            eap = load_file(str(run / "eap.safetensors"))["per_pair"].flatten(1).numpy()
            manifest = json.loads((run / "manifest.json").read_text())
            effect, source = np.asarray(patch["effect"], np.float32), "patching"
            seconds = {"patching_s": patch["seconds"], "eap_s": manifest["timings"]["eap"]}
            name = run.name
        else:  # task:seed:pairs, EAP only; the truth is then binarised |mean EAP|
            task, seed, n = item.split(":")
            pairs = tasks.make_pairs(
                task, model.tokenizer, int(n), seed=int(seed), require_aligned=True
            )
            t0 = time.perf_counter()
            eap = patching.attribution_patching(model, pairs, per_pair=True).flatten(1).numpy()
            seconds = {"patching_s": float("nan"), "eap_s": time.perf_counter() - t0}
            effect, source = eap.mean(0).reshape(model.n_layers, model.n_heads), "eap"
            name = f"truth-{task}-s{seed}"
        seqs = pairs.positive + pairs.negative
        z = {
            p: torch.empty(len(seqs), model.n_layers, model.n_heads, model.head_dim)
            for p in ("mean", "last")
        }
        with torch.inference_mode():
            for idx, ids in tasks.length_batches(seqs, 16):
                cap = BothPositions(skip_first=bos is not None and bool((ids[:, 0] == bos).all()))
                with model.hooks(cap):
                    model.forward(ids.to(model.device), use_cache=False, logits_to_keep=1)
                for pos in z:
                    z[pos][idx] = torch.stack(
                        [cap.z[pos][i] for i in range(model.n_layers)], 1
                    ).cpu()
        np.savez(
            out / f"{name}.npz",
            # [examples, layers, heads, head_dim]: positives then negatives
            z_mean=z["mean"].numpy().astype(np.float16),
            z_last=z["last"].numpy().astype(np.float16),
            effect=effect,
            truth_source=np.str_(source),
            eap=eap.astype(np.float32),
            n_kv=np.int64(model.n_kv_heads),
            **{k: np.float64(v) for k, v in seconds.items()},
        )
        print(f"{name}: {len(pairs)} pairs, truth from {source}", flush=True)


def head_outputs(z: np.ndarray, w_o: torch.Tensor, device: str) -> torch.Tensor:
    """[examples, layers*heads, d_model] float32 from z [examples, layers, heads, d]."""
    zt = torch.as_tensor(z, dtype=torch.float32, device=device)
    n, L, H, d = zt.shape
    w = w_o.to(device).float().reshape(L, -1, H, d)  # [L, d_model, H, d]
    return torch.einsum("nlhd,lmhd->nlhm", zt, w).reshape(n, L * H, -1)


EPOCHS: int | None = None  # --epochs overrides every setting's (smoke tests only)


def run_config(data, cfg: dict, trials: int, edges: bool) -> dict:
    """Mean / std over trials of each method's AUC, per task, for one setting; trials are
    headhunt's own (``run_trial``), on the device the activations are on."""
    from headhunt.sae.circuits import CircuitConfig, run_trial

    cfg = cfg if EPOCHS is None else {**cfg, "epochs": EPOCHS}
    config = CircuitConfig(trials=trials, **{k: cfg[k] for k in KEYS})
    out = {}
    for task, d in data.items():
        acts = d["acts"][cfg["position"]]
        aucs: dict[str, list[float]] = {}
        secs = []
        for t in range(trials):
            tr = run_trial(t, acts, config, eap_pairs=d["eap"], truth=d["truth"], edges=edges)
            secs.append(tr.seconds["sae_train"] + tr.seconds["sae_score"])
            for k, v in tr.auc.items():
                aucs.setdefault(k, []).append(v)
        out[task] = {k: [float(np.mean(v)), float(np.std(v))] for k, v in aucs.items()}
        out[task]["seconds_per_trial"] = float(np.mean(secs))
    return out


def load(acts_dir: Path, tag: str, device: str) -> dict:
    from headhunt.sae import roc

    w_o = torch.as_tensor(np.load(acts_dir / "w_o.npy"))
    data = {}
    for f in sorted(acts_dir.glob(f"truth-*-{tag}.npz")):
        task = f.stem.removeprefix("truth-").removesuffix(f"-{tag}")
        z = np.load(f)
        effect = z["effect"]
        data[task] = {
            "acts": {p: head_outputs(z[f"z_{p}"], w_o, device) for p in ("mean", "last")},
            "truth": roc.binarize_truth(effect, share=0.5).ravel(),
            "effect": effect,
            "eap": z["eap"],
            "patching_s": float(z["patching_s"]),
            "eap_s": float(z["eap_s"]),
            "n_kv": int(z["n_kv"]),
            "truth_source": str(z["truth_source"]),
        }
    return data


def gqa_note(data: dict) -> dict:
    """How the truth heads fall into KV groups (GQA), per task."""
    out = {}
    for task, d in data.items():
        L, H = d["effect"].shape
        g = H // d["n_kv"]
        heads = [(i // H, i % H) for i in np.flatnonzero(d["truth"])]
        groups = {(la, h // g) for la, h in heads}
        out[task] = {"truth_heads": [f"{la}.{h}" for la, h in heads], "kv_groups": len(groups)}
    return out


RULES = ("sae_node", "sae_node_norm", "sae_pos_only", "sae_changed")
OLD = {  # the defaults before this sweep (the paper's)
    "dict_size": 200,
    "sae_examples": 10,
    "position": "mean",
    "head_norm": "none",
    "subsample": 0.5,
    "l1": 0.02,
    "epochs": 500,
}


def mean_over_tasks(select: dict, rule: str) -> float:
    return float(np.mean([select[t][rule][0] for t in select]))


def best_rule(select: dict) -> tuple[float, str]:
    return max((mean_over_tasks(select, r), r) for r in RULES)


def sweep(a: argparse.Namespace) -> None:
    """Stage-wise search on the selection runs (each stage around the best so far, within
    ``--budget-s``), then the chosen setting and the old defaults on the held-out runs."""
    t_start = time.perf_counter()
    device = a.device
    acts_dir = Path(a.acts)
    sel, held = load(acts_dir, a.select, device), load(acts_dir, a.heldout, device)
    t_start = time.perf_counter()  # the budget counts from here
    result: dict = {
        "device": _device_name(device),
        "gqa": gqa_note(sel),
        "truth_source": {t: d["truth_source"] for t, d in (sel | held).items()},
        "runs": [],
    }
    seen: set[tuple] = set()

    def run(cfg: dict, stage: str) -> None:
        key = tuple(cfg[k] for k in KEYS)
        late = result["runs"] and time.perf_counter() - t_start > a.budget_s
        if key in seen or late:
            return
        seen.add(key)
        r = run_config(sel, cfg, a.trials, edges=False)
        result["runs"].append({"stage": stage, "config": cfg, "select": r})
        print(json.dumps({"stage": stage, "config": cfg, **_brief(r)}), flush=True)

    def top(n: int) -> list[dict]:
        ranked = sorted(result["runs"], key=lambda e: -best_rule(e["select"])[0])
        return [e["config"] for e in ranked[:n]]

    # 1. which activations and how heads are scaled (the paper's SAE otherwise)
    for pos, norm in itertools.product(("mean", "last"), ("none", "center", "standardize")):
        run({**OLD, "position": pos, "head_norm": norm}, "activations")
    # 2. codebook size and training data, around the two best of stage 1
    for base in top(2):
        for d, ex in itertools.product(a.dict_sizes, a.examples):
            run({**base, "dict_size": d, "sae_examples": ex}, "codebook")
    # 3. prompt pairs per trial and sparsity, around the best
    base = top(1)[0]
    for sub, l1 in ((1.0, base["l1"]), (0.25, base["l1"]), (base["subsample"], 0.05)):
        run({**base, "subsample": sub, "l1": l1}, "pairs_l1")
    # 4. does training matter? the same settings with the SAE left at its random start
    for base in (top(1)[0], OLD):
        run({**base, "epochs": 0}, "untrained")
    best = max(result["runs"], key=lambda e: best_rule(e["select"])[0])
    result["chosen"] = {"config": best["config"], "rule": best_rule(best["select"])[1]}
    result["heldout"] = {}
    heldout = [("chosen", best["config"]), ("old_default", OLD)]
    if best["config"]["epochs"]:
        heldout.append(("chosen_untrained", {**best["config"], "epochs": 0}))
    for name, cfg in heldout:
        r = run_config(held, cfg, a.heldout_trials, edges=True)
        result["heldout"][name] = {"config": cfg, "auc": r}
        print(json.dumps({"heldout": name, **_brief(r)}), flush=True)
    result["times"] = {t: {"eap_s": d["eap_s"]} for t, d in held.items()}
    result["seconds"] = time.perf_counter() - t_start
    Path(a.out).write_text(json.dumps(result, indent=1))


def _brief(r: dict) -> dict:
    return {
        t: {k: round(v[0], 3) for k, v in m.items() if k != "seconds_per_trial"}
        for t, m in r.items()
    }


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} thr)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("prepare")
    q.add_argument("--model", default="smollm2-135m")
    q.add_argument("--device", default="cpu")
    q.add_argument("--runs", nargs="+", required=True)
    q.add_argument("--out", required=True)
    s = sub.add_parser("sweep")
    s.add_argument("--acts", required=True)
    s.add_argument("--select", default="s1")
    s.add_argument("--heldout", default="s0")
    s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    s.add_argument("--dict-sizes", type=int, nargs="+", default=[50, 200, 800])
    s.add_argument("--examples", type=int, nargs="+", default=[10, 64])
    s.add_argument("--trials", type=int, default=4)
    s.add_argument("--heldout-trials", type=int, default=10)
    s.add_argument("--budget-s", type=float, default=200)
    s.add_argument("--epochs", type=int, help="override every setting's epochs (smoke tests)")
    s.add_argument("--out", required=True)
    a = p.parse_args()
    globals()["EPOCHS"] = getattr(a, "epochs", EPOCHS)
    prepare(a) if a.cmd == "prepare" else sweep(a)


if __name__ == "__main__":
    main()
