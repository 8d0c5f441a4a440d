"""Which kvpress 0.5.5 presses run on Gemma 3 270M (``Gemma3ForCausalLM``, 15 sliding-window
layers of 512 tokens, 3 global ones) and what they keep of each layer: one prefill of a
700-token essay window per press at ratio 0.5 (kvpress's environment, CPU is enough). Head data
are random (this checks the plumbing, not accuracy); DuoAttention's on-the-fly scorer is called
directly on two essay chunks (its 50 BookSum samples take minutes on a CPU).

    .venv-kvpress/bin/python benchmarks/kvpress/gemma3_check.py --model GEMMA_DIR --out check.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from compare import FIELD_PRESSES, essay_chunks, essay_windows, load, local_booksum, make_press
from kvpress.presses import duo_attention_press
from transformers import DynamicCache

from headhunt.kvbudget import lukv_curve

PRESSES = (*FIELD_PRESSES, "hh_duo", "hh_budget", "hh_spread_recent")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=700)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    model, tok, _ = load(a.model)
    c = model.config
    ids = torch.tensor([essay_windows(tok, 1, a.tokens)[0]], device=model.device)
    kv = np.random.default_rng(0).random((c.num_hidden_layers, c.num_key_value_heads))
    data = {"duo": kv, "kv": kv, "spread_kv": kv, "adakv": kv + 0.1, "lukv": lukv_curve(kv)}
    out = {}
    for name in PRESSES:
        try:
            press = make_press(name, 0.5, a.tokens, data)
            cache = DynamicCache()
            with torch.no_grad(), press(model):
                model.model(input_ids=ids, past_key_values=cache)
            kept = []
            for layer, cl in zip(model.model.layers, cache.layers, strict=True):
                masked = getattr(layer.self_attn, "masked_key_indices", None)
                held = cl.keys.shape[1] * cl.keys.shape[2]
                n = held - (0 if masked is None else masked[0].numel())
                kept.append(round(n / (c.num_key_value_heads * a.tokens), 3))
            out[name] = {"kept_share_per_layer": kept}
        except Exception as e:  # what kvpress does with this model: recorded
            out[name] = {"error": f"{type(e).__name__}: {e}"[:200]}
        print(name, out[name], flush=True)
    duo_attention_press.load_dataset = local_booksum(essay_chunks(4, 1500))
    try:
        duo_attention_press.duo_attention_on_the_fly(model, num_samples=2)
        out["duo_fly"] = {"ran": True}
    except Exception as e:
        out["duo_fly"] = {"error": f"{type(e).__name__}: {e}"[:200]}
    print("duo_fly", out["duo_fly"], flush=True)
    meta = {
        "model": f"{type(model).__name__}, {next(model.parameters()).dtype}, {a.tokens} tokens",
        "ratio": 0.5,
        "layer_types": list(c.layer_types),
    }
    with open(a.out, "w") as f:
        json.dump({**meta, "presses": out}, f, indent=1)


if __name__ == "__main__":
    main()
