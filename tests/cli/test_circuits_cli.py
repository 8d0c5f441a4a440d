"""`headhunt circuits`: run directories, resume, and one-line errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from headhunt.cli import main
from headhunt.engine import ModelSpec
from headhunt.rundir import load_run
from headhunt.sae.planted import planted_model


@pytest.fixture(scope="module")
def planted():
    return planted_model()


@pytest.fixture
def task_file(tmp_path, planted):
    f = tmp_path / "pairs.jsonl"
    f.write_text("\n".join(json.dumps(p.to_dict()) for p in planted.pairs(10, seed=0).pairs))
    return f


@pytest.fixture
def use_planted(monkeypatch, planted):
    monkeypatch.setattr(ModelSpec, "load", lambda self: planted.model)


FAST = ["--trials", "2", "--epochs", "60", "--no-progress", "--no-png"]


def test_run_writes_a_complete_run_directory(tmp_path, task_file, use_planted, capsys):
    out = tmp_path / "run"
    args = ["circuits", "--task-file", str(task_file), "--out", str(out), "--truth-top", "2"]
    assert main(args + FAST) == 0
    run = load_run(out)
    m = run.manifest
    assert m["method"] == "circuits" and m["n_pairs"] == 10
    assert list(m["parameters"])[:3] == ["model", "dtype", "task"]  # as the old command wrote
    assert m["parameters"]["dtype"] == "auto"  # a resume with another --dtype is refused
    for name in (
        "scores.parquet",
        "auc.json",
        "circuit.json",
        "trials.jsonl",
        "edges.parquet",
        "patching.json",
        "eap.safetensors",
        "sae.safetensors",
        "sae.json",
        "pairs.jsonl",
        "roc.html",
        "heads.html",
    ):
        assert (out / name).is_file(), name
    for key in ("capture", "patching", "eap", "sae_train_per_trial", "sae_method"):
        assert m["timings"][key] >= 0
    scores = run.scores()
    assert {"sae_node", "sae_node_norm", "sae_edge", "eap", "patching", "truth"} <= set(
        scores.metrics
    )
    truth = {
        (r.layer, r.head)
        for r in scores.df[scores.df.metric == "truth"].itertuples()
        if r.value == 1
    }
    assert truth == {(2, 1), (2, 3)}
    auc = run.json("auc.json")
    assert auc["methods"]["sae_node"]["mean"] >= 0.9 and len(auc["methods"]["eap"]["trials"]) == 2
    assert sorted(map(tuple, m["circuit"]["heads"])) == [(2, 1), (2, 3)]
    printed = capsys.readouterr().out
    assert "ROC AUC" in printed and "run directory" in printed
    # a finished run is reprinted with --resume, not recomputed
    assert main(args + FAST + ["--resume"]) == 0
    assert "heads by SAE node score" in capsys.readouterr().out
    assert main(args + FAST + ["--resume", "--dtype", "float16"]) == 2
    assert "other parameters (dtype)" in capsys.readouterr().err


def test_sae_only_run_without_answers(tmp_path, use_planted):
    f = tmp_path / "plain.jsonl"
    f.write_text(
        '{"positive": "the secret gate", "negative": "the code gate"}\n'
        '{"positive": "a secret day", "negative": "a code day"}\n'
    )
    out = tmp_path / "run"
    rc = main(
        [
            "circuits",
            "--task-file",
            str(f),
            "--out",
            str(out),
            "--no-truth",
            "--no-eap",
            "--circuit-size",
            "3",
            *FAST,
        ]
    )
    assert rc == 0
    m = load_run(out).manifest
    assert m["auc"] == {} and len(m["circuit"]["heads"]) == 3
    assert "patching" not in m["timings"]


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--task-file", "/nonexistent/pairs.jsonl"], "no task file"),
        (["--circuit-size", "3", "--circuit-threshold", "0.5"], "not both"),
        (["--subsample", "1.5"], "subsample"),
        (["--trials", "0"], "trial"),
        (["--pairs", "1"], "--pairs"),
        (["--truth-share", "2"], "share"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, use_planted, task_file, capsys, extra, match):
    args = ["circuits", "--task-file", str(task_file), "--out", str(tmp_path / "r"), *FAST]
    assert main(args + extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_missing_answers_need_no_truth(tmp_path, use_planted, capsys):
    f = tmp_path / "plain.jsonl"
    f.write_text('{"positive": "the secret gate", "negative": "the code gate"}\n' * 2)
    assert main(["circuits", "--task-file", str(f), "--out", str(tmp_path / "r"), *FAST]) == 2
    assert "--no-truth" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_existing_run_needs_force(tmp_path, use_planted, task_file, capsys):
    (tmp_path / "r").mkdir()
    rc = main(["circuits", "--task-file", str(task_file), "--out", str(tmp_path / "r"), *FAST])
    assert rc == 2 and "--force" in capsys.readouterr().err


def test_help_is_fast_and_complete():
    out = subprocess.run(
        [sys.executable, "-m", "headhunt", "circuits", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    for opt in ("--task-file", "--truth-share", "--sae-examples", "--circuit-size"):
        assert opt in out


@pytest.mark.slow
def test_embedded_model_sae_only(tmp_path, smol, monkeypatch, capsys):
    monkeypatch.setattr(ModelSpec, "load", lambda self: smol)
    out = tmp_path / "smol"
    rc = main(
        [
            "circuits",
            "--task",
            "greater-than",
            "--pairs",
            "3",
            "--trials",
            "1",
            "--epochs",
            "20",
            "--no-truth",
            "--no-eap",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    scores = load_run(out).scores()
    assert scores.matrix("sae_node").shape == (30, 9)


def test_interrupted_run_resumes_from_saved_work(tmp_path, task_file, use_planted):
    import shutil

    first = tmp_path / "first"
    args = ["--task-file", str(task_file), "--truth-top", "2", *FAST]
    assert main(["circuits", *args, "--out", str(first)]) == 0
    # fake an interruption after the ground truth, EAP and trial 0 of a second run
    second = tmp_path / "second"
    partial = tmp_path / "second.partial"
    partial.mkdir()
    for name in ("parameters.json", "patching.json", "eap.safetensors"):
        shutil.copy(first / name, partial / name)
    trial0 = (first / "trials.jsonl").read_text().splitlines()[0]
    (partial / "trials.jsonl").write_text(trial0 + "\n")
    assert main(["circuits", *args, "--out", str(second), "--resume"]) == 0
    a, b = load_run(first), load_run(second)
    assert b.manifest["timings"]["patching"] == a.manifest["timings"]["patching"]  # reused
    assert b.manifest["timings"]["eap"] == a.manifest["timings"]["eap"]
    lines = (second / "trials.jsonl").read_text().splitlines()
    assert len(lines) == 2 and lines[0] == trial0
    assert (
        json.loads(lines[1])["node"]
        == json.loads((first / "trials.jsonl").read_text().splitlines()[1])["node"]
    )  # trial 1 recomputed with the same seed gives the same scores
    assert a.json("auc.json")["methods"] == b.json("auc.json")["methods"]


def test_truth_from_another_run(tmp_path, task_file, use_planted, planted, capsys):
    first = tmp_path / "first"
    args = ["--task-file", str(task_file), "--truth-top", "2", *FAST]
    assert main(["circuits", *args, "--out", str(first)]) == 0
    second = tmp_path / "second"
    rc = main(
        [
            "circuits",
            *args,
            "--out",
            str(second),
            "--truth-from",
            str(first),
            "--head-norm",
            "standardize",
        ]
    )
    assert rc == 0
    a, b = load_run(first), load_run(second)
    assert b.manifest["timings"]["patching"] == a.manifest["timings"]["patching"]
    assert b.manifest["parameters"]["head_norm"] == "standardize"
    assert b.manifest["truth_from"] == str(first.resolve())
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(json.dumps(p.to_dict()) for p in planted.pairs(10, seed=9).pairs))
    capsys.readouterr()
    rc = main(
        [
            "circuits",
            "--task-file",
            str(other),
            "--truth-top",
            "2",
            *FAST,
            "--out",
            str(tmp_path / "third"),
            "--truth-from",
            str(first),
        ]
    )
    assert rc == 2 and "other prompt pairs" in capsys.readouterr().err


def test_a_prompt_longer_than_the_context_is_refused_before_any_work(tmp_path, tiny_folder, capsys):
    pair = {"positive": "the " * 1100 + "blue", "negative": "the " * 1100 + "red"}
    pair.update(answer=" blue", wrong=" red")
    task = tmp_path / "long.jsonl"
    task.write_text(json.dumps(pair) + "\n" + json.dumps(pair) + "\n")
    out = tmp_path / "r"
    args = ["circuits", "--model", str(tiny_folder), "--task-file", str(task), "--out", str(out)]
    assert main([*args, *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than the model's context (1024)" in err
    assert not out.exists() and not (tmp_path / "r.partial").exists()


def test_trial_0s_sae_is_on_disk_before_its_record(tmp_path, task_file, use_planted, monkeypatch):
    """A kill between the two must not leave a resumed run without ``sae.safetensors`` (the
    resume skips trial 0 once its record is saved); both files are written atomically."""
    from headhunt.rundir import RunDir

    seen = []
    append = RunDir.append_record

    def checked(self, record, name="records.jsonl"):
        if name == "trials.jsonl" and record["index"] == 0:
            seen.append(sorted(p.name for p in self.work.iterdir() if "sae" in p.name))
        append(self, record, name)

    monkeypatch.setattr(RunDir, "append_record", checked)
    args = ["circuits", "--task-file", str(task_file), "--out", str(tmp_path / "r"), *FAST]
    assert main(args) == 0
    assert seen == [["sae.json", "sae.safetensors"]]
