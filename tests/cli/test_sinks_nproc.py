"""`headhunt sinks --nproc 2`: two gloo processes on the CPU write the run directory of one, and a
run interrupted with its texts split over rank shards resumes."""

from __future__ import annotations

import json
import os

from headhunt.cli import main

WORDS = "the secret code of the vault is blue . remember the code and read the answer . "


def test_two_processes_match_one_and_resume_per_shard(
    tiny_folder, tmp_path, capsys, one_and_two_processes
):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": WORDS * k}) + "\n" for k in (4, 5, 3)))
    argv = ["sinks", "--model", str(tiny_folder), "--texts", str(texts), "--device", "cpu"]
    argv += ["--min-queries", "8", "--eps-tokens", "16"]
    one, _ = one_and_two_processes(argv, tmp_path)

    # Interrupted: rank 0 finished text 0 of its 0 and 2, rank 1 nothing of its text 1.
    partial = tmp_path / "three.partial"
    partial.mkdir()
    lines = (one / "texts.jsonl").read_text().splitlines()
    (partial / "texts.rank0.jsonl").write_text(lines[0] + "\n")
    (partial / "texts.rank1.jsonl").write_text("")
    three = tmp_path / "three"
    capsys.readouterr()
    assert main([*argv, "--out", str(three), "--resume"]) == 0
    assert "resuming: 1 of 3 texts already done" in capsys.readouterr().out
    for name in ("texts.jsonl", "scores.parquet", "summary.json"):
        assert (one / name).read_bytes() == (three / name).read_bytes(), name
    assert not os.path.exists(partial)
