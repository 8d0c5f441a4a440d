"""The circuits method through the run engine: its SAE trials dealt over two processes give the
one-process run directory, and ``headhunt.run`` makes a run on an in-memory model."""

from __future__ import annotations

import json

from test_faults import assert_same_run

import headhunt
from headhunt.cli import main
from headhunt.sae.planted import planted_model

FAST = ["--truth-top", "2", "--trials", "3", "--epochs", "30", "--batch-size", "4", "--no-png"]


def test_two_processes_deal_the_trials_and_match_one(tiny_folder, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    rows = [
        {"positive": f"the {w} is {a} .", "negative": f"the {w} is {b} .", "answer": f" {a}",
         "wrong": f" {b}"}
        for w in ("code", "key", "gate", "lamp", "river", "park")
        for a, b in [("blue", "red")]
    ]  # fmt: skip
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["circuits", "--model", str(tiny_folder), "--device", "cpu", "--task-file", str(pairs)]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*argv, *FAST, "--no-progress", "--out", str(one)]) == 0
    assert main([*argv, *FAST, "--no-progress", "--out", str(two), "--nproc", "2"]) == 0
    assert_same_run(one, two)
    assert not list(two.glob("*.rank*"))
    m1, m2 = (json.loads((d / "manifest.json").read_text()) for d in (one, two))
    assert (m1["processes"], m2["processes"]) == (1, 2)
    indices = [json.loads(x)["index"] for x in (two / "trials.jsonl").read_text().splitlines()]
    assert indices == [0, 1, 2]


def test_run_from_python_on_an_in_memory_model(tmp_path):
    planted = planted_model()
    task = tmp_path / "pairs.jsonl"
    task.write_text(
        "".join(json.dumps(p.to_dict()) + "\n" for p in planted.pairs(10, seed=0).pairs)
    )
    config = {"task_file": str(task), "truth_top": 2, "trials": 2, "epochs": 60, "png": False}
    run = headhunt.run("circuits", config, model=planted.model, out=tmp_path / "r", progress=False)
    assert run.method == "circuits" and run.manifest["n_pairs"] == 10
    assert sorted(map(tuple, run.manifest["circuit"]["heads"])) == [(2, 1), (2, 3)]
    assert run.json("auc.json")["methods"]["sae_node"]["mean"] >= 0.9


def test_defaults_are_sized_to_the_device_and_recorded(tmp_path, capsys):
    """Issue 29: the default run on a CPU is the CPU's setting (16 pairs, 3 trials, 400
    features), on a GPU the full one; what a run used is in its parameters, and it says so."""
    from headhunt.sae.configs import CircuitsConfig

    full = CircuitsConfig(pairs=32, trials=10, dict_size=800)
    assert CircuitsConfig().for_device("cuda") == full
    cpu = CircuitsConfig(trials=5).for_device("cpu")  # a value given is kept
    assert (cpu.pairs, cpu.trials, cpu.dict_size) == (16, 5, 400)

    planted = planted_model()
    task = tmp_path / "pairs.jsonl"
    task.write_text(
        "".join(json.dumps(p.to_dict()) + "\n" for p in planted.pairs(10, seed=0).pairs)
    )
    config = {"task_file": str(task), "truth_top": 2, "epochs": 20, "png": False}
    run = headhunt.run("circuits", config, model=planted.model, out=tmp_path / "r")
    p = run.manifest["parameters"]
    assert (p["pairs"], p["trials"], p["dict_size"]) == (16, 3, 400)
    assert len((run.path / "trials.jsonl").read_text().splitlines()) == 3
    out = capsys.readouterr().out
    assert "the CPU's defaults, pairs 16, trials 3, dict_size 400" in out
