"""The configs of the methods whose analyzers live in ``headhunt.heads``: one dataclass per
method, the library's config and the method's at once (``score_retrieval(model,
RetrievalConfig(...))``, ``headhunt.run("retrieval", RetrievalConfig(...))`` and ``headhunt
retrieval --lengths ...`` take the same class). Kept apart from the analyzers so that the CLI's
``--help`` and the dashboard read them without importing torch; each analyzer module re-exports
its config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headhunt.config import MethodConfig, default_of, option
from headhunt.errors import HeadhuntError
from headhunt.heads.inputs.needles import NEEDLES
from headhunt.heads.inputs.ruler import TASKS as KV_TASKS

if TYPE_CHECKING:
    from headhunt.probes.hooked import HookedModel

# Size limits: a grid past them is refused before any work starts (a mistyped --repeats would
# otherwise build millions of trials in memory with no word).
MAX_TRIALS = 100_000
MAX_LENGTH = 2**20  # tokens: past any model's context


@dataclass
class NeedlePrompts(MethodConfig):
    """The needle-in-a-haystack prompts: lengths, depths, needle templates and the haystack
    (declared once for retrieval, ablate and kv-eval)."""

    lengths: list[int] = option(
        [500, 1000, 2000],
        "prompt lengths in tokens (frame, haystack, needle and question together)",
        min=64,
        limit=MAX_LENGTH,
    )
    depths: list[float] = option(
        [0.0, 25.0, 50.0, 75.0, 100.0], "needle depths in percent (0: start, 100: end)"
    )
    needles: list[str] = option(
        ["passkey", "city", "magic"], f"needle templates ({', '.join(NEEDLES)})"
    )
    haystack: str | None = option(
        None, "text file for the haystack (default: bundled essays)", type=str
    )


@dataclass
class NeedleTrialGrid(NeedlePrompts):
    """Needle trials: each (length, depth) cell gets one trial per needle and repeat, answers
    drawn at random (seeded by ``seed``), decoded greedily."""

    repeats: int = option(1, "trials per (length, depth, needle)", limit=MAX_TRIALS)
    max_new_tokens: int = option(
        24, "decoding budget per trial (stops earlier at a newline or end of turn)", limit=4096
    )

    def validate(self, model: HookedModel | None = None) -> None:
        """Raise a one-line error for a grid that cannot run (on ``model``, when given)."""
        if not self.lengths or not self.depths or not self.needles:
            raise HeadhuntError("lengths, depths and needles must each list at least one value")
        unknown = [n for n in self.needles if n not in NEEDLES]
        if unknown:
            raise HeadhuntError(f"unknown needle {unknown[0]!r} (choose from {', '.join(NEEDLES)})")
        bad = [d for d in self.depths if not 0 <= d <= 100]
        if bad:
            raise HeadhuntError(f"depth {bad[0]} is outside 0..100 (percent)")
        if self.repeats < 1 or self.max_new_tokens < 1:
            raise HeadhuntError("repeats and max_new_tokens must be at least 1")
        for n in self.lengths:
            if n < 64:
                raise HeadhuntError(
                    f"length {n} is too short for a needle-in-a-haystack trial (min 64)"
                )
        super().validate()
        n = len(self.lengths) * len(self.depths) * len(self.needles) * self.repeats
        if n > MAX_TRIALS:
            raise HeadhuntError(
                f"--lengths x --depths x --needles x --repeats make {n} trials; at most "
                f"{MAX_TRIALS} (split the grid over runs)"
            )
        for n in self.lengths:
            if model is not None and n + self.max_new_tokens > model.max_context:
                raise HeadhuntError(
                    f"length {n} plus {self.max_new_tokens} new tokens exceeds the model's context "
                    f"of {model.max_context} tokens"
                )


@dataclass
class DecodeBatch(MethodConfig):
    """Trials decoded together (ablate's and kv-eval's: a fixed number, at least 1)."""

    batch_size: int = option(8, "trials decoded together", min=1)


@dataclass
class RetrievalConfig(NeedleTrialGrid):
    """A retrieval run: the needle trials, and how the KV-head table is folded."""

    batch_size: int = option(0, "trials decoded together (0: auto, by device and length)", min=0)
    threshold: float = option(0.1, "score above which a head is a retrieval head")
    min_recall: float = option(
        0.5, "a trial counts when the response's ROUGE-1 recall of the answer exceeds it",
        min=0.0, below=1.0,
    )  # fmt: skip
    kv_aggregate: str = option(
        "max", "how duo_attention.tsv folds query heads into their KV head", choices=("max", "mean")
    )


@dataclass
class SinksConfig(MethodConfig):
    """A sinks run: which texts, and the settings of the sink analysis."""

    texts: str | None = option(
        None,
        'a .txt file (one text) or .jsonl file ({"text": ...} per line); default: the bundled '
        "essays",
        type=str,
    )
    length: int | None = option(
        None,
        "tokens per text (texts are cut to it; bundled essays are joined to reach it; default "
        "1024 for the essays, the whole text for --texts)",
        type=int,
        min=2,
        limit=2**20,
    )
    n_texts: int = option(4, "texts to analyse (at most)", min=1, limit=100_000)
    tau: float = option(0.1, "s_j threshold of a sink (a key is a sink of a head above it)")
    min_queries: int = option(32, "queries that must see a key to judge it")
    min_query_share: float = option(
        0.1, "... and at least this share of the text's queries (the last 10%% is not judged)"
    )
    eps: float = option(0.3, "Sink_eps threshold on s_0 (Gu et al.'s 0.3)")
    eps_tokens: int = option(64, "prefix length T of Sink_eps (Gu et al.'s 64)")
    massive_top: int = option(3, "top |activations| kept per layer (massive activations)")

    def validate(self) -> None:
        if not 0.0 < self.tau < 1.0:
            raise HeadhuntError(f"tau must be in (0, 1), got {self.tau}")
        if not 0.0 < self.eps < 1.0:
            raise HeadhuntError(f"eps must be in (0, 1), got {self.eps}")
        if self.min_queries < 1 or self.eps_tokens < 2 or self.massive_top < 1:
            raise HeadhuntError("min_queries, massive_top must be >= 1 and eps_tokens >= 2")
        if not 0.0 <= self.min_query_share < 1.0:
            raise HeadhuntError(f"min_query_share must be in [0, 1), got {self.min_query_share}")
        super().validate()

    def min_count(self, n: int) -> int:
        """Queries a key of an n-token text needs behind it to be judged."""
        return max(self.min_queries, math.ceil(self.min_query_share * n))


@dataclass
class CalibrateConfig(MethodConfig):
    """A calibration run (ACT, Yu et al. 2024): the task and its split, the head search, the
    calibration (``beta``, ``tau``, ``min_queries``: see :class:`headhunt.heads.interventions.act.ActConfig`)
    and the bootstrap. ``seed`` seeds the split and the bootstrap."""

    task: str = option("sentiment", "bundled task or a JSONL file")
    n_calib: int = option(100, "items in the calibration split", limit=1_000_000)
    n_dev: int = option(100, "items in the dev split", limit=1_000_000)
    n_test: int | None = option(
        None, "items in the test split (default: all the rest)", type=int, limit=1_000_000
    )
    batch_size: int = option(16, "prompts per forward pass")
    heads: str | None = option(None, "apply a saved head set instead of searching", type=str)
    max_heads: int = option(
        24, "candidate heads screened (those with the largest movable sink mass)", limit=100_000
    )
    exclude_layers: list[int] | None = option(
        None, "layers never calibrated (default: 0, 1 and the last, as in ACT)", type=int
    )
    beta: float = option(0.4, "factor on hidden-sink attention (1 leaves it alone)", min=0, max=1)
    tau: float = option(0.1, "s_j threshold of a sink of a row", min=0, below=1)
    min_queries: int = option(
        1,
        "rows that must have seen a key before it can be a sink (1: the reference rule)",
        min=1,
    )
    bootstrap: int = option(2000, "bootstrap resamples (at least 100)", limit=10_000_000)

    def validate(self) -> None:
        if self.max_heads < 1 or self.batch_size < 1 or self.bootstrap < 100:
            raise HeadhuntError("max_heads and batch_size must be >= 1, bootstrap >= 100")
        super().validate()

    def act(self):
        """The calibration's own settings (:class:`headhunt.heads.interventions.act.ActConfig`)."""
        from headhunt.heads.interventions.act import ActConfig

        return ActConfig(beta=self.beta, tau=self.tau, min_queries=self.min_queries)

    def excluded(self, n_layers: int) -> list[int]:
        if self.exclude_layers is None:
            return sorted({0, 1, n_layers - 1} & set(range(n_layers)))
        return sorted(set(self.exclude_layers))


