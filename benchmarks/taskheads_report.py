"""Markdown tables of taskheads runs (docs/taskheads.md's results): per run, the full model's
accuracy; per detector and k, the top-k accuracy (binomial SE) against random k-head sets drawn
from all heads and from the heads outside that detector's top k (mean and SE over draws), the
closed-book specificity control (with the closed-book reference mean; in brackets with the
task's mean, as first reported), and which of the issue's three targets hold; the top-16
overlaps and the retriever against BM25.

    python benchmarks/taskheads_report.py benchmarks/results/taskheads/h200-controls/*/

Targets (issue 26, at some k <= 16): top-k accuracy at most a quarter of the full model's;
random k heads lose at most 5 points (judged on both pools, named); the specificity control
loses at most 5 points (closed-book accuracy is 1.00 unablated by construction). A met cell is
"not firm" when any of its three margins is inside one SE.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

POINTS = 0.05 + 1e-9  # "at most 5 points", with room for float rounding of e.g. 0.14 - 0.09


def _pm(mean, se) -> str:
    return "n/a" if pd.isna(mean) else f"{mean:.2f} ± {se:.2f}"


def targets(r) -> dict[str, bool]:
    """Which of the three targets a (detector, mode, k) row meets."""
    out = {"collapse": r.accuracy <= r.full / 4,
           "random (all)": not pd.isna(r.random) and r.full - r.random <= POINTS}  # fmt: skip
    if "random_outside" in r._fields:
        out["random (outside)"] = not pd.isna(r.random_outside) and (
            r.full - r.random_outside <= POINTS
        )
    spec = r.specificity if "specificity" in r._fields else r.closed_book
    out["specificity"] = 1.0 - spec <= POINTS
    return out


def met(t: dict[str, bool], pool: str) -> bool:
    return t["collapse"] and t[pool] and t["specificity"]


def _margin(room: float, se) -> float:
    """How many SEs a met target clears its bar by (infinite with no spread: SE 0)."""
    if pd.isna(se) or se == 0:
        return float("inf") if room >= 0 else float("-inf")
    return room / se


def firm(r, pool: str) -> bool:
    """Every target of the cell clears its bar by at least one SE: the top k's accuracy under
    a quarter of the full model's (binomial SE), the random pool's loss under 5 points (SE over
    draws) and the closed-book loss under 5 points (binomial SE over the kept prompts; a run
    from before that column: no SE)."""
    rand, rand_se = (r.random, r.random_se) if pool == "random (all)" else (
        r.random_outside, r.random_outside_se)  # fmt: skip
    spec = r.specificity if "specificity" in r._fields else r.closed_book
    spec_se = getattr(r, "specificity_se", float("nan"))
    return min(_margin(r.full / 4 - r.accuracy, r.se),
               _margin(POINTS - (r.full - rand), rand_se),
               _margin(POINTS - (1.0 - spec), spec_se)) >= 1.0  # fmt: skip


def ablation_rows(run: Path, mode: str) -> list[str]:
    t = pd.read_csv(run / "ablation.csv")
    t = t[t["mode"] == mode]
    new = "specificity" in t
    out = []
    for r in t.sort_values(["k", "detector"]).itertuples():
        spec = f"{r.specificity:.2f} ({r.closed_book:.2f})" if new else f"({r.closed_book:.2f})"
        if "specificity_se" in t:
            n = int(r.closed_book_prompts)
            lost = round((1.0 - r.specificity) * n)
            spec = (f"{r.specificity:.2f} ± {r.specificity_se:.2f}, {lost} of {n} lost "
                    f"({r.closed_book:.2f})")  # fmt: skip
        outside = _pm(r.random_outside, r.random_outside_se) if new else "-"
        tg = targets(r)
        hold = [name + ("" if firm(r, name) else " (not firm)")
                for name in ("random (all)", "random (outside)")
                if name in tg and met(tg, name)]  # fmt: skip
        out.append(f"| {r.k} | {r.detector} | {_pm(r.accuracy, r.se)} | "
                   f"{_pm(r.random, r.random_se)} | {outside} | {spec} | "
                   f"{', '.join(hold) or '-'} |")  # fmt: skip
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
        f"closed-book prompts kept: {base['closed_book_kept']} of "
        f"{base.get('closed_book_prompts', 24)}; scoring examples answered "
        f"correctly: {det['scoring_examples_correct']}; random draws per k: "
        f"{int(t['draws'].iloc[0])}.",
        "",
    ]
    for mode in t["mode"].unique():
        lines += [f"`{mode}` ablation: accuracy ± SE; closed-book accuracy with the closed-book "
                  "mean (with the task's mean); all three targets met with the random pool named "
                  "(not firm: some target's margin is inside one SE)",
                  "", "| k | detector | top-k | random k (all heads) | random k (outside top k) "
                  "| closed-book | targets met |", "| --- | --- | --- | --- | --- | --- | --- |",
                  *ablation_rows(run, mode), ""]  # fmt: skip
    lines += [f"top-16 overlaps: {det['overlaps']}; top 4: "
              + "; ".join(f"{d} {[f'{a}-{b}' for a, b in h[:4]]}" for d, h in det["top"].items()),
              ""]  # fmt: skip
    if ret:
        lines += ["| retriever | recall@1 | NDCG@10 | examples |", "| --- | --- | --- | --- |"]
        for name, r in ret.items():
            lines.append(f"| {name} | {_pm(r['recall1'], r['recall1_se'])} | "
                         f"{_pm(r['ndcg10'], r['ndcg10_se'])} | {r['examples']} |")  # fmt: skip
        lines.append("")

    if (run / "singles.jsonl").is_file():
        lines += singles(run)
    return "\n".join(lines)


def paired(cond: list[bool], base: list[bool]) -> tuple[float, float]:
    """Accuracy change of an ablation against the full model on the same examples, with the
    SE of the paired difference (the examples are shared, so it is smaller than a binomial's)."""
    d = [float(a) - float(b) for a, b in zip(cond, base, strict=True)]
    n = len(d)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    return mean, (var / n) ** 0.5


def singles(run: Path, show: int = 14) -> list[str]:
    """taskheads_single_heads.py's sweep: how many heads lose accuracy when ablated alone,
    and the detectors' ranks of the worst."""
    recs = [json.loads(line) for line in (run / "singles.jsonl").open()]
    base = next(r for r in recs if r["name"] == "none")
    rows = []
    for r in recs:
        if r["name"] == "none":
            continue
        d, se = paired(r["correct"], base["correct"])
        spec = sum(r["specificity"]), len(r["specificity"])
        rows.append((d, se, tuple(r["heads"][0]), spec))
    rows.sort()
    ranks = {}
    path = run / "scores.parquet"
    if path.is_file():
        s = pd.read_parquet(path)
        for metric in ("copy_score", "query_focus", "write_score"):
            m = s[s["metric"] == metric].sort_values("value", ascending=False, kind="stable")
            ranks[metric] = {(int(a), int(b)): i + 1 for i, (a, b)
                             in enumerate(zip(m["layer"], m["head"], strict=True))}  # fmt: skip
    n = len(base["correct"])
    lose5 = sum(d < -POINTS for d, *_ in rows)
    lose2 = sum(d < -2 * se for d, se, *_ in rows)
    gain2 = sum(d > 2 * se for d, se, *_ in rows)
    lines = [f"every head ablated alone ({len(rows)} heads, {n} evaluation examples): "
             f"{lose5} lose more than 5 points, {lose2} lose more than 2 paired SEs, "
             f"{gain2} gain more than 2 paired SEs", "",
             "| head | accuracy change ± paired SE | closed-book kept | rank: copy / query / "
             "write |", "| --- | --- | --- | --- |"]  # fmt: skip
    for d, se, (la, h), (kept, of) in rows[:show]:
        rk = " / ".join(str(ranks[m].get((la, h), "-")) for m in ranks) or "-"
        lines.append(f"| {la}-{h} | {d:+.2f} ± {se:.2f} | {kept} of {of} | {rk} |")
    return [*lines, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    for run in ap.parse_args().runs:
        print(report(run))


if __name__ == "__main__":
    main()
