"""Two gloo processes on the CPU give the same run directory as one process."""

from __future__ import annotations

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


def test_two_processes_match_one_and_resume_per_shard(
    tiny_folder, tmp_path, one_and_two_processes, resume_from_shards
):
    argv = ["retrieval", "--model", str(tiny_folder), *ARGS]
    one, _ = one_and_two_processes(argv, tmp_path)

    # Interrupted: rank 1 finished its first trial (batch 1 of 0..3), rank 0 nothing yet.
    lines = (one / "trials.jsonl").read_text().splitlines()
    shards = {"trials.rank0.jsonl": "", "trials.rank1.jsonl": lines[1] + "\n"}
    names = ("trials.jsonl", "retrieval_heads.json", "duo_attention.tsv", "scores.parquet")
    resume_from_shards(argv, one, shards, "resuming: 1 of 4 trials already done", names)


def test_a_failing_group_reports_one_line(tiny_folder, tmp_path, capfd):
    out = tmp_path / "run"
    argv = ["sinks", "--model", str(tiny_folder), "--device", "cpu", "--length", "5000"]
    assert main([*argv, "--nproc", "2", "--out", str(out)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err == ["headhunt sinks: error: --length 5000 exceeds the model's context (1024 tokens)"]
    assert not out.exists() and not (tmp_path / "run.partial").exists()
