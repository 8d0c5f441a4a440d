"""Heads for your task as a method: three detectors per head from one teacher-forced pass per
example (copy, query focus, write), the causal check (top-k mean / zero ablation against random
heads, with a closed-book specificity control) and a document retriever from the heads."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from headhunt.heads.evaluations.task_modes import MODES
from headhunt.methods.base import (
    Method,
    MethodConfig,
    MetricInfo,
    option,
    print_table,
    read_jsonl,
    require,
    spread_frame,
)

EXAMPLES = "examples.jsonl"
CONDITIONS = "conditions.jsonl"
RETRIEVER = "retriever_heads.json"  # the retriever's heads, chosen on the scoring examples
DETECTOR_METRICS = {"copy": "copy_score", "query": "query_focus", "write": "write_score"}
CLOSED_BOOK_BATCH = 256  # closed-book prompts per forward (each is 4-20 tokens)


@dataclass
class TaskHeadsConfig(MethodConfig):
    """A taskheads run: the examples, how they split, and the causal check's grid."""

    task: str = option(
        "multidoc", "bundled task", choices=("multidoc", "multidoc-hard", "kv", "needle")
    )
    input: str | None = option(None, "a JSONL of your examples (replaces --task)", type=str)
    examples: int = option(24, "bundled examples", min=2, limit=100_000)
    score_examples: int = option(
        12, "the first examples score heads and give the mean-ablation reference", min=1
    )
    docs: int = option(6, "documents per bundled example (key-value pairs for kv)", min=1)
    doc_words: int = option(60, "words per bundled document (needle: x --docs)", min=10)
    ks: list[int] = option([1, 2, 4, 8, 16, 32, 64], "top-k heads ablated", min=1)
    modes: list[str] = option(
        ["mean", "zero"], "ablations (mean-keep-first: a mean ablation that keeps the first "
        "position, the attention sink; mean-readout / zero-readout: only the rows from the "
        "question's first token through the answer, the context rows keep their own output)",
        choices=tuple(MODES),
    )  # fmt: skip
    detectors: list[str] = option(
        ["copy", "query", "write"], "detectors checked", choices=("copy", "query", "write")
    )
    random_draws: int = option(3, "random head sets per k (per pool, per detector for outside)",
                               min=0)  # fmt: skip
    random_from: list[str] = option(
        ["all", "outside"], "the random control's pools: all heads (as LOCOS draws them) and "
        "the heads outside the detector's top k (Wu et al.'s non-retrieval heads)",
        choices=("all", "outside"),
    )  # fmt: skip
    retriever_heads: int = option(16, "top query-focus heads of the retriever", min=1)
    batch_size: int = option(1, "evaluation sequences per forward in the causal check", min=1)
    specificity: bool = option(
        True, "skip the closed-book specificity control", flag="--no-specificity"
    )

    def check(self) -> None:
        n = len(self.load()) if self.input else self.examples
        require(
            self.score_examples < n,
            f"--score-examples ({self.score_examples}) must leave examples to evaluate ({n})",
        )
        require(len(set(self.ks)) == len(self.ks), "--ks repeats a value")

    def load(self):
        from headhunt.heads.inputs import task_inputs as T

        if self.input:
            return T.read_examples(self.input)
        return T.bundled(self.task, self.examples, self.docs, self.doc_words, self.seed)


