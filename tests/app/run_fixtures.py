"""Run directories for the dashboard tests: synthetic but valid runs written through
HeadScores + RunDir in the layouts the CLI writes, plus broken ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from headhunt.rundir import RunDir
from headhunt.scores import HeadScores

L, H, KV = 2, 4, 2  # the tiny test model's shape, so on-demand views can run on it
PLANTED = (1, 2)  # the head every synthetic run makes best


def _model(spec: str) -> dict:
    return {
        "spec": spec,
        "class": "LlamaForCausalLM",
        "n_layers": L,
        "n_heads": H,
        "n_kv_heads": KV,
        "head_dim": 16,
        "d_model": 64,
        "max_context": 1024,
        "dtype": "float32",
        "device": "cpu",
    }


def _planted(value: float, rest: float = 0.05, seed: int = 0) -> np.ndarray:
    m = np.random.default_rng(seed).uniform(0, rest, (L, H))
    m[PLANTED] = value
    return m


def _trial_span(spec: str, tid: str, depth: float) -> list[int]:
    """Where the retrieval analyzer would put the answer of trial ``tid`` with the model's
    tokenizer (seed 0, bundled haystack): the Head view rebuilds trials and checks this. A
    spec that is no model folder gets a made-up span."""
    import random

    if not Path(spec).is_dir():
        return [40, 46]

    from transformers import AutoTokenizer

    from headhunt.heads.inputs.needles import NEEDLES, TrialBuilder, read_haystack

    tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    builder = TrialBuilder(tok, read_haystack(None))
    trial = builder.build(120, depth / 100, NEEDLES["passkey"], random.Random(f"0/{tid}"), tid)
    return list(trial.span)


def retrieval_run(out: Path, spec: str) -> Path:
    run = RunDir.open(out, "retrieval", parameters={"lengths": [120], "depths": [0, 50]})
    records = []
    for i, depth in enumerate([0.0, 50.0, 100.0]):
        tid = f"L120-D{depth:g}-passkey-0"
        scores = _planted(0.8 - 0.1 * i, seed=i)
        on = _planted(0.9, seed=10 + i)
        rec = {
            "id": tid,
            "length": 120,
            "depth": depth / 100,  # a fraction, as the retrieval analyzer stores it
            "needle": "passkey",
            "answer": "482913",
            "response": "482913" if i < 2 else "4829",
            "recall": 1.0 if i < 2 else 0.0,
            "counted": i < 2,
            "span": _trial_span(spec, tid, depth),
            "scores": scores.round(6).tolist(),
            "on_needle": on.round(4).tolist(),
        }
        run.append_record(rec, "trials.jsonl")
        records.append(rec)
    counted = [r for r in records if r["counted"]]
    mean = np.mean([r["scores"] for r in counted], 0)
    HeadScores.concat(
        [
            HeadScores.from_matrix("retrieval_score", mean, n_kv_heads=KV),
            HeadScores.from_matrix(
                "retrieval_score_std", np.std([r["scores"] for r in counted], 0), n_kv_heads=KV
            ),
            HeadScores.from_matrix(
                "needle_attention", np.mean([r["on_needle"] for r in counted], 0), n_kv_heads=KV
            ),
        ]
    ).to_parquet(run.path("scores.parquet"))
    ref = {f"{la}-{h}": [r["scores"][la][h] for r in counted] for la in range(L) for h in range(H)}
    run.path("retrieval_heads.json").write_text(json.dumps(ref))
    return run.finalize(
        model=_model(spec),
        parameters={"lengths": [120], "depths": [0, 50]},
        timings={"trials_s": 1.0},
        extra={"summary": {"trials": 3, "counted_trials": 2, "retrieval_heads": 1, "heads": 8}},
    )


def sinks_run(out: Path, spec: str) -> Path:
    run = RunDir.open(out, "sinks", parameters={"tau": 0.1})
    for t in range(3):
        run.append_record(
            {
                "text": t,
                "token_ids": [1, 5, 6, 7],
                "s0": _planted(0.9, 0.5, seed=t).tolist(),
                "s0_prefix": _planted(0.9, 0.5, seed=t).tolist(),
                "hidden_count": np.zeros((L, H), int).tolist(),
                "hidden_mass": _planted(0.3, seed=20 + t).tolist(),
                "sinks": [[1, 2, 3, 0.3]],
                "massive": [[10.0, 9.0, 8.0, 1.0, 0.0, 3.0]] * L,
            },
            "texts.jsonl",
        )
    per_layer = pd.DataFrame(
        {
            "layer": [0, 1, 0, 1],
            "head": pd.array([pd.NA] * 4, dtype="Int64"),
            "kv_head": pd.array([pd.NA] * 4, dtype="Int64"),
            "metric": ["sink_eps", "sink_eps", "massive_ratio", "massive_ratio"],
            "value": [0.5, 0.75, 12.0, 40.0],
        }
    )
    scores = HeadScores.concat(
        [
            HeadScores.from_matrix("first_sink_mass", _planted(0.9, 0.5), n_kv_heads=KV),
            HeadScores.from_matrix("hidden_sink_mass", _planted(0.3), n_kv_heads=KV),
            HeadScores(per_layer),
        ]
    )
    scores.df["head"] = scores.df["head"].astype("Int64")
    scores.df["kv_head"] = scores.df["kv_head"].astype("Int64")
    scores.to_parquet(run.path("scores.parquet"))
    return run.finalize(model=_model(spec), parameters={"tau": 0.1}, timings={"texts_s": 1.0})


def ngram_run(out: Path, spec: str) -> Path:
    run = RunDir.open(out, "ngram", parameters={"k_max": 2})
    tables = []
    for source in ("random", "natural"):
        shift = 0.1 if source == "natural" else 0.0  # the input kinds score differently
        records = [
            {
                "n": 20,
                "tl_prev": (_planted(0.2, seed=i) + shift).tolist(),
                "tl_dup": (_planted(0.1, seed=i) + shift).tolist(),
                "tl_ind": (_planted(0.7, seed=i) + shift).tolist(),
            }
            for i in range(2)
        ]
        for r in records:
            run.append_record(r, f"records-{source}.jsonl")
        # As the analyzer scores them: per input kind, the mean over that kind's sequences.
        for metric, key in (("induction", "tl_ind"), ("prev_token", "tl_prev")):
            mean = np.mean([r[key] for r in records], 0)
            tables.append(HeadScores.from_matrix(metric, mean, n_kv_heads=KV, source=source))
        for k in (1, 2):
            tables += [
                HeadScores.from_matrix(
                    "kgram_contrast", _planted(0.9 / k), n_kv_heads=KV, source=source, order=k
                ),
                # A run-level count (the same for every head) and a view no head has a value
                # in (too few queries with both kinds of keys), as real n-gram runs hold.
                HeadScores.from_matrix(
                    "kgram_queries", np.full((L, H), 40.0), n_kv_heads=KV, source=source, order=k
                ),
                HeadScores.from_matrix(
                    "kgram_only_mass",
                    np.full((L, H), np.nan),
                    n_kv_heads=KV,
                    source=source,
                    order=k,
                ),
            ]
    HeadScores.concat(tables).to_parquet(run.path("scores.parquet"))
    return run.finalize(model=_model(spec), parameters={"k_max": 2}, timings={"random_s": 1.0})


def circuits_run(out: Path, spec: str) -> Path:
    run = RunDir.open(out, "circuits", parameters={"task": "ioi", "pairs": 8, "trials": 2})
    truth = np.zeros((L, H))
    truth[PLANTED] = 1
    truth[0, 1] = 1
    node = _planted(0.9, 0.3)
    effect = truth * 2.0 + np.random.default_rng(3).normal(0, 0.1, (L, H))
    HeadScores.concat(
        [
            HeadScores.from_matrix("sae_node", node, n_kv_heads=KV),
            HeadScores.from_matrix("sae_node_norm", node / 2, n_kv_heads=KV),
            HeadScores.from_matrix("sae_edge", node * 0.5, n_kv_heads=KV),
            HeadScores.from_matrix("eap", effect * 0.8, n_kv_heads=KV),
            HeadScores.from_matrix("patching", effect, n_kv_heads=KV),
            HeadScores.from_matrix("truth", truth, n_kv_heads=KV),
        ]
    ).to_parquet(run.path("scores.parquet"))
    for t in range(2):
        run.append_record(
            {
                "index": t,
                "node": (node.ravel() + 0.01 * t).tolist(),
                "node_norm": (node.ravel() / 2).tolist(),
                "edge": (node.ravel() * 0.5).tolist(),
                "auc": {"sae_node": 0.9, "eap": 0.95},
            },
            "trials.jsonl",
        )
    auc = {
        "methods": {
            "sae_node": {"mean": 0.9, "std": 0.01, "trials": [0.89, 0.91]},
            "eap": {"mean": 0.95, "std": 0.0, "trials": [0.95, 0.95]},
        },
        "truth_rule": "fewest heads covering 50% of total |patching effect|",
        "truth_heads": [[0, 1], list(PLANTED)],
        "spearman_vs_abs_effect": {"sae_node": 0.5, "eap": 0.8},
    }
    run.path("auc.json").write_text(json.dumps(auc))
    run.path("circuit.json").write_text(json.dumps({"rule": "top 2", "heads": [[1, 2], [0, 1]]}))
    # As sae/report.py writes them ("layer.head"); three pairs tie at 0.5.
    pd.DataFrame(
        {
            "trial": [0, 1, 0, 0, 0],
            "head_a": ["1.2", "1.2", "0.0", "0.0", "0.2"],
            "head_b": ["0.1", "0.1", "1.0", "1.1", "1.3"],
            "edge": [0.7, 0.8, 0.5, 0.5, 0.5],
        }
    ).to_parquet(run.path("edges.parquet"), index=False)
    return run.finalize(
        model=_model(spec),
        parameters={"task": "ioi", "pairs": 8, "trials": 2},
        timings={"capture": 1.0},
    )


def broken_runs(root: Path) -> dict[str, Path]:
    """A corrupt manifest, a run whose scores.parquet is garbage, and an unfinished run."""
    corrupt = root / "corrupt-manifest"
    corrupt.mkdir()
    (corrupt / "manifest.json").write_text('{"method": "retrieval", ')
    bad_scores = root / "bad-scores"
    retrieval_run(bad_scores, "unused")
    (bad_scores / "scores.parquet").write_bytes(b"not a parquet file")
    partial = root / "half-done.partial"
    partial.mkdir()
    (partial / "parameters.json").write_text("{}")
    (partial / "trials.jsonl").write_text('{"id": "x"}\n')
    return {"corrupt": corrupt, "bad_scores": bad_scores, "partial": partial}


def make_runs(root: Path, spec: str) -> Path:
    """Four valid runs of model ``spec`` (the tiny model's shape) and three broken folders."""
    retrieval_run(root / "retrieval-tiny", spec)
    sinks_run(root / "sinks-tiny", spec)
    ngram_run(root / "ngram-tiny", spec)
    circuits_run(root / "circuits-tiny", spec)
    broken_runs(root)
    return root
