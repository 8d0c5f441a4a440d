"""Score compare.py's responses in headhunt's environment (the scorers of heads/inputs/ruler.py:
needles by ROUGE-1 recall of the answer, RULER-like tasks by the share of answers found) and
write the table (CSV and Markdown) and a plotly figure.

    .venv/bin/python benchmarks/kvpress/summarize.py --results R.jsonl --examples E.jsonl \
        --out benchmarks/results/kvpress_h100/summary
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from headhunt.heads.inputs.ruler import TaskTrial

NAMES = {
    "none": "no compression",
    "streaming": "StreamingLLM",
    "snapkv": "SnapKV",
    "expected": "ExpectedAttention",
    "kvzip": "KVzip",
    "adakv": "AdaKV(ExpectedAttention)",
    "criticalkv": "CriticalKV(ExpectedAttention)",
    "duo_fly": "DuoAttention on the fly",
    "hh_duo": "headhunt DuoAttention pattern",
    "hh_lukv": "headhunt LU-KV curve",
    "hh_adakv": "headhunt AdaKV weights",
    "hh_budget": "headhunt HeadBudgetPress",
}


def scored(results: Path, examples: Path) -> pd.DataFrame:
    ex = {}
    for line in examples.read_text().splitlines():
        r = json.loads(line)
        ex[r["id"]] = TaskTrial(r["id"], r["task"], r["length"], [], r["answers"])
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    df = pd.DataFrame([r for r in rows if "error" not in r])
    df["task"] = [ex[i].task for i in df["id"]]
    df["group"] = np.where(df["task"] == "needle", "needle", "ruler")
    df["score"] = [
        100 * ex[i].score(resp) for i, resp in zip(df["id"], df["response"], strict=True)
    ]
    # against the full cache of the same example (scorer presses shrink the cache itself;
    # head-wise ones mask entries in a full-size cache)
    full = df[df["press"] == "none"].set_index("id")["held"]
    df["removed"] = 1 - df["kept"] / full.loc[df["id"]].to_numpy()
    df["held_share"] = df["held"] / full.loc[df["id"]].to_numpy()
    errors = pd.DataFrame([r for r in rows if "error" in r])
    return df, errors


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    base = df[df["press"] == "none"].set_index(["id"])["score"]
    out = []
    for (press, ratio, group), g in df.groupby(["press", "ratio", "group"], sort=False):
        d = g["score"].to_numpy() - base.loc[g["id"]].to_numpy()
        out.append(
            {
                "press": press,
                "name": NAMES.get(press, press),
                "ratio": ratio,
                "group": group,
                "trials": len(g),
                "accuracy": g["score"].mean(),
                "accuracy_se": g["score"].std(ddof=1) / np.sqrt(len(g)) if len(g) > 1 else np.nan,
                "change": d.mean(),
                "change_se": d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else np.nan,
                "measured_removed": g["removed"].mean(),
                "reported_ratio": g["reported_ratio"].mean()
                if g["reported_ratio"].notna().any()
                else np.nan,
                "kept_entries": g["kept"].mean(),
                "held_share": g["held_share"].mean(),
                "prefill_ms": 1000 * g["prefill_s"].median(),
                "decode_ms": 1000 * g["decode_s"].median(),
            }
        )
    return pd.DataFrame(out)


def markdown(summary: pd.DataFrame, group: str) -> str:
    s = summary[summary["group"] == group]
    ratios = sorted(r for r in s["ratio"].unique() if r > 0)
    head = "| press | " + " | ".join(f"{r:g}" for r in ratios) + " |"
    lines = [head, "| --- |" + " --- |" * len(ratios)]
    for press in dict.fromkeys(s["press"]):
        p = s[s["press"] == press].set_index("ratio")
        cells = []
        for r in ratios:
            if press == "none":
                row = p.iloc[0]
            elif r not in p.index:
                cells.append("")
                continue
            else:
                row = p.loc[r]
            n = "" if row["trials"] == s["trials"].max() else f", n={row['trials']}"
            cells.append(
                f"{row['accuracy']:.1f} ({row['accuracy_se']:.1f}{n}); "
                f"removed {row['measured_removed']:.3f}"
            )
        lines.append(f"| {NAMES.get(press, press)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(summary: pd.DataFrame, title: str):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    groups = [g for g in ("needle", "ruler") if g in set(summary["group"])]
    fig = make_subplots(rows=1, cols=len(groups), subplot_titles=groups, shared_yaxes=True)
    for col, grp in enumerate(groups, start=1):
        for i, press in enumerate(dict.fromkeys(summary["press"])):
            s = summary[(summary["group"] == grp) & (summary["press"] == press)]
            s = s.sort_values("measured_removed")
            fig.add_trace(
                go.Scatter(
                    x=s["measured_removed"],
                    y=s["accuracy"],
                    error_y={"type": "data", "array": s["accuracy_se"]},
                    mode="lines+markers",
                    name=NAMES.get(press, press),
                    legendgroup=press,
                    showlegend=col == 1,
                    line={"dash": "solid" if press.startswith("hh_") else "dot"},
                    marker={"color": f"hsl({int(360 * i / 12)},65%,45%)"},
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="measured share of KV entries removed", row=1, col=col)
    fig.update_yaxes(title_text="accuracy (x100, SE bars)", row=1, col=1)
    fig.update_layout(title=title, height=480)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--results", required=True)
    p.add_argument("--examples", required=True)
    p.add_argument("--title", default="kvpress presses and headhunt's head data")
    p.add_argument("--out", required=True, help="path prefix for .csv, .md, .html")
    a = p.parse_args()
    df, errors = scored(Path(a.results), Path(a.examples))
    summary = summarize(df)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary.to_csv(out.with_suffix(".csv"), index=False)
    text = "\n\n".join(f"{g}:\n\n{markdown(summary, g)}" for g in ("needle", "ruler"))
    if len(errors):
        text += "\n\nerrors:\n" + "\n".join(
            f"- {r.press} {r.ratio}: {r.error}" for r in errors.itertuples()
        )
    out.with_suffix(".md").write_text(text + "\n")
    figure(summary, a.title).write_html(out.with_suffix(".html"), include_plotlyjs="cdn")
    print(text)


if __name__ == "__main__":
    main()