class TaskHeads(Method):
    name = "taskheads"
    Config = TaskHeadsConfig
    metric = "write_score"
    help = "heads for your task: copy, query focus and write, ablated"
    description = """Which heads a model uses for your task, shown causally.

Examples come from --input (JSONL rows: context as a text or a list of documents, question,
answer, optional evidence document indices and answer lead) or a bundled task: multidoc
(facts planted in one of --docs essay paragraphs, distractor facts in the others), kv (key-value
retrieval, Lost in the Middle) or needle. One teacher-forced pass per example (the gold answer
fed; whether greedy decoding would have answered is recorded) and one null-question pass
give three scores per head: copy_score (Wu et al.'s rule under teacher forcing), query_focus
(QRHead's null-calibrated question-to-evidence attention, its outlier filter per document;
query_recall1 / query_ndcg10: its document ranking) and write_score (LOCOS: the
evidence-weighted write toward the gold token's logit minus the off-evidence write rescaled to
the evidence's length, final norm linearised, correct examples only).
The first --score-examples examples score the heads; the rest evaluate: each detector's top-k
heads are ablated (--modes: mean, zero, or only at the question and answer rows with
mean-readout / zero-readout) against --random-draws random k-head sets (from all heads, and
from the heads outside that detector's top k), with closed-book prompts the model answers
without context as the specificity control (mean ablation there puts in the heads' mean over
other closed-book prompts; closed_book: with the task's mean), and documents are
ranked by the top --retriever-heads query-focus heads (QRHead's retriever, the heads chosen on
the scoring examples) against BM25 and all heads. Writes scores.parquet, examples.jsonl,
retriever_heads.json, conditions.jsonl, ablation.csv, detectors.json, retrieval.json and
taskheads.html."""
    units = "examples and ablation conditions"
    top = 10
    glossary = {
        "copy_score": MetricInfo(
            "share of answer steps whose argmax key is on the evidence and holds the gold token "
            "(Wu et al.'s copy rule, teacher forced)",
            "share of steps",
        ),
        "query_focus": MetricInfo(
            "attention from the question to the evidence documents minus the same from a null "
            "question, per token, outlying tokens dropped per document (QRHead)",
            "probability mass",
        ),
        "query_recall1": MetricInfo(
            "share of examples where the head's query-focus document scores rank an evidence "
            "document first",
            "share of examples",
            "no example has two documents or more",
        ),
        "query_ndcg10": MetricInfo(
            "NDCG@10 of the head's document ranking by its query-focus document scores",
            "NDCG",
            "no example has two documents or more",
        ),
        "write_score": MetricInfo(
            "the head's write toward the gold token's logit from the evidence keys minus from "
            "every other key, rescaled to the evidence's length (LOCOS; final norm's scale "
            "frozen), correct examples only",
            "logit",
            "the model answered no scoring example correctly",
        ),
    }

    def run(self, model, config: TaskHeadsConfig, ctx):
        from headhunt.heads.inputs.task_inputs import Encoder

        examples = config.load()
        encoder = Encoder(model.tokenizer, model.max_context)
        encoded = [encoder.encode(ex) for ex in examples]
        ids = [e.id for e in encoded]
        require(len(set(ids)) == len(ids), "two examples share an id")
        t1 = time.perf_counter()
        done = ctx.done(EXAMPLES, key=lambda r: r["id"])
        if done:
            ctx.say(f"resuming: {len(done)} of {len(encoded)} examples already scored")
        n = config.score_examples
        _score_examples(model, ctx, encoded, range(n), "scoring example", scoring=True)
        ctx.wait()
        # The retriever's heads come from the scoring examples; an evaluation example's pass
        # scores its documents with them (QRHead filters the heads' per-token sum).
        heads = ctx.step(RETRIEVER, lambda: {"heads": _retriever_heads(config, ctx)})["heads"]
        heads = [(int(la), int(h)) for la, h in heads]
        _score_examples(model, ctx, encoded, range(n, len(encoded)), "evaluation example",
                        retriever_heads=heads)  # fmt: skip
        ctx.wait("examples_s", since=t1)
        plan = Plan(model, config, ctx.records(EXAMPLES), encoded)
        t2 = time.perf_counter()
        plan.run_conditions(ctx)
        ctx.wait("conditions_s", since=t2)
        records = ctx.collect(EXAMPLES, ids, key=lambda r: r["id"])
        if records is None:
            return None
        conditions = ctx.collect(CONDITIONS, list(plan.conditions), key=lambda r: r["name"])
        return plan.finish(ctx, conditions)

    def show(self, run, top: int) -> None:
        import pandas as pd

        det = run.json("detectors.json")
        scores = run.scores()
        for metric in DETECTOR_METRICS.values():
            t = scores.top(metric, top)[["layer", "head", "value"]]
            print_table(t.rename(columns={"value": metric}), f"top {top} heads: {metric}")
        print(f"top-16 overlaps: {det['overlaps']}")
        print(
            f"accuracy {det['baseline']['accuracy']:.3f} on {det['baseline']['examples']} examples"
        )
        path = run.path / "ablation.csv"
        if path.is_file():
            cols = ["detector", "mode", "k", "accuracy", "se", "random", "random_se"]
            cols += ["random_outside", "random_outside_se", "specificity", "random_specificity"]
            table = pd.read_csv(path)
            cols = [c for c in cols if c in table]  # runs from before a column existed
            print_table(table[cols], "ablation: task accuracy at each k")
        ret = run.json("retrieval.json")
        if ret:
            rows = [{"retriever": k, **v} for k, v in ret.items()]
            print_table(pd.DataFrame(rows), "document retrieval (evaluation examples)")

    def spread(self, run, layer: int, head: int):
        rows = []
        for r in read_jsonl(run.path / EXAMPLES):
            from headhunt.heads.taskheads import ExampleResult

            res = ExampleResult.from_record(r)
            scoring = r.get("split") == "score"
            for metric, m in (("copy_score", res.copy), ("query_focus", res.query_focus),
                              ("write_score", res.write)):  # fmt: skip
                counted = scoring and (metric != "write_score" or res.correct)
                rows.append({"unit": r["id"], "metric": metric, "value": float(m[layer, head]),
                             "counted": counted})  # fmt: skip
        return spread_frame(rows)


