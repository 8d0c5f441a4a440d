"""Multi-query associative recall (MQAR, Zoology) as a method: the accuracy grid's cells, the
heads cell and the masking sets are units dealt over ranks."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headhunt.errors import HeadhuntError
from headhunt.heads.configs import WithBos
from headhunt.methods.base import Method, option, print_table, require

CELLS = "cells.jsonl"
MASKS = "masking.jsonl"
HEADS = "heads.jsonl"


@dataclass
class MQARConfig(WithBos):
    """An MQAR run: the (pairs x gap) grid, the cell where recall heads are scored and masked."""

    layout: str = option("kv", "kv or zoology (pretrained models)")
    pairs: list[int] = option([4, 8, 16, 32], "pairs N")
    tokens_per_pair: int = option(
        16, "Zoology sequence length L = this x N (their grid: 16; at least 4)"
    )
    gaps: list[int] = option([0, 256, 1024], "filler tokens between the pairs and the queries")
    examples: int = option(8, "examples per (pairs, gap) cell", limit=100_000)
    power_a: float = option(0.01, "power-law a of the query gaps")
    heads_cell: list[int] = option(
        [8, 0], "N,GAP of the cell where recall heads are scored and masked", distinct=False
    )
    head_examples: int = option(16, "examples of that cell", limit=100_000)
    top_k: int = option(10, "recall heads to mask")
    random_sets: int = option(5, "random head sets to mask", limit=10_000)
    mask_mode: str = option("query", "query (uniform attention) or output")
    batch_size: int = option(8, "examples per forward")

    def check(self) -> None:
        require(self.layout in ("kv", "zoology"), f"unknown --layout {self.layout!r} (kv, zoology)")
        require(all(n >= 1 for n in self.pairs), "--pairs must be positive")
        require(
            self.tokens_per_pair >= 4, "--tokens-per-pair must be at least 4 (Zoology: L >= 4N)"
        )
        require(all(g >= 0 for g in self.gaps), "--gaps must be >= 0")
        require(self.examples >= 1 and self.head_examples >= 1, "--examples must be at least 1")
        require(len(self.heads_cell) == 2, "--heads-cell takes N,GAP")
        require(
            self.heads_cell[0] >= 1 and self.heads_cell[1] >= 0, "--heads-cell N >= 1, GAP >= 0"
        )
        require(self.top_k >= 1 and self.random_sets >= 0, "--top-k >= 1, --random-sets >= 0")
        require(self.mask_mode in ("query", "output"), "--mask-mode must be query or output")
        require(self.batch_size >= 1, "--batch-size must be at least 1")
        require(0 < self.power_a <= 1, "--power-a must be in (0, 1]")


def _is_trained_mqar(spec: str) -> bool:
    import json

    cfg = Path(spec).expanduser() / "config.json"
    if not cfg.is_file():
        return False
    try:
        return "train" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


class CellBuilder:
    """Builds the examples of one (N, gap) cell for the loaded model, deterministic per cell:
    rendered into the tokenizer's words, or abstract ids for a model trained on MQAR
    (``trained``: its training config)."""

    def __init__(self, model, config: MQARConfig, trained=None):
        from headhunt.heads.inputs.mqar_inputs import word_pools

        self.model, self.config, self.trained = model, config, trained
        self.pools = None if trained is not None else word_pools(model.tokenizer, seed=config.seed)
        self.bos = model.tokenizer.bos_token_id if config.bos else None

    @property
    def n_keys(self) -> int:
        """Distinct keys available (the most pairs a cell may have)."""
        if self.trained is None:
            return len(self.pools.keys)
        cfg = self.trained
        return (cfg.vocab_size - 1) // 2 if cfg.shared_vocab else cfg.vocab_size // 2 - 1

    def __call__(self, n_pairs: int, gap: int, n_examples: int, salt: int = 0):
        from headhunt.heads.inputs.mqar_inputs import (
            MQARSpec,
            generate_mqar,
            insert_gap,
            render_mqar,
        )

        c = self.config
        seed = c.seed * 1_000_003 + 7919 * n_pairs + 31 * gap + salt
        L = c.tokens_per_pair * n_pairs
        if self.trained is not None:
            spec = MQARSpec(
                vocab_size=self.trained.vocab_size,
                seq_len=L,
                n_pairs=n_pairs,
                power_a=c.power_a,
                shared_vocab=self.trained.shared_vocab,
            )
            return insert_gap(
                generate_mqar(spec, n_examples, seed), gap, spec.vocab_size, seed=seed
            )
        if n_pairs > len(self.pools.keys):
            raise HeadhuntError(f"{n_pairs} pairs exceed the {len(self.pools.keys)} key words")
        spec = MQARSpec(
            vocab_size=self.pools.vocab_size, seq_len=L, n_pairs=n_pairs, power_a=c.power_a
        )
        return render_mqar(
            spec,
            self.pools,
            n_examples,
            tokenizer=self.model.tokenizer,
            layout=c.layout,
            prefix_gap=gap,
            bos_id=self.bos,
            seed=seed,
        )


class MQAR(Method):
    name = "mqar"
    Config = MQARConfig
    metric = "query_to_value"
    help = "MQAR recall accuracy, recall heads, masking"
    description = """Multi-query associative recall (MQAR, Zoology) on a model.

