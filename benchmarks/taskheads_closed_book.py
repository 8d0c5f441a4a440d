"""Which closed-book prompts (taskheads' specificity control) a model answers with no context:
greedy exact match of the answer after the plain-text prompt (``answers_right``, the method's
own check), per prompt, for the evaluated set and the reference set, and the counts per kind.
The control keeps a prompt when the full model answers it; this says how many each model keeps
before any ablation is run.

    python benchmarks/taskheads_closed_book.py --model gemma3-270m --dtype float32 \
        --json OUT.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
import time


def kinds() -> dict[str, str]:
    """Prompt -> its kind (the original lists: "original")."""
    from headhunt.heads.inputs import task_closed_book as C

    out = {p: "original" for p, _ in C.ORIGINAL + C.ORIGINAL_REFERENCE}
    for name, kind in C.KINDS.items():
        for p, _ in kind:
            out.setdefault(p, name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--json", default=None, help="write one JSON line per prompt here")
    args = ap.parse_args()

    from headhunt.heads.evaluations.task_ablation import answers_right
    from headhunt.heads.inputs.task_inputs import (
        CLOSED_BOOK,
        CLOSED_BOOK_REFERENCE,
        closed_book_ids,
    )
    from headhunt.probes.hooked import load_model

    model = load_model(args.model, device="cpu", dtype=args.dtype)
    kind = kinds()
    rows = []
    for name, prompts in (("evaluated", CLOSED_BOOK), ("reference", CLOSED_BOOK_REFERENCE)):
        t0 = time.perf_counter()
        ids = closed_book_ids(model.tokenizer, prompts)
        right = answers_right(model, [(p + a, len(p)) for p, a in ids],
                              batch_size=args.batch_size)  # fmt: skip
        for (p, a), ok in zip(prompts, right, strict=True):
            rows.append({"model": args.model, "dtype": args.dtype, "set": name, "kind": kind[p],
                         "prompt": p, "answer": a, "right": ok})  # fmt: skip
        by = collections.defaultdict(lambda: [0, 0])
        for r in rows:
            if r["set"] == name:
                by[r["kind"]][0] += r["right"]
                by[r["kind"]][1] += 1
        print(f"{args.model} ({args.dtype}) {name}: {sum(right)} of {len(right)} answered "
              f"({time.perf_counter() - t0:.0f} s); by kind: "
              + ", ".join(f"{k} {a}/{n}" for k, (a, n) in by.items()), flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
