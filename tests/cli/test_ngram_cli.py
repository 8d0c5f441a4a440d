"""`headhunt ngram` end to end on the tiny model folder, resuming, and bad input."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from headhunt.cli import main

WORDS = "the secret code of the vault is blue . remember the code and read the answer . "
SMALL = ["--n-seqs", "2", "--repeat-len", "12", "--planted-len", "60", "--text-tokens", "40"]


def test_ngram_writes_a_complete_run_directory(tiny_folder, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text(WORDS * 6)
    out = tmp_path / "run"
    argv = ["ngram", "--model", str(tiny_folder), "--out", str(out), "--texts", str(texts)]
    argv += [*SMALL, "--n-texts", "2", "--k-max", "3"]
    assert main(argv) == 0
    files = set(os.listdir(out))
    assert {
        "manifest.json",
        "scores.parquet",
        "orders.csv",
        "summary.json",
        "ngram.html",
        "records-random.jsonl",
        "records-planted.jsonl",
        "records-natural.jsonl",
    } <= files
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] == "ngram" and manifest["parameters"]["k_max"] == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["random"]["tokens"] == [25]  # BOS + 12 tokens x 2
    assert summary["natural"]["sequences"] == 2
    assert all(summary["planted"]["kgram_both_queries"][k] > 0 for k in range(3))
    scores = pd.read_parquet(out / "scores.parquet")
    assert {"prev_token", "induction", "kgram_contrast", "ngram_order"} <= set(scores.metric)
    assert set(scores.source) == {"random", "planted", "natural"}
    orders = pd.read_csv(out / "orders.csv")
    assert len(orders) == 3 * 2 * 4  # sources x layers x heads
    text = capsys.readouterr().out
    assert "random: top induction heads" in text

    assert main([*argv, "--resume"]) == 0  # a finished run is reprinted
    assert "top induction heads" in capsys.readouterr().out
    assert main(argv) == 2  # an existing run is refused without --resume/--force


def test_interrupted_run_resumes_from_its_records(tiny_folder, tmp_path):
    out = tmp_path / "run"
    argv = ["ngram", "--model", str(tiny_folder), "--out", str(out), *SMALL]
    argv += ["--inputs", "random,planted"]
    assert main(argv) == 0
    full = pd.read_parquet(out / "scores.parquet")
    # Pretend the run stopped after one planted sequence: keep its partial folder.
    partial = tmp_path / "run.partial"
    os.replace(out, partial)
    (partial / "manifest.json").unlink()
    lines = (partial / "records-planted.jsonl").read_text().splitlines()
    (partial / "records-planted.jsonl").write_text(lines[0] + "\n")
    assert main([*argv, "--resume"]) == 0
    again = pd.read_parquet(out / "scores.parquet")
    pd.testing.assert_frame_equal(full, again)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--k-max", "9"], "--k-max must be in 1..8"),
        (["--inputs", "random,bogus"], "unknown --inputs"),
        (["--texts", "/nonexistent/texts.txt"], "cannot read texts"),
        (["--texts", "SHORT", "--inputs", "natural"], "too short to contain any repeated"),
        (["--planted-len", "2000", "--inputs", "planted"], "longer than the model's context"),
        (
            ["--repeat-len", "60", "--repeats", "20", "--inputs", "random"],
            "longer than the model's context",
        ),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(tiny_folder, tmp_path, capsys, extra, message):
    short = tmp_path / "short.txt"
    short.write_text("the secret code")
    extra = [str(short) if e == "SHORT" else e for e in extra]
    out = tmp_path / "run"
    code = main(["ngram", "--model", str(tiny_folder), "--out", str(out), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "run.partial").exists()
