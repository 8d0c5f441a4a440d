"""Retrieval heads (Wu et al. 2024) as a method: needle-in-a-haystack trials, dealt over ranks
in whole decoding batches."""

from __future__ import annotations

import json
import time

from headhunt.heads.configs import RetrievalConfig
from headhunt.methods.base import (
    NEEDLE_TRIALS,
    Method,
    model_label,
    print_table,
    read_jsonl,
    spread_frame,
)

TRIALS = "trials.jsonl"


class Retrieval(Method):
    name = "retrieval"
    Config = RetrievalConfig
    metric = "retrieval_score"
    help = "score retrieval heads (needle in a haystack)"
    description = """Score every attention head's retrieval behaviour (Wu et al. 2024).

Each trial hides a needle sentence with a random answer in a haystack, asks for it, and decodes
greedily. A head scores when its attention argmax lies on the answer and the token there is the
one just produced; trials count only when the answer is right (ROUGE-1 recall > 0.5). Writes
manifest.json, scores.parquet, retrieval_heads.json (the reference's format), trials.jsonl,
duo_attention.tsv (layers x KV heads) and retrieval_heatmap.html.

A model with no attention layers (Mamba, Mamba-2, Falcon-Mamba, RWKV, xLSTM) gets the needle
accuracy only: the same trials decoded greedily by the model's own generate, each answer
scored; no head scores (an empty scores table), no retrieval_heads.json or heatmap."""
    units = "decoding batches"
    top = 20
    panels = frozenset({NEEDLE_TRIALS})
    runs_attention_free = True

    def prepare(self, config: RetrievalConfig) -> None:
        from headhunt.heads.inputs.needles import read_haystack

        super().prepare(config)
        read_haystack(config.haystack)  # a bad haystack fails before the model loads

    def run(self, model, config: RetrievalConfig, ctx):

        from headhunt.heads import retrieval as R
        from headhunt.plots import head_heatmap

        config.validate(model)
        if model.is_hybrid:  # say which layers carry heads (the others score NaN)
            ctx.say(R.scored_layers_line(model))
        trials = R.build_trials(model, config)
        # Whole decoding batches are dealt over the ranks; each keeps its trials in its shard.
        done = ctx.done(TRIALS, key=lambda r: r["id"])
        share = ctx.todo(R.plan_batches(model, trials, config))
        mine = [b for b in ([t for t in b if t.id not in done] for b in share) if b]
        if done:
            ctx.say(f"resuming: {len(done)} of {len(trials)} trials already done")
        t1 = time.perf_counter()
        # A batch's cost grows with its tokens (trials x length): the estimate and the
        # per-length time left weigh them.
        for batch in ctx.units(
            mine,
            "trial",
            weight=lambda b: len(b) * b[0].length,
            count=len,
            stage=lambda b: b[0].length,
            stage_unit="tokens",
            done_before=sum(map(len, share)) - sum(map(len, mine)),
        ):
            R.run_needle_trials(
                model,
                [],
                config,
                batches=[batch],
                progress=False,
                on_record=lambda r: ctx.append(TRIALS, r),
            )
        ctx.wait("trials_s", since=t1)
        records = ctx.collect(TRIALS, [t.id for t in trials], key=lambda r: r["id"])
        if records is None:
            return None
        ctx.timings["trials_per_s"] = len(trials) / max(ctx.timings["trials_s"], 1e-9)

        if model.attention_free:
            return _accuracy_only(records, config, ctx)
        scores = R.aggregate(records, model)
        reference = R.reference_json(records, model.n_layers, model.n_heads)
        ctx.write("retrieval_heads.json", reference, indent=None, end="")
        mean = scores.matrix(R.METRIC)
        if isinstance(model.score_kv_heads(), int):
            kv = R.kv_group_table(mean, model.n_kv_heads, config.kv_aggregate)
            ctx.write("duo_attention.tsv", kv, fmt="%.6f")
        else:  # one row of KV heads per layer needs one count of them
            ctx.extra["duo_attention.tsv"] = "not written: the number of key heads varies per layer"
        heatmap = head_heatmap(mean, f"Retrieval score: {model.name}", "retrieval score")
        ctx.write("retrieval_heatmap.html", heatmap)
        ctx.extra["summary"] = {
            "trials": len(records),
            "counted_trials": sum(r["counted"] for r in records),
            "retrieval_heads": int((mean > config.threshold).sum()),
            "heads": int(mean.size),
        }
        ctx.extra["interchange"] = {
            "retrieval_heads.json": 'reference format {"layer-head": [score per counted trial]}, 0-based, query heads',
            "duo_attention.tsv": f"layers x KV heads, tab separated, {config.kv_aggregate} over each KV group's query heads (raw scores; DuoAttention's pattern folder, with its config.json: headhunt export --format duo)",
        }
        return scores

    def show(self, run, top: int) -> None:
        manifest, s = run.manifest, run.manifest.get("summary", {})
        if "needle_accuracy" in s:  # a model with no attention layers
            print(
                f"Needle accuracy {s['needle_accuracy']:.3f} +- {s['needle_accuracy_se']:.3f} "
                f"(SE): {s['counted_trials']} of {s['trials']} trials answered (ROUGE-1 recall "
                f"> {manifest['parameters'].get('min_recall', 0.5)}); mean recall "
                f"{s['mean_recall']:.3f}. No attention layers: no retrieval heads to score."
            )
            return
        table = run.scores().top(self.metric, top)[["layer", "head", "kv_head", "value"]]
        table = table.rename(columns={"value": self.metric})
        print_table(table, title=f"Top {top} retrieval heads: {model_label(manifest)}")
        if s:
            threshold = manifest["parameters"].get("threshold")
            pct = 100 * s["retrieval_heads"] / max(s["heads"], 1)
            print(
                f"{s['retrieval_heads']} of {s['heads']} heads ({pct:.1f}%) score above "
                f"{threshold}; {s['counted_trials']} of {s['trials']} trials answered correctly "
                "and counted"
            )

    def spread(self, run, layer: int, head: int):
        """Per trial: the retrieval score and the needle attention (``counted``: the model
        answered right); from retrieval_heads.json's counted trials when trials.jsonl is gone."""
        rows = [
            {
                "unit": r["id"],
                "metric": metric,
                "value": float(r[key][layer][head]),
                "counted": bool(r.get("counted", True)),
            }
            for r in read_jsonl(run.path / TRIALS)
            for metric, key in (("retrieval_score", "scores"), ("needle_attention", "on_needle"))
        ]
        if not rows and (run.path / "retrieval_heads.json").is_file():
            per = json.loads((run.path / "retrieval_heads.json").read_text())
            rows = [
                {"unit": f"counted trial {i}", "metric": "retrieval_score", "value": float(v)}
                for i, v in enumerate(per.get(f"{layer}-{head}", []))
            ]
        return spread_frame(rows)


def _accuracy_only(records, config, ctx):
    """The run of a model with no attention layers: needle accuracy (the share of trials
    answered, with its standard error) and mean ROUGE-1 recall; an empty scores table."""
    import numpy as np
    import pandas as pd

    from headhunt.scores import COLUMNS, HeadScores

    counted = np.array([r["counted"] for r in records], dtype=float)
    acc = float(counted.mean())
    ctx.extra["summary"] = {
        "trials": len(records),
        "counted_trials": int(counted.sum()),
        "needle_accuracy": acc,
        "needle_accuracy_se": float(np.sqrt(acc * (1 - acc) / len(records))),
        "mean_recall": float(np.mean([r["recall"] for r in records])),
        "attention_layers": [],
    }
    return HeadScores(pd.DataFrame({col: [] for col in COLUMNS}))
