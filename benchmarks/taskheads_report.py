"""Markdown tables of taskheads runs (docs/taskheads.md's results): per run, the full model's
accuracy, each detector's top-k accuracy (binomial SE) against random k-head sets (mean and SE
over draws), the closed-book control, the top-16 overlaps and the retriever against BM25.

    python benchmarks/taskheads_report.py benchmarks/results/taskheads/h100/*/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd


def _pm(mean, se) -> str:
    return "n/a" if pd.isna(mean) else f"{mean:.2f} ± {se:.2f}"


def ablation_rows(run: Path, mode: str) -> list[str]:
    t = pd.read_csv(run / "ablation.csv")
    t = t[t["mode"] == mode]
    out = []
    for k, g in t.groupby("k", sort=True):
        by = {r.detector: r for r in g.itertuples()}
        r0 = g.iloc[0]
        cells = [f"{_pm(by[d].accuracy, by[d].se)} ({by[d].closed_book:.2f})" if d in by else "-"
                 for d in ("copy", "query", "write")]  # fmt: skip
        rand = f"{_pm(r0.random, r0.random_se)} ({r0.random_closed_book:.2f})"
        out.append(f"| {k} | " + " | ".join(cells) + f" | {rand} |")
    return out


def report(run: Path) -> str:
    det = json.loads((run / "detectors.json").read_text())
    ret = json.loads((run / "retrieval.json").read_text())

    base = det["baseline"]
    t = pd.read_csv(run / "ablation.csv")
    lines = [
        f"### {run.name}",
        "",
        f"full model: accuracy {base['accuracy']:.2f} on {base['examples']} evaluation examples; "
        f"closed-book prompts kept: {base['closed_book_kept']} of 24; scoring examples answered "
        f"correctly: {det['scoring_examples_correct']}; random draws per k: "
        f"{int(t['draws'].iloc[0])}.",
        "",
    ]
    for mode in t["mode"].unique():
        lines += [f"`{mode}` ablation: accuracy ± SE (closed-book accuracy)", "",
                  "| k | copy top-k | query top-k | write top-k | random k |",
                  "| --- | --- | --- | --- | --- |", *ablation_rows(run, mode), ""]  # fmt: skip
    lines += [f"top-16 overlaps: {det['overlaps']}; top 4: "
              + "; ".join(f"{d} {[f'{a}-{b}' for a, b in h[:4]]}" for d, h in det["top"].items()),
              ""]  # fmt: skip
    if ret:
        lines += ["| retriever | recall@1 | NDCG@10 | examples |", "| --- | --- | --- | --- |"]
        for name, r in ret.items():
            lines.append(f"| {name} | {_pm(r['recall1'], r['recall1_se'])} | "
                         f"{_pm(r['ndcg10'], r['ndcg10_se'])} | {r['examples']} |")  # fmt: skip
        lines.append("")

    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    for run in ap.parse_args().runs:
        print(report(run))


if __name__ == "__main__":
    main()
