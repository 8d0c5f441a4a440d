"""Attention sinks (ACT, Yu et al. 2024; Gu et al. 2024) as a method: texts dealt over ranks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from headhunt.errors import HeadhuntError
from headhunt.heads.configs import SinksConfig
from headhunt.methods.base import Method, print_table, read_jsonl, require, spread_frame

RECORDS = "texts.jsonl"


def texts_option(path: str | None) -> list[str] | None:
    """The texts of --texts (None: the bundled essays); see :func:`headhunt.reading.read_texts`."""
    from headhunt.reading import read_texts

    return None if path is None else read_texts(path)


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


class Sinks(Method):
    name = "sinks"
    Config = SinksConfig
    metric = "hidden_sink_mass"
    help = "attention sinks: first token, hidden sinks"
    description = """Find every head's attention sinks (ACT, Yu et al. 2024; Gu et al. 2024).

For each head, s_j = the mean attention key j receives from the queries that see it (kernel
column statistics: no N x N matrix, so texts can fill the model's context). A sink has
s_j > --tau and at least --min-queries queries behind it (so the last keys of a text, seen
by a few queries, are not called sinks; nor is any key in the last --min-query-share of a
text). Reports the first-token sink (s_0), hidden sinks
(sinks after position 0) with their positions and tokens, Sink_eps per layer (share of heads
with s_0 > --eps on the first --eps-tokens tokens) and massive activations (top |hidden
value| over the median, per layer). Writes manifest.json, scores.parquet, sinks.parquet
(one row per hidden sink), sink_tokens.csv, layers.csv, summary.json and sinks.html."""
    units = "texts"
    top = 15

    def prepare(self, config: SinksConfig) -> None:
        super().prepare(config)
        texts_option(config.texts)  # bad files fail before the model loads (or processes start)

    def parameters(self, config: SinksConfig, model: str) -> dict[str, Any]:
        texts = str(Path(config.texts).resolve()) if config.texts else "bundled essays"
        d = config.to_dict()
        del d["seed"]  # the analysis draws nothing at random (and no earlier run recorded it)
        return {**d, "model": model, "texts": texts}

    def run(self, model, config: SinksConfig, ctx):
        from headhunt.heads.sinks import TextSinks, analyze_text, plot, summarize

        inputs = build_inputs(model, texts_option(config.texts), config.length, config.n_texts)
        # Texts are dealt over the ranks; each keeps its finished texts in its shard.
        done = ctx.done(RECORDS, key=lambda r: r["text"])
        if done:
            ctx.say(f"resuming: {len(done)} of {len(inputs)} texts already done")
        t1 = time.perf_counter()
        share = ctx.todo(list(range(len(inputs))))
        mine = [i for i in share if i not in done]
        for i in ctx.units(mine, "text", done_before=len(share) - len(mine)):
            ctx.append(RECORDS, analyze_text(model, inputs[i], config, index=i).to_dict())
        ctx.wait("texts_s", since=t1)
        records = ctx.collect(RECORDS, list(range(len(inputs))), key=lambda r: r["text"])
        if records is None:
            return None
        result = summarize([TextSinks.from_dict(r) for r in records], model, config)
        ctx.write("sinks.parquet", result.sinks)
        ctx.write("sink_tokens.csv", result.tokens)
        ctx.write("layers.csv", result.layers)
        ctx.write("summary.json", result.summary)
        ctx.write("sinks.html", plot(result, f"Attention sinks: {model.name}"))
        ctx.extra["summary"] = result.summary
        return result.scores

    def show(self, run, top: int) -> None:
        import pandas as pd

        summary, scores = run.json("summary.json"), run.scores()
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
        heads = scores.top(self.metric, top)[["layer", "head", "kv_head", "value"]]
        print_table(heads.rename(columns={"value": self.metric}), "heads by hidden-sink mass")
        toks = pd.DataFrame(summary["top_hidden_sink_tokens"])
        if len(toks):
            toks = toks.head(top).copy()
            toks["token"] = [repr(t) for t in toks["token"]]
            print_table(toks, "tokens that become hidden sinks")

    def spread(self, run, layer: int, head: int):
        """Per text: the first-token sink mass, the hidden-sink mass and count."""
        return spread_frame(
            {"unit": f"text {r['text']}", "metric": metric, "value": float(r[key][layer][head])}
            for r in read_jsonl(run.path / RECORDS)
            for metric, key in (
                ("first_sink_mass", "s0"),
                ("hidden_sink_mass", "hidden_mass"),
                ("hidden_sink_count", "hidden_count"),
            )
        )
