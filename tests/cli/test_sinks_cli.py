"""`headhunt sinks` end to end on the tiny model folder, and bad input."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from headhunt.cli import main

WORDS = "the secret code of the vault is blue . remember the code and read the answer . "


def test_sinks_writes_a_complete_run_directory(tiny_folder, tmp_path, capsys):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": WORDS * k}) + "\n" for k in (4, 5)))
    out = tmp_path / "run"
    argv = ["sinks", "--model", str(tiny_folder), "--out", str(out), "--texts", str(texts)]
    argv += ["--min-queries", "8", "--eps-tokens", "16"]
    assert main(argv) == 0
    files = set(os.listdir(out))
    assert {
        "manifest.json",
        "scores.parquet",
        "sinks.parquet",
        "sink_tokens.csv",
        "layers.csv",
        "summary.json",
        "sinks.html",
        "texts.jsonl",
    } <= files
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] == "sinks" and manifest["parameters"]["min_queries"] == 8
    summary = json.loads((out / "summary.json").read_text())
    assert summary["texts"] == 2 and summary["tokens_per_text"] == [69, 86]
    scores = pd.read_parquet(out / "scores.parquet")
    assert {"first_sink_mass", "hidden_sink_mass", "sink_eps", "massive_ratio"} <= set(
        scores.metric
    )
    sinks = pd.read_parquet(out / "sinks.parquet")
    assert (sinks.queries >= 8).all()
    layers = pd.read_csv(out / "layers.csv")
    assert len(layers) == 2
    text = capsys.readouterr().out
    assert "First token: mean s_0" in text and "heads by hidden-sink mass" in text

    assert main([*argv, "--resume"]) == 0  # a finished run is reprinted
    assert "First token" in capsys.readouterr().out
    assert main(argv) == 2  # an existing run is refused without --resume/--force


def test_bundled_essays_by_default(tiny_folder, tmp_path):
    out = tmp_path / "run"
    argv = ["sinks", "--model", str(tiny_folder), "--out", str(out), "--length", "96"]
    assert main([*argv, "--n-texts", "2", "--min-queries", "8"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens_per_text"] == [96, 96]


@pytest.mark.parametrize(
    ("setup", "extra", "message"),
    [
        ("missing", [], "no texts file"),
        ("malformed", [], "not valid JSON"),
        ("notext", [], "needs a non-empty string 'text'"),
        ("empty", [], "is empty"),
        ("long", [], "more than the model's context"),
        ("ok", ["--length", "5000"], "exceeds the model's context"),
        ("ok", ["--tau", "2"], "tau must be in"),
        ("ok", ["--n-texts", "0"], "--n-texts must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(
    tiny_folder, tmp_path, capsys, setup, extra, message
):
    path = tmp_path / ("texts.txt" if setup in ("empty", "long") else "texts.jsonl")
    content = {
        "malformed": '{"text": "a"\n',
        "notext": '{"body": "a"}\n',
        "empty": "  \n",
        "long": WORDS * 70,
        "ok": json.dumps({"text": WORDS}) + "\n",
    }
    if setup != "missing":
        path.write_text(content[setup])
    out = tmp_path / "run"
    argv = ["sinks", "--model", str(tiny_folder), "--out", str(out), "--texts", str(path)]
    code = main([*argv, *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "run.partial").exists()
