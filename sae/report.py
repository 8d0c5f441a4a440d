"""A `headhunt circuits` run: prompts -> activations -> ground truth, EAP, SAE trials -> run dir.

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

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headhunt.errors import HeadhuntError
from headhunt.heads.scores import HeadScores
from headhunt.probes.hooked import HookedModel
from headhunt.rundir import RunDir, load_run, write_json_atomic
from headhunt.sae import activations, patching, roc, scoring, tasks
from headhunt.sae.circuits import NODE_RULES, CircuitConfig, Trial, run_trials, summarize

METHOD_NAMES = {
    "sae_node": "SAE node |P\\N|",
    "sae_node_norm": "SAE node, normalised",
    "sae_pos_only": "SAE node, positive-only share",
    "sae_changed": "SAE node, changed in pair",
    "sae_edge": "SAE edge",
    "eap": "EAP |score|",
}


# scores.parquet metric -> the Trial attribute holding it
SCORES = {key: rule for rule, key in NODE_RULES.items()} | {"sae_edge": "edge"}


def verdict(
    summary: dict[str, dict[str, Any]], timings: dict[str, float], rule_key: str = "sae_node"
) -> dict[str, Any]:
    """SAE (the run's node rule) against EAP and patching, side by side, and which to trust.

    Patching is the reference the AUCs are measured against; of the two fast methods the one
    with the higher mean AUC is the one to trust for this model and task (the SAE method wins
    only if it is better by more than its trial-to-trial spread).
    """
    rows = {
        "patching": {"auc": 1.0, "seconds": timings.get("patching"), "role": "reference"},
        rule_key: {"auc": None, "seconds": timings.get("sae_method"), "role": "fast"},
        "eap": {"auc": None, "seconds": timings.get("eap"), "role": "fast"},
    }
    for k in (rule_key, "eap"):
        if k in summary:
            rows[k]["auc"] = summary[k]["mean"]
    sae, eap = rows[rule_key]["auc"], rows["eap"]["auc"]
    if sae is None:
        return {"methods": rows, "trust": "no ground truth: nothing says which method to trust"}
    if eap is None:
        trust = f"SAE node scores reach AUC {sae:.2f} against patching (EAP was not run)"
    elif sae > eap + summary[rule_key]["std"]:
        trust = f"SAE node scores: AUC {sae:.2f} against patching, EAP {eap:.2f}"
    else:
        trust = (
            f"EAP: AUC {eap:.2f} against patching, SAE node scores {sae:.2f}; use the SAE "
            "for its codes and edges, not to rank heads"
        )
    return {"methods": rows, "trust": trust}


def load_pairs(
    model: HookedModel, params: dict[str, Any], task_file: str | None
) -> tasks.EncodedPairs:
    """The run's prompt pairs: generated for the task, or read from the task file."""
    need = params["truth"] or params["eap"]
    if task_file:
        pairs = tasks.encode_pairs(
            model.tokenizer, tasks.read_task_file(task_file), require_aligned=need
        )
        if need and not pairs.has_answers:
            raise HeadhuntError(
                "the ground truth and EAP need 'answer' and 'wrong' on every line "
                "(or pass --no-truth --no-eap)"
            )
        if len(pairs) < 2:
            raise HeadhuntError("the task file needs at least 2 prompt pairs")
        return pairs
    return tasks.make_pairs(
        params["task"], model.tokenizer, params["pairs"], seed=params["seed"], require_aligned=True
    )


def _reuse_truth(src: str, model: HookedModel, run_dir: RunDir, params: dict[str, Any]) -> None:
    """Copy the ground truth and EAP of a finished run made on the same model and pairs."""
    import shutil

    done = load_run(src)
    if done.method != "circuits":
        raise HeadhuntError(f"{src} is a {done.method} run, not a circuits run")
    if done.manifest.get("model") != model.describe():
        raise HeadhuntError(f"{src} was made with another model")
    mine = run_dir.path("pairs.jsonl").read_text()
    if (done.path / "pairs.jsonl").read_text() != mine:
        raise HeadhuntError(f"{src} used other prompt pairs (task, --pairs and --seed must match)")
    for name, wanted in (("patching.json", params["truth"]), ("eap.safetensors", params["eap"])):
        if not wanted or run_dir.path(name).is_file():
            continue
        if not (done.path / name).is_file():
            raise HeadhuntError(f"{src} has no {name}")
        shutil.copy(done.path / name, run_dir.path(name))


def _patching(
    model: HookedModel, pairs, run: RunDir, batch_size: int, progress: bool
) -> dict[str, Any]:
    path = run.path("patching.json")
    if path.is_file():  # resumed: the slowest step is done once
        return json.loads(path.read_text())
    t0 = time.perf_counter()
    res = patching.activation_patching(model, pairs, batch_size=batch_size, progress=progress)
    out = {
        "effect": res.effect.tolist(),
        "normalised": res.normalised.tolist(),
        "clean_metric": res.clean_metric,
        "corrupt_metric": res.corrupt_metric,
        "shortcut": res.shortcut,
        "seconds": time.perf_counter() - t0,
    }
    write_json_atomic(path, out)
    return out


def _eap(
    model: HookedModel, pairs, run: RunDir, batch_size: int, progress: bool
) -> tuple[np.ndarray, float]:
    from safetensors.torch import load_file, save_file

    path = run.path("eap.safetensors")
    if path.is_file():
        got = load_file(str(path))
        return got["per_pair"].flatten(1).numpy(), float(got["seconds"])
    t0 = time.perf_counter()
    per_pair = patching.attribution_patching(
        model, pairs, batch_size=batch_size, per_pair=True, progress=progress
    )
    seconds = time.perf_counter() - t0
    tensors = {"per_pair": per_pair.contiguous(), "seconds": torch.tensor(seconds)}
    _write_atomic(path, lambda tmp: save_file(tensors, str(tmp)))
    return per_pair.flatten(1).numpy(), seconds


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)``, made durable, then renamed to ``path``: a crash never leaves half a file
    (an interrupted run's ``.*.tmp`` files are dropped when it resumes)."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save_sae(sae, run_dir: RunDir) -> None:
    """Trial 0's SAE, as ``DiscreteSAE.save`` writes it (``sae.safetensors`` + ``sae.json``),
    each file atomically."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in sae.state_dict().items()}
    _write_atomic(run_dir.path("sae.safetensors"), lambda tmp: save_file(tensors, str(tmp)))
    write_json_atomic(run_dir.path("sae.json"), sae.config.to_dict())


def run(
    model: HookedModel,
    run_dir: RunDir,
    params: dict[str, Any],
    config: CircuitConfig,
    *,
    task_file: str | None = None,
    truth_from: str | None = None,
    batch_size: int = 8,
    circuit_size: int | None = None,
    circuit_threshold: float | None = None,
    progress: bool = True,
    png: bool = True,
) -> Path:
    """Do the whole run into ``run_dir`` and finalize it; returns the finished directory."""
    L, H = model.n_layers, model.n_heads
    pairs = load_pairs(model, params, task_file)
    with open(run_dir.path("pairs.jsonl"), "w") as f:
        for p in pairs.pairs:
            f.write(json.dumps(p.to_dict()) + "\n")
    timings: dict[str, float] = {}
    if truth_from:
        _reuse_truth(truth_from, model, run_dir, params)

    t0 = time.perf_counter()
    acts = activations.head_outputs(
        model,
        pairs.positive + pairs.negative,
        position=config.position,
        batch_size=2 * batch_size,
        progress=progress,
    )
    timings["capture"] = time.perf_counter() - t0

    truth = effect = None
    patch: dict[str, Any] = {}
    if params["truth"]:
        patch = _patching(model, pairs, run_dir, batch_size, progress)
        timings["patching"] = patch["seconds"]
        effect = np.asarray(patch["effect"])
        truth = roc.binarize_truth(effect, share=config.truth_share, top=config.truth_top).ravel()
    eap_pairs = None
    if params["eap"]:
        eap_pairs, timings["eap"] = _eap(model, pairs, run_dir, batch_size, progress)

    def keep(trial: Trial) -> None:
        # The SAE first: once trial 0's record is saved, a resume never trains it again.
        if trial.index == 0 and trial.sae is not None:
            _save_sae(trial.sae, run_dir)
        run_dir.append_record(trial.record(), "trials.jsonl")

    done = [Trial.from_record(r) for r in run_dir.records("trials.jsonl")]
    trials = run_trials(
        acts,
        config,
        eap_pairs=eap_pairs,
        truth=truth,
        done=done,
        on_trial=keep,
        progress=progress,
    )
    timings["sae_train_per_trial"] = float(np.mean([t.seconds["sae_train"] for t in trials]))
    timings["sae_score_per_trial"] = float(np.mean([t.seconds["sae_score"] for t in trials]))
    timings["sae_method"] = (
        timings["capture"] + timings["sae_train_per_trial"] + timings["sae_score_per_trial"]
    )

    sae_scores = mean_scores(trials)
    rule_key = NODE_RULES[config.node_rule]
    tables = [
        HeadScores.from_matrix(k, v.reshape(L, H), n_kv_heads=model.n_kv_heads)
        for k, v in sae_scores.items()
    ]
    if eap_pairs is not None:
        eap_mean = eap_pairs.mean(0).reshape(L, H)
        tables.append(HeadScores.from_matrix("eap", eap_mean, n_kv_heads=model.n_kv_heads))
    if effect is not None:
        tables += [
            HeadScores.from_matrix("patching", effect, n_kv_heads=model.n_kv_heads),
            HeadScores.from_matrix(
                "patching_norm", np.asarray(patch["normalised"]), n_kv_heads=model.n_kv_heads
            ),
            HeadScores.from_matrix(
                "truth", truth.reshape(L, H).astype(float), n_kv_heads=model.n_kv_heads
            ),
        ]
    HeadScores.concat(tables).to_parquet(run_dir.path("scores.parquet"))
    _write_edges(run_dir, trials, L, H)

    ranking = sae_scores[rule_key].reshape(L, H)
    if circuit_threshold is not None:
        chosen = scoring.circuit(ranking, threshold=circuit_threshold)
        rule = f"{rule_key} > {circuit_threshold}"
    else:
        size = circuit_size or (int(truth.sum()) if truth is not None else 10)
        chosen = scoring.circuit(ranking, size=min(size, L * H))
        rule = f"top {size} heads by {rule_key}"
    truth_heads = [] if truth is None else [(i // H, i % H) for i in np.flatnonzero(truth)]
    circuit = {"rule": rule, "heads": chosen}
    write_json_atomic(run_dir.path("circuit.json"), circuit)
    summary = summarize(trials) if truth is not None else {}
    truth_rule = (
        f"top {config.truth_top} heads by |patching effect|"
        if config.truth_top is not None
        else f"fewest heads covering {config.truth_share:.0%} of total |patching effect|"
    )
    auc = {
        "methods": summary,
        "truth_rule": truth_rule,
        "truth_heads": truth_heads,
        "clean_metric": patch.get("clean_metric"),
        "corrupt_metric": patch.get("corrupt_metric"),
        "spearman_vs_abs_effect": _spearman(sae_scores, eap_pairs, effect),
        "node_rule": rule_key,
        "verdict": verdict(summary, timings, rule_key),
    }
    write_json_atomic(run_dir.path("auc.json"), auc)
    plot_notes = _plots(
        run_dir, sae_scores, rule_key, summary, eap_pairs, effect, truth, L, H, params, png
    )

    extra = {
        "n_pairs": len(pairs),
        "auc": {k: {"mean": v["mean"], "std": v["std"]} for k, v in summary.items()},
        "circuit": circuit,
        "truth_heads": truth_heads,
        "plots": plot_notes,
        "truth_from": str(Path(truth_from).resolve()) if truth_from else None,
        "trust": auc["verdict"]["trust"],
    }
    if "patching" in timings:
        extra["speedup_vs_patching"] = timings["patching"] / timings["sae_method"]
    return run_dir.finalize(model=model.describe(), parameters=params, timings=timings, extra=extra)


def mean_scores(trials: list[Trial]) -> dict[str, np.ndarray]:
    """Every SAE head score (``sae_node``, ..., ``sae_edge``), averaged over the trials."""
    return {key: np.mean([getattr(t, attr) for t in trials], 0) for key, attr in SCORES.items()}


def _spearman(sae_scores, eap_pairs, effect) -> dict[str, float]:
    """Rank correlation of each method's mean score with |patching effect| (no binarising)."""
    if effect is None:
        return {}
    from scipy.stats import spearmanr

    a = np.abs(effect).ravel()
    out = {k: spearmanr(v, a)[0] for k, v in sae_scores.items()}
    if eap_pairs is not None:
        out["eap"] = spearmanr(np.abs(eap_pairs.mean(0)), a)[0]
    return {k: float(v) if np.isfinite(v) else float("nan") for k, v in out.items()}


def _write_edges(run_dir: RunDir, trials: list[Trial], L: int, H: int) -> None:
    import pandas as pd

    rows = []
    for t in trials:
        for i, j, v in t.top_edges:
            rows.append(
                {
                    "trial": t.index,
                    "head_a": f"{i // H}.{i % H}",
                    "head_b": f"{j // H}.{j % H}",
                    "edge": v,
                }
            )
    pd.DataFrame(rows, columns=["trial", "head_a", "head_b", "edge"]).to_parquet(
        run_dir.path("edges.parquet"), index=False
    )


def _plots(
    run_dir, sae_scores, rule_key, summary, eap_pairs, effect, truth, L, H, params, png
) -> list[str]:
    """ROC curves (of each method's trial-mean score) and head heatmaps; returns notes on
    anything that could not be written."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

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
        note = roc.write_figure(
            fig, run_dir.path("roc.html"), run_dir.path("roc.png") if png else None
        )
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
    note = roc.write_figure(
        fig, run_dir.path("heads.html"), run_dir.path("heads.png") if png else None
    )
    if note:
        notes.append(note)
    return notes


def print_summary(path: Path, print_table: Callable, top: int = 15) -> None:
    """Print a finished run's AUC table and its best heads."""
    import pandas as pd

    done = load_run(path)
    m = done.manifest
    auc = done.json("auc.json")
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
    df = done.scores().df.pivot_table(index=["layer", "head"], columns="metric", values="value")
    rule_key = auc.get("node_rule", "sae_node")
    df = df.sort_values([rule_key, "sae_node"], ascending=False).head(top).reset_index()
    # The run's rule, the paper's, and what they are checked against (all in scores.parquet).
    cols = dict.fromkeys(["layer", "head", rule_key, "sae_node", "eap", "patching", "truth"])
    print_table(
        df[[c for c in cols if c in df.columns]],
        title=f"heads by SAE node score ({METHOD_NAMES[rule_key]})",
    )
    t = m["timings"]
    line = ", ".join(f"{k} {v:.1f}s" for k, v in t.items())
    print(f"timings: {line}")
    v = auc.get("verdict")
    if v:
        side = [
            {"method": k, "ROC AUC vs patching": r["auc"], "seconds": r["seconds"]}
            for k, r in v["methods"].items()
        ]
        print_table(pd.DataFrame(side), title="SAE vs EAP vs patching (SAE: capture + 1 trial)")
        print(f"trust: {v['trust']}")
    print(f"run directory: {done.path}")
