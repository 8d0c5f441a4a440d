"""Score compare.py's responses in headhunt's environment (the scorers of heads/inputs/ruler.py:
needles by ROUGE-1 recall of the answer, RULER-like tasks by the share of answers found) and
write the table (CSV and Markdown) and a plotly figure. Every change is paired on the same
examples: against the uncompressed cache and against headhunt's best entry at that ratio and task
group (the ``hh_`` press of the highest mean there: chosen after the fact, so its margin over the
others is an upper estimate), each with its SE. Rows compare.py marks ``timing`` (each press
timed alone after the queued runs) give the prefill / decode medians; without them the medians
come from all rows.

    .venv/bin/python benchmarks/kvpress/summarize.py --results R.jsonl [R2.jsonl] --examples E.jsonl \
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
    "hh_spread": "headhunt spread budgets (ExpectedAttention)",
    "hh_spread_recent": "headhunt spread budgets (recent)",
    "hh_duo_snap": "headhunt DuoAttention pattern, SnapKV tokens in streaming heads",
    "hh_duo_union": "headhunt DuoAttention pattern, retrieval or spread rank",
    "knorm": "Knorm",
    "tova": "TOVA",
    "streaming_asis": "StreamingLLM, kvpress as shipped (all layers)",
    "snapkv_asis": "SnapKV, kvpress as shipped (all layers)",
}
HEAD_AWARE = ("duo_fly", "adakv", "criticalkv")  # the bar: >= 2 points above these


def scored(results: list[Path], examples: Path) -> pd.DataFrame:
    """``results``: one run's file, or several runs on the same examples and card; a condition
    (press, ratio, example) answered in more than one keeps the first file's answer."""
    ex = {}
    for line in examples.read_text().splitlines():
        r = json.loads(line)
        ex[r["id"]] = TaskTrial(r["id"], r["task"], r["length"], [], r["answers"])
    rows, seen = [], set()
    for path in results:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            key = (r["press"], r["ratio"], r["id"], r.get("timing"))
            if key not in seen:
                seen.add(key)
                rows.append(r)
    df = pd.DataFrame([r for r in rows if "error" not in r])
    if "timing" not in df:
        df["timing"] = None
    df["task"] = [ex[i].task for i in df["id"]]
    df["group"] = np.where(df["task"] == "needle", "needle", "ruler")
    df["score"] = [
        100 * ex[i].score(resp) for i, resp in zip(df["id"], df["response"], strict=True)
    ]
    # against the full cache of the same example (scorer presses shrink the cache itself;
    # head-wise ones mask entries in a full-size cache)
    full = df[(df["press"] == "none") & df["timing"].isna()].set_index("id")["held"]
    df["removed"] = 1 - df["kept"] / full.loc[df["id"]].to_numpy()
    df["held_share"] = df["held"] / full.loc[df["id"]].to_numpy()
    df["removed_all"] = df["removed"]
    if "held_global" in df and df["held_global"].notna().any():
        # Gemma 3: the ratio's base is the global layers' entries (kvpress's Gemma 3 rule);
        # removed_all counts every entry held, the sliding layers' windows included
        glob = df[(df["press"] == "none") & df["timing"].isna()].set_index("id")["held_global"]
        df["removed"] = 1 - df["kept_global"] / glob.loc[df["id"]].to_numpy()
    errors = pd.DataFrame([r for r in rows if "error" in r])
    return df, errors


def paired(a: pd.Series, b: pd.Series) -> tuple[float, float, int]:
    """Mean and SE of a - b over the examples both hold."""
    ids = a.index.intersection(b.index)
    d = a.loc[ids].to_numpy() - b.loc[ids].to_numpy()
    se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else np.nan
    return (d.mean() if len(d) else np.nan), se, len(d)


def best_entries(df: pd.DataFrame) -> dict:
    """(ratio, group) -> headhunt's press of the highest mean score there."""
    hh = df[df["press"].str.startswith("hh_")]
    means = hh.groupby(["ratio", "group", "press"])["score"].mean()
    return {k: g.idxmax()[2] for k, g in means.groupby(level=[0, 1])}


