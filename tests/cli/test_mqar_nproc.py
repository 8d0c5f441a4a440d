"""`headhunt mqar --nproc 2`: two gloo processes on the CPU write the run directory of one (grid
cells, the heads cell and the masking sets are dealt to the ranks), and a run interrupted with
rank shards resumes."""

from __future__ import annotations

import os

from headhunt.cli import main

SMALL = ["--pairs", "2,4", "--tokens-per-pair", "8", "--gaps", "0,6", "--examples", "3"]
SMALL += ["--heads-cell", "2,0", "--head-examples", "3", "--top-k", "2", "--random-sets", "2"]


def test_two_processes_match_one_and_resume_per_shard(
    tiny_folder, tmp_path, capsys, one_and_two_processes
):
    argv = ["mqar", "--model", str(tiny_folder), "--device", "cpu", *SMALL]
    one, _ = one_and_two_processes(argv, tmp_path)

    # Interrupted after the grid (split over two shards) and the heads cell; one masking set
    # saved by rank 1.
    partial = tmp_path / "three.partial"
    partial.mkdir()
    cells = (one / "cells.jsonl").read_text().splitlines(keepends=True)
    (partial / "cells.rank0.jsonl").write_text("".join(cells[0::2]))
    (partial / "cells.rank1.jsonl").write_text("".join(cells[1::2]))
    (partial / "heads.rank1.jsonl").write_bytes((one / "heads.jsonl").read_bytes())
    masks = (one / "masking.jsonl").read_text().splitlines(keepends=True)
    (partial / "masking.rank1.jsonl").write_text(masks[1])
    three = tmp_path / "three"
    capsys.readouterr()
    assert main([*argv, "--out", str(three), "--resume"]) == 0
    assert "resuming: 5 of 5 cells already done (heads cell included)" in capsys.readouterr().out
    for name in ("cells.jsonl", "heads.jsonl", "masking.jsonl", "masking.json", "scores.parquet"):
        assert (one / name).read_bytes() == (three / name).read_bytes(), name
    assert not os.path.exists(partial)
