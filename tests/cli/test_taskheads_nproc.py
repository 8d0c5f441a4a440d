"""`headhunt taskheads --nproc 2`: two gloo processes on the CPU write the run directory of one
(examples and ablation conditions are dealt to the ranks), and an interrupted run resumes from
rank shards."""

from __future__ import annotations

import json

DOCS = ["the secret word is {} .", "it was a sunny day in the park .", "the city is by the gate ."]


def test_two_processes_match_one_and_resume_per_shard(
    tiny_folder, tmp_path, one_and_two_processes, resume_from_shards
):
    rows = [
        {"context": [DOCS[0].format(v), *DOCS[1:]], "question": "what is the secret word ?",
         "answer": v, "lead": "the secret word is"}
        for v in ("blue", "red", "green")
    ]  # fmt: skip
    data = tmp_path / "task.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["taskheads", "--model", str(tiny_folder), "--device", "cpu", "--input", str(data)]
    argv += ["--score-examples", "2", "--ks", "1", "--modes", "mean", "--random-draws", "1"]
    one, _ = one_and_two_processes(argv, tmp_path)

    # Interrupted with the examples split over two shards and one condition saved by rank 1.
    examples = (one / "examples.jsonl").read_text().splitlines(keepends=True)
    conditions = (one / "conditions.jsonl").read_text().splitlines(keepends=True)
    shards = {
        "examples.rank0.jsonl": "".join(examples[0::2]),
        "examples.rank1.jsonl": "".join(examples[1::2]),
        "conditions.rank1.jsonl": conditions[2],
    }
    names = ("examples.jsonl", "conditions.jsonl", "ablation.csv", "retrieval.json")
    names += ("detectors.json", "scores.parquet", "retriever_heads.json")
    resume_from_shards(argv, one, shards, "resuming: 3 of 3 examples already scored", names)
