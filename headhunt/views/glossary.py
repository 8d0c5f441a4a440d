"""What each metric in a run's scores means: a one-line definition and its unit, shown next to
every map, table and chart of the dashboard (and available to notebooks). A method's own
metrics may instead be defined by the method (``Method.glossary``)."""

from __future__ import annotations

from headhunt.methods import METHODS, get
from headhunt.methods.base import MetricInfo

SHARE = "share of attention, 0-1"
COUNT = "count"
PER_RUN = "it counts the run's inputs, the same for every head by definition"
NO_TRIAL = (
    "with no counted trial (counted_trials 0: the model never answered right) every head scores 0"
)

METRICS: dict[str, MetricInfo] = {
    # retrieval / ablate
    "retrieval_score": MetricInfo(
        "mean over counted trials of the share of decoding steps whose attention argmax lies on "
        "the needle's answer token that is being copied (Wu et al.)",
        "share of steps, 0-1",
        "no trial was counted (the model never answered correctly)",
        NO_TRIAL,
    ),
    "retrieval_score_std": MetricInfo(
        "sample standard deviation (ddof=1) of the retrieval score over counted trials (0 "
        "with one trial)",
        "share of steps, 0-1",
        when_constant=NO_TRIAL,
    ),
    "needle_attention": MetricInfo(
        "mean over counted trials of the share of decoding steps whose attention argmax lies "
        "anywhere on the answer span (no copy condition)",
        "share of steps, 0-1",
        when_constant=NO_TRIAL,
    ),
    "counted_trials": MetricInfo(
        "trials whose answer was right (ROUGE-1 recall > 0.5): the trials the scores average; "
        "the same for every head",
        COUNT,
        when_constant=PER_RUN,
    ),
    # sinks / calibrate
    "first_sink_mass": MetricInfo(
        "s_0: mean attention the first token receives, averaged over the texts", SHARE
    ),
    "hidden_sink_mass": MetricInfo(
        "attention on the head's hidden sinks (positions >= 1 with s_j > tau), averaged over "
        "all queries of a text and over texts",
        SHARE,
    ),
    "hidden_sink_count": MetricInfo("hidden sinks per text (mean over texts)", "tokens per text"),
    "sink_eps": MetricInfo(
        "Sink_eps (Gu et al.): share of (text, head) pairs of the layer whose s_0 on the first "
        "T tokens exceeds eps",
        "share of heads, 0-1",
    ),
    "massive_ratio": MetricInfo(
        "largest |hidden-state value| of the layer's output divided by the median |value| "
        "(massive activations, Sun et al.)",
        "ratio (x median)",
    ),
    "movable_sink_mass": MetricInfo(
        "attention ACT would take off the head's sink tokens on the calibration prompts", SHARE
    ),
    "calib_acc_gain": MetricInfo(
        "accuracy with the head calibrated minus without (dev split)",
        "accuracy points, -1-1",
        "the head was not screened",
    ),
    "calib_logprob_gain": MetricInfo(
        "mean log-probability of the right answer with the head calibrated minus without",
        "nats",
        "the head was not screened",
    ),
    "chosen": MetricInfo("1 when the head is in the calibrated set, else 0", "0/1"),
    # ngram
    "prev_token": MetricInfo(
        "TransformerLens 'mul' score of the previous-token pattern: attention on key t-1 over "
        "all attention, mean over sequences",
        SHARE,
    ),
    "duplicate_token": MetricInfo(
        "TransformerLens 'mul' score of the duplicate-token pattern (keys holding the query's "
        "token), mean over sequences",
        SHARE,
    ),
    "induction": MetricInfo(
        "TransformerLens 'mul' score of the induction pattern (keys right after an earlier "
        "copy of the query's token), mean over sequences",
        SHARE,
    ),
    "kgram_mass": MetricInfo(
        "mean attention mass on the keys whose preceding k tokens match the query's last k, "
        "over queries with such a key",
        SHARE,
        "no query of this input kind had a full k-gram match",
    ),
    "kgram_only_mass": MetricInfo(
        "mean attention mass on keys matching only k-1 tokens, over queries having both kinds",
        SHARE,
        "no query of this input kind had both a full and a (k-1)-only match",
    ),
    "kgram_contrast": MetricInfo(
        "(F - O) / (F + O), F and O the mean attention per full-match and per (k-1)-only key: "
        "+1 = attends to full k-gram matches only, 0 = cannot tell them apart",
        "contrast, -1-1",
        "fewer queries than --min-queries had both a full and a (k-1)-only match at this order "
        "(use longer or more texts, or a smaller --min-queries)",
    ),
    "kgram_queries": MetricInfo(
        "queries of this input kind with a full k-gram match (the same for every head)",
        COUNT,
        when_constant=PER_RUN,
    ),
    "kgram_both_queries": MetricInfo(
        "queries with both a full and a (k-1)-only match (the same for every head)",
        COUNT,
        when_constant=PER_RUN,
    ),
    "ngram_order": MetricInfo(
        "the head's best order: the largest k whose contrast and mass pass the thresholds "
        "(0 = none)",
        "order k",
    ),
    "ngram_contrast": MetricInfo(
        "kgram_contrast at the head's best order", "contrast, -1-1", "the head has no order"
    ),
    "ngram_mass": MetricInfo("kgram_mass at the head's best order", SHARE, "the head has no order"),
    "ngram_next_contrast": MetricInfo(
        "kgram_contrast one order above the best (~0 for a true order-k head)",
        "contrast, -1-1",
        "no order above the best one was measured, or too few queries there",
    ),
    # mqar
    "query_to_value": MetricInfo(
        "mean attention from a query key to the value that followed it in the context (what an "
        "induction head reads)",
        SHARE,
    ),
    "query_to_key": MetricInfo(
        "mean attention from a query key to its earlier occurrence as a key", SHARE
    ),
    "value_to_key": MetricInfo(
        "mean attention from each context value to its own key (a previous-token head)", SHARE
    ),
    # probe (a layer's residual stream: head -1, drawn per layer; --heads: one probe per head)
    "accuracy": MetricInfo(
        "held-out accuracy of the linear probe (texts split, not positions)", "share, 0-1"
    ),
    "r2": MetricInfo("held-out R^2 of the linear (ridge) probe", "R^2, at most 1"),
    "train": MetricInfo("the probe's score on its own training texts", "same as the score"),
    "within_type": MetricInfo(
        "the probe's score on labels moved among rows of the same type (token, context, key)",
        "same as the score",
    ),
    "shuffled": MetricInfo("the probe's score on labels shuffled across rows", "same as the score"),
    "control": MetricInfo(
        "the probe's score on Hewitt & Liang's control task (one random label per type)",
        "same as the score",
    ),
    "selectivity": MetricInfo(
        "the probe's score minus the target's informative control (docs/probes.md)",
        "score difference",
    ),
    "chance": MetricInfo(
        "the training split's majority class (R^2 of its mean) on the test texts",
        "same as the score",
    ),
    "C": MetricInfo(
        "inverse regularisation picked by cross-validation over training texts", "C (1/alpha)"
    ),
    "n_train": MetricInfo("rows the probe was trained on", COUNT, when_constant=PER_RUN),
    "n_test": MetricInfo("rows the probe was tested on", COUNT, when_constant=PER_RUN),
    # circuits
    "sae_node": MetricInfo(
        "|P \\ N|: distinct SAE codes the head takes on positive prompts and never on negative "
        "ones (O'Neill & Bui), mean over SAE trials",
        "codes",
    ),
    "sae_node_norm": MetricInfo(
        "|P \\ N| / |P u N|: the share of the head's distinct codes that are positive-only, "
        "mean over SAE trials",
        "share, 0-1",
    ),
    "sae_pos_only": MetricInfo(
        "share of positive prompts whose SAE code no negative prompt gives the head, mean over "
        "SAE trials",
        "share, 0-1",
    ),
    "sae_changed": MetricInfo(
        "share of prompt pairs on which the head's SAE code differs between the positive and "
        "its own negative, mean over SAE trials",
        "share, 0-1",
    ),
    "sae_edge": MetricInfo(
        "how many of the top head pairs by SAE edge score the head belongs to (ties weighted), "
        "mean over SAE trials",
        "pairs",
    ),
    "eap": MetricInfo(
        "edge attribution patching: the first-order estimate of the head's patching effect, "
        "signed, mean over prompt pairs",
        "logits",
    ),
    "patching": MetricInfo(
        "activation patching: mean change of the task's logit difference over prompt pairs when "
        "the head's output is patched (the ground-truth effect)",
        "logits",
    ),
    "patching_norm": MetricInfo(
        "the patching effect divided by the clean - corrupted logit-difference gap",
        "share of the gap",
    ),
    "truth": MetricInfo("1 for the ground-truth heads (the rule is in auc.json), else 0", "0/1"),
}


def metric_info(metric: str) -> MetricInfo | None:
    """The metric's entry (``first_sink_mass_T64`` reads as ``first_sink_mass`` on T tokens),
    else a registered method's definition of it, else None."""
    if metric in METRICS:
        return METRICS[metric]
    if metric.startswith("first_sink_mass_T"):
        tokens = metric.removeprefix("first_sink_mass_T")
        return MetricInfo(f"s_0 on the texts' first {tokens} tokens, mean over texts", SHARE)
    for name in METHODS:  # a method's own metrics, defined where the method is
        info = get(name).glossary.get(metric)
        if info is not None:
            return info
    return None


def describe(metric: str) -> str:
    """``"<definition> [unit]"``, or a line saying the metric has no recorded definition."""
    info = metric_info(metric)
    if info is None:
        return f"{metric}: no definition recorded (see the method's docs page)"
    return f"{metric}: {info.definition} [{info.unit}]"
