"""`headhunt ngram`: previous-token, duplicate-token, induction and k-gram (n-gram) heads."""

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

DESCRIPTION = """Score every head as previous-token, duplicate-token and induction head
(TransformerLens head_detector conventions, "mul" score) and as a k-gram head for k = 1..k-max
(Akyürek et al. 2024): the attention mass a query puts on the keys that follow earlier
occurrences of its last k tokens, the mass on keys where only the last k-1 tokens match, and
the contrast between the two per key ((F - O) / (F + O): 1 = only full k-gram matches, 0 = no
preference). A head's best order is the largest k whose contrast >= --order-contrast and
mass >= --order-mass. Probes: --inputs random (50 random tokens repeated twice), planted
(random tokens with planted k-gram repeats and (k-1)-only distractors), natural (the bundled
essays, or --texts). Scores come from per-query log-sum-exp and exact probabilities at the
matched positions (headhunt.kernels): memory grows with n x matches, not n^2. Writes
manifest.json, scores.parquet, orders.csv, summary.json, ngram.html."""

SOURCES = ("random", "planted", "natural")


def add_parser(sub) -> None:
    p = add_command(sub, "ngram", "n-gram, induction and previous-token heads", DESCRIPTION)
    add_model_args(p)
    add_out_args(p, "runs/ngram")
    g = p.add_argument_group("probes")
    g.add_argument(
        "--inputs",
        type=comma_list(str, "input kind"),
        default=list(SOURCES),
        help="probe kinds: random, planted, natural",
    )
    g.add_argument("--n-seqs", type=int, default=8, help="random and planted sequences")
    g.add_argument("--repeat-len", type=int, default=50, help="random tokens per repeat")
    g.add_argument("--repeats", type=int, default=2, help="repeats of the random tokens")
    g.add_argument("--planted-len", type=int, default=256, help="tokens per planted sequence")
    g.add_argument(
        "--texts",
        default=None,
        help='natural texts: a .txt file (one text) or .jsonl ({"text": ...} per line); '
        "default: the bundled essays",
    )
    g.add_argument("--text-tokens", type=int, default=512, help="tokens per natural chunk")
    g.add_argument("--n-texts", type=int, default=4, help="natural chunks (at most)")
    g.add_argument("--no-bos", action="store_true", help="do not prepend the tokenizer's BOS token")
    g = p.add_argument_group("scores")
    g.add_argument("--k-max", type=int, default=4, help="largest k-gram order (1..8)")
    g.add_argument(
        "--exclude-bos", action="store_true", help="TransformerLens: drop attention to key 0"
    )
    g.add_argument(
        "--exclude-current-token",
        action="store_true",
        help="TransformerLens: drop attention to the query's own position",
    )
    g.add_argument("--order-contrast", type=finite_float, default=0.5, help="contrast of an order")
    g.add_argument("--order-mass", type=finite_float, default=0.1, help="mass of an order")
    g.add_argument("--min-queries", type=int, default=5, help="queries behind a contrast")
    g.add_argument("--batch-size", type=int, default=8, help="sequences per forward")
    g.add_argument("--top", type=int, default=10, help="rows of the printed tables")
    add_parallel_args(p)
    p.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    bad = [s for s in args.inputs if s not in SOURCES]
    require(not bad, f"unknown --inputs {bad} (use {', '.join(SOURCES)})")
    require(1 <= args.k_max <= 8, f"--k-max must be in 1..8, got {args.k_max}")
    require(args.n_seqs >= 1, "--n-seqs must be at least 1")
    require(args.n_texts >= 1, "--n-texts must be at least 1")
    require(args.repeat_len >= 2 and args.repeats >= 2, "--repeat-len and --repeats must be >= 2")
    require(args.planted_len >= 8, "--planted-len must be at least 8")
    require(args.text_tokens >= 2, "--text-tokens must be at least 2")
    require(args.batch_size >= 1, "--batch-size must be at least 1")
    require(-1 <= args.order_contrast <= 1, "--order-contrast must be in [-1, 1]")
    require(0 <= args.order_mass <= 1, "--order-mass must be in [0, 1]")
    require(args.min_queries >= 1, "--min-queries must be at least 1")
    require(args.top >= 0, "--top must not be negative")


