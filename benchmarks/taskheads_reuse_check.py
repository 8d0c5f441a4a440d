"""On a real model: the task-head scores with the null pass on the documents' KV cache against
two whole passes, for the first examples of each bundled task the GPU runs use (bf16: the two
paths round differently; this says by how much).

    python3 taskheads_reuse_check.py GGUF_OR_NAME                 # bf16, 2 examples per task
    python3 taskheads_reuse_check.py NAME --float32 --tasks kv --examples 1 --device cpu

With ``--float32`` each bf16 path is also set against a float32 whole pass, and the float32
cached path against it: how far each bf16 path is from float32, next to how far they are from
each other. Differences are the largest over heads, over the largest value of the float32 (or
whole-pass) score.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from headhunt.heads import taskheads as T
from headhunt.heads.inputs.task_inputs import Encoder, bundled
from headhunt.probes.hooked import load_model

SCORES = ("copy", "mass", "null_mass", "focus", "write_evidence", "write_off")
TASKS = {"multidoc-hard": (12, 40), "kv": (10, 10)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--float32", action="store_true")
    ap.add_argument("--tasks", default="multidoc-hard,kv")
    ap.add_argument("--examples", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    m16 = load_model(a.model, device=a.device, dtype="bfloat16")
    m32 = load_model(a.model, device=a.device, dtype="float32") if a.float32 else None
    enc = Encoder(m16.tokenizer, m16.max_context)
    for task in a.tasks.split(","):
        for ex in bundled(task, a.examples, *TASKS[task], 0):
            e = enc.encode(ex)
            cached = T.score_example(m16, e, reuse_prefix=True)
            whole = T.score_example(m16, e, reuse_prefix=False)
            head = f"{m16.name} {task} {e.id}: {len(e.ids)} tokens, prefix {T.shared_prefix(e)}"
            if m32 is None:
                d = {n: _diff(cached, whole, whole, n) for n in SCORES}
                worst = max(d, key=d.get)
                print(f"{head}, correct {cached.correct}/{whole.correct}, largest difference "
                      f"/ largest value: {worst} {d[worst]:.2e}; all {d}")  # fmt: skip
                continue
            ref = T.score_example(m32, e, reuse_prefix=False)
            ref_cached = T.score_example(m32, e, reuse_prefix=True)
            for n in SCORES[1:]:
                print(f"{head}, {n}: bf16 cached vs bf16 whole {_diff(cached, whole, ref, n):.3f}"
                      f"; bf16 whole vs float32 {_diff(whole, ref, ref, n):.3f}; bf16 cached vs "
                      f"float32 {_diff(cached, ref, ref, n):.3f}; float32 cached vs float32 whole "
                      f"{_diff(ref_cached, ref, ref, n):.1e}")  # fmt: skip


def _diff(x, y, ref, name: str) -> float:
    a, b, r = getattr(x, name), getattr(y, name), getattr(ref, name)
    return float(np.abs(a - b).max() / max(np.abs(r).max(), 1e-12))


if __name__ == "__main__":
    main()
