"""The full model's accuracy on a bundled taskheads task at several sizes, forward only (no
detectors, no ablation): the cheap look that picks a setting for the causal check before any
ablation is run. For each --docs value it builds the task's examples (the same generator and
seed as ``headhunt taskheads``, so example i is the run's example i), keeps those from
--first on (a run's evaluation examples start after its --score-examples), and reports greedy
exact match (``answers_right``, the method's own accuracy) with its binomial SE, the prompt
lengths in tokens, and the chance of picking the right one of the cities the context names
for the asked attribute (multidoc: the mean of 1 / that count).

    python benchmarks/taskheads_accuracy.py --model gemma3-270m --task multidoc --docs 6,12,20 \
        --examples 60 --first 32 [--doc-words 60] [--json OUT.jsonl]

``--choose OUT.jsonl`` applies the rule fixed before any ablation is run: the largest --docs
at which every model in the file answers at least ``--floor`` (0.25) and at least twice the
chance of picking among the named cities; the smallest tried if none does. It prints DOCS.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time


def chance(example) -> float | None:
    """1 / the number of distinct cities of the asked attribute in the documents (multidoc)."""
    from headhunt.heads.inputs.task_inputs import ATTRIBUTES

    for cities in ATTRIBUTES.values():
        if example.answer in cities:
            text = " ".join(example.documents)
            named = {c for c in cities if c in text}
            return 1 / len(named)
    return None


def choose(rows: list[dict], floor: float) -> int:
    """The largest docs where every model's accuracy is >= max(floor, 2 x chance)."""
    sizes = sorted({r["docs"] for r in rows}, reverse=True)
    for docs in sizes:
        at = [r for r in rows if r["docs"] == docs]
        if all(r["accuracy"] >= max(floor, 2 * (r["chance"] or 0)) for r in at):
            return docs
    return sizes[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--choose", default=None, help="a JSONL this script wrote: print the DOCS")
    ap.add_argument("--floor", type=float, default=0.25)
    ap.add_argument("--task", default="multidoc")
    ap.add_argument("--docs", default="6,12,20", help="DOCS,...: the sizes tried")
    ap.add_argument("--doc-words", type=int, default=60)
    ap.add_argument("--examples", type=int, default=60)
    ap.add_argument("--first", type=int, default=32, help="the first example index used")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--json", default=None, help="append one JSON line per setting here")
    args = ap.parse_args()
    if args.choose:
        with open(args.choose) as f:
            print(choose([json.loads(line) for line in f], args.floor))
        return

    from headhunt.heads.evaluations.task_ablation import answers_right
    from headhunt.heads.inputs.task_inputs import Encoder, bundled
    from headhunt.probes.hooked import load_model

    model = load_model(args.model, dtype=args.dtype)
    encoder = Encoder(model.tokenizer, model.max_context)
    for docs in [int(d) for d in args.docs.split(",")]:
        t0 = time.perf_counter()
        examples = bundled(args.task, args.first + args.examples, docs, args.doc_words, args.seed)
        examples = examples[args.first :]
        encoded = [encoder.encode(ex) for ex in examples]
        right = answers_right(model, [(e.ids, e.answer_start) for e in encoded],
                              batch_size=args.batch_size)  # fmt: skip
        n = len(right)
        acc = sum(right) / n
        lengths = [len(e.ids) for e in encoded]
        chances = [c for c in map(chance, examples) if c is not None]
        row = {
            "model": args.model, "task": args.task, "docs": docs, "doc_words": args.doc_words,
            "seed": args.seed, "examples": n, "first": args.first, "accuracy": acc,
            "se": math.sqrt(acc * (1 - acc) / n),
            "tokens": [min(lengths), statistics.median(lengths), max(lengths)],
            "chance": statistics.mean(chances) if chances else None,
            "dtype": str(next(model.model.parameters()).dtype), "device": str(model.device),
            "seconds": round(time.perf_counter() - t0, 1),
        }  # fmt: skip
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
