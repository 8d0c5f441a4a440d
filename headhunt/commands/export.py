"""`headhunt export`: head scores as DuoAttention, kvpress or HeadKV files."""

from __future__ import annotations

import argparse

from headhunt.commands.common import add_command

DESCRIPTION = """Write one metric of a run as the files a KV-cache tool reads.

  duo      DuoAttention's pattern folder: full_attention_heads.tsv (layers x KV heads, tab
           separated, in [0, 1]) and config.json (sink_size, recent_size). Deploy with
           sparsity s: the KV heads below the s-quantile keep only sink + recent tokens.
  kvpress  the same two files for kvpress's DuoAttentionPress, and a README on loading them
           (head_compression_ratio r streams the round(r * layers * KV heads) lowest).
  headkv   HeadKV's one-line {"layer-head": [score]} JSON over all query heads, and budget.json
           with the per-head KV budgets HeadKV would allot (base 128, beta 1.2).

A KV head gets the max of its query heads' scores. The layer and head counts are checked
against the model (--model) or, without it, the run's manifest."""


def add_parser(sub) -> None:
    p = add_command(
        sub, "export", "head scores as DuoAttention / kvpress / HeadKV files", DESCRIPTION
    )
    p.add_argument("--scores", required=True, help="a run directory (or a scores .parquet file)")
    p.add_argument("--metric", default="retrieval_score", help="the metric to export")
    p.add_argument("--format", required=True, choices=["duo", "kvpress", "headkv"])
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
    p.add_argument("--seed", type=int, default=0, help="breaks ties between equal scores")
    p.add_argument("--force", action="store_true", help="write into an existing folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from headhunt.errors import HeadhuntError
    from headhunt.export import ModelShape, export, read_scores, streaming_window

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
    files = export(
        args.format,
        out,
        matrix,
        ModelShape.of(facts),
        sink=sink,
        recent=recent,
        full_fraction=args.full_fraction,
        provenance=provenance,
        seed=args.seed,
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
        }
    from headhunt.probes.hooked import load_model

    return load_model(spec, device="cpu").describe()
