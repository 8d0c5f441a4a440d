"""`headhunt probe`: linear probes on captured residual-stream states, per layer."""

from __future__ import annotations

import argparse

from headhunt.commands import common

TARGETS = ("ngram", "needle", "mqar", "jsonl")
DEFAULT_TEXTS = {"ngram": 300, "needle": 200, "mqar": 300}
DEFAULT_LENGTH = {"ngram": 96, "needle": 256}
# Options that change nothing in the results: a resumed run may change them.
# (argv is the CLI's own copy of the command line.)
NOT_PARAMETERS = {
    "out",
    "resume",
    "force",
    "debug",
    "func",
    "command",
    "argv",
    "batch_size",
    "drop_states",
}


def add_parser(sub) -> None:
    p = common.add_command(
        sub,
        "probe",
        "linear probes on residual-stream states, per layer, with controls chosen per target",
        description=(
            "Capture the residual stream after every layer at a target's positions (sharded "
            "on disk, resumable), fit a standardised logistic (or ridge) probe per layer with "
            "its regularisation cross-validated over training texts, test on held-out texts, "
            "and compare with controls: labels moved among rows of the same token type "
            "(within_type), shuffled labels, and on request Hewitt & Liang's random label per "
            "type (control); selectivity is measured against the target's informative one. "
            "Writes scores.parquet (metric per layer; head = kv_head = -1 for the "
            "residual stream), probe_curve.html, probe_weights.safetensors, rows.parquet and "
            "the states."
        ),
    )
    common.add_model_args(p)
    common.add_out_args(p, "runs/probe")
    t = p.add_argument_group("target")
    t.add_argument("--target", choices=TARGETS, required=True, help="what to probe for")
    t.add_argument("--data", help="jsonl target: file of {text, position|substring, label}")
    t.add_argument(
        "--task",
        choices=("auto", "classification", "regression"),
        default="auto",
        help="jsonl target: force classification or regression",
    )
    t.add_argument(
        "--texts", type=int, help="number of texts (default: ngram/mqar 300, needle 200)"
    )
    t.add_argument(
        "--length", type=int, help="ngram: words per text (96); needle: tokens per prompt (256)"
    )
    t.add_argument("--k", type=int, default=1, help="ngram: context length")
    t.add_argument(
        "--stat",
        choices=("argmax", "freq"),
        default="argmax",
        help="ngram: most frequent follower (class) or frequency of the actual next word (R^2)",
    )
    t.add_argument("--positions-per-text", type=int, default=8, help="ngram: rows per text")
    t.add_argument(
        "--words",
        type=common.comma_list(str, "word"),
        help="ngram: the alphabet (single-token words; default river,bread,lamp,...)",
    )
    t.add_argument("--bins", type=int, default=5, help="needle: depth bins")
    t.add_argument(
        "--needles",
        type=common.comma_list(str, "needle"),
        default=["passkey", "city", "magic"],
        help="needle: needle kinds",
    )
    t.add_argument("--haystack", help="needle: haystack text file (default: bundled essays)")
    t.add_argument(
        "--needle-position",
        choices=("question", "last"),
        default="question",
        help="needle: read the question's last token or the prompt's last token",
    )
    t.add_argument("--pairs", type=int, default=6, help="mqar: key-value pairs per text")
    t.add_argument("--seq-len", type=int, default=48, help="mqar: Zoology's abstract length L")
    t.add_argument(
        "--mqar-layout",
        choices=("kv", "zoology"),
        default="kv",
        help="mqar: 'key: value,' lists or Zoology's bare token layout",
    )
    t.add_argument(
        "--keys",
        type=common.comma_list(str, "word"),
        help="mqar: key words (one fewer than values)",
    )
    t.add_argument(
        "--values", type=common.comma_list(str, "word"), help="mqar: value words (the classes)"
    )
    c = p.add_argument_group("capture")
    c.add_argument("--layers", type=common.comma_list(int, "layer"), help="layers (default all)")
    c.add_argument("--heads", action="store_true", help="also probe every head's output")
    c.add_argument("--batch-size", type=int, default=8, help="texts per forward pass")
    c.add_argument("--shard-size", type=int, default=64, help="texts per shard on disk")
    c.add_argument("--state-dtype", choices=("float32", "float16"), default="float32")
    c.add_argument(
        "--drop-states", action="store_true", help="delete the captured states when done"
    )
    f = p.add_argument_group("probe")
    f.add_argument(
        "--test-fraction", type=common.finite_float, default=0.25, help="share of texts held out"
    )
    f.add_argument("--folds", type=int, default=3, help="cross-validation folds (by text)")
    f.add_argument(
        "--grid",
        type=common.comma_list(float, "number"),
        default=[1e-4, 1e-3, 1e-2, 1e-1, 1.0],
        help="inverse regularisation strengths (logistic C; ridge alpha = 1/C)",
    )
    f.add_argument(
        "--controls",
        type=common.comma_list(str, "control"),
        default=["within_type", "shuffled"],
        help="controls to fit: within_type, shuffled, control (Hewitt & Liang), or none; "
        "selectivity is always against the target's informative control (fitted anyway)",
    )
    p.set_defaults(func=run)


