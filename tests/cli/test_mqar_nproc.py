"""`headhunt mqar --nproc 2`: two gloo processes on the CPU write the run directory of one (grid
cells, the heads cell and the masking sets are dealt to the ranks), and a run interrupted with
rank shards resumes."""

from __future__ import annotations

SMALL = ["--pairs", "2,4", "--tokens-per-pair", "8", "--gaps", "0,6", "--examples", "3"]
SMALL += ["--heads-cell", "2,0", "--head-examples", "3", "--top-k", "2", "--random-sets", "2"]


def test_two_processes_match_one_and_resume_per_shard(
    tiny_folder, tmp_path, one_and_two_processes, resume_from_shards
):
    argv = ["mqar", "--model", str(tiny_folder), "--device", "cpu", *SMALL]
    one, _ = one_and_two_processes(argv, tmp_path)

    # Interrupted after the grid (split over two shards) and the heads cell; one masking set
    # saved by rank 1.
    cells = (one / "cells.jsonl").read_text().splitlines(keepends=True)
    masks = (one / "masking.jsonl").read_text().splitlines(keepends=True)
    shards = {
        "cells.rank0.jsonl": "".join(cells[0::2]),
        "cells.rank1.jsonl": "".join(cells[1::2]),
        "heads.rank1.jsonl": (one / "heads.jsonl").read_text(),
        "masking.rank1.jsonl": masks[1],
    }
    names = ("cells.jsonl", "heads.jsonl", "masking.jsonl", "masking.json", "scores.parquet")
    message = "resuming: 5 of 5 cells already done (heads cell included)"
    resume_from_shards(argv, one, shards, message, names)
