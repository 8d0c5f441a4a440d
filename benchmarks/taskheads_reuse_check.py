"""On a real model: the task-head scores with the null pass on the documents' KV cache against
two whole passes, for the first two examples of each bundled task the GPU runs use (bf16:
the two paths round differently; this says by how much).

    python3 taskheads_reuse_check.py GGUF
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from headhunt.heads import taskheads as T
from headhunt.heads.inputs.task_inputs import Encoder, bundled
from headhunt.probes.hooked import load_model


def main() -> None:
    model = load_model(sys.argv[1], device="cuda" if torch.cuda.is_available() else "cpu",
                       dtype="bfloat16")  # fmt: skip
    enc = Encoder(model.tokenizer, model.max_context)
    for task, docs, words in (("multidoc-hard", 12, 40), ("kv", 10, 10)):
        for ex in bundled(task, 2, docs, words, 0):
            e = enc.encode(ex)
            a = T.score_example(model, e, reuse_prefix=True)
            b = T.score_example(model, e, reuse_prefix=False)
            diffs = {}
            for name in ("copy", "mass", "null_mass", "write_evidence", "write_other"):
                x, y = getattr(a, name), getattr(b, name)
                diffs[name] = float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-12))
            worst = max(diffs, key=diffs.get)
            print(f"{model.name} {task} {e.id}: {len(e.ids)} tokens, prefix "
                  f"{T.shared_prefix(e)}, correct {a.correct}/{b.correct}, largest difference "
                  f"/ largest value: {worst} {diffs[worst]:.2e}; all {diffs}")  # fmt: skip


if __name__ == "__main__":
    main()
