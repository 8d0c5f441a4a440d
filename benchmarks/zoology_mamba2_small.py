"""A check that the Mamba2 models of benchmarks/zoology.py can learn MQAR at all: the same
build (``headhunt.heads.mqar_train.build_family_model``, two Mamba2 layers, width 64, Zoology's
disjoint key and value halves) on a small task (vocabulary 128, 64 tokens, 8 pairs, fresh
batches of 64, learning rate 3e-3), trained on one CPU thread by ``train_mqar_model`` until a
held-out batch of 256 reaches 0.99.

Run: python benchmarks/zoology_mamba2_small.py OUT.json [STEPS] (about 6 minutes on one core).
"""

from __future__ import annotations

import json
import platform
import sys

import torch

from headhunt.heads.mqar_train import MQARTrainConfig, train_mqar_model


def main() -> None:
    torch.set_num_threads(1)
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    cfg = MQARTrainConfig(
        family="mamba2",
        n_layers=2,
        d_model=64,
        n_heads=8,
        vocab_size=128,
        seq_len=64,
        n_pairs=8,
        shared_vocab=False,
        steps=steps,
        lr=3e-3,
        batch_size=64,
    )
    _, log = train_mqar_model(cfg)
    import transformers

    out = {
        "device": f"CPU ({platform.processor() or platform.machine()}, 1 thread)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "config": cfg.to_dict(),
        "log_every": 100,
        **log,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "config"}))


if __name__ == "__main__":
    main()
