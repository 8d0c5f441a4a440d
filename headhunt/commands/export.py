"""`headhunt export`: head scores as DuoAttention, kvpress (DuoAttention, LU-KV, AdaKV) or
HeadKV files."""

from __future__ import annotations

import argparse

from headhunt.commands.common import add_command

DESCRIPTION = """Write one metric of a run as the files a KV-cache tool reads.

  duo      DuoAttention's pattern folder: full_attention_heads.tsv (layers x KV heads, tab
           separated, in [0, 1]) and config.json (sink_size, recent_size). Deploy with
           sparsity s: the KV heads below the s-quantile keep only sink + recent tokens.
  kvpress  the same two files for kvpress's DuoAttentionPress, and a README on loading them
           (head_compression_ratio r streams the round(r * layers * KV heads) lowest), and
           budget.json: per ratio 0.25/0.5/0.75/0.875 the ratio kvpress reports and the KV
           bytes kept at --context tokens (kvpress's ratio counts heads, not bytes).
  lukv     budget_curve.npy [99, layers, KV heads] for kvpress's LUKVPress (row t: per-head
           prune ratios for the global ratio (t + 1) / 100).
  adakv    head_weights.npy [layers, KV heads] for AdaKVPress through headhunt's
           HeadWeightedPress.
  headkv   HeadKV's one-line {"layer-head": [score]} JSON over all query heads, and budget.json
           with the per-head KV budgets HeadKV would allot (base 128, beta 1.2).

A KV head gets the max of its query heads' scores. The layer and head counts are checked
against the model (--model) or, without it, the run's manifest. The files record how many
trials the ranking rests on and how stable it is (top-k overlap of two halves of the trials, at
the budgets the format serves); a warning is printed when it is too unstable for them."""


def add_parser(sub) -> None:
    p = add_command(
        sub, "export", "head scores as DuoAttention / kvpress / HeadKV files", DESCRIPTION
    )
    p.add_argument("--scores", required=True, help="a run directory (or a scores .parquet file)")
    p.add_argument("--metric", default="retrieval_score", help="the metric to export")
    p.add_argument("--format", required=True, choices=["duo", "kvpress", "headkv", "lukv", "adakv"])
    p.add_argument("--out", required=True, help="folder to write")
    p.add_argument(
        "--model",
        default=None,
        help="check the counts against this model's config (default: the run's manifest)",
    )
    p.add_argument(
        "--sink",
        type=int,
        default=None,
        help="sink tokens a streaming head keeps (default: from --sinks, else 4)",
    )
    p.add_argument(
        "--recent", type=int, default=None, help="recent tokens a streaming head keeps (256)"
    )
    p.add_argument(
        "--sinks",
        default=None,
        help="a sinks run: the sink size keeps token 0 and its leading hidden sinks",
    )
    p.add_argument(
        "--full-fraction",
        type=float,
        default=None,
        help="duo: write a binary pattern (1 = full cache) for this share of KV heads; "
        "kvpress: the suggested head_compression_ratio is 1 minus it",
    )
    p.add_argument(
        "--context", type=int, default=4096, help="kvpress: context tokens for budget.json's bytes"
    )
    p.add_argument(
        "--floor",
        type=float,
        default=0.1,
        help="lukv/adakv: a zero-score head's weight (kept share grows with floor + score)",
    )
    p.add_argument("--seed", type=int, default=0, help="breaks ties between equal scores")
    p.add_argument("--force", action="store_true", help="write into an existing folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from headhunt.errors import HeadhuntError
    from headhunt.export import (
        ModelShape,
        export,
        read_scores,
        stability_report,
        streaming_window,
    )
    from headhunt.kvbudget import TARGETS

    matrix, facts = read_scores(args.scores, args.metric)
    if args.model is not None:
        facts = model_facts(args.model)
    if facts is None:
        raise HeadhuntError("a bare scores file says nothing about the model: give --model")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise HeadhuntError(f"{out} exists and is not empty; pass --force to write into it")
    sink, recent, window_from = streaming_window(args.sink, args.recent, args.sinks)
    provenance = {"scores": str(Path(args.scores).resolve()), "metric": args.metric}
    provenance["window"] = window_from
    shape = ModelShape.of(facts)
    shares = [args.full_fraction] if args.full_fraction is not None else [1 - c for c in TARGETS]
    ranking = stability_report(args.scores, args.metric, shape.n_kv_heads, shares, args.seed)
    provenance["ranking"] = ranking
    for warning in ranking["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    files = export(
        args.format,
        out,
        matrix,
        shape,
        sink=sink,
        recent=recent,
        full_fraction=args.full_fraction,
        provenance=provenance,
        seed=args.seed,
        context=args.context,
        floor=args.floor,
    )
    for f in files:
        print(f)
    return 0


def model_facts(spec: str) -> dict:
    """Layer and head counts from a model folder's config.json (no weights read), or from the
    loaded model for other specs (registry names, GGUF files)."""
    import json
    from pathlib import Path

    cfg = Path(spec).expanduser() / "config.json"
    if cfg.is_file():
        c = json.loads(cfg.read_text())
        c = c.get("text_config", c)
        heads = c["num_attention_heads"]
        return {
            "n_layers": c["num_hidden_layers"],
            "n_heads": heads,
            "n_kv_heads": c.get("num_key_value_heads") or heads,
            "head_dim": c.get("head_dim") or c.get("hidden_size", 0) // heads or None,
        }
    from headhunt.probes.hooked import load_model

    return load_model(spec, device="cpu").describe()