K_LIMIT = 8  # the largest order the n-gram scorer accepts
NGRAM_SOURCES = ("random", "planted", "natural")


@dataclass
class WithBos(MethodConfig):
    """Whether sequences start with the tokenizer's BOS token (n-gram and MQAR inputs)."""

    bos: bool = option(True, "do not prepend the tokenizer's BOS token", flag="--no-bos")


@dataclass
class NgramConfig(WithBos):
    """An n-gram run: the probe sequences (repeated random tokens, planted k-grams, natural
    text) and the n-gram / induction scorer's options."""

    inputs: list[str] = option(
        list(NGRAM_SOURCES), "probe kinds: random, planted, natural", choices=NGRAM_SOURCES
    )
    n_seqs: int = option(8, "random and planted sequences", min=1, limit=100_000)
    repeat_len: int = option(50, "random tokens per repeat", limit=2**20)
    repeats: int = option(2, "repeats of the random tokens", limit=1000)
    planted_len: int = option(256, "tokens per planted sequence", min=8, limit=2**20)
    texts: str | None = option(
        None,
        'natural texts: a .txt file (one text) or .jsonl ({"text": ...} per line); default: '
        "the bundled essays",
        type=str,
    )
    text_tokens: int = option(512, "tokens per natural chunk", min=2, limit=2**20)
    n_texts: int = option(4, "natural chunks (at most)", min=1, limit=100_000)
    k_max: int = option(4, f"largest k-gram order scored (1..{K_LIMIT})")
    exclude_bos: bool = option(False, "TransformerLens: drop attention to key 0")
    exclude_current_token: bool = option(
        False, "TransformerLens: drop attention to the query's own position"
    )
    order_contrast: float = option(
        0.5,
        "contrast a head needs at order k to be called order >= k (0.5: a full-match key gets "
        "at least 3x the attention of a (k-1)-only key)",
        min=-1,
        max=1,
    )
    order_mass: float = option(
        0.1, "attention mass on the full k-gram matches a head needs at that order", min=0, max=1
    )
    min_queries: int = option(
        5, "fewest queries with both kinds of keys for a contrast to be reported", min=1
    )
    batch_size: int = option(8, "sequences per forward", min=1)
    chunk_pairs: int = option(
        1 << 15, "(query, key) pairs gathered per kernel call (bounds transient memory)", min=1
    )

    def validate(self) -> None:
        if not 1 <= self.k_max <= K_LIMIT:
            raise HeadhuntError(
                f"--k-max must be in 1..{K_LIMIT} (every order k must be in 1..{K_LIMIT}), "
                f"got {self.k_max}"
            )
        if self.repeat_len < 2 or self.repeats < 2:
            raise HeadhuntError("--repeat-len and --repeats must be >= 2")
        super().validate()


