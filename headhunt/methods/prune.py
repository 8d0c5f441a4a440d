"""Structural head pruning as a method: remove heads from the weights, save a smaller Hugging
Face folder, and (with --evaluate) measure it against reverse and random pruning."""

from __future__ import annotations

from dataclasses import dataclass

from headhunt.config import fields_of
from headhunt.errors import HeadhuntError
from headhunt.heads.configs import PruneMeasurement, Ranking
from headhunt.methods.base import Method, option, print_table

RECORDS = "conditions.jsonl"


@dataclass
class PruneConfig(PruneMeasurement, Ranking):
    """Which heads go (a share of a ranking, or a list), and what to measure."""

    tiebreak: str = option(
        "random",
        "orders heads of equal --metric score: random (seeded), masking (each head's masking "
        "effect on calibration needle trials, measured in the run) or RUN:METRIC (another "
        "run's metric, e.g. a sinks run's hidden_sink_mass)",
    )
    keep: float | None = option(
        None, "share of query heads kept (top first)", type=float, min=0, max=1
    )
    drop_heads: str | None = option(None, "heads to drop instead: L-H,L-H,...", type=str)
    evaluate: bool = option(False, "measure against reverse and random pruning")
    sweep: list[float] | None = option(None, "more kept shares to measure", type=float)

    def check(self) -> None:
        from headhunt.export import read_scores

        if (self.keep is None) == (self.drop_heads is None):
            raise HeadhuntError("give exactly one of --keep (with --scores) and --drop-heads")
        if self.keep is not None and not 0 < self.keep <= 1:
            raise HeadhuntError(f"--keep {self.keep} must be in (0, 1]: the share of heads kept")
        if self.keep is not None and self.scores is None:
            raise HeadhuntError("--keep ranks heads by a metric: give --scores RUN")
        if self.evaluate and self.scores is None:
            raise HeadhuntError("--evaluate compares rankings: give --scores RUN")
        if self.scores is not None:
            from headhunt.heads.interventions.pruning import all_tied

            values = read_scores(self.scores, self.metric)[0].ravel()
            if all_tied(values) and self.tiebreak == "random":
                raise HeadhuntError(
                    f"every head of {self.scores} has the same {self.metric} ({values[0]:.3g}): "
                    "the ranking would be a random order; pass --tiebreak masking (heads ordered "
                    "by their measured masking effect) or --tiebreak RUN:METRIC"
                )
        if self.tiebreak not in ("random", "masking"):
            path, sep, metric = self.tiebreak.rpartition(":")
            if not sep or not path:
                raise HeadhuntError(
                    f"--tiebreak {self.tiebreak!r}: use random, masking or RUN:METRIC"
                )
            read_scores(path, metric)

    def evaluation(self):
        """The library's config of the evaluation: this run's measurement at every kept share."""
        from headhunt.heads.evaluations.prune_eval import PruneEvalConfig

        keep = sorted({self.keep or 1.0, *(self.sweep or [])} - {1.0}, reverse=True)
        return PruneEvalConfig(keep=keep or [1.0], **fields_of(self, PruneMeasurement))