def summarize(df: pd.DataFrame, entry_bytes: int) -> pd.DataFrame:
    timed = df[df["timing"] == True]  # noqa: E712 (None / True / "warm-up")
    df = df[df["timing"].isna()]
    base = df[df["press"] == "none"].set_index(["id"])["score"]
    best = best_entries(df)
    out = []
    for (press, ratio, group), g in df.groupby(["press", "ratio", "group"], sort=False):
        d = g["score"].to_numpy() - base.loc[g["id"]].to_numpy()
        t = timed[timed["press"] == press]
        alone = bool(len(t))
        t = t if alone else g
        entry = best.get((ratio, group))
        if entry is not None and press != "none":
            other = df[(df["press"] == entry) & (df["ratio"] == ratio) & (df["group"] == group)]
            vs = paired(other.set_index("id")["score"], g.set_index("id")["score"])
        else:
            vs = (np.nan, np.nan, 0)
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
                "removed_all": g["removed_all"].mean(),
                "kept_entries": g["kept"].mean(),
                "kv_mib_held": g["held"].mean() * entry_bytes / 2**20,
                "kv_mib_kept": g["kept"].mean() * entry_bytes / 2**20,
                "held_share": g["held_share"].mean(),
                "best_hh": entry,
                "best_hh_minus_this": vs[0],
                "best_hh_minus_this_se": vs[1],
                "best_hh_pairs": vs[2],
                "prefill_ms": 1000 * t["prefill_s"].median(),
                "decode_ms": 1000 * t["decode_s"].median(),
                "timed_alone": alone,
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


def paired_markdown(summary: pd.DataFrame, ratios=(0.5, 0.75)) -> str:
    """Per press at the bar's ratios: change vs the full cache and headhunt's best entry minus
    the press (paired, SE), per task group."""
    lines = [
        "| press | " + " | ".join(f"{g} {r:g}" for r in ratios for g in ("needle", "ruler")) + " |",
        "| --- |" + " --- |" * (2 * len(ratios)),
    ]
    s = summary[summary["press"] != "none"]
    for press in dict.fromkeys(s["press"]):
        cells = []
        for r in ratios:
            for g in ("needle", "ruler"):
                row = s[(s["press"] == press) & (s["ratio"] == r) & (s["group"] == g)]
                if not len(row):
                    cells.append("")
                    continue
                x = row.iloc[0]
                best = (
                    "best"
                    if x["best_hh"] == press
                    else f"{x['best_hh_minus_this']:+.1f} ({x['best_hh_minus_this_se']:.1f})"
                )
                cells.append(f"{x['change']:+.1f} ({x['change_se']:.1f}); {best}")
        lines.append(f"| {NAMES.get(press, press)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def timing_markdown(summary: pd.DataFrame) -> str:
    s = summary[(summary["ratio"].isin([0.0, 0.5])) & (summary["group"] == "needle")]
    lines = [
        "| press | KV MiB kept (0.5) | prefill ms | decode ms | timed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for x in s.itertuples():
        how = "alone" if x.timed_alone else "sharing the GPU with the other workers"
        lines.append(
            f"| {NAMES.get(x.press, x.press)} | {x.kv_mib_kept:.1f} | {x.prefill_ms:.0f} | "
            f"{x.decode_ms:.0f} | {how} |"
        )
    return "\n".join(lines)


def figure(summary: pd.DataFrame, title: str):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    groups = [g for g in ("needle", "ruler") if g in set(summary["group"])]
    fig = make_subplots(rows=1, cols=len(groups), subplot_titles=groups, shared_yaxes=True)
    for col, grp in enumerate(groups, start=1):
        for i, press in enumerate(dict.fromkeys(summary["press"])):
            s = summary[(summary["group"] == grp) & (summary["press"] == press)]
            full = summary[(summary["group"] == grp) & (summary["press"] == "none")]
            # at ratio 0 every press keeps the whole cache: its line starts at the full cache
            s = pd.concat([full, s]) if press != "none" else s
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
    p.add_argument("--results", required=True, nargs="+", help="one run, or runs to merge")
    p.add_argument("--examples", required=True)
    p.add_argument("--title", default="kvpress presses and headhunt's head data")
    p.add_argument("--out", required=True, help="path prefix for .csv, .md, .html")
    p.add_argument(
        "--entry-bytes", type=int, default=256, help="bytes of one KV entry (2 x head_dim x 2)"
    )
    a = p.parse_args()
    df, errors = scored([Path(r) for r in a.results], Path(a.examples))
    summary = summarize(df, a.entry_bytes)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary.to_csv(out.with_suffix(".csv"), index=False)
    text = "\n\n".join(f"{g}:\n\n{markdown(summary, g)}" for g in ("needle", "ruler"))
    text += "\n\npaired change vs no compression; best headhunt entry minus the press:\n\n"
    text += paired_markdown(summary)
    text += "\n\nKV kept and time (median per example):\n\n" + timing_markdown(summary)
    if len(errors):
        text += "\n\nerrors:\n" + "\n".join(
            f"- {r.press} {r.ratio}: {r.error}" for r in errors.itertuples()
        )
    out.with_suffix(".md").write_text(text + "\n")
    figure(summary, a.title).write_html(out.with_suffix(".html"), include_plotlyjs="cdn")
    print(text)


if __name__ == "__main__":
    main()