# What a streaming head keeps when neither a flag, a sinks run nor a DuoAttention pattern says
# (StreamingLLM's four sink tokens, a 256-token window).
STREAMING_SINK, STREAMING_RECENT = 4, 256


@dataclass
class Ranking(MethodConfig):
    """The run a method ranks heads by (prune's and kv-eval's)."""

    scores: str | None = option(None, "a run directory (or scores .parquet) to rank by", type=str)
    metric: str = option("retrieval_score", "the metric of --scores")


@dataclass
class PruneMeasurement(DecodeBatch):
    """How pruned models are compared (prune's ``--evaluate`` and the library's
    :class:`~headhunt.heads.evaluations.prune_eval.PruneEvalConfig`): the random head sets, the
    needle trials and the perplexity windows each pruned model is measured on."""

    unit: str = option(
        "head",
        "head: rank and drop query heads (uneven GQA groups get zero pad heads); kv: rank KV "
        "groups by their best query head and drop whole groups (k/v and the KV cache shrink)",
        choices=("head", "kv"),
    )
    draws: int = option(3, "random head sets per share", min=0)
    lengths: list[int] = default_of(NeedlePrompts, "lengths", [1000, 2000])
    depths: list[float] = default_of(NeedlePrompts, "depths", [0.0, 50.0, 100.0])
    ppl_windows: int = option(8, "perplexity windows (512 tokens)", min=1)