def say_tied_cut(ctx, scores, n_kv_heads: int | None, n_kept: int, config: PruneConfig) -> None:
    """Say so when the heads dropped are picked among heads of equal score (by the tie-break)."""
    import numpy as np

    from headhunt.heads.interventions.kvcache import kv_scores
    from headhunt.heads.interventions.pruning import tied_cut

    units = scores if n_kv_heads is None else kv_scores(scores, n_kv_heads)
    group = 1 if n_kv_heads is None else scores.shape[1] // n_kv_heads
    values = np.sort(np.where(np.isnan(units), -np.inf, units).ravel())[::-1]
    cut = tied_cut(values, n_kept // group)
    if cut is not None:
        what = "query heads" if n_kv_heads is None else "KV groups"
        ctx.say(
            f"prune: {cut.block - cut.chosen} of the {values.size - n_kept // group} {what} "
            f"dropped are picked among {cut.block} of equal {config.metric} {cut.value:.3g} by "
            f"--tiebreak {config.tiebreak}"
        )


class Prune(Method):
    name = "prune"
    Config = PruneConfig
    metric = "kept"
    help = "structural head pruning to a smaller HF folder"
    description = """Structural head pruning: the dropped query heads' rows of q_proj and columns of
o_proj are removed (a KV head's k/v rows go with its last query head); uneven GQA groups are
padded with zero heads (--unit kv drops whole KV groups instead). Keep the top --keep share of
heads by any metric of any run (--scores, --metric), or drop a list (--drop-heads 14-3,20-1).
Heads of equal score are ordered by --tiebreak: seeded at random, by their masking effect
(measured on calibration needle trials; written to scores.parquet as masking_effect), or by
another run's metric.
Writes model/ (safetensors, tokenizer, a config recording each layer's heads; --model and
load_model load it), prune.json (layout and size), the kept heads (kept = 1) to
scores.parquet and manifest.json. With --evaluate, also prunes by the reverse ranking and at
random (--draws) at --keep and every --sweep share, and measures each pruned model: parameters,
KV bytes per token, prefill time, perplexity on the bundled essays and needle recall (fresh
trials); writes prune_eval.csv."""
    units = "pruning conditions"

    def run(self, model, config: PruneConfig, ctx):
        import numpy as np

        from headhunt.export import ModelShape, check_scores, read_scores
        from headhunt.heads.evaluations import prune_eval as pe
        from headhunt.heads.interventions.pruning import (
            fill_pruned_folder,
            heads_to_drop,
            model_size,
            prune_model,
            ranked_heads,
        )
        from headhunt.scores import HeadScores, parse_heads

        shape = ModelShape.of(model.describe())
        scores = read_scores(config.scores, config.metric)[0] if config.scores else None
        if scores is not None:
            check_scores(scores, shape, f"--scores {config.scores}")
        by_kv = config.unit == "kv"
        secondary, extra = None, []
        if config.tiebreak == "masking" and scores is not None:
            cal = pe.needle_trials(model, config.evaluation(), calibration=True)
            secondary = pe.masking_effect(model, cal, config.batch_size)
            extra.append(
                HeadScores.from_matrix("masking_effect", secondary, n_kv_heads=shape.n_kv_heads)
            )
        elif config.tiebreak not in ("random", "masking"):
            path, _, metric = config.tiebreak.rpartition(":")
            secondary = read_scores(path, metric)[0]
            check_scores(secondary, shape, f"--tiebreak {config.tiebreak}")
        if config.drop_heads is not None:
            drop = sorted(set(parse_heads(config.drop_heads, model.n_layers, model.n_heads)))
            if not drop:
                raise HeadhuntError("--drop-heads names no head")
        else:
            kv = model.n_kv_heads if by_kv else None
            ranking = ranked_heads(scores, "top", config.seed, n_kv_heads=kv, secondary=secondary)
            drop = heads_to_drop(ranking, config.keep, model.group_size if by_kv else 1)
            say_tied_cut(ctx, scores, kv, len(ranking) - len(drop), config)
        conds: list[tuple[str, float]] = []
        if config.evaluate:
            ev = config.evaluation()
            ev.validate()
            orders = pe.pruning_orders(scores, ev, model.n_kv_heads if by_kv else None, secondary)
            conds = pe.prune_conditions(orders, ev)
            m = pe.materials(model, ev)
        plan = {f"{o}@{k:g}": (o, k) for o, k in conds}

        def measure(cond: tuple[str, float]) -> dict:
            return {"result": pe.measure_condition(model, orders, *cond, m, ev)}

        records = ctx.run_conditions(RECORDS, plan, measure, timing="evaluate_s") if conds else {}
        if records is None:
            return None
        evaluation = None
        if conds:
            import pandas as pd

            summary = pe.summarize(pd.DataFrame([r["result"] for r in records.values()]))
            ctx.write("prune_eval.csv", summary)
            evaluation = summary.to_dict(orient="records")
        full = model_size(model)
        record = prune_model(model, drop)
        ctx.write("model", lambda folder: fill_pruned_folder(model, folder))
        ctx.write(
            "prune.json",
            {
                "dropped": record["dropped"],
                "kept_heads": model.n_layers * model.n_heads - len(record["dropped"]),
                "full": full,
                "pruned": model_size(model),
                "layers": record["layers"],
                "evaluation": evaluation,
            },
        )
        kept = np.ones((model.n_layers, model.n_heads))
        for layer, head in drop:
            kept[layer, head] = 0.0
        result = HeadScores.from_matrix(self.metric, kept, n_kv_heads=model.n_kv_heads)
        return HeadScores.concat([result, *extra]) if extra else result

    def show(self, run, top: int) -> None:
        import pandas as pd

        result = run.json("prune.json")
        full, pruned = result["full"], result["pruned"]
        rows = [
            ("heads kept", result["kept_heads"]),
            ("heads dropped", len(result["dropped"])),
            ("parameters", f"{full['parameters']:,} -> {pruned['parameters']:,}"),
            (
                "KV bytes per token",
                f"{full['kv_bytes_per_token']:,} -> {pruned['kv_bytes_per_token']:,}",
            ),
            ("zero pad heads (uneven GQA groups)", pruned["pad_heads"]),
        ]
        print_table(pd.DataFrame(rows, columns=["", "value"]), title="Structural pruning")
        print(f"pruned model: {run.path / 'model'}")
        if result.get("evaluation"):
            df = pd.DataFrame(result["evaluation"])
            df = df[~df["order"].str.match(r"random\d")]
            cols = ["order", "keep", "parameters", "kv_bytes_per_token", "prefill_s"]
            cols += ["perplexity", "needle_recall", "recall_change", "recall_change_se"]
            print_table(df[cols], title="Pruning by ranking, reverse and random (random: mean)")
