"""`headhunt mqar` end to end: a pretrained-style folder (rendered words), the trained tiny MQAR
model (abstract ids, where masking its recall heads must collapse recall), and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from headhunt.cli import main

FIXTURE = Path(__file__).parents[1] / "fixtures" / "mqar"
SMALL = ["--pairs", "2,4", "--tokens-per-pair", "8", "--gaps", "0,6", "--examples", "3"]
SMALL += ["--heads-cell", "2,0", "--head-examples", "3", "--top-k", "2", "--random-sets", "2"]


@pytest.mark.parametrize("layout", ["kv", "zoology"])
def test_mqar_writes_a_complete_run_directory(tiny_folder, tmp_path, capsys, layout):
    out = tmp_path / "run"
    argv = ["mqar", "--model", str(tiny_folder), "--out", str(out), "--layout", layout, *SMALL]
    assert main(argv) == 0
    files = set(os.listdir(out))
    assert {
        "manifest.json",
        "scores.parquet",
        "accuracy.csv",
        "distance.csv",
        "masking.json",
        "summary.json",
        "mqar.html",
        "cells.jsonl",
        "masking.jsonl",
    } <= files
    acc = pd.read_csv(out / "accuracy.csv")
    assert len(acc) == 4 and set(acc.n_pairs) == {2, 4} and set(acc.gap) == {0, 6}
    assert (acc.queries == 3 * acc.n_pairs).all()
    masking = json.loads((out / "masking.json").read_text())
    assert len(masking["recall_heads"]) == 2 and len(masking["random"]) == 2
    assert not set(map(tuple, masking["recall_heads"])) & {
        tuple(h) for s in masking["random_sets"] for h in s
    }
    scores = pd.read_parquet(out / "scores.parquet")
    assert set(scores.metric) == {"query_to_value", "query_to_key", "value_to_key"}
    assert "MQAR accuracy" in capsys.readouterr().out
    assert main([*argv, "--resume"]) == 0
    assert "recall heads" in capsys.readouterr().out


def test_trained_model_recall_collapses_when_its_recall_heads_are_masked(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["mqar", "--model", str(FIXTURE), "--out", str(out), "--pairs", "4,8"]
    argv += ["--tokens-per-pair", "8", "--gaps", "0,8", "--examples", "32", "--heads-cell", "8,0"]
    argv += ["--head-examples", "64", "--top-k", "2", "--random-sets", "3", "--batch-size", "64"]
    assert main(argv) == 0
    acc = pd.read_csv(out / "accuracy.csv").set_index(["n_pairs", "gap"])
    assert acc.loc[(8, 0), "accuracy"] > 0.9  # the training task itself
    masking = json.loads((out / "masking.json").read_text())
    # The two induction heads of layer 1 (heads/mqar_train.py); random pairs of the other
    # heads may hit a previous-token head of layer 0, which hurts, but far less.
    assert sorted(map(tuple, masking["recall_heads"])) == [(1, 0), (1, 1)]
    assert masking["masked"] < 0.1
    assert masking["random_mean"] > masking["masked"] + 0.3
    assert json.loads((out / "manifest.json").read_text())["parameters"]["layout"] == "abstract"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layout", "bogus"], "unknown --layout"),
        (["--pairs", "0"], "--pairs must be positive"),
        (["--tokens-per-pair", "2"], "--tokens-per-pair must be at least 4"),
        (["--gaps", "5000"], "longer than the model's context"),
        (["--pairs", "64"], "exceed the"),
        (["--top-k", "8"], "--top-k must be below"),
        (["--mask-mode", "zero"], "--mask-mode must be"),
        (["--heads-cell", "4"], "--heads-cell takes N,GAP"),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(tiny_folder, tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    code = main(["mqar", "--model", str(tiny_folder), "--out", str(out), *SMALL, *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "run.partial").exists()