def parameters(args: argparse.Namespace) -> dict:
    return {k: v for k, v in sorted(vars(args).items()) if k not in NOT_PARAMETERS}


def build_target(args: argparse.Namespace, tokenizer):
    """The :class:`~headhunt.probes.targets.ProbeTarget` the options describe."""
    from headhunt.probes import targets

    common.require(args.texts is None or args.texts >= 1, "--texts must be at least 1")
    common.require(args.length is None or args.length >= 1, "--length must be at least 1")
    n = args.texts or DEFAULT_TEXTS.get(args.target)
    length = args.length or DEFAULT_LENGTH.get(args.target)
    if args.target != "jsonl":
        common.require(args.data is None, "--data is only for --target jsonl")
    if args.target == "ngram":
        return targets.ngram_target(
            tokenizer,
            k=args.k,
            stat=args.stat,
            n_texts=n,
            length=length,
            positions_per_text=args.positions_per_text,
            words=args.words or targets.NGRAM_WORDS,
            seed=args.seed,
        )
    if args.target == "needle":
        return targets.needle_target(
            tokenizer,
            n_texts=n,
            length=length,
            bins=args.bins,
            needles=args.needles,
            haystack=args.haystack,
            position=args.needle_position,
            seed=args.seed,
        )
    if args.target == "mqar":
        return targets.mqar_target(
            tokenizer,
            n_texts=n,
            n_pairs=args.pairs,
            seq_len=args.seq_len,
            layout=args.mqar_layout,
            keys=args.keys or targets.MQAR_KEYS,
            values=args.values or targets.MQAR_VALUES,
            seed=args.seed,
        )
    common.require(args.data is not None, "--target jsonl needs --data FILE")
    return targets.jsonl_target(args.data, tokenizer, task=args.task)


