"""`headhunt sinks`: first-token sinks, hidden sinks, Sink_eps and massive activations."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from headhunt.commands.common import (
    add_command,
    add_model_args,
    add_out_args,
    add_parallel_args,
    open_model,
    print_table,
    require,
    seed_everything,
)
from headhunt.errors import HeadhuntError

DESCRIPTION = """Find every head's attention sinks (ACT, Yu et al. 2024; Gu et al. 2024).

For each head, s_j = the mean attention key j receives from the queries that see it (kernel
column statistics: no N x N matrix, so texts can fill the model's context). A sink has
s_j > --tau and at least --min-queries queries behind it (so the last keys of a text, seen
by a few queries, are not called sinks; nor is any key in the last --min-query-share of a
text). Reports the first-token sink (s_0), hidden sinks
(sinks after position 0) with their positions and tokens, Sink_eps per layer (share of heads
with s_0 > --eps on the first --eps-tokens tokens) and massive activations (top |hidden
value| over the median, per layer). Writes manifest.json, scores.parquet, sinks.parquet
(one row per hidden sink), sink_tokens.csv, layers.csv, summary.json and sinks.html."""

RECORDS = "texts.jsonl"


def add_parser(sub) -> None:
    p = add_command(sub, "sinks", "attention sinks: first token, hidden sinks", DESCRIPTION)
    add_model_args(p)
    add_out_args(p, "runs/sinks")
    g = p.add_argument_group("texts")
    g.add_argument(
        "--texts",
        default=None,
        help='a .txt file (one text) or .jsonl file ({"text": ...} per line); '
        "default: the bundled essays",
    )
    g.add_argument(
        "--length",
        type=int,
        default=None,
        help="tokens per text (texts are cut to it; bundled essays are joined to reach it; "
        "default 1024 for the essays, the whole text for --texts)",
    )
    g.add_argument("--n-texts", type=int, default=4, help="texts to analyse (at most)")
    g = p.add_argument_group("sinks")
    g.add_argument("--tau", type=float, default=0.1, help="s_j threshold of a sink")
    g.add_argument(
        "--min-queries", type=int, default=32, help="queries that must see a key to judge it"
    )
    g.add_argument(
        "--min-query-share",
        type=float,
        default=0.1,
        help="... and at least this share of the text's queries (the last 10%% is not judged)",
    )
    g.add_argument("--eps", type=float, default=0.3, help="Sink_eps threshold on s_0")
    g.add_argument("--eps-tokens", type=int, default=64, help="prefix length T of Sink_eps")
    g.add_argument("--top", type=int, default=15, help="rows of the printed tables")
    add_parallel_args(p)
    p.set_defaults(func=run)


def read_texts(path: str | None) -> list[str] | None:
    """User texts from a .txt (one text) or .jsonl file; None for the bundled essays."""
    if path is None:
        return None
    p = Path(path).expanduser()
    require(p.is_file(), f"no texts file at {p}")
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise HeadhuntError(f"cannot read {p}: {e}") from None
    if p.suffix != ".jsonl":
        require(bool(raw.strip()), f"{p} is empty")
        return [raw]
    texts = []
    for no, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise HeadhuntError(f"{p.name} line {no}: not valid JSON ({e.msg})") from None
        text = obj.get("text") if isinstance(obj, dict) else None
        require(
            isinstance(text, str) and bool(text.strip()),
            f"{p.name} line {no}: needs a non-empty string 'text'",
        )
        texts.append(text)
    require(bool(texts), f"{p} holds no texts")
    return texts


def build_inputs(model, texts: list[str] | None, length: int | None, n_texts: int):
    """Token ids of each text (BOS first), cut to ``length``."""
    import torch

    if length is not None and length > model.max_context:
        raise HeadhuntError(
            f"--length {length} exceeds the model's context ({model.max_context} tokens)"
        )
    if texts is None:
        from importlib import resources

        folder = resources.files("headhunt.heads") / "data" / "haystack"
        essays = [f.read_text(encoding="utf-8") for f in sorted(folder.iterdir(), key=str)]
        essays = [e for e in essays if e.strip()]
        length = length or 1024
        out = []
        for i in range(min(n_texts, len(essays))):
            # Essays i, i+1, ... joined until the text is long enough.
            parts, ids = [], None
            for j in range(len(essays)):
                parts.append(essays[(i + j) % len(essays)])
                ids = model.encode("\n\n".join(parts))
                if len(ids) >= length:
                    break
            out.append(ids[:length])
        return out
    out = []
    for i, text in enumerate(texts[:n_texts]):
        ids = model.encode(text)
        if length is not None:
            ids = ids[:length]
        elif len(ids) > model.max_context:
            raise HeadhuntError(
                f"text {i} has {len(ids)} tokens, more than the model's context "
                f"({model.max_context}); pass --length to cut it"
            )
        require(len(ids) >= 2, f"text {i} is too short ({len(ids)} token)")
        out.append(torch.as_tensor(ids))
    return out


def run(args: argparse.Namespace) -> int:
    from headhunt import distributed

    require(args.n_texts >= 1, "--n-texts must be at least 1")
    require(args.length is None or args.length >= 2, "--length must be at least 2")
    texts = read_texts(args.texts)  # bad files fail before the model loads (or processes start)
    return distributed.main(args, lambda a, dist: _run(a, dist, texts))


def _run(args: argparse.Namespace, dist, texts: list[str] | None) -> int:
    from tqdm import tqdm

    from headhunt import distributed
    from headhunt.heads.scores import HeadScores
    from headhunt.heads.sinks import SinkConfig, TextSinks, analyze_text, plot, summarize
    from headhunt.plots import write_html
    from headhunt.rundir import load_run

    config = SinkConfig(
        tau=args.tau,
        min_queries=args.min_queries,
        min_query_share=args.min_query_share,
        eps=args.eps,
        eps_tokens=args.eps_tokens,
    )
    params = {
        **config.to_dict(),
        "model": args.model,
        "texts": str(Path(args.texts).resolve()) if args.texts else "bundled essays",
        "length": args.length,
        "n_texts": args.n_texts,
    }
    seed_everything(args.seed)
    t0 = time.perf_counter()
    model = open_model(args)
    t_load = time.perf_counter() - t0
    inputs = build_inputs(model, texts, args.length, args.n_texts)
    run_dir = distributed.open_run(
        dist, args.out, "sinks", resume=args.resume, force=args.force, parameters=params
    )
    if run_dir.complete:
        if dist.is_main:
            done = load_run(run_dir.out)
            show(
                done.json("summary.json"),
                HeadScores.read_parquet(run_dir.out / "scores.parquet"),
                args.top,
            )
        return 0

    # Texts are dealt round-robin over the ranks; each keeps its finished texts in its shard.
    done = {r["text"] for r in distributed.shard_records(run_dir, RECORDS)}
    if done and dist.is_main:
        print(f"resuming: {len(done)} of {len(inputs)} texts already done")
    shard = distributed.shard_name(dist, RECORDS)
    mine = [i for i in dist.share(list(range(len(inputs)))) if i not in done]
    t1 = time.perf_counter()
    for i in tqdm(mine, desc="texts", unit="text", disable=not dist.is_main):
        rec = analyze_text(model, inputs[i], config, index=i)
        run_dir.append_record(rec.to_dict(), shard)
    t_texts = max(dist.gather(time.perf_counter() - t1))  # also waits for every rank's shard
    if not dist.is_main:
        return 0
    by_text = {r["text"]: r for r in distributed.shard_records(run_dir, RECORDS)}
    records = [by_text[i] for i in range(len(inputs))]
    distributed.merge_records(run_dir, RECORDS, records)
    result = summarize([TextSinks.from_dict(r) for r in records], model, config)
    result.scores.to_parquet(run_dir.path("scores.parquet"))
    result.sinks.to_parquet(run_dir.path("sinks.parquet"), index=False)
    result.tokens.to_csv(run_dir.path("sink_tokens.csv"), index=False)
    result.layers.to_csv(run_dir.path("layers.csv"), index=False)
    (run_dir.path("summary.json")).write_text(json.dumps(result.summary, indent=2) + "\n")
    write_html(plot(result, f"Attention sinks: {model.name}"), run_dir.path("sinks.html"))
    out = run_dir.finalize(
        model=model.describe(),
        parameters=params,
        timings={"load_model_s": t_load, "texts_s": t_texts},
        extra={"processes": dist.world, "summary": result.summary},
    )
    show(result.summary, result.scores, args.top, result.tokens)
    print(f"run directory: {out}")
    return 0


def show(summary: dict, scores, top: int, tokens=None) -> None:
    import pandas as pd

    n = summary["tokens_per_text"]
    print(
        f"{summary['texts']} text(s) of {min(n)}-{max(n)} tokens. First token: mean s_0 = "
        f"{summary['first_sink_mean_s0']:.3f}, a sink (s_0 > tau) in "
        f"{100 * summary['first_sink_share_of_heads']:.0f}% of heads; Sink_eps = "
        f"{100 * summary['sink_eps_overall']:.1f}%."
    )
    print(
        f"Hidden sinks: in {100 * summary['heads_with_hidden_sinks']:.0f}% of heads, "
        f"{summary['hidden_sinks_per_head']:.2f} per head on average, at "
        f"{summary['hidden_sink_positions']} distinct text positions. Largest massive "
        f"activation: {summary['massive_ratio_max']:.0f}x the median (layer "
        f"{summary['massive_ratio_max_layer']})."
    )
    heads = scores.top("hidden_sink_mass", top)[["layer", "head", "kv_head", "value"]]
    print_table(heads.rename(columns={"value": "hidden_sink_mass"}), "heads by hidden-sink mass")
    toks = tokens if tokens is not None else pd.DataFrame(summary["top_hidden_sink_tokens"])
    if len(toks):
        toks = toks.head(top).copy()
        toks["token"] = [repr(t) for t in toks["token"]]
        print_table(toks, "tokens that become hidden sinks")
