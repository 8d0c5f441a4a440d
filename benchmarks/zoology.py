"""Zoology (Arora et al., arXiv 2312.04927) on the project's own runs: MQAR accuracy of tiny
attention, attention-free and hybrid models built from installed transformers config classes,
then headhunt's recall-head, induction and masking analyses on the trained hybrids.

Models (2 layers each, widths 64 / 128 / 256, 8 heads where there are heads):
- attention: LFM2 with two full-attention layers;
- gated conv: LFM2 with two double-gated short-convolution layers (attention-free);
- mamba2: two Mamba2 layers (attention-free state-space model);
- hybrid: LFM2 with a short-convolution layer, then one attention layer.
All train on one mixture of MQAR sets (Zoology's generator, disjoint key and value halves of a
8192-token vocabulary, 256 tokens, 4 to 64 pairs), the same steps, batches and optimiser, and
are tested on held-out examples at each pair count. On each trained hybrid and attention model,
headhunt's MQAR recall scores (query -> value attention) name the top heads, n-gram scores give
their induction score, and masking those heads (query mode) is compared with masking as many
random attention heads.

Run on the GPU machine: python3 benchmarks/zoology.py OUT.json [--smoke]
"""

from __future__ import annotations

import json
import math
import random
import sys
import time

import numpy as np
import torch
from torch import nn

VOCAB, SEQ = 8192, 256
TRAIN_PAIRS = (4, 8, 16, 32, 64)
TEST_PAIRS = (4, 16, 64)
WIDTHS = (64, 128, 256)
HEADS = 8
ARCHS = {
    "attention": ("lfm2", ("full_attention", "full_attention")),
    "gated conv": ("lfm2", ("conv", "conv")),
    "mamba2": ("mamba2", None),
    "hybrid": ("lfm2", ("conv", "full_attention")),
}


def make_sets(smoke: bool):
    from headhunt.heads.inputs.mqar_inputs import MQARSpec, generate_mqar

    n_train = 512 if smoke else 12_000
    train = {
        n: generate_mqar(MQARSpec(vocab_size=VOCAB, seq_len=SEQ, n_pairs=n), n_train, seed=n)
        for n in TRAIN_PAIRS
    }
    test = {
        n: generate_mqar(MQARSpec(vocab_size=VOCAB, seq_len=SEQ, n_pairs=n), 256, seed=10**6 + n)
        for n in TEST_PAIRS
    }
    return train, test


def logits_at(model, ids, positions):
    """Logits at ``positions`` ([b, k]) only: the [b, n, 8192] logits of every position would
    cost more than the model."""
    hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
    picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
    return model.get_output_embeddings()(picked)


def accuracy(model, probe, dev, batch: int = 128) -> float:
    hits = []
    with torch.no_grad():
        for s in range(0, len(probe), batch):
            ids = probe.ids[s : s + batch].to(dev)
            qp = probe.query_pos[s : s + batch].to(dev)
            pred = logits_at(model, ids, qp).argmax(-1)
            hits.append((pred == probe.target[s : s + batch].to(dev)).float().cpu())
    return float(torch.cat(hits).mean())


def train(arch: str, width: int, sets, dev, steps: int, seconds: float, seed: int = 0):
    from headhunt.heads.mqar_train import MQARTrainConfig, build_model

    family, layers = ARCHS[arch]
    cfg = MQARTrainConfig(
        vocab_size=VOCAB,
        seq_len=SEQ,
        d_model=width,
        n_layers=2,
        n_heads=HEADS,
        seed=seed,
        family=family,
        layer_types=layers,
    )
    model = build_model(cfg).to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1)
    warm = max(1, steps // 20)

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / (steps - warm))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = random.Random(seed)
    per = 32  # examples of each pair count per step (160 in all)
    t0 = time.perf_counter()
    done = 0
    for _ in range(steps):
        loss = 0.0
        for n in TRAIN_PAIRS:  # every step mixes the pair counts, as Zoology's training set
            idx = torch.tensor([rng.randrange(len(sets[n].ids)) for _ in range(per)])
            qp, tgt = sets[n].query_pos[idx].to(dev), sets[n].target[idx].to(dev)
            logits = logits_at(model, sets[n].ids[idx].to(dev), qp)
            loss = loss + nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
        loss = loss / len(TRAIN_PAIRS)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        done += 1
        if time.perf_counter() - t0 > seconds:
            break
    model.eval()
    torch.cuda.synchronize() if dev.type == "cuda" else None
    return model, cfg, {"steps": done, "seconds": round(time.perf_counter() - t0, 1)}


