"""The Zoology table and figure (docs/zoology.md, docs/zoology.html) from the raw results of
benchmarks/zoology.py (benchmarks/results/zoology_*.json).

Run: python benchmarks/zoology_report.py benchmarks/results/zoology_h100.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ARCH_ORDER = ["attention", "hybrid", "mamba2", "gated conv"]


def stderr(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def accuracy_table(res: dict) -> str:
    pairs = sorted({int(k) for r in res["runs"] for k in r["accuracy"]})
    n = res.get("test_examples", 256)
    head = "| model | width | params | steps | " + " | ".join(f"{p} pairs" for p in pairs) + " |"
    lines = [head, "|" + "---|" * (4 + len(pairs))]
    for arch in ARCH_ORDER:
        for r in sorted((r for r in res["runs"] if r["arch"] == arch), key=lambda r: r["width"]):
            cells = []
            for p in pairs:
                a = r["accuracy"][str(p)]
                cells.append(f"{a:.3f} ± {stderr(a, n * p):.3f}")
            lines.append(
                f"| {arch} | {r['width']} | {r['params'] / 1e6:.2f}M | {r['steps']} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines)


def gap_closed(res: dict, pairs: int) -> list[str]:
    """Per width: the share of the attention-free -> attention gap the hybrid closes."""
    out = []
    by = {(r["arch"], r["width"]): r["accuracy"][str(pairs)] for r in res["runs"]}
    for w in sorted({r["width"] for r in res["runs"]}):
        att, hyb = by.get(("attention", w)), by.get(("hybrid", w))
        free = max(by.get(("mamba2", w), 0.0), by.get(("gated conv", w), 0.0))
        if att is None or hyb is None or att - free < 0.05:
            out.append(f"- width {w}: no gap to close at {pairs} pairs")
            continue
        out.append(
            f"- width {w}: attention {att:.3f}, best attention-free {free:.3f}, hybrid "
            f"{hyb:.3f}: the hybrid closes {(hyb - free) / (att - free):.1%} of the gap"
        )
    return out


def masking_table(res: dict) -> str:
    lines = [
        "| model | width | attention layers | top heads (query->value) | their induction score "
        "| accuracy | top heads masked | as many random heads masked (mean ± s.e., sets) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        h = r.get("heads")
        if not h:
            continue
        ind = [h["induction"][la][hd] for la, hd in h["top_heads"]]
        rand = h["masked_random"]
        mean = sum(rand) / len(rand)
        se = math.sqrt(sum((x - mean) ** 2 for x in rand) / max(1, len(rand) - 1) / len(rand))
        tops = ", ".join(f"{la}-{hd}" for la, hd in h["top_heads"])
        lines.append(
            f"| {r['arch']} | {r['width']} | {h['attention_layers']} | {tops} | "
            f"{', '.join(f'{x:.2f}' for x in ind)} | {h['baseline']:.3f} | "
            f"{h['masked_top']:.3f} | {mean:.3f} ± {se:.3f} ({len(rand)}) |"
        )
    return "\n".join(lines)


def figure(res: dict, path: Path) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    pairs = sorted({int(k) for r in res["runs"] for k in r["accuracy"]})
    fig = make_subplots(rows=1, cols=len(pairs), subplot_titles=[f"{p} pairs" for p in pairs])
    colors = {"attention": "#1f77b4", "hybrid": "#2ca02c", "mamba2": "#ff7f0e"}
    colors["gated conv"] = "#d62728"
    for c, p in enumerate(pairs, start=1):
        for arch in ARCH_ORDER:
            rs = sorted((r for r in res["runs"] if r["arch"] == arch), key=lambda r: r["width"])
            fig.add_trace(
                go.Scatter(
                    x=[r["width"] for r in rs],
                    y=[r["accuracy"][str(p)] for r in rs],
                    name=arch,
                    legendgroup=arch,
                    showlegend=c == 1,
                    mode="lines+markers",
                    line={"color": colors[arch]},
                ),
                row=1,
                col=c,
            )
        fig.update_xaxes(title_text="model width", type="log", row=1, col=c)
        fig.update_yaxes(range=[-0.02, 1.02], row=1, col=c)
    fig.update_yaxes(title_text="MQAR accuracy", row=1, col=1)
    fig.update_layout(
        title=f"MQAR accuracy by model width, {res['device']}",
        height=420,
        width=1100,
    )
    fig.write_html(path, include_plotlyjs="cdn")


def main() -> None:
    src = Path(sys.argv[1])
    res = json.loads(src.read_text())
    docs = Path(__file__).parents[1] / "docs"
    figure(res, docs / "zoology.html")
    print(accuracy_table(res))
    print()
    print("\n".join(gap_closed(res, 64)))
    print()
    print(masking_table(res))


if __name__ == "__main__":
    main()
