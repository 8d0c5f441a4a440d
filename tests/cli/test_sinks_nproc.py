"""`headhunt sinks --nproc 2`: two gloo processes on the CPU write the run directory of one, and a
run interrupted with its texts split over rank shards resumes."""

from __future__ import annotations

import json

WORDS = "the secret code of the vault is blue . remember the code and read the answer . "


def test_two_processes_match_one_and_resume_per_shard(
    tiny_folder, tmp_path, one_and_two_processes, resume_from_shards
):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": WORDS * k}) + "\n" for k in (4, 5, 3)))
    argv = ["sinks", "--model", str(tiny_folder), "--texts", str(texts), "--device", "cpu"]
    argv += ["--min-queries", "8", "--eps-tokens", "16"]
    one, _ = one_and_two_processes(argv, tmp_path)

    # Interrupted: rank 0 finished text 0 of its 0 and 2, rank 1 nothing of its text 1.
    lines = (one / "texts.jsonl").read_text().splitlines()
    shards = {"texts.rank0.jsonl": lines[0] + "\n", "texts.rank1.jsonl": ""}
    names = ("texts.jsonl", "scores.parquet", "summary.json")
    resume_from_shards(argv, one, shards, "resuming: 1 of 3 texts already done", names)
