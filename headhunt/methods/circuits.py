"""Circuit heads from discrete SAE codes (O'Neill & Bui 2024), checked against activation
patching, as a method: the patching ground truth and EAP are compute-once steps (rank 0 computes
them, every rank reads them), the SAE trials are the units dealt over ranks.

Files written (besides ``manifest.json``):

- ``scores.parquet``: per head, ``sae_node`` (mean |P \\ N| over trials), ``sae_node_norm``,
  ``sae_pos_only``, ``sae_changed`` (the node rules of ``headhunt.sae.scoring.NodeScores``),
  ``sae_edge`` (edge-derived head score), ``eap`` (signed, mean over all pairs),
  ``patching`` (effect in logits), ``patching_norm`` (share of the clean - corrupted gap) and
  ``truth`` (1 for ground-truth circuit heads).
- ``auc.json``: per method, ROC AUC mean / std / per trial; the ground-truth rule and heads;
  ``verdict``: SAE vs EAP vs patching side by side (AUC, seconds) and which to trust.
- ``circuit.json``: the chosen circuit (by the run's node rule, ``CircuitConfig.node_rule``).
- ``trials.jsonl``: one record per trial (scores, AUCs, seconds, SAE training draw).
- ``edges.parquet``: each trial's 100 best head pairs by edge score.
- ``patching.json``, ``eap.safetensors``: ground truth and per-pair EAP (kept for resuming).
- ``sae.safetensors`` + ``sae.json``: trial 0's SAE. ``pairs.jsonl``: the prompt pairs.
- ``roc.html`` / ``roc.png`` and ``heads.html`` / ``heads.png``: plots.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from headhunt.errors import HeadhuntError
from headhunt.methods.base import (
    CIRCUIT,
    Method,
    print_table,
    read_jsonl,
    require,
    spread_frame,
)
from headhunt.sae.configs import CircuitsConfig

TRIALS = "trials.jsonl"


def numbers(c: CircuitsConfig) -> dict[str, Any]:
    """What decides the numbers of a run (a resumed run must match them); the circuit rule,
    batch size, plots and --truth-from do not."""
    return {
        "task": None if c.task_file else c.task,
        "task_file": str(Path(c.task_file).expanduser().resolve()) if c.task_file else None,
        "pairs": c.pairs,
        "trials": c.trials,
        "sae_examples": c.sae_examples,
        "subsample": c.subsample,
        "position": c.position,
        "head_norm": c.head_norm,
        "dict_size": c.dict_size,
        "l1": c.l1,
        "lr": c.lr,
        "epochs": c.epochs,
        "edge_top_fraction": c.edge_top_fraction,
        "truth": c.truth,
        "eap": c.eap,
        "truth_share": None if c.truth_top is not None else c.truth_share,
        "truth_top": c.truth_top,
        "seed": c.seed,
    }


class Circuits(Method):
    name = "circuits"
    Config = CircuitsConfig
    metric = "sae_changed"  # the default node rule (older runs open on their first view)
    help = "circuit heads from discrete SAE codes"
    description = """\
Find the heads of a task's circuit with discrete sparse autoencoders (O'Neill & Bui 2024): one
SAE over every head's output turns each head's output on a prompt into an integer code; a head
scores by the codes it takes on positive prompts and never on negative ones (node score), or by
the code pairs it forms with other heads (edge score).

Unless --no-truth, the same prompt pairs give the ground truth for this model: per-head
activation patching (clean into corrupted, effect on the logit difference), binarised by
--truth-share or --truth-top. Each method's ROC AUC against it is reported over --trials seeds,
with attribution patching (EAP) as the fast baseline, and every method's runtime.

