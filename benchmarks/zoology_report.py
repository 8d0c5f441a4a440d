"""The Zoology table and figure (docs/zoology.md, docs/zoology.html) from the raw results of
benchmarks/zoology.py (benchmarks/results/zoology_*.json).

Run: python benchmarks/zoology_report.py RESULTS.json [MORE.json ...]: with several files, a
later file's run of a (model, width) replaces an earlier one's (a longer or wider call on top of
the sweep); every table names the file and card each run came from. The two-attention-layer
hybrid (``hybrid2``, several seeds per width) is listed run by run in a table of its own, every
run of every file.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ARCH_ORDER = ["attention", "hybrid", "mamba2", "gated conv"]
TRAINED_AT = 0.95  # test accuracy at 16 and 64 pairs for a model to count as trained


def stderr(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def mean_se(xs: list[float]) -> tuple[float, float]:
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / max(1, len(xs) - 1)
    return mean, math.sqrt(var / len(xs))


def best(res: dict) -> list[dict]:
    """The reported run of each (model, width): the learning rate chosen on validation."""
    chosen = {(b["arch"], b["width"], b["lr"]) for b in res.get("best", [])}
    runs = [r for r in res["runs"] if (r["arch"], r["width"], r.get("lr")) in chosen]
    return runs or [r for r in res["runs"] if "accuracy" in r]


def merged(results: list[tuple[str, dict]]) -> list[dict]:
    """The reported runs of every file, each tagged with its file, card and test-set size; a later
    file's (model, width) replaces an earlier one's."""
    by: dict[tuple, dict] = {}
    for name, res in results:
        for r in best(res):
            if r["arch"] == "hybrid2":  # every run in hybrid2_table
                continue
            n = res.get("test_examples", 256)
            solved_at = res.get("solved_at", 1.0)
            tags = {"source": name, "device": res["device"], "n_test": n, "solved_at": solved_at}
            by[(r["arch"], r["width"])] = {**r, **tags}
    return list(by.values())


def accuracy_table(runs: list[dict]) -> str:
    pairs = sorted({int(k) for r in runs for k in r["accuracy"]})
    head = "| model | width | params | lr | steps | seconds | solved | "
    head += " | ".join(f"{p} pairs" for p in pairs) + " | results (card) |"
    lines = [head, "|" + "---|" * (8 + len(pairs))]
    for arch in ARCH_ORDER:
        for r in sorted((r for r in runs if r["arch"] == arch), key=lambda r: r["width"]):
            cells = []
            for p in pairs:
                a = r["accuracy"][str(p)]
                cells.append(f"{a:.3f} ± {stderr(a, r['n_test'] * p):.3f}")
            solved = min(r["val"].values()) >= r["solved_at"] if "val" in r else False
            lines.append(
                f"| {arch} | {r['width']} | {r['params'] / 1e6:.2f}M | {r.get('lr', '')} | "
                f"{r['steps']} | {r.get('train_s', r.get('seconds', ''))} | "
                f"{'yes' if solved else 'no'} | " + " | ".join(cells) + f" | {card(r)} |"
            )
    return "\n".join(lines)


def card(r: dict) -> str:
    return f"{r['source']} ({r['device'].removeprefix('NVIDIA ')})"


def gap_closed(runs: list[dict], pairs: int) -> list[str]:
    """Per width: the share of the attention-free -> attention gap the hybrid closes."""
    out = []
    by = {(r["arch"], r["width"]): r["accuracy"][str(pairs)] for r in runs}
    for w in sorted({r["width"] for r in runs}):
        att, hyb = by.get(("attention", w)), by.get(("hybrid", w))
        free = max(by.get(("mamba2", w), 0.0), by.get(("gated conv", w), 0.0))
        if att is None or hyb is None or att - free < 0.05:
            out.append(f"- width {w}, {pairs} pairs: no gap to close")
            continue
        out.append(
            f"- width {w}, {pairs} pairs: attention {att:.3f}, best attention-free {free:.3f}, "
            f"hybrid {hyb:.3f}: the hybrid closes {(hyb - free) / (att - free):.1%} of the gap"
        )
    return out


def hybrid2_runs(results: list[tuple[str, dict]]) -> list[dict]:
    """Every run of the two-attention-layer hybrid, each seed and call, tagged like merged's."""
    return [
        {**r, "source": name, "device": res["device"], "n_test": res.get("test_examples", 256)}
        for name, res in results
        for r in res["runs"]
        if r["arch"] == "hybrid2" and "accuracy" in r
    ]