def build_inputs(model, args: argparse.Namespace, texts: list[str] | None) -> dict:
    """The probe sequences of each requested kind (deterministic given --seed)."""
    from headhunt.heads.needles import default_haystack_text
    from headhunt.heads.ngram_inputs import (
        natural_chunks,
        planted_kgrams,
        repeated_random,
        token_pool,
    )

    tok = model.tokenizer
    bos = None if args.no_bos else tok.bos_token_id
    vocab = min(len(tok), int(model.model.config.vocab_size))
    pool = token_pool(tok, vocab)
    out = {}
    if "random" in args.inputs:
        out["random"] = list(
            repeated_random(
                pool,
                n_seqs=args.n_seqs,
                length=args.repeat_len,
                repeats=args.repeats,
                bos_id=bos,
                seed=args.seed,
            )
        )
    if "planted" in args.inputs:
        out["planted"] = list(
            planted_kgrams(
                pool,
                n_seqs=args.n_seqs,
                length=args.planted_len,
                k_max=args.k_max,
                bos_id=bos,
                seed=args.seed + 1,
            )
        )
    if "natural" in args.inputs:
        out["natural"] = natural_chunks(
            tok,
            texts if texts is not None else [default_haystack_text()],
            n_tokens=args.text_tokens,
            n_chunks=args.n_texts,
            bos_id=bos,
        )
    from headhunt.heads.ngram import match_pairs

    for source, seqs in out.items():
        if not any((mp.p + 1 < mp.t).any() for mp in (match_pairs(s, 1) for s in seqs)):
            raise HeadhuntError(
                f"the {source} texts are too short to contain any repeated token, so no query "
                "has a k-gram match: use longer or more texts"
            )
        longest = max(len(s) for s in seqs)
        if longest > model.max_context:
            raise HeadhuntError(
                f"{source} sequences have {longest} tokens, longer than the model's context "
                f"({model.max_context})"
            )
    return out


def run(args: argparse.Namespace) -> int:
    from headhunt import distributed
    from headhunt.heads.ngram_inputs import read_texts

    _validate(args)
    texts = read_texts(args.texts) if args.texts and "natural" in args.inputs else None
    return distributed.main(args, lambda a, dist: _run(a, dist, texts))


def _run(args: argparse.Namespace, dist, texts: list[str] | None) -> int:
    from tqdm import tqdm

    from headhunt import distributed
    from headhunt.heads.ngram import (
        NgramConfig,
        SeqRecord,
        plan_batches,
        score_sequences,
        summarize,
    )
    from headhunt.heads.scores import HeadScores
    from headhunt.plots import write_html
    from headhunt.rundir import load_run

    cfg = NgramConfig(
        k_max=args.k_max,
        order_contrast=args.order_contrast,
        order_mass=args.order_mass,
        min_queries=args.min_queries,
        exclude_bos=args.exclude_bos,
        exclude_current_token=args.exclude_current_token,
    )
    params = {
        **cfg.to_dict(),
        "model": args.model,
        "inputs": args.inputs,
        "n_seqs": args.n_seqs,
        "repeat_len": args.repeat_len,
        "repeats": args.repeats,
        "planted_len": args.planted_len,
        "texts": str(Path(args.texts).resolve()) if args.texts else "bundled essays",
        "text_tokens": args.text_tokens,
        "n_texts": args.n_texts,
        "bos": not args.no_bos,
        "seed": args.seed,
    }
    run_dir = distributed.open_run(
        dist, args.out, "ngram", resume=args.resume, force=args.force, parameters=params
    )
    if run_dir.complete:  # reprinted without loading the model
        if dist.is_main:
            done = load_run(run_dir.out)
            show(HeadScores.read_parquet(run_dir.out / "scores.parquet"), args.inputs, args.top)
            print(f"run directory: {done.path}")
        return 0
    seed_everything(args.seed)
    t0 = time.perf_counter()
    model = open_model(args)
    t_load = time.perf_counter() - t0
    inputs = build_inputs(model, args, texts)

    # Whole batches are dealt round-robin over the ranks; a record keeps its sequence's index.
    mine_t: dict[str, float] = {}
    for source, seqs in inputs.items():
        name = f"records-{source}.jsonl"
        saved = distributed.shard_records(run_dir, name)
        done = {r.get("index", k) for k, r in enumerate(saved)}
        if done and dist.is_main:
            print(f"{source}: resuming, {len(done)} of {len(seqs)} sequences already done")
        batches = [b for b in dist.share(plan_batches(seqs, args.batch_size)) if set(b) - done]
        shard = distributed.shard_name(dist, name)
        t1 = time.perf_counter()
        bar = tqdm(total=sum(map(len, batches)), desc=source, unit="seq", disable=not dist.is_main)
        for batch in batches:

            def save(j, r, batch=batch, shard=shard, done=done):
                if batch[j] not in done:
                    run_dir.append_record({"index": batch[j], **r.to_dict()}, shard)

            score_sequences(
                model,
                [seqs[k] for k in batch],
                cfg,
                batch_size=args.batch_size,
                on_record=save,
            )
            bar.update(len(batch))
        bar.close()
        mine_t[f"{source}_s"] = time.perf_counter() - t1
    every = dist.gather(mine_t)  # also waits for every rank's shard
    if not dist.is_main:
        return 0

    timings = {"load_model_s": t_load}
    timings.update({k: max(t[k] for t in every) for k in mine_t})  # the slowest rank
    tables, summary = [], {}
    for source, seqs in inputs.items():
        name = f"records-{source}.jsonl"
        saved = distributed.shard_records(run_dir, name)
        by_index = {r.get("index", k): r for k, r in enumerate(saved)}
        records = [{**by_index[k], "index": k} for k in range(len(seqs))]
        distributed.merge_records(run_dir, name, records)
        recs = [SeqRecord.from_dict(r) for r in records]
        scores = summarize(recs, cfg, n_kv_heads=model.n_kv_heads, source=source)
        tables.append(scores)
        summary[source] = {
            "sequences": len(seqs),
            "tokens": sorted({len(s) for s in seqs}),
            **_query_counts(scores, source, cfg.k_max),
        }
    scores = HeadScores.concat(tables)
    scores.to_parquet(run_dir.path("scores.parquet"))
    orders = order_frame(scores, list(inputs))
    orders.to_csv(run_dir.path("orders.csv"), index=False)
    _write_json(run_dir.path("summary.json"), summary)
    write_html(figure(scores, list(inputs), model.name), run_dir.path("ngram.html"))
    out = run_dir.finalize(
        model=model.describe(),
        parameters=params,
        timings=timings,
        extra={"processes": dist.world, "summary": summary},
    )
    show(scores, list(inputs), args.top)
    print(f"run directory: {out}")
    return 0