def analyse(model, cfg, test, dev, top_k: int = 2, n_random: int = 10) -> dict:
    """headhunt on a trained model with attention layers: recall heads, induction, masking."""
    from headhunt.heads.evaluations.causal import random_head_sets
    from headhunt.heads.interventions.masking import HeadMask
    from headhunt.heads.mqar import recall_scores, run_mqar
    from headhunt.heads.mqar_train import mqar_tokenizer
    from headhunt.heads.ngram import NgramConfig, score_sequences
    from headhunt.probes.hooked import HookedModel

    hm = HookedModel(model=model, tokenizer=mqar_tokenizer(VOCAB), name=f"zoology-{cfg.family}")
    probe = test[16]
    base = run_mqar(hm, probe, batch_size=64, score_heads=True)
    scores = recall_scores(base.recall, probe.query_pos.numel(), n_kv_heads=hm.n_kv_heads)
    q2v = scores.matrix("query_to_value")
    top = [(int(r.layer), int(r.head)) for r in scores.top("query_to_value", top_k).itertuples()]
    g = torch.Generator().manual_seed(0)
    half = torch.randint(1, VOCAB, (32, 64), generator=g)
    (seqs) = torch.cat([half, half], 1)
    recs = score_sequences(hm, list(seqs), NgramConfig(exclude_bos=False), batch_size=32)
    induction = np.nanmean(np.stack([r.tl_ind for r in recs]), 0)
    masked = run_mqar(hm, probe, batch_size=64, hooks=[HeadMask(top)]).accuracy
    sets = random_head_sets(hm.attention_layers, hm.n_heads, top_k, n_random, exclude=top)
    rand = [run_mqar(hm, probe, batch_size=64, hooks=[HeadMask(s)]).accuracy for s in sets]
    return {
        "attention_layers": hm.attention_layers,
        "layer_kinds": hm.layer_kinds,
        "pairs": 16,
        "examples": len(probe),
        "queries": int(probe.query_pos.numel()),
        "baseline": base.accuracy,
        "query_to_value": np.where(np.isnan(q2v), None, q2v).tolist(),
        "induction": np.where(np.isnan(induction), None, induction).tolist(),
        "top_heads": top,
        "masked_top": masked,
        "random_sets": sets,
        "masked_random": rand,
    }


def main() -> None:
    out_path = sys.argv[1]
    smoke = "--smoke" in sys.argv
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    steps = 20 if smoke else 4000
    t0 = time.perf_counter()
    train_sets, test = make_sets(smoke)
    result = {
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "data_s": round(time.perf_counter() - t0, 1),
        "vocab": VOCAB,
        "seq_len": SEQ,
        "train_pairs": TRAIN_PAIRS,
        "heads": HEADS,
        "runs": [],
    }
    import transformers

    result["transformers"] = transformers.__version__
    budget = {"mamba2": 30.0}  # seconds of training per model; the others get 20
    widths = WIDTHS[:1] if smoke else WIDTHS
    for width in widths:
        for arch in ARCHS:
            seconds = 3.0 if smoke else budget.get(arch, 20.0)
            try:
                model, cfg, log = train(arch, width, train_sets, dev, steps, seconds)
            except Exception as e:  # keep the other models' numbers
                result["runs"].append({"arch": arch, "width": width, "error": repr(e)[:300]})
                print(arch, width, "failed:", repr(e)[:300], flush=True)
                continue
            run = {"arch": arch, "width": width, **log}
            run["accuracy"] = {str(n): accuracy(model, test[n], dev) for n in TEST_PAIRS}
            run["params"] = sum(p.numel() for p in model.parameters())
            if arch in ("hybrid", "attention"):
                try:
                    run["heads"] = analyse(model, cfg, test, dev)
                except Exception as e:  # keep the sweep's numbers if an analysis fails
                    run["heads_error"] = f"{type(e).__name__}: {e}"
            result["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "heads"}), flush=True)
            if "heads" in run:
                h = run["heads"]
                print(
                    f"  top {h['top_heads']} masked {h['masked_top']:.3f} vs random "
                    f"{np.mean(h['masked_random']):.3f} (baseline {h['baseline']:.3f})",
                    flush=True,
                )
            del model
            with open(out_path, "w") as f:
                json.dump(result, f, indent=1)
    result["total_s"] = round(time.perf_counter() - t0, 1)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
