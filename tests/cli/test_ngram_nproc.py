"""`headhunt ngram --nproc 2`: two gloo processes on the CPU write the run directory of one
(whole batches are dealt to the ranks), and a run interrupted with rank shards resumes."""

from __future__ import annotations

import json
import os

from headhunt.cli import main

SMALL = ["--n-seqs", "5", "--repeat-len", "12", "--planted-len", "60", "--batch-size", "2"]


def test_two_processes_match_one_and_resume_per_shard(
    tiny_folder, tmp_path, capsys, one_and_two_processes
):
    argv = ["ngram", "--model", str(tiny_folder), "--device", "cpu", *SMALL]
    argv += ["--inputs", "random,planted", "--k-max", "3"]
    one, _ = one_and_two_processes(argv, tmp_path)
    rows = [json.loads(r) for r in (one / "records-planted.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 4]

    # Interrupted: random done by both ranks; planted batches [0,1] [2,3] [4]: rank 0 saved
    # sequence 0 only, rank 1 nothing.
    partial = tmp_path / "three.partial"
    partial.mkdir()
    lines = (one / "records-random.jsonl").read_text().splitlines(keepends=True)
    (partial / "records-random.rank0.jsonl").write_text("".join(lines[0:2] + lines[4:]))
    (partial / "records-random.rank1.jsonl").write_text("".join(lines[2:4]))
    (partial / "records-planted.rank0.jsonl").write_text(json.dumps(rows[0]) + "\n")
    three = tmp_path / "three"
    capsys.readouterr()
    assert main([*argv, "--out", str(three), "--resume"]) == 0
    assert "planted: resuming, 1 of 5 sequences already done" in capsys.readouterr().out
    for name in ("records-random.jsonl", "records-planted.jsonl", "scores.parquet"):
        assert (one / name).read_bytes() == (three / name).read_bytes(), name
    assert not os.path.exists(partial)