def _retriever_heads(config: TaskHeadsConfig, ctx) -> list[tuple[int, int]]:
    """The top ``--retriever-heads`` query-focus heads over the scoring examples."""
    from headhunt.heads.taskheads import ExampleResult, head_matrices, top_heads

    scoring = [ExampleResult.from_record(r) for r in ctx.records(EXAMPLES)
               if r["split"] == "score"]  # fmt: skip
    _require_current(scoring)
    return top_heads(head_matrices(scoring)["query_focus"], config.retriever_heads)


def _require_current(results) -> None:
    require(all(r.current for r in results),
            "this run's records predate QRHead's token filter and LOCOS's rescaled contrast: "
            "run it again with --force")  # fmt: skip


def _score_examples(model, ctx, encoded, indices, what: str, *, scoring: bool = False,
                    retriever_heads=None) -> None:  # fmt: skip
    from headhunt.heads.taskheads import OutputSum, score_example

    done = ctx.done(EXAMPLES, key=lambda r: r["id"])
    share = ctx.todo(list(indices))
    todo = [i for i in share if encoded[i].id not in done]
    # an example costs about its tokens: the estimate weighs them
    for i in ctx.units(todo, what, weight=lambda i: len(encoded[i].ids),
                       done_before=len(share) - len(todo)):  # fmt: skip
        sums = OutputSum(readout_from=encoded[i].question[0])
        res = score_example(model, encoded[i], extra_hooks=[sums] if scoring else [],
                            retriever_heads=retriever_heads)  # fmt: skip
        rec = {"index": i, "split": "score" if scoring else "eval", **res.to_record()}
        if scoring:
            rec["out_sum"] = [sums.total[la].tolist() for la in range(model.n_layers)]
            rec["out_first"] = [sums.first[la].tolist() for la in range(model.n_layers)]
            rec["out_count"] = sums.count
            # the question and answer rows' sum: the mean-readout reference
            rec["out_readout"] = [sums.readout[la].tolist() for la in range(model.n_layers)]
            rec["out_readout_count"] = sums.readout_count
        ctx.append(EXAMPLES, rec)


