"""Two gloo processes on the CPU give the same run directory as one process."""

from __future__ import annotations

import json

import pandas as pd

from headhunt.cli import main
from headhunt.distributed import Dist, strip_option

ARGS = [
    "--lengths",
    "128",
    "--depths",
    "0,100",
    "--needles",
    "passkey,magic",
    "--max-new-tokens",
    "3",
    "--batch-size",
    "1",
    "--device",
    "cpu",
]


def test_share_and_strip():
    d = Dist(rank=1, world=3)
    assert d.share(list(range(8))) == [1, 4, 7]
    assert strip_option(["a", "--nproc", "2", "b", "--nproc=3"], "--nproc") == ["a", "b"]


def test_two_processes_match_one(tiny_folder, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["retrieval", "--model", str(tiny_folder), "--out", str(one), *ARGS]) == 0
    assert (
        main(["retrieval", "--model", str(tiny_folder), "--out", str(two), "--nproc", "2", *ARGS])
        == 0
    )
    m1 = json.loads((one / "manifest.json").read_text())
    m2 = json.loads((two / "manifest.json").read_text())
    assert m2["processes"] == 2 and m1["processes"] == 1
    assert m1["parameters"] == m2["parameters"]
    for name in ("trials.jsonl", "retrieval_heads.json", "duo_attention.tsv"):
        assert (one / name).read_text() == (two / name).read_text(), name
    pd.testing.assert_frame_equal(
        pd.read_parquet(one / "scores.parquet"), pd.read_parquet(two / "scores.parquet")
    )
    assert not list(two.glob("trials.rank*.jsonl"))


def test_a_failing_group_reports_one_line(tiny_folder, tmp_path, capfd):
    out = tmp_path / "run"
    argv = ["sinks", "--model", str(tiny_folder), "--device", "cpu", "--length", "5000"]
    assert main([*argv, "--nproc", "2", "--out", str(out)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err == ["headhunt sinks: error: --length 5000 exceeds the model's context (1024 tokens)"]
    assert not out.exists() and not (tmp_path / "run.partial").exists()