def _query_counts(scores, source: str, k_max: int) -> dict[str, list[int]]:
    """Queries with a full k-gram match, and with both kinds of keys, per order k."""
    out = {}
    for metric in ("kgram_queries", "kgram_both_queries"):
        out[metric] = [
            int(scores.matrix(metric, source=source, order=k)[0, 0]) for k in range(1, k_max + 1)
        ]
    return out


def _write_json(path: Path, obj) -> None:
    from headhunt.rundir import write_json_atomic

    write_json_atomic(path, obj)


def order_frame(scores, sources: list[str]):
    """Every head's best order per source (one row per head and source)."""
    import pandas as pd

    from headhunt.heads.ngram import order_table

    frames = []
    for s in sources:
        df = order_table(scores, s, min_order=0)
        df.insert(0, "source", s)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def show(scores, sources: list[str], top: int) -> None:
    from headhunt.heads.ngram import order_table

    for source in sources:
        for metric in ("induction", "prev_token"):
            t = scores.top(metric, top, source=source)[["layer", "head", "kv_head", "value"]]
            print_table(t.rename(columns={"value": metric}), f"{source}: top {metric} heads")
        high = order_table(scores, source, min_order=2).head(top)
        title = f"{source}: heads of best order >= 2 (contrast = at that order)"
        if len(high):
            print_table(high, title)
        else:
            print(f"{source}: no head of best order >= 2")


def figure(scores, sources: list[str], name: str):
    """Heatmaps: induction and previous-token score, best order and its contrast, per source."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = []
    for s in sources:
        panels += [
            (f"{s}: induction", scores.matrix("induction", source=s)),
            (f"{s}: previous token", scores.matrix("prev_token", source=s)),
            (f"{s}: best k-gram order", scores.matrix("ngram_order", source=s)),
            (f"{s}: contrast at best order", scores.matrix("ngram_contrast", source=s)),
        ]
    fig = make_subplots(rows=len(sources), cols=4, subplot_titles=[t for t, _ in panels])
    axes = ["coloraxis", "coloraxis", "coloraxis2", "coloraxis3"]
    for i, (_title, m) in enumerate(panels):
        fig.add_trace(
            go.Heatmap(
                z=m,
                coloraxis=axes[i % 4],
                hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>",
            ),
            row=i // 4 + 1,
            col=i % 4 + 1,
        )
    n_layers = scores.matrix("induction", source=sources[0]).shape[0]
    fig.update_layout(
        title=f"N-gram and induction heads: {name}",
        height=max(450, 14 * n_layers) * len(sources),
        coloraxis={"colorscale": "Viridis", "cmin": 0, "cmax": 1, "colorbar": {"x": 1.02}},
        coloraxis2={
            "colorscale": "Plasma",
            "cmin": 0,
            "cmax": int(scores.df["order"].max()),
            "colorbar": {"x": 1.09, "title": "order"},
        },
        coloraxis3={
            "colorscale": "RdBu",
            "cmin": -1,
            "cmax": 1,
            "colorbar": {"x": 1.16, "title": "contrast"},
        },
    )
    fig.update_xaxes(title_text="head")
    fig.update_yaxes(title_text="layer")
    return fig