Examples follow Zoology's generator (N key-value pairs, every key queried once, power-law
query gaps, filler) rendered into the model's tokenizer: keys, values and filler are
single-token words from disjoint pools. --layout kv writes pairs as "key: value," and queries
as "key:" (the value is predicted at the colon, then shown); --layout zoology keeps Zoology's
token-for-token layout (bare keys amid filler, answers never shown). --gaps inserts that many
filler words between the pairs and the queries. A model folder written by headhunt's MQAR
trainer (heads/mqar_train.py) is run on the abstract token ids directly.

Reports recall accuracy (argmax over the whole vocabulary; and over the value pool) against
the number of pairs and the gap; the recall heads (mean attention from each query to its key's
value in the context: query_to_value; to the key: query_to_key; from each context value to its
key: value_to_key) on the --heads-cell; and accuracy with the --top-k recall heads masked
against --random-sets sets of as many random other heads. Writes manifest.json,
scores.parquet, accuracy.csv, distance.csv, masking.json, summary.json and mqar.html.

A model with no attention layers (Mamba, Mamba-2, Falcon-Mamba, RWKV, xLSTM) gets the
accuracy grid only (Zoology's comparison of attention with attention-free models): no recall
heads, no masking, an empty scores table."""
    units = "grid cells and masking sets"
    top = 10
    runs_attention_free = True

    def parameters(self, config: MQARConfig, model: str) -> dict[str, Any]:
        keys = ("layout", "pairs", "tokens_per_pair", "gaps", "examples", "power_a", "heads_cell")
        keys += ("head_examples", "top_k", "random_sets", "mask_mode", "seed")
        params = {"model": model, **{k: getattr(config, k) for k in keys}, "bos": config.bos}
        if _is_trained_mqar(model):
            params["layout"] = "abstract"
        return params

    def load(self, spec):
        """A folder written by headhunt's MQAR trainer loads with its training config."""
        if not _is_trained_mqar(spec.spec):
            return spec.load()
        from headhunt.heads.mqar_train import load_mqar_model

        model, cfg, _meta = load_mqar_model(spec.spec)
        model.mqar_config = cfg
        return model

    def run(self, model, config: MQARConfig, ctx):
        import torch

        from headhunt.heads.evaluations.causal import MaskingCheck
        from headhunt.heads.mqar import RECALL_METRICS, MQARResult, recall_scores

        c = config
        cells = CellBuilder(model, c, getattr(model, "mqar_config", None))
        _check_sizes(model, c, cells)
        grid = [(n, g) for g in c.gaps for n in c.pairs]
        if model.attention_free:  # the accuracy grid is all there is to measure
            _run_cells(model, c, ctx, cells, grid, None)
            return _accuracy_only(model, c, ctx, cells, grid)
        hn, hgap = c.heads_cell
        heads_cell = cells(hn, hgap, c.head_examples, salt=1)
        # 1. The accuracy grid (one record per cell) and the heads cell, dealt over the ranks.
        _run_cells(model, c, ctx, cells, grid, heads_cell)

        # 2. Recall heads on the heads cell (every rank reads the one record).
        t2 = time.perf_counter()
        rec = ctx.records(HEADS)[0]
        recall = torch.tensor(rec["recall"])
        base = MQARResult(
            torch.tensor(rec["correct"]).bool(),
            torch.tensor(rec["correct_pool"]).bool(),
            heads_cell.gaps(),
            recall,
        )
        n_queries = heads_cell.query_pos.numel()
        scores = recall_scores(
            recall, n_queries, n_kv_heads=model.score_kv_heads(), n_pairs=hn, gap=hgap
        )
        ctx.timings["heads_s"] = time.perf_counter() - t2

        # 3. Masking: the top-k recall heads against random sets of as many other heads (the
        # unmasked baseline is the heads cell's own run).
        top = scores.top("query_to_value", c.top_k)
        recall_heads = [(int(r.layer), int(r.head)) for r in top.itertuples()]
        check = MaskingCheck.draw(model, recall_heads, c.random_sets, seed=c.seed)
        masked = ctx.run_conditions(
            MASKS,
            check.conditions(baseline=False),
            lambda heads: _masked_accuracy(model, heads_cell, heads, c),
            timing="masking_s",
        )
        if masked is None:
            return None
        cell_recs = ctx.collect(CELLS, grid, key=lambda r: (r["n_pairs"], r["gap"]))
        ctx.collect(HEADS, ["heads"], key=lambda r: "heads")
        acc = accuracy_table(cell_recs)
        masking = masking_summary(check, masked, base, recall_heads, c)
        ctx.write("accuracy.csv", acc)
        ctx.write("distance.csv", distance_table(cell_recs))
        ctx.write("masking.json", masking)
        summary = {
            "layout": "abstract" if cells.trained is not None else c.layout,
            "accuracy_overall": float(acc["accuracy"].mean()),
            "recall_heads": recall_heads,
            "metrics": RECALL_METRICS,
        }
        ctx.write("summary.json", summary)
        ctx.write("mqar.html", figure(acc, scores, masking, model.name))
        ctx.extra["summary"] = summary
        return scores

    def show(self, run, top: int) -> None:
        import pandas as pd

        acc = pd.read_csv(run.path / "accuracy.csv")
        if not (run.path / "masking.json").exists():  # a model with no attention layers
            show_accuracy(acc)
            print("No attention layers: no recall heads to score or mask.")
            return
        show(acc, run.scores(), run.json("masking.json"), top)


def _accuracy_only(model, c: MQARConfig, ctx, cells: CellBuilder, grid):
    """The run of a model with no attention layers: the accuracy grid, its tables and figure,
    and an empty scores table (there is no head to score)."""
    import pandas as pd

    from headhunt.scores import COLUMNS, HeadScores

    cell_recs = ctx.collect(CELLS, grid, key=lambda r: (r["n_pairs"], r["gap"]))
    if cell_recs is None:
        return None
    acc = accuracy_table(cell_recs)
    ctx.write("accuracy.csv", acc)
    ctx.write("distance.csv", distance_table(cell_recs))
    summary = {
        "layout": "abstract" if cells.trained is not None else c.layout,
        "accuracy_overall": float(acc["accuracy"].mean()),
        "recall_heads": [],
        "attention_layers": [],
    }
    ctx.write("summary.json", summary)
    ctx.write("mqar.html", accuracy_figure(acc, model.name))
    ctx.extra["summary"] = summary
    return HeadScores(pd.DataFrame({col: [] for col in COLUMNS}))


def _check_sizes(model, c: MQARConfig, cells: CellBuilder) -> None:
    """Enough distinct keys for the largest cell, fewer masked heads than the model has, and
    every cell's examples inside the model's context."""
    most = max(*c.pairs, c.heads_cell[0])
    require(most <= cells.n_keys, f"{most} pairs exceed the {cells.n_keys} distinct keys available")
    n_heads_total = len(model.attention_layers) * model.n_heads
    if not model.attention_free:  # no heads: nothing is masked
        require(c.top_k < n_heads_total, f"--top-k must be below the {n_heads_total} heads")
    kv = cells.trained is None and c.layout == "kv"
    for n in {*c.pairs, c.heads_cell[0]}:
        for gap in {*c.gaps, c.heads_cell[1]}:
            length = c.tokens_per_pair * n + 2 * n * kv + gap + 1
            if length > model.max_context:
                raise HeadhuntError(
                    f"N={n}, gap={gap} makes {length}-token examples, longer than the "
                    f"model's context ({model.max_context})"
                )


def _run_cells(model, c: MQARConfig, ctx, cells: CellBuilder, grid, heads_cell) -> None:
    """This rank's share of the grid cells and the heads cell, each saved as it finishes."""
    from headhunt.heads.mqar import run_mqar

    t1 = time.perf_counter()
    done = ctx.done(CELLS, key=lambda r: (r["n_pairs"], r["gap"]))
    if ctx.records(HEADS):
        done.add("heads")
    if done:
        ctx.say(
            f"resuming: {len(done)} of {len(grid) + 1} cells already done (heads cell included)"
        )
    share = ctx.todo([*grid, "heads"] if heads_cell is not None else grid)
    units = [u for u in share if u not in done]
    for unit in ctx.units(units, "cell", done_before=len(share) - len(units)):
        if unit == "heads":
            base = run_mqar(model, heads_cell, batch_size=c.batch_size, score_heads=True)
            rec = {
                "recall": base.recall.tolist(),
                "correct": base.correct.int().tolist(),
                "correct_pool": base.correct_pool.int().tolist(),
            }
            ctx.append(HEADS, rec)
            continue
        n, gap = unit
        examples = cells(n, gap, c.examples)
        res = run_mqar(model, examples, batch_size=c.batch_size)
        rec = {
            "n_pairs": n,
            "gap": gap,
            "tokens": int(examples.ids.shape[1]),
            "correct": res.correct.int().tolist(),
            "correct_pool": res.correct_pool.int().tolist(),
            "distance": res.gaps.tolist(),
        }
        ctx.append(CELLS, rec)
    ctx.wait("grid_s", since=t1)  # also waits for every rank's shard


def _masked_accuracy(model, heads_cell, heads, c: MQARConfig) -> dict[str, Any]:
    """Accuracy on the heads cell with ``heads`` masked (one masking condition's record)."""
    from headhunt.heads.interventions.masking import HeadMask
    from headhunt.heads.mqar import run_mqar

    hooks = [HeadMask(heads, c.mask_mode)]
    res = run_mqar(model, heads_cell, batch_size=c.batch_size, hooks=hooks)
    return {"heads": heads, "accuracy": res.accuracy, "accuracy_pool": res.accuracy_pool}


def masking_summary(check, masked: dict, base, recall_heads, c: MQARConfig) -> dict[str, Any]:
    """masking.json: the heads cell's accuracy unmasked, with the recall heads masked and with
    each random set masked (argmax over the vocabulary, and over the value pool)."""
    import numpy as np

    rand = [masked[n]["accuracy"] for n in check.random_names()]
    rand_pool = [masked[n]["accuracy_pool"] for n in check.random_names()]
    return {
        "cell": {"n_pairs": c.heads_cell[0], "gap": c.heads_cell[1], "examples": c.head_examples},
        "mode": c.mask_mode,
        "baseline": base.accuracy,
        "baseline_pool": base.accuracy_pool,
        "recall_heads": recall_heads,
        "masked": masked["top"]["accuracy"],
        "masked_pool": masked["top"]["accuracy_pool"],
        "random": rand,
        "random_pool": rand_pool,
        "random_mean": float(np.mean(rand)) if rand else None,
        "random_pool_mean": float(np.mean(rand_pool)) if rand_pool else None,
        "random_sets": check.random_sets,
    }


def accuracy_table(cells: list[dict]):
    """One row per (pairs, gap) cell: tokens, queries, accuracy, accuracy over the value pool."""
    import numpy as np
    import pandas as pd

    rows = []
    for c in cells:
        cor = np.asarray(c["correct"], float)
        rows.append(
            {
                "n_pairs": c["n_pairs"],
                "gap": c["gap"],
                "tokens": c["tokens"],
                "queries": cor.size,
                "accuracy": float(cor.mean()),
                "accuracy_pool": float(np.mean(c["correct_pool"])),
            }
        )
    return pd.DataFrame(rows)


def distance_table(cells: list[dict]):
    """Accuracy pooled over cells by the distance (tokens) from a context value to its query."""
    import numpy as np
    import pandas as pd

    d = np.concatenate([np.ravel(c["distance"]) for c in cells])
    cor = np.concatenate([np.ravel(c["correct"]) for c in cells]).astype(float)
    edges = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, np.inf]
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = (d >= lo) & (d < hi)
        if sel.any():
            rows.append(
                {
                    "distance": f"{int(lo)}-{'' if np.isinf(hi) else int(hi) - 1}",
                    "queries": int(sel.sum()),
                    "accuracy": float(cor[sel].mean()),
                }
            )
    return pd.DataFrame(rows)


