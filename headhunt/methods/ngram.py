"""N-gram, induction and previous-token heads as a method: probe sequences dealt over ranks in
whole batches."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from headhunt.errors import HeadhuntError
from headhunt.heads.configs import NgramConfig
from headhunt.methods.base import Method, print_table, read_jsonl, spread_frame


def natural_texts(config: NgramConfig) -> list[str] | None:
    """The user's natural texts (None: the bundled essays, or no natural input)."""
    from headhunt.reading import read_texts

    return read_texts(config.texts) if config.texts and "natural" in config.inputs else None


def build_inputs(model, config: NgramConfig, texts: list[str] | None) -> dict:
    """The probe sequences of each requested kind (deterministic given the seed)."""
    from headhunt.heads.inputs.needles import default_haystack_text
    from headhunt.heads.inputs.ngram_inputs import (
        natural_chunks,
        planted_kgrams,
        repeated_random,
        token_pool,
    )

    tok = model.tokenizer
    bos = tok.bos_token_id if config.bos else None
    vocab = min(len(tok), model.vocab_size or len(tok))
    pool = token_pool(tok, vocab)
    out = {}
    if "random" in config.inputs:
        out["random"] = list(
            repeated_random(
                pool,
                n_seqs=config.n_seqs,
                length=config.repeat_len,
                repeats=config.repeats,
                bos_id=bos,
                seed=config.seed,
            )
        )
    if "planted" in config.inputs:
        out["planted"] = list(
            planted_kgrams(
                pool,
                n_seqs=config.n_seqs,
                length=config.planted_len,
                k_max=config.k_max,
                bos_id=bos,
                seed=config.seed + 1,
            )
        )
    if "natural" in config.inputs:
        out["natural"] = natural_chunks(
            tok,
            texts if texts is not None else [default_haystack_text()],
            n_tokens=config.text_tokens,
            n_chunks=config.n_texts,
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


class Ngram(Method):
    name = "ngram"
    Config = NgramConfig
    metric = "induction"
    help = "n-gram, induction and previous-token heads"
    description = """Score every head as previous-token, duplicate-token and induction head
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
    units = "batches of sequences"
    top = 10

    def prepare(self, config: NgramConfig) -> None:
        super().prepare(config)
        natural_texts(config)  # a bad texts file fails before the model loads

    def parameters(self, config: NgramConfig, model: str) -> dict[str, Any]:
        d = config.to_dict()
        del d["batch_size"]  # how sequences are batched does not change the numbers
        texts = str(Path(config.texts).resolve()) if config.texts else "bundled essays"
        return {**d, "model": model, "texts": texts}

    def run(self, model, config: NgramConfig, ctx):
        from headhunt.heads.ngram import SeqRecord, plan_batches, score_sequences, summarize
        from headhunt.scores import HeadScores

        inputs = build_inputs(model, config, natural_texts(config))
        # Whole batches are dealt over the ranks; a record keeps its sequence's index.
        for source, seqs in inputs.items():
            name = f"records-{source}.jsonl"
            done = ctx.done(name, key=lambda r: r["index"])
            if done:
                ctx.say(f"{source}: resuming, {len(done)} of {len(seqs)} sequences already done")
            share = ctx.todo(plan_batches(seqs, config.batch_size))
            batches = [b for b in share if set(b) - done]
            t1 = time.perf_counter()
            # one estimate per source; a batch costs about its tokens
            units = ctx.units(
                batches,
                "sequence",
                count=len,
                weight=lambda b, seqs=seqs: sum(len(seqs[k]) for k in b),
                stage=lambda b, source=source: source,
                done_before=sum(map(len, share)) - sum(map(len, batches)),
            )
            for batch in units:

                def save(j, r, batch=batch, name=name, done=done):
                    if batch[j] not in done:
                        ctx.append(name, {"index": batch[j], **r.to_dict()})

                score_sequences(
                    model,
                    [seqs[k] for k in batch],
                    config,
                    batch_size=config.batch_size,
                    on_record=save,
                )
            ctx.wait(f"{source}_s", since=t1)
        if not ctx.is_main:
            return None

        tables, summary = [], {}
        for source, seqs in inputs.items():
            records = ctx.collect(
                f"records-{source}.jsonl", list(range(len(seqs))), key=lambda r: r["index"]
            )
            recs = [SeqRecord.from_dict(r) for r in records]
            scores = summarize(recs, config, n_kv_heads=model.score_kv_heads(), source=source)
            tables.append(scores)
            summary[source] = {
                "sequences": len(seqs),
                "tokens": sorted({len(s) for s in seqs}),
                **_query_counts(scores, source, config.k_max),
            }
        scores = HeadScores.concat(tables)
        ctx.write("orders.csv", order_frame(scores, list(inputs)))
        ctx.write("summary.json", summary)
        ctx.write("ngram.html", figure(scores, list(inputs), model.name))
        ctx.extra["summary"] = summary
        return scores

    def show(self, run, top: int) -> None:
        show(run.scores(), run.manifest["parameters"]["inputs"], top)

    def spread(self, run, layer: int, head: int):
        """Per sequence of each input kind (``source``): the previous-token, duplicate-token
        and induction scores."""
        return spread_frame(
            {
                "unit": f"{source} {i}",
                "source": source,
                "metric": metric,
                "value": float(r[key][layer][head]),
            }
            for path in sorted(run.path.glob("records-*.jsonl"))
            for source in [path.stem.removeprefix("records-")]
            for i, r in enumerate(read_jsonl(path))
            for metric, key in (
                ("prev_token", "tl_prev"),
                ("duplicate_token", "tl_dup"),
                ("induction", "tl_ind"),
            )
        )


def _query_counts(scores, source: str, k_max: int) -> dict[str, list[int]]:
    """Queries with a full k-gram match, and with both kinds of keys, per order k."""
    out = {}
    for metric in ("kgram_queries", "kgram_both_queries"):
        out[metric] = [
            int(scores.matrix(metric, source=source, order=k)[0, 0]) for k in range(1, k_max + 1)
        ]
    return out


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
