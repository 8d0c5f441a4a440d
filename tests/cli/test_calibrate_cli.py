"""`headhunt calibrate` end to end on the tiny model folder: run directory, resume, --heads,
and bad input (one-line errors, exit 2, no run directory left behind)."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from headhunt.cli import main

FAST = ["--n-calib", "8", "--n-dev", "8", "--max-heads", "3", "--exclude-layers", "0"]
FAST += ["--bootstrap", "200", "--batch-size", "8"]


def task_file(path, n=40, labels=("red", "blue", "green")):
    rng = np.random.default_rng(0)
    words = ["the", "a", "of", "and", "to", "in", "is", "was", "it", "for", "on", "that", "with"]
    rows = []
    for _ in range(n):
        lab = labels[rng.integers(len(labels))]
        text = " ".join(rng.choice(words, 10)) + f" {lab}"
        rows.append({"text": text, "labels": list(labels), "label": lab})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_calibrate_run_resume_and_saved_heads(tiny_folder, tmp_path, capsys, monkeypatch):
    task = task_file(tmp_path / "task.jsonl")
    out = tmp_path / "run"
    argv = ["calibrate", "--model", str(tiny_folder), "--task", str(task), "--out", str(out)]

    # Interrupt the run at its third evaluation: the sink-mass record and two finished
    # evaluations are kept in records.jsonl.
    from headhunt.heads.evaluations import calibrate as C

    real, calls = C.evaluate, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(C, "evaluate", flaky)
    assert main([*argv, *FAST]) == 130
    assert not out.exists() and (tmp_path / "run.partial").is_dir()
    monkeypatch.setattr(C, "evaluate", real)
    assert main([*argv, *FAST, "--resume"]) == 0
    text = capsys.readouterr().out
    assert "resuming: 3 finished evaluations kept" in text
    assert "test split (24 items)" in text

    files = set(os.listdir(out))
    assert {
        "manifest.json",
        "scores.parquet",
        "records.jsonl",
        "split.json",
        "heads.json",
        "result.json",
        "test_items.parquet",
        "calibrate.html",
    } <= files
    result = json.loads((out / "result.json").read_text())
    assert result["n"] == 24 and result["n_candidates"] == 3
    lo, hi = result["gain_ci"]
    assert lo <= result["gain"] <= hi
    split = json.loads((out / "split.json").read_text())
    assert not set(split["test"]) & (set(split["calibration"]) | set(split["dev"]))
    scores = pd.read_parquet(out / "scores.parquet")
    assert {"movable_sink_mass", "calib_acc_gain", "chosen"} <= set(scores.metric)
    items = pd.read_parquet(out / "test_items.parquet")
    assert items.baseline_correct.mean() == pytest.approx(result["baseline"])

    # A finished run is reprinted with --resume.
    assert main([*argv, *FAST, "--resume"]) == 0
    assert "test split (24 items)" in capsys.readouterr().out

    # --heads applies a saved set without searching (a text file of LAYER-HEAD pairs).
    heads = tmp_path / "heads.txt"
    heads.write_text("1-2\n1-0\n")
    out2 = tmp_path / "applied"
    argv2 = ["calibrate", "--model", str(tiny_folder), "--task", str(task), "--out", str(out2)]
    assert main([*argv2, *FAST, "--heads", str(heads)]) == 0
    applied = json.loads((out2 / "result.json").read_text())
    assert applied["heads"] == [[1, 2], [1, 0]] and applied["n_candidates"] == 0
    assert applied["baseline"] == result["baseline"]  # same seed: same test items
    assert "calibrated heads: 1-2, 1-0" in capsys.readouterr().out
    # ... or a run directory's heads.json.
    out3 = tmp_path / "applied2"
    argv3 = ["calibrate", "--model", str(tiny_folder), "--task", str(task), "--out", str(out3)]
    assert main([*argv3, *FAST, "--heads", str(out)]) == 0


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ('{"text": "a", "labels": ["red", "blue"], "label": "red"\n', [], "not valid JSON"),
        ('{"text": "a", "labels": ["red", "blue"], "label": "pink"}\n', [], "is not one of"),
        ("", [], "holds no items"),
        (None, [], "more than the model's context"),
        (None, ["--heads", "9-9"], "outside the model"),
        (None, ["--n-calib", "30", "--n-dev", "30"], "leave none for the test"),
        (None, ["--exclude-layers", "0,1"], "every layer is excluded"),
        (None, ["--beta", "1.5"], "beta must be in"),
        (None, ["--task", "nonexistent"], "no bundled task of that name"),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(
    tiny_folder, tmp_path, capsys, content, extra, message
):
    task = tmp_path / "task.jsonl"
    if content is None:
        task_file(task)
        if "context" in message:
            rows = task.read_text().splitlines()
            long = {"text": "the " * 1100, "labels": ["red", "blue"], "label": "red"}
            task.write_text("\n".join([*rows, json.dumps(long)]) + "\n")
    else:
        task.write_text(content)
    out = tmp_path / "run"
    argv = ["calibrate", "--model", str(tiny_folder), "--task", str(task), "--out", str(out)]
    code = main([*argv, *FAST, *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "run.partial").exists()


def test_two_processes_match_one(tiny_folder, tmp_path, one_and_two_processes):
    """--nproc 2: the screening (the calibration baseline and each candidate head) is dealt over
    two gloo processes; the run directory equals one process's."""
    task = task_file(tmp_path / "task.jsonl")
    argv = ["calibrate", "--model", str(tiny_folder), "--task", str(task), "--device", "cpu"]
    one, _ = one_and_two_processes([*argv, *FAST], tmp_path)
    stages = [json.loads(r)["stage"] for r in (one / "records.jsonl").read_text().splitlines()]
    assert stages[:5] == ["mass", "calib_base", "screen", "screen", "screen"]