def show_accuracy(acc) -> None:
    wide = acc.pivot(index="n_pairs", columns="gap", values="accuracy")
    wide.columns = [f"gap {c}" for c in wide.columns]
    print_table(wide.reset_index(), "MQAR accuracy (rows: pairs N; columns: filler gap)")


def show(acc, scores, masking: dict, top: int) -> None:
    show_accuracy(acc)
    cols = ["layer", "head", "kv_head", "value"]
    t = scores.top("query_to_value", top)[cols].rename(columns={"value": "query_to_value"})
    other = scores.df.pivot_table(index=["layer", "head"], columns="metric", values="value")
    t["query_to_key"] = [other.loc[(r.layer, r.head), "query_to_key"] for r in t.itertuples()]
    t["value_to_key"] = [other.loc[(r.layer, r.head), "value_to_key"] for r in t.itertuples()]
    c = masking["cell"]
    print_table(t, f"recall heads (N={c['n_pairs']}, gap={c['gap']})")
    rand = masking["random"]
    rmean = f"{masking['random_mean']:.3f}" if rand else "n/a"
    print(
        f"Masking ({masking['mode']}) on N={c['n_pairs']}, gap={c['gap']}: accuracy "
        f"{masking['baseline']:.3f} unmasked, {masking['masked']:.3f} with the "
        f"{len(masking['recall_heads'])} recall heads masked, {rmean} with as many random "
        f"heads (mean of {len(rand)} sets: {', '.join(f'{r:.3f}' for r in rand)})."
    )


