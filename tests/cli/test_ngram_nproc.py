"""`headhunt ngram --nproc 2`: two gloo processes on the CPU write the run directory of one
(whole batches are dealt to the ranks), and a run interrupted with rank shards resumes."""

from __future__ import annotations

import json

SMALL = ["--n-seqs", "5", "--repeat-len", "12", "--planted-len", "60", "--batch-size", "2"]


def test_two_processes_match_one_and_resume_per_shard(
    tiny_folder, tmp_path, one_and_two_processes, resume_from_shards
):
    argv = ["ngram", "--model", str(tiny_folder), "--device", "cpu", *SMALL]
    argv += ["--inputs", "random,planted", "--k-max", "3"]
    one, _ = one_and_two_processes(argv, tmp_path)
    rows = [json.loads(r) for r in (one / "records-planted.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 4]

    # Interrupted: random done by both ranks; planted batches [0,1] [2,3] [4]: rank 0 saved
    # sequence 0 only, rank 1 nothing.
    lines = (one / "records-random.jsonl").read_text().splitlines(keepends=True)
    shards = {
        "records-random.rank0.jsonl": "".join(lines[0:2] + lines[4:]),
        "records-random.rank1.jsonl": "".join(lines[2:4]),
        "records-planted.rank0.jsonl": json.dumps(rows[0]) + "\n",
    }
    names = ("records-random.jsonl", "records-planted.jsonl", "scores.parquet")
    message = "planted: resuming, 1 of 5 sequences already done"
    resume_from_shards(argv, one, shards, message, names)
