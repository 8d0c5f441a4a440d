"""`headhunt mqar`: multi-query associative recall accuracy, recall heads and a masking check."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from headhunt.commands.common import (
    add_command,
    add_model_args,
    add_out_args,
    add_parallel_args,
    comma_list,
    finite_float,
    open_model,
    print_table,
    require,
    seed_everything,
)
from headhunt.errors import HeadhuntError

DESCRIPTION = """Multi-query associative recall (MQAR, Zoology) on a model.

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
scores.parquet, accuracy.csv, distance.csv, masking.json, summary.json and mqar.html."""

CELLS = "cells.jsonl"
MASKS = "masking.jsonl"
HEADS = "heads.jsonl"


def add_parser(sub) -> None:
    p = add_command(sub, "mqar", "MQAR recall accuracy, recall heads, masking", DESCRIPTION)
    add_model_args(p)
    add_out_args(p, "runs/mqar")
    g = p.add_argument_group("task")
    g.add_argument("--layout", default="kv", help="kv or zoology (pretrained models)")
    g.add_argument("--pairs", type=comma_list(int, "count"), default=[4, 8, 16, 32], help="pairs N")
    g.add_argument(
        "--tokens-per-pair",
        type=int,
        default=16,
        help="Zoology sequence length L = this x N (their grid: 16; at least 4)",
    )
    g.add_argument(
        "--gaps",
        type=comma_list(int, "length"),
        default=[0, 256, 1024],
        help="filler tokens between the pairs and the queries",
    )
    g.add_argument("--examples", type=int, default=8, help="examples per (pairs, gap) cell")
    g.add_argument(
        "--power-a", type=finite_float, default=0.01, help="power-law a of the query gaps"
    )
    g.add_argument("--no-bos", action="store_true", help="do not prepend the tokenizer's BOS token")
    g = p.add_argument_group("heads and masking")
    g.add_argument(
        "--heads-cell",
        type=comma_list(int, "number"),
        default=[8, 0],
        help="N,GAP of the cell where recall heads are scored and masked",
    )
    g.add_argument("--head-examples", type=int, default=16, help="examples of that cell")
    g.add_argument("--top-k", type=int, default=10, help="recall heads to mask")
    g.add_argument("--random-sets", type=int, default=5, help="random head sets to mask")
    g.add_argument("--mask-mode", default="query", help="query (uniform attention) or output")
    g.add_argument("--batch-size", type=int, default=8, help="examples per forward")
    g.add_argument("--top", type=int, default=10, help="rows of the printed tables")
    add_parallel_args(p)
    p.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    require(args.layout in ("kv", "zoology"), f"unknown --layout {args.layout!r} (kv, zoology)")
    require(all(n >= 1 for n in args.pairs), "--pairs must be positive")
    require(args.tokens_per_pair >= 4, "--tokens-per-pair must be at least 4 (Zoology: L >= 4N)")
    require(all(g >= 0 for g in args.gaps), "--gaps must be >= 0")
    require(args.examples >= 1 and args.head_examples >= 1, "--examples must be at least 1")
    require(len(args.heads_cell) == 2, "--heads-cell takes N,GAP")
    require(args.heads_cell[0] >= 1 and args.heads_cell[1] >= 0, "--heads-cell N >= 1, GAP >= 0")
    require(args.top_k >= 1 and args.random_sets >= 0, "--top-k >= 1, --random-sets >= 0")
    require(args.mask_mode in ("query", "output"), "--mask-mode must be query or output")
    require(args.batch_size >= 1, "--batch-size must be at least 1")
    require(0 < args.power_a <= 1, "--power-a must be in (0, 1]")


def _is_trained_mqar(spec: str) -> bool:
    import json

    cfg = Path(spec).expanduser() / "config.json"
    if not cfg.is_file():
        return False
    try:
        return "train" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


class Probes:
    """Builds the probe of one (N, gap) cell for the loaded model (deterministic per cell)."""

    def __init__(self, model, args: argparse.Namespace, trained=None):
        from headhunt.heads.mqar import word_pools

        self.model, self.args, self.trained = model, args, trained
        self.pools = None if trained is not None else word_pools(model.tokenizer, seed=args.seed)
        self.bos = None if args.no_bos else model.tokenizer.bos_token_id

    def __call__(self, n_pairs: int, gap: int, n_examples: int, salt: int = 0):
        from headhunt.heads.mqar import MQARSpec, generate_mqar, insert_gap, render_mqar

        seed = self.args.seed * 1_000_003 + 7919 * n_pairs + 31 * gap + salt
        L = self.args.tokens_per_pair * n_pairs
        if self.trained is not None:
            spec = MQARSpec(
                vocab_size=self.trained.vocab_size,
                seq_len=L,
                n_pairs=n_pairs,
                power_a=self.args.power_a,
                shared_vocab=self.trained.shared_vocab,
            )
            return insert_gap(
                generate_mqar(spec, n_examples, seed), gap, spec.vocab_size, seed=seed
            )
        if n_pairs > len(self.pools.keys):
            raise HeadhuntError(f"{n_pairs} pairs exceed the {len(self.pools.keys)} key words")
        spec = MQARSpec(
            vocab_size=self.pools.vocab_size,
            seq_len=L,
            n_pairs=n_pairs,
            power_a=self.args.power_a,
        )
        return render_mqar(
            spec,
            self.pools,
            n_examples,
            tokenizer=self.model.tokenizer,
            layout=self.args.layout,
            prefix_gap=gap,
            bos_id=self.bos,
            seed=seed,
        )


def run(args: argparse.Namespace) -> int:
    from headhunt import distributed

    _validate(args)
    return distributed.main(args, _run)


def _run(args: argparse.Namespace, dist) -> int:
    import numpy as np
    import pandas as pd
    import torch
    from tqdm import tqdm

    from headhunt import distributed
    from headhunt.heads.masking import HeadMask
    from headhunt.heads.mqar import (
        RECALL_METRICS,
        MQARResult,
        random_head_sets,
        recall_scores,
        run_mqar,
    )
    from headhunt.heads.scores import HeadScores
    from headhunt.plots import write_html
    from headhunt.rundir import load_run, write_json_atomic

    trained = _is_trained_mqar(args.model)
    params = {
        k: getattr(args, k)
        for k in (
            "model",
            "layout",
            "pairs",
            "tokens_per_pair",
            "gaps",
            "examples",
            "power_a",
            "heads_cell",
            "head_examples",
            "top_k",
            "random_sets",
            "mask_mode",
            "seed",
        )
    }
    params["bos"] = not args.no_bos
    if trained:
        params["layout"] = "abstract"
    run_dir = distributed.open_run(
        dist, args.out, "mqar", resume=args.resume, force=args.force, parameters=params
    )
    if run_dir.complete:  # reprinted without loading the model
        if dist.is_main:
            done = load_run(run_dir.out)
            show(
                pd.read_csv(run_dir.out / "accuracy.csv"),
                HeadScores.read_parquet(run_dir.out / "scores.parquet"),
                done.json("masking.json"),
                args.top,
            )
        return 0
    seed_everything(args.seed)
    t0 = time.perf_counter()
    cfg = None
    if trained:
        from headhunt.heads.mqar_train import load_mqar_model

        model, cfg, _meta = load_mqar_model(args.model)
    else:
        model = open_model(args)
    t_load = time.perf_counter() - t0
    probes = Probes(model, args, cfg)
    most = max(*args.pairs, args.heads_cell[0])
    if cfg is None:
        keys = len(probes.pools.keys)
    else:
        keys = (cfg.vocab_size - 1) // 2 if cfg.shared_vocab else cfg.vocab_size // 2 - 1
    require(most <= keys, f"{most} pairs exceed the {keys} distinct keys available")
    n_heads_total = model.n_layers * model.n_heads
    require(args.top_k < n_heads_total, f"--top-k must be below the {n_heads_total} heads")
    for n in {*args.pairs, args.heads_cell[0]}:
        for gap in {*args.gaps, args.heads_cell[1]}:
            kv = params["layout"] == "kv"
            length = args.tokens_per_pair * n + 2 * n * kv + gap + 1
            if length > model.max_context:
                raise HeadhuntError(
                    f"N={n}, gap={gap} makes {length}-token examples, longer than the model's "
                    f"context ({model.max_context})"
                )

    # 1. The accuracy grid (one record per cell) and the heads cell, dealt over the ranks.
    t1 = time.perf_counter()
    grid = [(n, g) for g in args.gaps for n in args.pairs]
    hn, hgap = args.heads_cell
    hprobe = probes(hn, hgap, args.head_examples, salt=1)
    done = {(r["n_pairs"], r["gap"]) for r in distributed.shard_records(run_dir, CELLS)}
    if distributed.shard_records(run_dir, HEADS):
        done.add("heads")
    if done and dist.is_main:
        print(f"resuming: {len(done)} of {len(grid) + 1} cells already done (heads cell included)")
    # Share the whole plan, then skip what is done: a rank that reads the shards after another
    # rank began appending still takes the same share.
    mine = [u for u in dist.share([*grid, "heads"]) if u not in done]
    cell_shard = distributed.shard_name(dist, CELLS)
    for unit in tqdm(mine, desc="mqar cells", unit="cell", disable=not dist.is_main):
        if unit == "heads":
            base = run_mqar(model, hprobe, batch_size=args.batch_size, score_heads=True)
            rec = {
                "recall": base.recall.tolist(),
                "correct": base.correct.int().tolist(),
                "correct_pool": base.correct_pool.int().tolist(),
            }
            run_dir.append_record(rec, distributed.shard_name(dist, HEADS))
            continue
        n, gap = unit
        probe = probes(n, gap, args.examples)
        res = run_mqar(model, probe, batch_size=args.batch_size)
        rec = {
            "n_pairs": n,
            "gap": gap,
            "tokens": int(probe.ids.shape[1]),
            "correct": res.correct.int().tolist(),
            "correct_pool": res.correct_pool.int().tolist(),
            "distance": res.gaps.tolist(),
        }
        run_dir.append_record(rec, cell_shard)
    t_grid = max(dist.gather(time.perf_counter() - t1))  # also waits for every rank's shard

    # 2. Recall heads on the heads cell (every rank reads the one record).
    t2 = time.perf_counter()
    rec = distributed.shard_records(run_dir, HEADS)[0]
    recall = torch.tensor(rec["recall"])
    base = MQARResult(
        torch.tensor(rec["correct"]).bool(),
        torch.tensor(rec["correct_pool"]).bool(),
        hprobe.gaps(),
        recall,
    )
    scores = recall_scores(
        recall, hprobe.query_pos.numel(), n_kv_heads=model.n_kv_heads, n_pairs=hn, gap=hgap
    )
    t_heads = time.perf_counter() - t2

    # 3. Masking: the top-k recall heads against random sets of as many other heads.
    t3 = time.perf_counter()
    top = scores.top("query_to_value", args.top_k)
    recall_heads = [(int(r.layer), int(r.head)) for r in top.itertuples()]
    sets = {"recall heads": recall_heads}
    for i, s in enumerate(
        random_head_sets(
            model.n_layers,
            model.n_heads,
            args.top_k,
            args.random_sets,
            exclude=recall_heads,
            seed=args.seed,
        )
    ):
        sets[f"random {i + 1}"] = s
    masked = {r["name"] for r in distributed.shard_records(run_dir, MASKS)}
    mask_shard = distributed.shard_name(dist, MASKS)
    todo = [name for name in dist.share(list(sets)) if name not in masked]
    for name in tqdm(todo, desc="masking", unit="set", disable=not dist.is_main):
        hs = sets[name]
        res = run_mqar(
            model, hprobe, batch_size=args.batch_size, hooks=[HeadMask(hs, args.mask_mode)]
        )
        rec = {
            "name": name,
            "heads": hs,
            "accuracy": res.accuracy,
            "accuracy_pool": res.accuracy_pool,
        }
        run_dir.append_record(rec, mask_shard)
    t_mask = max(dist.gather(time.perf_counter() - t3))
    if not dist.is_main:
        return 0
    timings = {"load_model_s": t_load, "grid_s": t_grid, "heads_s": t_heads, "masking_s": t_mask}

    by_cell = {(r["n_pairs"], r["gap"]): r for r in distributed.shard_records(run_dir, CELLS)}
    cell_recs = [by_cell[c] for c in grid]
    distributed.merge_records(run_dir, CELLS, cell_recs)
    distributed.merge_records(run_dir, HEADS, distributed.shard_records(run_dir, HEADS)[:1])
    by_name = {r["name"]: r for r in distributed.shard_records(run_dir, MASKS)}
    distributed.merge_records(run_dir, MASKS, [by_name[n] for n in sets])
    masked = {n: by_name[n] for n in sets}
    acc = accuracy_table(cell_recs)
    dist_table = distance_table(cell_recs)
    rand = [masked[n]["accuracy"] for n in sets if n != "recall heads"]
    rand_pool = [masked[n]["accuracy_pool"] for n in sets if n != "recall heads"]
    masking = {
        "cell": {"n_pairs": hn, "gap": hgap, "examples": args.head_examples},
        "mode": args.mask_mode,
        "baseline": base.accuracy,
        "baseline_pool": base.accuracy_pool,
        "recall_heads": recall_heads,
        "masked": masked["recall heads"]["accuracy"],
        "masked_pool": masked["recall heads"]["accuracy_pool"],
        "random": rand,
        "random_pool": rand_pool,
        "random_mean": float(np.mean(rand)) if rand else None,
        "random_pool_mean": float(np.mean(rand_pool)) if rand_pool else None,
        "random_sets": [sets[n] for n in sets if n != "recall heads"],
    }

    scores.to_parquet(run_dir.path("scores.parquet"))
    acc.to_csv(run_dir.path("accuracy.csv"), index=False)
    dist_table.to_csv(run_dir.path("distance.csv"), index=False)
    write_json_atomic(run_dir.path("masking.json"), masking)
    summary = {
        "layout": params["layout"],
        "accuracy_overall": float(acc["accuracy"].mean()),
        "recall_heads": recall_heads,
        "metrics": RECALL_METRICS,
    }
    write_json_atomic(run_dir.path("summary.json"), summary)
    write_html(figure(acc, scores, masking, model.name), run_dir.path("mqar.html"))
    out = run_dir.finalize(
        model=model.describe(),
        parameters=params,
        timings=timings,
        extra={"processes": dist.world, "summary": summary},
    )
    show(acc, scores, masking, args.top)
    print(f"run directory: {out}")
    return 0


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


def show(acc, scores, masking: dict, top: int) -> None:
    wide = acc.pivot(index="n_pairs", columns="gap", values="accuracy")
    wide.columns = [f"gap {c}" for c in wide.columns]
    print_table(wide.reset_index(), "MQAR accuracy (rows: pairs N; columns: filler gap)")
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


def figure(acc, scores, masking: dict, name: str):
    """Accuracy heatmap, recall-head heatmap and the masking bars."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    wide = acc.pivot(index="n_pairs", columns="gap", values="accuracy")
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
        go.Heatmap(
            z=wide.to_numpy(),
            x=[str(c) for c in wide.columns],
            y=[str(i) for i in wide.index],
            colorscale="Viridis",
            zmin=0,
            zmax=1,
            showscale=False,
            texttemplate="%{z:.2f}",
        ),
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