class Plan:
    """What the causal check and the retriever need, from every example's record (each rank
    builds the same plan): head rankings, ablation means, the conditions to run."""

    def __init__(self, model, config: TaskHeadsConfig, records, encoded):
        import numpy as np

        from headhunt.heads.evaluations.causal import random_head_sets
        from headhunt.heads.evaluations.task_ablation import mean_outputs
        from headhunt.heads.taskheads import ExampleResult, head_matrices, top_heads

        self.model, self.config, self.encoded = model, config, {e.id: e for e in encoded}
        order = {e.id: i for i, e in enumerate(encoded)}
        records = sorted(records, key=lambda r: order[r["id"]])
        self.results = [ExampleResult.from_record(r) for r in records]
        score = [r for r, rec in zip(self.results, records, strict=True) if rec["split"] == "score"]
        self.eval = [
            r for r, rec in zip(self.results, records, strict=True) if rec["split"] == "eval"
        ]
        _require_current(self.results)
        self.matrices = head_matrices(score)
        scoring = [r for r in records if r["split"] == "score"]
        count = sum(r["out_count"] for r in scoring)
        total = np.sum([np.asarray(r["out_sum"]) for r in scoring], 0)
        first = np.sum([np.asarray(r["out_first"]) for r in scoring], 0)
        readout, n_readout = None, 0
        if all("out_readout" in r for r in scoring):
            readout = np.sum([np.asarray(r["out_readout"]) for r in scoring], 0)
            n_readout = sum(r["out_readout_count"] for r in scoring)
        require(readout is not None or not any(MODES[m].rows == "readout" and MODES[m].mean
                                                for m in config.modes),
                "this run's scoring records predate mean-readout (no question-row sums): "
                "run it again with --force")  # fmt: skip
        self.means = mean_outputs(total, first, count, len(scoring), readout, n_readout)
        n_total = model.n_layers * model.n_heads
        self.ks = [k for k in config.ks if k <= n_total]
        self.top = {d: top_heads(self.matrices[DETECTOR_METRICS[d]], max(self.ks, default=1))
                    for d in DETECTOR_METRICS}  # fmt: skip
        self.conditions: dict[str, dict[str, Any]] = {"none": {"heads": [], "mode": "zero"}}
        for mode in config.modes:
            for k in self.ks:
                for d in config.detectors:
                    self.conditions[f"{d}/{mode}/{k}"] = {"heads": self.top[d][:k], "mode": mode}
                if "all" in config.random_from:
                    sets = random_head_sets(model.n_layers, model.n_heads, k, config.random_draws,
                                            seed=config.seed * 7919 + k)  # fmt: skip
                    for i, s in enumerate(sets):
                        self.conditions[f"random/{mode}/{k}/{i}"] = {"heads": s, "mode": mode}
                if "outside" not in config.random_from or 2 * k > n_total:
                    continue  # (no k heads outside a top k: no outside control at that k)
                for d in config.detectors:
                    # k heads none of which is in the detector's top k: the control Wu et al.
                    # describe (random non-retrieval heads), so a draw cannot hold the heads
                    # whose effect it is the baseline for. Seeded by the detector's place in
                    # DETECTOR_METRICS, not in --detectors: the same draws whichever detectors run.
                    j = list(DETECTOR_METRICS).index(d)
                    sets = random_head_sets(model.n_layers, model.n_heads, k, config.random_draws,
                                            exclude=self.top[d][:k],
                                            seed=(config.seed * 7919 + k) * 31 + j + 1)  # fmt: skip
                    for i, s in enumerate(sets):
                        self.conditions[f"outside/{d}/{mode}/{k}/{i}"] = {"heads": s, "mode": mode}

    def run_conditions(self, ctx) -> None:
        from headhunt.heads.evaluations.task_ablation import (
            ablation,
            answers_right,
            closed_book_control,
        )

        evals = [(self.encoded[r.id].ids, self.encoded[r.id].answer_start) for r in self.eval]
        # readout ablations: from the question's first token on
        eval_rows = [self.encoded[r.id].question[0] for r in self.eval]
        # closed-book prompts are a few tokens each: a few hundred fit one forward
        book_bs = max(self.config.batch_size, CLOSED_BOOK_BATCH)
        closed, book_rows, closed_means = [], [], self.means
        if self.config.specificity:
            closed, book_rows, closed_means = closed_book_control(self.model, book_bs)
        done = ctx.done(CONDITIONS, key=lambda r: r["name"])
        share = ctx.todo(list(self.conditions))
        todo = [n for n in share if n not in done]
        bs = self.config.batch_size
        for name in ctx.units(todo, "ablation", done_before=len(share) - len(todo)):
            c = self.conditions[name]
            hooks = ablation(c["heads"], c["mode"], self.means)
            # closed_book: with the task's mean (as first reported); specificity: with the
            # closed-book reference mean (the control; the same for zero ablation)
            book = answers_right(self.model, closed, hooks, book_bs, book_rows)
            if MODES[c["mode"]].mean and c["heads"]:
                own = ablation(c["heads"], c["mode"], closed_means)
                spec = answers_right(self.model, closed, own, book_bs, book_rows)
            else:
                spec = book
            ctx.append(CONDITIONS, {
                "name": name, "mode": c["mode"], "heads": c["heads"],
                "correct": answers_right(self.model, evals, hooks, bs, eval_rows),
                "closed_book": book, "specificity": spec,
            })  # fmt: skip

    def finish(self, ctx, conditions):
        from headhunt.heads.inputs.task_inputs import CLOSED_BOOK
        from headhunt.heads.taskheads import retrieval_table, top_heads
        from headhunt.scores import HeadScores

        by = {c["name"]: c for c in conditions}
        table = ablation_table(by, self.config, self.ks)
        ctx.write("ablation.csv", table)
        # the top 16 of each detector whatever --ks ablated (self.top stops at the largest k;
        # the stable sort makes those lists prefixes of these)
        top16 = {d: top_heads(self.matrices[m], 16) for d, m in DETECTOR_METRICS.items()}
        sets = {d: set(heads) for d, heads in top16.items()}
        names = list(sets)
        overlaps = {f"{a}-{b}": len(sets[a] & sets[b]) for i, a in enumerate(names)
                    for b in names[i + 1 :]}  # fmt: skip
        base = by["none"]
        detectors = {
            "top": top16,
            "overlaps": overlaps,
            "baseline": {
                "accuracy": _acc(base["correct"]),
                "examples": len(base["correct"]),
                "closed_book_kept": len(base["closed_book"]),
                "closed_book_prompts": len(CLOSED_BOOK) if self.config.specificity else 0,
            },  # fmt: skip
            "scoring_examples_correct": sum(
                r.correct for r in self.results[: self.config.score_examples]
            ),
        }
        ctx.write("detectors.json", detectors)
        texts = {e.id: (e.texts, e.question_text) for e in self.encoded.values()}
        try:
            import bm25s  # noqa: F401
        except ImportError:
            texts = None
        retrieval = retrieval_table(self.eval, texts)
        ctx.write("retrieval.json", retrieval)
        ctx.write("taskheads.html", collapse_figure(table, self.model.name))
        ctx.extra["summary"] = {"baseline": detectors["baseline"], "overlaps": overlaps}
        n_kv = self.model.n_kv_heads
        return HeadScores.concat(HeadScores.from_matrix(m, v, n_kv_heads=n_kv)
                                 for m, v in self.matrices.items())  # fmt: skip


