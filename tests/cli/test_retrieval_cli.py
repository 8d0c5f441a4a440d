"""`headhunt retrieval` / `headhunt ablate` end to end on a tiny local model folder, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from headhunt.cli import main

FAST = ["--lengths", "128", "--depths", "50", "--needles", "passkey,magic", "--max-new-tokens", "3"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "headhunt", *args], capture_output=True, text=True, timeout=300
    )


def test_retrieval_writes_a_complete_run_directory(tiny_folder, tmp_path, capsys, rank_every_head):
    out = tmp_path / "run"
    assert main(["retrieval", "--model", str(tiny_folder), "--out", str(out), *FAST]) == 0
    files = set(os.listdir(out))
    assert {
        "manifest.json",
        "scores.parquet",
        "retrieval_heads.json",
        "trials.jsonl",
        "duo_attention.tsv",
        "retrieval_heatmap.html",
    } <= files
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] == "retrieval"
    assert manifest["model"]["n_heads"] == 4 and manifest["model"]["n_kv_heads"] == 2
    assert manifest["parameters"]["lengths"] == [128]
    assert {"torch", "transformers"} <= set(manifest["versions"])
    df = pd.read_parquet(out / "scores.parquet")
    assert {"layer", "head", "kv_head", "metric", "value"} <= set(df.columns)
    ref = json.loads((out / "retrieval_heads.json").read_text())
    assert sorted(ref) == sorted(f"{la}-{h}" for la in range(2) for h in range(4))
    tsv = (out / "duo_attention.tsv").read_text().strip().splitlines()
    assert len(tsv) == 2 and all(len(line.split("\t")) == 2 for line in tsv)
    assert not (tmp_path / "run.partial").exists()
    assert "retrieval heads" in capsys.readouterr().out.lower()

    # An existing run is refused, reprinted with --resume, replaced with --force.
    assert main(["retrieval", "--model", str(tiny_folder), "--out", str(out), *FAST]) == 2
    assert (
        main(["retrieval", "--model", str(tiny_folder), "--out", str(out), "--resume", *FAST]) == 0
    )
    assert (
        main(["retrieval", "--model", str(tiny_folder), "--out", str(out), "--force", *FAST]) == 0
    )

    # The causal check reads the run.
    rank_every_head(out)
    abl = tmp_path / "abl"
    code = main(
        [
            "ablate",
            "--model",
            str(tiny_folder),
            "--scores",
            str(out),
            "--out",
            str(abl),
            "--top-k",
            "2",
            "--draws",
            "2",
            "--lengths",
            "128",
            "--depths",
            "50",
            "--needles",
            "passkey",
            "--max-new-tokens",
            "3",
        ]
    )
    assert code == 0
    result = json.loads((abl / "ablation.json").read_text())
    assert len(result["top_heads"]) == 2 and len(result["random_heads"]) == 2
    top = {tuple(h) for h in result["top_heads"]}
    assert all(not (top & {tuple(h) for h in s}) for s in result["random_heads"])


def test_interrupted_run_resumes(tiny_folder, tmp_path, monkeypatch):
    import headhunt.heads.retrieval as R

    out = tmp_path / "run"
    args = [
        "retrieval",
        "--model",
        str(tiny_folder),
        "--out",
        str(out),
        "--batch-size",
        "1",
        "--lengths",
        "128",
        "--depths",
        "0,100",
        "--needles",
        "passkey",
        "--max-new-tokens",
        "2",
    ]
    real, calls = R._score_batch, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(R, "_score_batch", flaky)
    assert main(args) == 130
    assert not out.exists()
    partial = tmp_path / "run.partial"
    assert len((partial / "trials.jsonl").read_text().splitlines()) == 1
    monkeypatch.setattr(R, "_score_batch", real)
    assert main([*args, "--resume"]) == 0
    assert len((out / "trials.jsonl").read_text().splitlines()) == 2
    assert not partial.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-model"], "unknown model"),
        (["--model", "/nonexistent/model.gguf"], "no GGUF file"),
        (["--lengths", "100000"], "exceeds the model's context"),
        (["--lengths", "12"], "too short"),
        (["--depths", "120"], "outside 0..100"),
        (["--needles", "unicorn"], "unknown needle"),
        (["--lengths", "1,x"], "comma-separated"),
    ],
)
def test_bad_input_gives_one_line_error(tiny_folder, tmp_path, args, message):
    argv = ["retrieval", "--model", str(tiny_folder), "--out", str(tmp_path / "o"), *args]
    proc = run_cli(*argv)
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_bad_files(tmp_path, tiny_folder):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    short = tmp_path / "short.txt"
    short.write_text("One short sentence. Another one.")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    cases = [
        (["--model", str(bad)], "not a GGUF file"),
        (["--model", str(tiny_folder), "--haystack", str(empty)], "is empty"),
        (
            ["--model", str(tiny_folder), "--haystack", str(short), "--lengths", "300"],
            "haystack has",
        ),
        (["--model", str(tmp_path)], "not a Hugging Face model folder"),
    ]
    for args, message in cases:
        proc = run_cli("retrieval", "--out", str(tmp_path / "o"), *args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    if os.geteuid() != 0:  # root ignores directory permissions
        proc = run_cli("retrieval", "--model", str(tiny_folder), "--out", str(locked / "o"))
        assert proc.returncode == 2 and "cannot write" in proc.stderr
