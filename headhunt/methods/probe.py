"""Linear probes on residual-stream states, per layer (and per head), as a method: the capture
is a compute-once step (rank 0 captures, sharded on disk and resumable; the other ranks read
it), the probes (one per layer or head) are the units dealt over ranks."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from headhunt.config import fields_of
from headhunt.errors import HeadhuntError
from headhunt.methods.base import Method, MethodConfig, option, print_table, require
from headhunt.probes.configs import CaptureConfig, ProbeFitting

TARGETS = ("ngram", "needle", "mqar", "jsonl")
DEFAULT_TEXTS = {"ngram": 300, "needle": 200, "mqar": 300}
DEFAULT_LENGTH = {"ngram": 96, "needle": 256}
# Options that change nothing in the results: a resumed run may change them.
NOT_PARAMETERS = {"batch_size", "drop_states"}
RECORDS = "records.jsonl"
PARTS = "parts"  # each finished probe's weights, until probe_weights.safetensors holds them all


@dataclass
class ProbeTargetOptions(MethodConfig):
    """What to probe for: the target and its texts."""

    target: str | None = option(None, "what to probe for (required)", type=str, choices=TARGETS)
    data: str | None = option(
        None, "jsonl target: file of {text, position|substring, label}", type=str
    )
    task: str = option(
        "auto",
        "jsonl target: force classification or regression",
        choices=("auto", "classification", "regression"),
    )
    texts: int | None = option(
        None, "number of texts (default: ngram/mqar 300, needle 200)", type=int
    )
    length: int | None = option(
        None, "ngram: words per text (96); needle: tokens per prompt (256)", type=int
    )
    k: int = option(1, "ngram: context length")
    stat: str = option(
        "argmax",
        "ngram: most frequent follower (class) or frequency of the actual next word (R^2)",
        choices=("argmax", "freq"),
    )
    positions_per_text: int = option(8, "ngram: rows per text")
    words: list[str] | None = option(
        None, "ngram: the alphabet (single-token words; default river,bread,lamp,...)", type=str
    )
    bins: int = option(5, "needle: depth bins")
    needles: list[str] = option(["passkey", "city", "magic"], "needle: needle kinds")
    haystack: str | None = option(
        None, "needle: haystack text file (default: bundled essays)", type=str
    )
    needle_position: str = option(
        "question",
        "needle: read the question's last token or the prompt's last token",
        choices=("question", "last"),
    )
    pairs: int = option(6, "mqar: key-value pairs per text")
    seq_len: int = option(48, "mqar: Zoology's abstract length L")
    mqar_layout: str = option(
        "kv", "mqar: 'key: value,' lists or Zoology's bare token layout", choices=("kv", "zoology")
    )
    keys: list[str] | None = option(None, "mqar: key words (one fewer than values)", type=str)
    values: list[str] | None = option(None, "mqar: value words (the classes)", type=str)


@dataclass
class ProbeRunConfig(ProbeFitting, CaptureConfig, ProbeTargetOptions):
    """A probe run: the target (what to probe for), the capture (the library's
    :class:`~headhunt.probes.configs.CaptureConfig`) and the probes (its
    :class:`~headhunt.probes.configs.ProbeFitting`)."""

    drop_states: bool = option(False, "delete the captured states when done")

    def check(self) -> None:
        require(self.target is not None, f"--target is required ({', '.join(TARGETS)})")
        require(self.texts is None or self.texts >= 1, "--texts must be at least 1")
        require(self.length is None or self.length >= 1, "--length must be at least 1")
        if self.target != "jsonl":
            require(self.data is None, "--data is only for --target jsonl")
        if self.target == "jsonl":  # a bad file fails now, not after the model loads
            from headhunt.probes.targets import read_jsonl_rows

            require(self.data is not None, "--target jsonl needs --data FILE")
            read_jsonl_rows(self.data)


def build_target(c: ProbeRunConfig, tokenizer):
    """The :class:`~headhunt.probes.targets.ProbeTarget` the options describe."""
    from headhunt.probes import targets

    n = c.texts or DEFAULT_TEXTS.get(c.target)
    length = c.length or DEFAULT_LENGTH.get(c.target)
    if c.target == "ngram":
        return targets.ngram_target(
            tokenizer,
            k=c.k,
            stat=c.stat,
            n_texts=n,
            length=length,
            positions_per_text=c.positions_per_text,
            words=c.words or targets.NGRAM_WORDS,
            seed=c.seed,
        )
    if c.target == "needle":
        return targets.needle_target(
            tokenizer,
            n_texts=n,
            length=length,
            bins=c.bins,
            needles=c.needles,
            haystack=c.haystack,
            position=c.needle_position,
            seed=c.seed,
        )
    if c.target == "mqar":
        return targets.mqar_target(
            tokenizer,
            n_texts=n,
            n_pairs=c.pairs,
            seq_len=c.seq_len,
            layout=c.mqar_layout,
            keys=c.keys or targets.MQAR_KEYS,
            values=c.values or targets.MQAR_VALUES,
            seed=c.seed,
        )
    return targets.jsonl_target(c.data, tokenizer, task=c.task)


class Probe(Method):
    name = "probe"
    Config = ProbeRunConfig
    metric = "accuracy"
    help = "linear probes on residual-stream states, per layer, with controls chosen per target"
    description = (
        "Capture the residual stream after every layer at a target's positions (sharded "
        "on disk, resumable), fit a standardised logistic (or ridge) probe per layer with "
        "its regularisation cross-validated over training texts, test on held-out texts, "
        "and compare with controls: labels moved among rows of the same token type "
        "(within_type), shuffled labels, and on request Hewitt & Liang's random label per "
        "type (control); selectivity is measured against the target's informative one. "
        "Writes scores.parquet (metric per layer; head = kv_head = -1 for the "
        "residual stream), probe_curve.html, probe_weights.safetensors, rows.parquet and "
        "the states."
    )
    units = "probes (layers and heads)"
    top = 10

    def run_parameters(self, config: ProbeRunConfig, model: str, spec) -> dict[str, Any]:
        # Every option but those that change nothing, as the command always wrote them
        # (sorted; the loading options included).
        from headhunt.engine import ModelSpec

        spec = spec or ModelSpec(None, None, None)  # a model in memory: no loading options
        d = {k: v for k, v in config.to_dict().items() if k not in NOT_PARAMETERS}
        d.update(model=model, device=spec.device, device_map=spec.device_map, dtype=spec.dtype)
        d["trust_remote_code"] = spec.trust_remote_code
        return dict(sorted(d.items()))

    def run(self, model, config: ProbeRunConfig, ctx):
        import shutil

        from headhunt.probes import linear, states

        t0 = time.perf_counter()
        target = build_target(config, model.tokenizer)
        if not target.texts:
            raise HeadhuntError("the target produced no texts with a label to probe")
        for text in target.texts:  # positions outside a text fail here, before any work
            states.resolve_positions(text, model.max_context)
        labels, groups, types = target.arrays()
        fitting = fields_of(config, ProbeFitting)
        fitting["controls"] = [c for c in config.controls if c != "none"]
        probe_config = linear.ProbeConfig(task=target.task, **fitting)
        # The prober checks labels, controls and the split now, before any work is saved.
        prober = linear.Prober(labels, groups, types, probe_config)
        layers = config.layer_list(model.n_layers)  # the run's config is the capture's
        # The command's timing names: "load" is the model and the target.
        ctx.timings["load"] = ctx.timings.pop("load_model_s", 0.0) + time.perf_counter() - t0
        if ctx.is_main:
            ctx.write("rows.parquet", target.frame())

        t1 = time.perf_counter()
        store = _capture(model, target, groups, config, ctx)
        ctx.timings["capture"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        units = [(L, linear.RESIDUAL) for L in layers]
        if config.heads:
            units += [(L, h) for L in layers for h in range(model.n_heads)]
        results = _fit(units, prober, store, ctx)
        if results is None:
            return None
        ctx.timings["probe"] = time.perf_counter() - t2

        ctx.write("probe_weights.safetensors", linear.weight_tensors(results))
        title = (
            f"{model.name}: {target.name} probe ({probe_config.score_name}, "
            f"{len(target.texts)} texts)"
        )
        fig = linear.curve_figure(results, target.task, title)
        ctx.write("probe_curve.html", fig)
        shutil.rmtree(ctx.path(PARTS))
        if config.drop_states:
            shutil.rmtree(ctx.path("states"))
        ctx.extra["target"] = _target_facts(target, labels, types)
        ctx.extra["capture"] = store.meta
        ctx.extra["probe"] = prober.config.to_dict()  # selectivity_vs resolved ("auto" -> ...)
        self._note = selectivity_note(results, prober.config, target)
        return linear.to_scores(results, model.group_size)

    def show(self, run, top: int) -> None:
        from headhunt.probes.configs import ProbeConfig

        score = ProbeConfig.from_dict(run.manifest["probe"]).score_name
        _print(run.scores().df, score, top)
        note = getattr(self, "_note", None)
        if note:
            print(note)


def _capture(model, target, groups, cap, ctx):
    """The target's hidden states, captured once by rank 0 (resumable by shard); the other
    ranks read them."""
    import numpy as np

    from headhunt.probes import states

    store = None
    if ctx.is_main:
        store = states.capture_states(
            model, target.texts, ctx.path("states"), cap, progress=ctx.show_progress
        )
    ctx.wait()
    if store is None:
        store = states.StateStore.open(ctx.path("states"))
    if not np.array_equal(store.rows()["item"], groups):
        raise HeadhuntError("captured rows do not match the target's rows; rerun with --force")
    return store


def _fit(units, prober, store, ctx):
    """One probe per (layer, head) unit, dealt over the ranks; each keeps its weights in
    ``parts/`` and its metrics as a record. Rank 0 gets every result in plan order."""
    from headhunt.probes import linear

    parts = ctx.path(PARTS)
    parts.mkdir(exist_ok=True)

    def key(r: dict) -> tuple[int, int]:
        return r["layer"], r["head"]

    done = {key(r) for r in ctx.records(RECORDS) if (parts / _unit_name(*key(r))).is_file()}
    share = ctx.todo(units)
    mine = [u for u in share if u not in done]
    for layer, head in ctx.units(mine, "probe", done_before=len(share) - len(mine)):
        x = store.layer(layer) if head == linear.RESIDUAL else store.head(layer, head)
        res = prober.fit(x, layer, head)
        ctx.write(f"{PARTS}/{_unit_name(layer, head)}", res.weights)
        ctx.append(RECORDS, {"layer": layer, "head": head, "metrics": res.metrics})
    ctx.wait()
    records = ctx.collect(RECORDS, units, key=key)
    if records is None:
        return None
    return [
        linear.ProbeResult(r["layer"], r["head"], r["metrics"], _load(parts / _unit_name(*key(r))))
        for r in records
    ]


def _target_facts(target, labels, types) -> dict[str, Any]:
    """What the manifest says of the target."""
    import numpy as np

    return {
        "name": target.name,
        "task": target.task,
        "classes": target.classes,
        "control_types": target.types,
        "control": target.control,
        "control_why": target.control_why,
        "n_types": int(len(np.unique(types))),
        "n_texts": len(target.texts),
        "n_rows": int(len(labels)),
        **target.params,
    }


def selectivity_note(results, config, target) -> str:
    """Which control selectivity is measured against and why, and what it says at the best
    layer (or why no positive selectivity is to be expected there)."""
    resid = [r for r in results if r.head < 0 and "selectivity" in r.metrics]
    if not resid:
        return "no selectivity (no control fitted)"
    best = max(resid, key=lambda r: r.metrics[config.score_name])
    sel = best.metrics["selectivity"]
    line = (
        f"selectivity = {config.score_name} - {config.selectivity_vs}"
        f" ({target.control_why or 'the target names no reason'}); "
        f"best layer {best.layer}: {sel:+.3f}"
    )
    if sel <= 0:
        line += (
            " - not positive: at the best layer the probe does no better than on labels that "
            "lack the property, so nothing says this layer holds it"
        )
    return line


def _unit_name(layer: int, head: int) -> str:
    return f"L{layer:02d}.safetensors" if head < 0 else f"L{layer:02d}.H{head:02d}.safetensors"


def _load(path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(path))


def _print(df, score: str, top: int) -> None:
    """The per-layer table of the residual-stream probes (and the ``top`` best heads, if any)."""
    resid = df[df["head"] < 0]
    table = resid.pivot_table(index="layer", columns="metric", values="value").reset_index()
    cols = [
        c
        for c in (
            "layer",
            score,
            "control",
            "selectivity",
            "shuffled",
            "within_type",
            "chance",
            "C",
        )
        if c in table.columns
    ]
    table = table[cols]
    table["layer"] = table["layer"].astype(int)
    print_table(table, title=f"probe {score} per layer (held-out texts)")
    heads = df[(df["head"] >= 0) & (df["metric"] == score)]
    if len(heads):
        best = heads.sort_values("value", ascending=False).head(top)
        print_table(best[["layer", "head", "value"]], title=f"best heads by {score}")
