"""The causal check for retrieval heads as a method: mask the top-K heads of a retrieval run,
then K random heads, and compare needle recall on fresh trials."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headhunt.config import fields_of
from headhunt.errors import HeadhuntError
from headhunt.heads.configs import DecodeBatch, NeedleTrialGrid, RetrievalConfig
from headhunt.methods.base import Method, default_of, option, print_table

RECORDS = "records.jsonl"


@dataclass
class AblateConfig(DecodeBatch, NeedleTrialGrid):
    """An ablation run: the retrieval run to take the ranking from, and fresh trials."""

    scores: str | None = option(
        None, "a retrieval run directory to take the ranking from (required)", type=str
    )
    top_k: int = option(10, "heads to mask", min=1)
    draws: int = option(3, "random head sets", min=1)
    mode: str = option(
        "query",
        "query: zero the query (uniform attention, as Wu et al.); output: zero the head's output",
        choices=("query", "output"),
    )
    lengths: list[int] = default_of(NeedleTrialGrid, "lengths", [1000, 2000])
    depths: list[float] = default_of(NeedleTrialGrid, "depths", [0.0, 50.0, 100.0])

    def trials(self):
        """Fresh trials: another seed stream than any scoring run's (other answers, offsets)."""
        from headhunt.heads.retrieval import FRESH_SEED_OFFSET

        grid = fields_of(self, NeedleTrialGrid)
        return RetrievalConfig(**{**grid, "seed": self.seed + FRESH_SEED_OFFSET})

    def source(self):
        """The retrieval run it reads, checked."""
        from headhunt.rundir import load_run

        if self.scores is None:
            raise HeadhuntError("--scores is required (a retrieval run directory)")
        source = load_run(self.scores)
        if source.method != "retrieval":
            raise HeadhuntError(
                f"{self.scores} is a {source.method} run; --scores needs a retrieval run"
            )
        info = source.manifest.get("model")
        if not (
            isinstance(info, dict)
            and isinstance(info.get("n_layers"), int)
            and isinstance(info.get("n_heads"), int)
        ):
            raise HeadhuntError(
                f"{source.path / 'manifest.json'} does not say which model made the run (no "
                "model n_layers/n_heads)"
            )
        from headhunt.heads.interventions.pruning import all_tied

        values = source.scores().matrix("retrieval_score").ravel()  # a bad table fails now
        if all_tied(values):
            raise HeadhuntError(
                f"every head of {self.scores} has the same retrieval_score ({values[0]:.3g}): "
                "its top heads would be arbitrary ones; score more or longer trials first"
            )
        return source

    def check(self) -> None:
        self.source()


def say_tied_cut(ctx, scores, top_k: int) -> None:
    """Say so when the last of the top-K heads are picked among heads of equal score."""
    from headhunt.heads.interventions.pruning import tied_cut
    from headhunt.heads.retrieval import METRIC

    values = scores.top(METRIC, len(scores.df))["value"].to_numpy()
    cut = tied_cut(values, top_k)
    if cut is not None:
        ctx.say(
            f"ablate: {cut.chosen} of the top {top_k} heads are picked among {cut.block} heads "
            f"of equal {METRIC} {cut.value:.3g} (in layer, head order)"
        )


class Ablate(Method):
    name = "ablate"
    Config = AblateConfig
    metric = "retrieval_score"
    help = "mask top retrieval heads vs random heads"
    description = """Mask the top-K retrieval heads of a `headhunt retrieval` run, then K random heads
(several draws, excluding the top heads and every head above the run's threshold), and compare
needle-in-a-haystack recall on fresh trials (other answers and haystack offsets than the scoring
run's). Writes ablation.json and the ranking used to scores.parquet."""
    units = "masking conditions"

    def parameters(self, config: AblateConfig, model: str) -> dict[str, Any]:
        trials = config.trials().to_dict()
        trials.pop("kv_aggregate")  # the scoring run's option; no part of an ablation
        return {
            **trials,
            "model": model,
            "scores": str(Path(config.scores).expanduser()),
            "top_k": config.top_k,
            "draws": config.draws,
            "mode": config.mode,
            "batch_size": config.batch_size,
        }

    def run(self, model, config: AblateConfig, ctx):
        from headhunt.heads.evaluations.causal import AblationResult, MaskingCheck, needle_recall
        from headhunt.heads.retrieval import METRIC, build_trials, stop_token_ids

        source = config.source()
        scores = source.scores()
        shape = (model.n_layers, model.n_heads)
        made = (source.manifest["model"]["n_layers"], source.manifest["model"]["n_heads"])
        if shape != made:
            raise HeadhuntError(
                f"--scores was made on a {made[0]}x{made[1]} model, not this "
                f"{shape[0]}x{shape[1]} one"
            )
        grid = config.trials()
        grid.validate(model)
        trials = build_trials(model, grid)
        ranked = [
            (int(r.layer), int(r.head)) for r in scores.top(METRIC, len(scores.df)).itertuples()
        ]
        above = scores.heads(METRIC, source.manifest["parameters"].get("threshold", 0.1))
        if config.top_k > len(ranked):
            raise HeadhuntError(f"--top-k must be between 1 and {len(ranked)}")
        say_tied_cut(ctx, scores, config.top_k)
        # The check's conditions (no mask, the top heads, each random set) are the units of work.
        check = MaskingCheck.draw(
            model, ranked[: config.top_k], config.draws, seed=config.seed, exclude=above
        )

        def recall(heads) -> dict[str, list[float]]:
            return {
                "recall": needle_recall(
                    model,
                    trials,
                    max_new_tokens=config.max_new_tokens,
                    stop_ids=stop_token_ids(model.tokenizer),
                    heads=heads,
                    mode=config.mode,
                    batch_size=config.batch_size,
                )
            }

        records = ctx.run_conditions(RECORDS, check.conditions(), recall, timing="ablation_s")
        if records is None:
            return None
        result = AblationResult.of(check, {k: r["recall"] for k, r in records.items()})
        ctx.write("ablation.json", result.to_dict())
        ctx.extra["summary"] = {
            "baseline": result.baseline,
            "top_masked": result.top_masked,
            "random_masked_mean": result.random_mean,
            "trials": len(trials),
        }
        return scores

    def show(self, run, top: int) -> None:
        import pandas as pd

        result = run.json("ablation.json")
        k = result["top_k"]
        rows = [
            ("no heads masked", result["baseline"]),
            (f"top-{k} heads masked", result["top_masked"]),
        ]
        rows += [(f"random {k} heads, draw {i}", v) for i, v in enumerate(result["random_masked"])]
        rows += [(f"random {k} heads, mean", result["random_mean"])]
        print_table(
            pd.DataFrame(rows, columns=["condition", "needle recall (ROUGE-1 x100)"]),
            title="Causal check: masking retrieval heads",
        )