def _acc(values) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _spec(condition: dict) -> list[bool]:
    """The specificity control's verdicts (a record from before it existed: closed_book)."""
    return condition.get("specificity", condition["closed_book"])


def ablation_table(by: dict, config: TaskHeadsConfig, ks: list[int]):
    """One row per (detector, mode, k): accuracy with its binomial SE, random k-head sets'
    mean accuracy and SE over draws, and closed-book (specificity) accuracy of both."""
    import numpy as np
    import pandas as pd

    from headhunt.heads.taskheads import mean_se

    base = by["none"]
    rows = []

    def draws(prefix: str) -> dict[str, float | None]:
        """Mean and SE over the draws of ``prefix/i`` (None without draws)."""
        rand = [by[f"{prefix}/{i}"] for i in range(config.random_draws) if f"{prefix}/{i}" in by]
        acc = mean_se([_acc(r["correct"]) for r in rand])
        return {"": acc[0], "_se": acc[1] if rand else None,
                "_closed_book": mean_se([_acc(r["closed_book"]) for r in rand])[0],
                "_specificity": mean_se([_acc(_spec(r)) for r in rand])[0]}  # fmt: skip

    for mode in config.modes:
        for k in ks:
            rand = draws(f"random/{mode}/{k}")
            for d in config.detectors:
                c = by[f"{d}/{mode}/{k}"]
                out = draws(f"outside/{d}/{mode}/{k}")
                acc, se = mean_se(c["correct"])
                spec = _spec(c)
                rows.append({
                    "detector": d, "mode": mode, "k": k, "accuracy": acc, "se": se,
                    "random": rand[""], "random_se": rand["_se"],
                    "random_outside": out[""], "random_outside_se": out["_se"],
                    "closed_book": _acc(c["closed_book"]),
                    "random_closed_book": rand["_closed_book"],
                    "specificity": _acc(spec),
                    "specificity_se": mean_se(spec)[1] if spec else None,
                    "random_specificity": rand["_specificity"],
                    "random_outside_specificity": out["_specificity"],
                    "full": _acc(base["correct"]), "examples": len(c["correct"]),
                    "closed_book_prompts": len(c["closed_book"]), "draws": config.random_draws,
                })  # fmt: skip
    return pd.DataFrame(rows).replace({np.nan: None}) if rows else pd.DataFrame()


