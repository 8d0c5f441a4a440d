"""What QRHead's token filter changes in a finished taskheads run: query focus's top heads and
the head retriever, with the filter (as the method computes them now) and without it (the
question's minus the null question's attention summed over each document, as runs before
2026-11-28 computed them), from the same run's records.

    python benchmarks/taskheads_qrfilter.py RUN_DIR [RUN_DIR ...] --out qrfilter.json

Per run: the query-focus top 16 both ways and, for k = 1, 2, 4, 8 and 16, whether the top-k
sets are the same (an ablation of the top k depends only on that set); recall@1 and NDCG@10
on the evaluation examples for the retriever's heads and for all heads, both ways, beside the
run's BM25 (each with its standard error over examples).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

KS = (1, 2, 4, 8, 16)


def unfiltered(r):
    """The same example with query focus as before the filter (document sums of the
    calibrated attention)."""
    return dataclasses.replace(r, focus=r.mass - r.null_mass, current=False)


def compare(run: Path) -> dict:
    from headhunt.heads.taskheads import ExampleResult, head_matrices, top_heads
    from headhunt.heads.taskheads import retrieval_metrics as retrieval
    from headhunt.methods.base import read_jsonl

    params = json.loads((run / "parameters.json").read_text())
    records = read_jsonl(run / "examples.jsonl")
    score = [ExampleResult.from_record(r) for r in records if r["split"] == "score"]
    evals = [ExampleResult.from_record(r) for r in records if r["split"] == "eval"]
    if not all(r.current for r in score + evals):
        raise SystemExit(f"error: {run} predates the filter: nothing to compare")
    n = params["retriever_heads"]
    top = {"filtered": top_heads(head_matrices(score)["query_focus"], 16),
           "unfiltered": top_heads(head_matrices([unfiltered(r) for r in score])["query_focus"],
                                   16)}  # fmt: skip
    old_heads = top["unfiltered"][:n]
    ret = {
        "filtered top heads": retrieval(evals, lambda r: r.focus_top),
        "filtered all heads": retrieval(evals, lambda r: r.focus_all),
        "unfiltered top heads": retrieval(
            evals, lambda r: sum(r.mass[la, h] - r.null_mass[la, h] for la, h in old_heads)
        ),
        "unfiltered all heads": retrieval(evals, lambda r: (r.mass - r.null_mass).sum((0, 1))),
    }
    bm25 = run / "retrieval.json"
    if bm25.is_file() and "bm25" in json.loads(bm25.read_text()):
        ret["bm25"] = json.loads(bm25.read_text())["bm25"]
    return {
        "run": run.name,
        "task": params.get("input") or params["task"],
        "docs": params["docs"],
        "scoring_examples": len(score),
        "evaluation_examples": len(evals),
        "query_top16": {k: [list(h) for h in v] for k, v in top.items()},
        "same_top_k": {k: set(top["filtered"][:k]) == set(top["unfiltered"][:k]) for k in KS},
        "retriever_heads": n,
        "retrieval": ret,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="taskheads run directories")
    ap.add_argument("--out", type=Path, required=True, help="the comparison (JSON)")
    args = ap.parse_args()
    report = [compare(run) for run in args.runs]
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.rename(args.out)
    for r in report:
        rows = {k: f"{v['recall1']:.3f} ± {v['recall1_se']:.3f}" for k, v in r["retrieval"].items()}
        print(r["run"], "same top k:", r["same_top_k"], "recall@1:", rows)


if __name__ == "__main__":
    main()