def hybrid2_table(results: list[tuple[str, dict]], runs: list[dict]) -> str:
    """Each hybrid2 run: test accuracy, whether it trained, and the share of the attention-free
    -> attention gap it closes at 16 and 64 pairs (attention and the attention-free models from
    ``runs``, the merged table's)."""
    by = {(r["arch"], r["width"]): r["accuracy"] for r in runs}
    lines = [
        "| width | params | lr | seed | steps | seconds | trained | 4 pairs | 16 pairs | 64 pairs "
        "| gap closed, 16 / 64 pairs | results (card) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, (name, _) in enumerate(results)}  # a re-run after its first run
    for r in sorted(
        hybrid2_runs(results), key=lambda r: (r["width"], r["seed"], order[r["source"]])
    ):
        acc = r["accuracy"]
        cells = [f"{acc[p]:.3f} ± {stderr(acc[p], r['n_test'] * int(p)):.3f}" for p in acc]
        closed = []
        for p in ("16", "64"):
            att = by.get(("attention", r["width"]), {}).get(p)
            free = max(by.get((a, r["width"]), {}).get(p, 0.0) for a in ("mamba2", "gated conv"))
            ok = att is not None and att - free >= 0.05
            share = round((acc[p] - free) / (att - free), 3) + 0.0  # + 0.0: no "-0.0%"
            closed.append(f"{share:.1%}" if ok else "no gap")
        trained = acc["16"] >= TRAINED_AT and acc["64"] >= TRAINED_AT
        lines.append(
            f"| {r['width']} | {r['params'] / 1e6:.2f}M | {r['lr']} | {r['seed']} | {r['steps']} "
            f"| {r['train_s']} | {'yes' if trained else 'no'} | "
            + " | ".join(cells)
            + f" | {' / '.join(closed)} | {card(r)} |"
        )
    return "\n".join(lines)


def masking_table(runs: list[dict]) -> str:
    lines = [
        "| model | width | pairs | attention layers | top heads (query->value) | induction "
        "| accuracy | top 1 masked | 1 random (mean ± s.e., sets) | top 2 masked "
        "| 2 random (mean ± s.e., sets) | all attention heads masked |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arch in ("hybrid", "attention"):
        for r in sorted((r for r in runs if r["arch"] == arch), key=lambda r: r["width"]):
            for pairs, h in sorted(r.get("heads", {}).items(), key=lambda kv: int(kv[0])):
                top = h["ranked"][:2]
                ind = [h["induction"][la][hd] for la, hd in top]
                cells = []
                for k in ("1", "2"):
                    m = h["masking"][k]
                    mean, se = mean_se(m["random"])
                    cells += [f"{m['masked']:.3f}", f"{mean:.3f} ± {se:.3f} ({len(m['random'])})"]
                lines.append(
                    f"| {arch} | {r['width']} | {pairs} | {h['attention_layers']} | "
                    f"{', '.join(f'{la}-{hd}' for la, hd in top)} | "
                    f"{', '.join(f'{x:.2f}' for x in ind)} | {h['baseline']:.3f} | "
                    + " | ".join(cells)
                    + f" | {h['all_attention_masked']:.3f} |"
                )
    return "\n".join(lines)


def sweep_table(results: list[tuple[str, dict]]) -> str:
    """Every run of every file (each learning rate), with its validation accuracy."""
    lines = [
        "| results | model | width | lr | seed | steps | validation (4 / 16 / 64 pairs) | error |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|")
    for name, res in results:
        lines += [f"| {name} " + line for line in sweep_rows(res)]
    return "\n".join(lines)


def curve_table(results: list[tuple[str, dict]], arch: str, min_points: int = 4) -> str:
    """The validation curves of ``arch``'s runs with at least ``min_points`` validations, in
    every file, side by side (one row per step): training loss and validation accuracy at each
    test pair count."""
    runs = [
        (name, r)
        for name, res in results
        for r in res["runs"]
        if r["arch"] == arch and len(r.get("step", ())) >= min_points
    ]
    runs.sort(key=lambda nr: (nr[1]["width"], nr[1]["lr"]))
    if not runs:
        return ""
    head = "| step | " + " | ".join(
        f"width {r['width']}, lr {r['lr']}: loss | validation (4 / 16 / 64)" for _, r in runs
    )
    lines = [head + " |", "|---|" + "---|---|" * len(runs)]
    curves = [
        {s: (loss, val) for s, loss, val in zip(r["step"], r["loss"], r["val_curve"], strict=True)}
        for _, r in runs
    ]
    for step in sorted({s for c in curves for s in c}):
        cells = []
        for c in curves:
            loss, val = c.get(step, (None, None))
            cells += (
                ["", ""] if val is None else [f"{loss:.3f}", " / ".join(f"{v:.3f}" for v in val)]
            )
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    files = ", ".join(sorted({name for name, _ in runs}))
    return "\n".join(lines) + f"\n\n(results: {files})"


def sweep_rows(res: dict) -> list[str]:
    lines = []
    for r in res["runs"]:
        val = " / ".join(f"{v:.3f}" for v in r.get("val", {}).values()) if "val" in r else ""
        err = r.get("error", r.get("heads_error", ""))[:80]
        lines.append(
            f"| {r['arch']} | {r['width']} | {r.get('lr', '')} | {r.get('seed', '')} "
            f"| {r.get('steps', '')} | {val} "
            f"| {err} |"
        )
    return lines


def figure(runs: list[dict], path: Path, hybrid2: list[dict] | None = None) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    pairs = sorted({int(k) for r in runs for k in r["accuracy"]})
    fig = make_subplots(rows=1, cols=len(pairs), subplot_titles=[f"{p} pairs" for p in pairs])
    colors = {"attention": "#1f77b4", "hybrid": "#2ca02c", "mamba2": "#ff7f0e"}
    colors["gated conv"] = "#d62728"
    two = hybrid2 or []
    for c, p in enumerate(pairs, start=1):
        for arch in ARCH_ORDER:
            rs = sorted((r for r in runs if r["arch"] == arch), key=lambda r: r["width"])
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
        if two:  # every run, each seed and call: markers, no line (they differ in training)
            fig.add_trace(
                go.Scatter(
                    x=[r["width"] for r in two],
                    y=[r["accuracy"][str(p)] for r in two],
                    name="hybrid, 2 attention layers (each run)",
                    legendgroup="hybrid2",
                    showlegend=c == 1,
                    mode="markers",
                    marker={"color": "#9467bd", "symbol": "diamond"},
                ),
                row=1,
                col=c,
            )
        fig.update_xaxes(title_text="model width", type="log", row=1, col=c)
        fig.update_yaxes(range=[-0.02, 1.02], row=1, col=c)
    fig.update_yaxes(title_text="MQAR accuracy", row=1, col=1)
    fig.update_layout(
        title=f"MQAR accuracy by model width, {' / '.join(sorted({r['device'] for r in runs}))}",
        height=420,
        width=1100,
    )
    fig.write_html(path, include_plotlyjs="cdn")


def main() -> None:
    results = [(Path(a).stem, json.loads(Path(a).read_text())) for a in sys.argv[1:]]
    runs = merged(results)
    docs = Path(__file__).parents[1] / "docs"
    figure(runs, docs / "zoology.html", hybrid2_runs(results))
    print(accuracy_table(runs))
    print()
    for pairs in (16, 64):
        print("\n".join(gap_closed(runs, pairs)))
    print()
    print(hybrid2_table(results, runs))
    print()
    print(masking_table(runs))
    print()
    print(sweep_table(results))
    print()
    print(curve_table(results, "mamba2"))


if __name__ == "__main__":
    main()