def run(args: argparse.Namespace) -> int:
    import shutil
    import time

    import numpy as np
    from tqdm.auto import tqdm

    from headhunt.errors import HeadhuntError
    from headhunt.probes import linear, states
    from headhunt.rundir import SCORES, RunDir, load_run

    common.require(args.batch_size >= 1 and args.shard_size >= 1, "sizes must be at least 1")
    if args.target == "jsonl":  # a bad file fails now, not after the model loads
        from headhunt.probes.targets import read_jsonl_rows

        common.require(args.data is not None, "--target jsonl needs --data FILE")
        read_jsonl_rows(args.data)
    common.seed_everything(args.seed)
    params = parameters(args)
    t0 = time.perf_counter()
    model = common.open_model(args)
    target = build_target(args, model.tokenizer)
    if not target.texts:
        raise HeadhuntError("the target produced no texts with a label to probe")
    for text in target.texts:  # positions outside a text fail here, before any run folder
        states.resolve_positions(text, model.max_context)
    labels, groups, types = target.arrays()
    config = linear.ProbeConfig(
        task=target.task,
        test_fraction=args.test_fraction,
        folds=args.folds,
        grid=args.grid,
        controls=[c for c in args.controls if c != "none"],
        seed=args.seed,
    )
    common.require(all(c > 0 for c in config.grid), "--grid values must be positive")
    # The prober checks labels, controls and the split now, before any run folder exists.
    prober = linear.Prober(labels, groups, types, config)
    cap = states.CaptureConfig(
        layers=args.layers,
        heads=args.heads,
        batch_size=args.batch_size,
        shard_size=args.shard_size,
        dtype=args.state_dtype,
    )
    layers = cap.check(model.n_layers)

    run_dir = RunDir.open(
        args.out, "probe", resume=args.resume, force=args.force, parameters=params
    )
    if run_dir.complete:
        _print(load_run(run_dir.out).scores().df, config.score_name)
        return 0
    target.frame().to_parquet(run_dir.path("rows.parquet"), index=False)
    t_load = time.perf_counter() - t0

    t1 = time.perf_counter()
    store = states.capture_states(model, target.texts, run_dir.path("states"), cap)
    rows = store.rows()
    if not np.array_equal(rows["item"], groups):
        raise HeadhuntError("captured rows do not match the target's rows; rerun with --force")
    t_capture = time.perf_counter() - t1

    t2 = time.perf_counter()
    units = [(L, linear.RESIDUAL) for L in layers]
    if args.heads:
        units += [(L, h) for L in layers for h in range(model.n_heads)]
    parts = run_dir.path("parts")
    parts.mkdir(exist_ok=True)
    done = {(r["layer"], r["head"]): r["metrics"] for r in run_dir.records()}
    results = []
    for layer, head in tqdm(units, desc="probe", unit="probe"):
        part = parts / _unit_name(layer, head)
        if (layer, head) in done and part.is_file():
            results.append(linear.ProbeResult(layer, head, done[(layer, head)], _load(part)))
            continue
        x = store.layer(layer) if head == linear.RESIDUAL else store.head(layer, head)
        res = prober.fit(x, layer, head)
        _save(res.weights, part)
        run_dir.append_record({"layer": layer, "head": head, "metrics": res.metrics})
        results.append(res)
    t_probe = time.perf_counter() - t2

    linear.to_scores(results, model.group_size).to_parquet(run_dir.path(SCORES))
    linear.save_weights(results, run_dir.path("probe_weights.safetensors"))
    title = f"{model.name}: {target.name} probe ({config.score_name}, {len(target.texts)} texts)"
    fig = linear.curve_figure(results, target.task, title)
    fig.write_html(run_dir.path("probe_curve.html"), include_plotlyjs=True)
    shutil.rmtree(parts)
    if args.drop_states:
        shutil.rmtree(run_dir.path("states"))
    extra = {
        "target": {
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
        },
        "capture": store.meta,
        "probe": prober.config.to_dict(),  # selectivity_vs resolved ("auto" -> the control)
    }
    out = run_dir.finalize(
        model=model.describe(),
        parameters=params,
        timings={"load": t_load, "capture": t_capture, "probe": t_probe},
        extra=extra,
    )
    _print(linear.to_scores(results, model.group_size).df, config.score_name)
    print(selectivity_note(results, prober.config, target))
    print(f"run directory: {out}")
    return 0


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


def _save(weights: dict, path) -> None:
    from safetensors.numpy import save_file

    tmp = path.with_name(path.name + ".tmp")
    save_file(weights, str(tmp))
    tmp.replace(path)


def _load(path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(path))


def _print(df, score: str) -> None:
    """The per-layer table of the residual-stream probes (and the best heads, if any)."""
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
    common.print_table(table, title=f"probe {score} per layer (held-out texts)")
    heads = df[(df["head"] >= 0) & (df["metric"] == score)]
    if len(heads):
        best = heads.sort_values("value", ascending=False).head(10)
        common.print_table(best[["layer", "head", "value"]], title=f"best heads by {score}")