def collapse_figure(table, name: str):
    """Accuracy against k for each detector and ablation (SE bars), random k-head sets (from
    all heads: grey; from outside the detector's top k: dash-dot) and the closed-book
    specificity control (dotted)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    if len(table):
        for (d, mode), t in table.groupby(["detector", "mode"], sort=False):
            fig.add_trace(go.Scatter(x=t["k"], y=t["accuracy"], name=f"{d} top-k ({mode})",
                                     error_y={"array": t["se"]}, mode="lines+markers"))  # fmt: skip
            fig.add_trace(go.Scatter(x=t["k"], y=t["specificity"],
                                     name=f"{d} closed-book ({mode})", line={"dash": "dot"},
                                     mode="lines"))  # fmt: skip
            if t["random_outside"].notna().any():
                fig.add_trace(go.Scatter(x=t["k"], y=t["random_outside"],
                                         name=f"random k outside {d} top k ({mode})",
                                         error_y={"array": t["random_outside_se"]},
                                         line={"dash": "dashdot"}, mode="lines+markers"))  # fmt: skip
        for mode, t in table.drop_duplicates(["mode", "k"]).groupby("mode"):
            if t["random"].isna().all():
                continue
            fig.add_trace(go.Scatter(x=t["k"], y=t["random"], name=f"random k ({mode})",
                                     error_y={"array": t["random_se"]},
                                     line={"color": "grey"}, mode="lines+markers"))  # fmt: skip
        fig.add_hline(y=float(table["full"].iloc[0]), line_dash="dash",
                      annotation_text="full model")  # fmt: skip
    fig.update_xaxes(type="log", title_text="heads ablated (k)")
    fig.update_yaxes(range=[0, 1.02], title_text="task accuracy (greedy exact match)")
    fig.update_layout(title=f"Task heads: collapse curves, {name}", height=520, width=900)
    return fig
