"""`headhunt ablate --nproc 2`: the masking conditions are dealt over two gloo processes on the
CPU; the run directory equals one process's."""

from __future__ import annotations

from headhunt.cli import main

TRIALS = ["--lengths", "128", "--depths", "0,100", "--needles", "passkey", "--max-new-tokens", "3"]


def test_two_processes_match_one(tiny_folder, tmp_path, one_and_two_processes, rank_every_head):
    source = tmp_path / "retrieval"
    argv = ["retrieval", "--model", str(tiny_folder), "--out", str(source), "--device", "cpu"]
    assert main([*argv, *TRIALS]) == 0
    rank_every_head(source)
    argv = ["ablate", "--model", str(tiny_folder), "--scores", str(source), "--device", "cpu"]
    one, _ = one_and_two_processes([*argv, *TRIALS, "--top-k", "2", "--draws", "2"], tmp_path)
    assert len((one / "records.jsonl").read_text().splitlines()) == 4  # baseline, top, 2 random