def _accuracy_heatmap(acc, **style):
    """Accuracy over (pairs, gap) as a heatmap trace, 0 to 1."""
    import plotly.graph_objects as go

    wide = acc.pivot(index="n_pairs", columns="gap", values="accuracy")
    return go.Heatmap(
        z=wide.to_numpy(),
        x=[str(c) for c in wide.columns],
        y=[str(i) for i in wide.index],
        colorscale="Viridis",
        zmin=0,
        zmax=1,
        texttemplate="%{z:.2f}",
        **style,
    )


def accuracy_figure(acc, name: str):
    """The accuracy heatmap alone (a model with no attention layers)."""
    import plotly.graph_objects as go

    fig = go.Figure(_accuracy_heatmap(acc))
    fig.update_xaxes(title_text="gap")
    fig.update_yaxes(title_text="pairs N")
    fig.update_layout(title=f"MQAR accuracy (no attention layers): {name}", height=480)
    return fig


def figure(acc, scores, masking: dict, name: str):
    """Accuracy heatmap, recall-head heatmap and the masking bars."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=[
            "accuracy (pairs x gap)",
            "query -> value attention (recall heads)",
            "masking",
        ],
    )
    fig.add_trace(
        _accuracy_heatmap(acc, showscale=False),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Heatmap(
            z=scores.matrix("query_to_value"),
            colorscale="Magma",
            colorbar={"title": "attention"},
            hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>",
        ),
        row=1,
        col=2,
    )
    names = ["none", "recall heads"] + [f"random {i + 1}" for i in range(len(masking["random"]))]
    vals = [masking["baseline"], masking["masked"], *masking["random"]]
    fig.add_trace(go.Bar(x=names, y=vals, showlegend=False), row=1, col=3)
    fig.update_xaxes(title_text="gap", row=1, col=1)
    fig.update_yaxes(title_text="pairs N", row=1, col=1)
    fig.update_xaxes(title_text="head", row=1, col=2)
    fig.update_yaxes(title_text="layer", row=1, col=2)
    fig.update_yaxes(title_text="accuracy", range=[0, 1], row=1, col=3)
    fig.update_layout(title=f"MQAR recall: {name}", height=520, width=1500)
    return fig
