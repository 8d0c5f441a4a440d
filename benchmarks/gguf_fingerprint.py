"""Fingerprint transformers' own conversion of the bundled GGUFs: the SHA-256 of every tensor's
bytes in the model's state dict after ``AutoModelForCausalLM.from_pretrained(gguf_file=...)``,
in float32 and bfloat16. tests/probes/test_gguf_weights.py checks headhunt's reading of the same
files against it, bit for bit, without paying for transformers' conversion in every test run.

    python benchmarks/gguf_fingerprint.py > tests/fixtures/gguf_fingerprints.json

Regenerate it with the transformers version CI pins (pyproject.toml) when that pin moves."""

from __future__ import annotations

import json
import warnings

import transformers
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from headhunt.probes.gguf_weights import fingerprint
from headhunt.probes.loading import REGISTRY, file_sha256


def main() -> None:
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    out = {"transformers": transformers.__version__, "models": {}}
    for spec in ("smollm2-135m", "gemma3-270m"):
        path = REGISTRY[spec].path()
        entry = {"file": path.name, "sha256": file_sha256(path)}
        for dtype in ("float32", "bfloat16"):
            model = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=dtype
            )
            entry[dtype] = fingerprint(model)
            del model
        out["models"][spec] = entry
    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