@dataclass
class KVEvalConfig(Ranking, DecodeBatch, NeedlePrompts):
    """A KV-cache evaluation: the rankings it compares, and the sweep over the share of KV
    heads that keep the full cache (the others keep ``sink`` + ``recent`` tokens) on needle
    trials (fresh: another seed stream than a retrieval run's) and RULER-like tasks."""

    lengths: list[int] = default_of(NeedlePrompts, "lengths", [1000, 2000])
    duo_pattern: str | None = option(None, "a DuoAttention pattern folder to compare", type=str)
    random_draws: int = option(3, "random rankings", min=0)
    fractions: list[float] = option(
        [0.0, 0.1, 0.25, 0.5, 0.75, 1.0], "shares of KV heads with the full cache", min=0, max=1
    )
    sink: int | None = option(
        None,
        "leading tokens a streaming head keeps (default: from --sinks, else the --duo-pattern's "
        f"sink_size, else {STREAMING_SINK})",
        type=int,
        min=0,
    )
    recent: int | None = option(
        None,
        "trailing tokens a streaming head keeps (default: the --duo-pattern's recent_size, "
        f"else {STREAMING_RECENT})",
        type=int,
        min=1,
    )
    sinks: str | None = option(
        None, "a sinks run: the sink size keeps token 0 and its leading hidden sinks", type=str
    )
    needle_repeats: int = option(
        1, "needle trials per (length, depth, needle)", min=1, limit=MAX_TRIALS
    )
    tasks: list[str] = option(list(KV_TASKS), "RULER-like tasks")
    task_repeats: int = option(2, "trials per (task, length)", min=0, limit=MAX_TRIALS)
    window_from: str = option("", "where --sink and --recent came from", cli=False)

    def window(self) -> tuple[int, int]:
        """(sink, recent) a streaming head keeps (None: the defaults)."""
        sink = STREAMING_SINK if self.sink is None else self.sink
        return sink, STREAMING_RECENT if self.recent is None else self.recent

    def validate(self) -> None:
        super().validate()
        if not self.fractions or any(not 0 <= f <= 1 for f in self.fractions):
            raise HeadhuntError("fractions must be shares of KV heads between 0 and 1")
        if not self.needles and not (self.tasks and self.task_repeats):
            raise HeadhuntError("nothing to evaluate: give needles or tasks")
        bad = [t for t in self.tasks if t not in KV_TASKS] + [
            n for n in self.needles if n not in NEEDLES
        ]
        if bad:
            raise HeadhuntError(
                f"unknown task or needle {bad[0]!r} (tasks: {', '.join(KV_TASKS)}; needles: "
                f"{', '.join(NEEDLES)})"
            )