Tasks: ioi, greater-than, docstring (generated for the model's tokenizer), or --task-file: JSON
lines {"positive": ..., "negative": ..., "answer": " Mary", "wrong": " John"} ("answer" and
"wrong" may be lists; both are needed for the ground truth and EAP, not for the SAE scores).
SAE defaults were chosen on SmolLM2-135M (docs/circuits.md); the paper's: --sae-examples 10
--position mean --head-norm none --dict-size 200. --pairs, --trials and --dict-size default to
the device's size: the full setting on a GPU, a smaller one on a CPU (minutes instead of most of
an hour, the same held-out AUC; docs/circuits.md); the run's parameters record the values."""
    units = "trials"
    panels = frozenset({CIRCUIT})

    def prepare(self, config: CircuitsConfig) -> None:
        super().prepare(config)
        if config.truth_from:  # a missing or unfinished run fails now, not after the model loads
            from headhunt.rundir import load_run

            done = load_run(config.truth_from)
            require(
                done.method == "circuits",
                f"--truth-from {config.truth_from} is a {done.method} run, not a circuits run",
            )
        if (
            config.task_file
        ):  # a missing, binary or malformed task file fails before the model loads
            from headhunt.sae.prompt_pairs import read_task_file

            path = Path(config.task_file).expanduser()
            require(path.is_file(), f"no task file at {path}")
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise HeadhuntError(f"--task-file {path} is not UTF-8 text (JSON lines)") from None
            except OSError as e:
                raise HeadhuntError(f"cannot read --task-file {path}: {e.strerror or e}") from None
            read_task_file(path)

    def for_device(self, config: CircuitsConfig, device: str) -> CircuitsConfig:
        return config.for_device(device)

    def parameters(self, config: CircuitsConfig, model: str) -> dict[str, Any]:
        return {"model": model, **numbers(config)}

    def run_parameters(self, config: CircuitsConfig, model: str, spec) -> dict[str, Any]:
        # The dtype decides the numbers too: a resume with another --dtype is refused (None:
        # a model in memory, already in its dtype).
        return {"model": model, "dtype": spec.dtype if spec else None, **numbers(config)}

    def run(self, model, config: CircuitsConfig, ctx):
        import numpy as np

        from headhunt.sae import activations, report
        from headhunt.sae.circuits import NODE_RULES, summarize
        from headhunt.sae.configs import DEVICE_DEFAULTS
        from headhunt.scores import HeadScores

        L, H = model.n_layers, model.n_heads
        params = numbers(config)
        cpu, gpu = DEVICE_DEFAULTS["cpu"], DEVICE_DEFAULTS["cuda"]
        if model.device.type == "cpu" and all(params[k] == v for k, v in cpu.items()):
            ctx.say(
                "circuits: the CPU's defaults, "
                + ", ".join(f"{k} {v}" for k, v in cpu.items())
                + " (on a GPU: "
                + ", ".join(f"{k} {v}" for k, v in gpu.items())
                + ")"
            )
        progress = config.progress and ctx.show_progress
        pairs = _pairs(model, config, params, ctx)
        timings = ctx.timings
        t0 = time.perf_counter()
        acts = activations.head_outputs(
            model,
            pairs.positive + pairs.negative,
            position=config.position,
            batch_size=2 * config.batch_size,
            progress=progress,
        )
        timings["capture"] = time.perf_counter() - t0
        patch, truth, eap_pairs = _references(model, pairs, config, ctx, progress)
        effect = np.asarray(patch["effect"]) if patch else None
        trials = _sae_trials(acts, config, eap_pairs, truth, ctx, progress)
        if trials is None:
            return None
        timings["sae_train_per_trial"] = float(np.mean([t.seconds["sae_train"] for t in trials]))
        timings["sae_score_per_trial"] = float(np.mean([t.seconds["sae_score"] for t in trials]))
        timings["sae_method"] = (
            timings["capture"] + timings["sae_train_per_trial"] + timings["sae_score_per_trial"]
        )

        sae_scores = report.mean_scores(trials)
        rule_key = NODE_RULES[config.node_rule]
        tables = _tables(model, sae_scores, eap_pairs, patch, truth)
        _write_edges(ctx, trials, L, H)
        circuit = _circuit(config, sae_scores[rule_key].reshape(L, H), rule_key, truth)
        if "tie" in circuit:
            ctx.say(f"circuits: {circuit['tie']}")
        ctx.write("circuit.json", circuit)
        summary = summarize(trials) if truth is not None else {}
        truth_heads = [] if truth is None else [(i // H, i % H) for i in np.flatnonzero(truth)]
        auc = {
            "methods": summary,
            "truth_rule": _truth_rule(config),
            "truth_heads": truth_heads,
            "clean_metric": patch.get("clean_metric"),
            "corrupt_metric": patch.get("corrupt_metric"),
            "spearman_vs_abs_effect": report.spearman(sae_scores, eap_pairs, effect),
            "node_rule": rule_key,
            "verdict": report.verdict(summary, timings, rule_key),
        }
        ctx.write("auc.json", auc)
        plot_notes = _plots(
            ctx, sae_scores, rule_key, summary, eap_pairs, effect, truth, L, H, params, config.png
        )
        truth_from = str(Path(config.truth_from).resolve()) if config.truth_from else None
        ctx.extra.update(
            n_pairs=len(pairs),
            auc={k: {"mean": v["mean"], "std": v["std"]} for k, v in summary.items()},
            circuit=circuit,
            truth_heads=truth_heads,
            plots=plot_notes,
            truth_from=truth_from,
            trust=auc["verdict"]["trust"],
        )
        if "patching" in timings:
            ctx.extra["speedup_vs_patching"] = timings["patching"] / timings["sae_method"]
        return HeadScores.concat(tables)

    def show(self, run, top: int) -> None:
        """The AUC table, the best heads, the timings and the verdict."""
        import pandas as pd

        from headhunt.sae.report import METHOD_NAMES

        m = run.manifest
        auc = run.json("auc.json")
        if auc["methods"]:
            rows = [
                {
                    "method": METHOD_NAMES.get(k, k),
                    "ROC AUC mean": v["mean"],
                    "std": v["std"],
                    "spearman": auc["spearman_vs_abs_effect"].get(k, float("nan")),
                }
                for k, v in auc["methods"].items()
            ]
            print_table(
                pd.DataFrame(rows),
                title=f"vs patching ground truth: {auc['truth_rule']}, "
                f"{len(auc['truth_heads'])} heads; {m['parameters']['trials']} trials",
            )
        df = run.scores().df.pivot_table(index=["layer", "head"], columns="metric", values="value")
        rule_key = auc.get("node_rule", "sae_node")
        df = df.sort_values([rule_key, "sae_node"], ascending=False).head(top).reset_index()
        # The run's rule, the paper's, and what they are checked against (all in scores.parquet).
        cols = dict.fromkeys(["layer", "head", rule_key, "sae_node", "eap", "patching", "truth"])
        print_table(
            df[[c for c in cols if c in df.columns]],
            title=f"heads by SAE node score ({METHOD_NAMES[rule_key]})",
        )
        line = ", ".join(f"{k} {v:.1f}s" for k, v in m["timings"].items())
        print(f"timings: {line}")
        v = auc.get("verdict")
        if v:
            side = [
                {"method": k, "ROC AUC vs patching": r["auc"], "seconds": r["seconds"]}
                for k, r in v["methods"].items()
            ]
            print_table(pd.DataFrame(side), title="SAE vs EAP vs patching (SAE: capture + 1 trial)")
            print(f"trust: {v['trust']}")

    def spread(self, run, layer: int, head: int):
        """Per SAE trial: the head's node scores and its edge score (a trial record holds
        every head's, layer-major)."""
        n_heads = int(run.manifest.get("model", {}).get("n_heads", 0))
        return spread_frame(
            {
                "unit": f"trial {r['index']}",
                "metric": metric,
                "value": float(r[key][layer * n_heads + head]),
            }
            for r in read_jsonl(run.path / TRIALS)
            for metric, key in (
                ("sae_node", "node"),
                ("sae_node_norm", "node_norm"),
                ("sae_edge", "edge"),
            )
            if key in r and n_heads
        )


def _pairs(model, config: CircuitsConfig, params: dict[str, Any], ctx):
    """The task's prompt pairs, checked against the context and kept in ``pairs.jsonl`` (with
    the ground truth of --truth-from copied in)."""
    from headhunt.sae import report

    pairs = report.load_pairs(model, params, config.task_file)
    # A prompt longer than the context would fail only after minutes of capture and patching.
    longest = max(len(ids) for ids in [*pairs.positive, *pairs.negative])
    require(
        longest <= model.max_context,
        f"a prompt has {longest} tokens, more than the model's context ({model.max_context})",
    )
    if ctx.is_main:
        ctx.write("pairs.jsonl", [p.to_dict() for p in pairs.pairs])
        if config.truth_from:
            _reuse_truth(config.truth_from, model, ctx, params)
    return pairs


def _references(model, pairs, config: CircuitsConfig, ctx, progress: bool):
    """What the SAE scores are checked against, each computed once per run: the patching
    ground truth (its record and the binarised truth per head) and per-pair EAP."""
    import numpy as np

    from headhunt.sae import roc

    patch: dict[str, Any] = {}
    truth = eap_pairs = None
    if config.truth:
        patch = _patching(model, pairs, ctx, config.batch_size, progress)
        ctx.timings["patching"] = patch["seconds"]
        truth = roc.binarize_truth(np.asarray(patch["effect"]), **config.truth_rule()).ravel()
    if config.eap:
        eap_pairs, ctx.timings["eap"] = _eap(model, pairs, ctx, config.batch_size, progress)
    return patch, truth, eap_pairs


def _sae_trials(acts, config, eap_pairs, truth, ctx, progress: bool):
    """The SAE trials, dealt over the ranks, each saved as it finishes (trial 0's SAE first,
    so a resume that skips trial 0 finds its SAE); rank 0 gets them all, the others None."""
    from headhunt.sae.circuits import SAETrial, run_trial

    plan = list(range(config.trials))
    done = ctx.done(TRIALS, key=lambda r: r["index"])
    share = ctx.todo(plan)
    todo = [t for t in share if t not in done]
    units = ctx.units(todo, "SAE trial", done_before=len(share) - len(todo), bar=progress)
    for t in units:
        trial = run_trial(t, acts, config, eap_pairs=eap_pairs, truth=truth)
        if t == 0 and trial.sae is not None:
            _save_sae(trial.sae, ctx)
        ctx.append(TRIALS, trial.record())
    ctx.wait()
    records = ctx.collect(TRIALS, plan, key=lambda r: r["index"])
    return None if records is None else [SAETrial.from_record(r) for r in records]


def _tables(model, sae_scores, eap_pairs, patch, truth) -> list:
    """Every per-head score of the run: the SAE's, EAP's and the patching ground truth's."""
    import numpy as np

    from headhunt.scores import HeadScores

    def table(metric: str, values) -> HeadScores:
        shape = (model.n_layers, model.n_heads)
        return HeadScores.from_matrix(
            metric, np.asarray(values).reshape(shape), n_kv_heads=model.n_kv_heads
        )

    tables = [table(k, v) for k, v in sae_scores.items()]
    if eap_pairs is not None:
        tables.append(table("eap", eap_pairs.mean(0)))
    if patch:
        tables += [
            table("patching", patch["effect"]),
            table("patching_norm", patch["normalised"]),
            table("truth", truth.astype(float)),
        ]
    return tables


def _circuit(config: CircuitsConfig, ranking, rule_key: str, truth) -> dict[str, Any]:
    """The heads called the circuit: above --circuit-threshold, else the top --circuit-size
    (default: as many as the ground truth has, else 10)."""
    import numpy as np

    from headhunt.heads.interventions.pruning import tied_cut
    from headhunt.sae import scoring

    if config.circuit_threshold is not None:
        chosen = scoring.circuit(ranking, threshold=config.circuit_threshold)
        return {"rule": f"{rule_key} > {config.circuit_threshold}", "heads": chosen}
    size = config.circuit_size or (int(truth.sum()) if truth is not None else 10)
    chosen = scoring.circuit(ranking, size=min(size, ranking.size))
    out: dict[str, Any] = {"rule": f"top {size} heads by {rule_key}", "heads": chosen}
    cut = tied_cut(np.sort(np.asarray(ranking, float).ravel())[::-1], len(chosen))
    if cut is not None:  # the last heads are one pick among equals: say which rule picked them
        out["tie"] = (
            f"the last {cut.chosen} of the {len(chosen)} circuit heads are picked among "
            f"{cut.block} heads of equal {rule_key} {cut.value:.3g} (earlier layer, head first)"
        )
    return out


def _truth_rule(sae_config) -> str:
    if sae_config.truth_top is not None:
        return f"top {sae_config.truth_top} heads by |patching effect|"
    return f"fewest heads covering {sae_config.truth_share:.0%} of total |patching effect|"


def _reuse_truth(src: str, model, ctx, params: dict[str, Any]) -> None:
    """Copy the ground truth and EAP of a finished run made on the same model and pairs."""
    import shutil

    from headhunt.rundir import load_run

    done = load_run(src)
    if done.method != "circuits":
        raise HeadhuntError(f"{src} is a {done.method} run, not a circuits run")
    if done.manifest.get("model") != model.describe():
        raise HeadhuntError(f"{src} was made with another model")
    if (done.path / "pairs.jsonl").read_text() != ctx.path("pairs.jsonl").read_text():
        raise HeadhuntError(f"{src} used other prompt pairs (task, --pairs and --seed must match)")
    for name, wanted in (("patching.json", params["truth"]), ("eap.safetensors", params["eap"])):
        if not wanted or ctx.path(name).is_file():
            continue
        if not (done.path / name).is_file():
            raise HeadhuntError(f"{src} has no {name}")
        ctx.write(name, lambda tmp, n=name: shutil.copy(done.path / n, tmp))


def _patching(model, pairs, ctx, batch_size: int, progress: bool) -> dict[str, Any]:
    """Per-head activation patching, once per run (kept in ``patching.json``)."""
    from headhunt.sae import patching

    def compute() -> dict[str, Any]:
        t0 = time.perf_counter()
        res = patching.activation_patching(model, pairs, batch_size=batch_size, progress=progress)
        return {
            "effect": res.effect.tolist(),
            "normalised": res.normalised.tolist(),
            "clean_metric": res.clean_metric,
            "corrupt_metric": res.corrupt_metric,
            "shortcut": res.shortcut,
            "seconds": time.perf_counter() - t0,
        }

    return ctx.step("patching.json", compute)


def _eap(model, pairs, ctx, batch_size: int, progress: bool):
    """Per-pair attribution patching, once per run (kept in ``eap.safetensors``)."""
    import torch

    from headhunt.sae import patching

    def compute() -> dict[str, torch.Tensor]:
        t0 = time.perf_counter()
        per_pair = patching.attribution_patching(
            model, pairs, batch_size=batch_size, per_pair=True, progress=progress
        )
        seconds = time.perf_counter() - t0
        return {"per_pair": per_pair.contiguous(), "seconds": torch.tensor(seconds)}

    got = ctx.step("eap.safetensors", compute)
    return got["per_pair"].flatten(1).numpy(), float(got["seconds"])


def _save_sae(sae, ctx) -> None:
    """Trial 0's SAE, as ``DiscreteSAE.save`` writes it (``sae.safetensors`` + ``sae.json``),
    each file atomically."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in sae.state_dict().items()}
    ctx.write("sae.safetensors", tensors)
    ctx.write("sae.json", sae.config.to_dict())


def _write_edges(ctx, trials, L: int, H: int) -> None:
    import pandas as pd

    rows = [
        {"trial": t.index, "head_a": f"{i // H}.{i % H}", "head_b": f"{j // H}.{j % H}", "edge": v}
        for t in trials
        for i, j, v in t.top_edges
    ]
    ctx.write("edges.parquet", pd.DataFrame(rows, columns=["trial", "head_a", "head_b", "edge"]))


def _plots(
    ctx, sae_scores, rule_key, summary, eap_pairs, effect, truth, L, H, params, png
) -> list[str]:
    """ROC curves (of each method's trial-mean score) and head heatmaps; returns notes on
    anything that could not be written."""
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from headhunt.sae import roc
    from headhunt.sae.report import METHOD_NAMES

    notes = []
    task = params.get("task") or Path(params.get("task_file") or "task").stem
    if truth is not None:
        scores = dict(sae_scores)
        if eap_pairs is not None:
            scores["eap"] = np.abs(eap_pairs.mean(0))
        curves = {}
        for k, s in scores.items():
            c = roc.roc_curve(s, truth)
            s_ = summary.get(k)
            label = METHOD_NAMES[k]
            if s_:
                label += f": trials {s_['mean']:.3f} ± {s_['std']:.3f}; mean score"
            curves[label] = c
        fig = roc.roc_figure(
            curves, f"{task}: heads vs patching ground truth ({int(truth.sum())} heads)"
        )
        note = _write_figure(ctx, fig, "roc", png)
        if note:
            notes.append(note)
    panels = [(f"{METHOD_NAMES[rule_key]} (trial mean)", sae_scores[rule_key])]
    if effect is not None:
        panels.append(("patching effect (logits)", np.asarray(effect).ravel()))
    if eap_pairs is not None:
        panels.append(("EAP (logits)", eap_pairs.mean(0)))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels])
    for c, (_, v) in enumerate(panels, 1):
        fig.add_trace(
            go.Heatmap(
                z=np.asarray(v).reshape(L, H),
                colorscale="RdBu" if c > 1 else "Viridis",
                zmid=0 if c > 1 else None,
                showscale=False,
            ),
            row=1,
            col=c,
        )
        fig.update_xaxes(title_text="head", row=1, col=c)
        fig.update_yaxes(title_text="layer", row=1, col=c)
    fig.update_layout(title=f"{task}: per-head scores", width=360 * len(panels), height=640)
    note = _write_figure(ctx, fig, "heads", png)
    if note:
        notes.append(note)
    return notes


def _write_figure(ctx, fig, stem: str, png: bool) -> str | None:
    """``stem.html``, and ``stem.png`` when asked and kaleido works here; returns why the PNG
    was not written, or None."""
    ctx.write(f"{stem}.html", fig)
    if not png:
        return None
    try:
        ctx.write(f"{stem}.png", fig)
    except Exception as e:  # kaleido needs a Chrome it can start; the HTML is enough without
        return f"PNG not written ({type(e).__name__}: {e})"
    return None
