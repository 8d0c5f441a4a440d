"""The run directory's lifecycle under misuse and faults (issue 18, items 8-11 and 15-16):
--force never deletes what is not a run, a torn records line is dropped on resume, a live run
is locked, --nproc is bounded and its workers never outlive the launcher, an interrupted
--force run resumes, failed runs leave no folders, and a failing rank ends the group."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headhunt.cli import main
from headhunt.errors import HeadhuntError
from headhunt.rundir import RunDir, release_runs

WORDS = "the secret code of the vault is blue . remember the code and read the answer . "
NO_MODEL = "/nonexistent/model"


def one_line_error(capsys_or_capfd) -> str:
    err = capsys_or_capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def texts(tmp_path) -> Path:
    f = tmp_path / "texts.jsonl"
    f.write_text("".join(json.dumps({"text": WORDS * k}) + "\n" for k in (4, 5, 3)))
    return f


def sinks_argv(model, texts, out) -> list[str]:
    return ["sinks", "--model", str(model), "--texts", str(texts), "--device", "cpu",
            "--min-queries", "8", "--eps-tokens", "16", "--out", str(out)]  # fmt: skip


# 8. --force replaces only run directories.
def test_force_refuses_a_folder_that_is_not_a_run(tmp_path, texts, capsys):
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("keep me")
    assert main([*sinks_argv(NO_MODEL, texts, project), "--force"]) == 2
    assert "not a headhunt run" in one_line_error(capsys)
    assert (project / "notes.txt").read_text() == "keep me"

    a_file = tmp_path / "report.txt"
    a_file.write_text("keep me too")
    assert main([*sinks_argv(NO_MODEL, texts, a_file), "--force"]) == 2
    assert "is a file" in one_line_error(capsys)
    assert a_file.read_text() == "keep me too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project", "report.txt", "texts.jsonl"]

    odd = tmp_path / "odd"
    (tmp_path / "odd.partial").mkdir()
    (tmp_path / "odd.partial" / "thesis.tex").write_text("keep")
    assert main([*sinks_argv(NO_MODEL, texts, odd), "--force"]) == 2
    assert "not an unfinished headhunt run" in one_line_error(capsys)
    assert (tmp_path / "odd.partial" / "thesis.tex").is_file()


# 9. A record cut by a crash is dropped; new records never land on it.
def test_a_torn_last_record_is_dropped_on_resume(tmp_path):
    run = RunDir.open(tmp_path / "run", "demo", parameters={"a": 1})
    for i in range(3):
        run.append_record({"id": i})
    run.release()
    path = run.path("records.jsonl")
    path.write_bytes(path.read_bytes() + b'{"id": 3, "val')  # killed mid-write
    run = RunDir.open(tmp_path / "run", "demo", resume=True, parameters={"a": 1})
    assert [r["id"] for r in run.records()] == [0, 1, 2]
    run.append_record({"id": 3})
    assert [r["id"] for r in run.records()] == [0, 1, 2, 3]
    assert path.read_text().endswith('{"id": 3}\n')
    run.release()


# 10. One process at a time writes a run directory.
def test_a_live_run_is_locked(tmp_path, texts, capsys):
    out = tmp_path / "run"
    live = RunDir.open(out, "sinks")  # another process's run, as far as the lock can tell
    try:
        assert main([*sinks_argv(NO_MODEL, texts, out), "--resume"]) == 2
        assert "another headhunt process is writing" in one_line_error(capsys)
        assert main([*sinks_argv(NO_MODEL, texts, out), "--force"]) == 2
        assert "another headhunt process is writing" in one_line_error(capsys)
        assert (tmp_path / "run.partial").is_dir()
    finally:
        live.release()
    with pytest.raises(HeadhuntError, match="corrupt"):
        (tmp_path / "run.partial" / "parameters.json").write_text("{not json")
        RunDir.open(out, "sinks", resume=True, parameters={"a": 1})
    release_runs()


# 11. --nproc is bounded on a CPU.
def test_nproc_is_bounded_by_the_cpu_cores(tmp_path, texts, capsys):
    out = tmp_path / "run"
    assert main([*sinks_argv(NO_MODEL, texts, out), "--nproc", "99"]) == 2
    assert "exceeds the" in one_line_error(capsys) and not out.exists()


def _children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_workers_never_outlive_the_launcher(tiny_folder, tmp_path, texts, how):
    """Ctrl-C (SIGINT) or kill -9 of the launcher while its workers start stops every worker."""
    argv = [*sinks_argv(tiny_folder, texts, tmp_path / "run"), "--nproc", "2"]
    launcher = subprocess.Popen([sys.executable, "-m", "headhunt", *argv])
    deadline = time.monotonic() + 60
    while len(workers := _children(launcher.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) == 2
    launcher.send_signal(how)
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 15
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, workers))


# 15. Interrupted --force runs resume; failed runs leave no folders behind.
def test_an_interrupted_force_run_resumes(tiny_folder, tmp_path, texts, monkeypatch, capsys):
    import headhunt.heads.sinks as sinks

    out = tmp_path / "run"
    argv = sinks_argv(tiny_folder, texts, out)
    assert main(argv) == 0
    first = (out / "texts.jsonl").read_bytes()
    real, calls = sinks.analyze_text, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sinks, "analyze_text", interrupted)
    assert main([*argv, "--force"]) == 130
    assert "rerun with --resume" in capsys.readouterr().err
    assert (tmp_path / "run.partial").is_dir() and (out / "manifest.json").is_file()
    monkeypatch.setattr(sinks, "analyze_text", real)
    assert main([*argv, "--resume"]) == 0  # the advice works: the --force run continues
    assert "resuming: 1 of 3 texts already done" in capsys.readouterr().out
    assert (out / "texts.jsonl").read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "texts.jsonl"]


def test_a_failed_run_leaves_no_folders(tmp_path, texts, capsys):
    out = tmp_path / "a" / "b" / "run"
    assert main(sinks_argv(NO_MODEL, texts, out)) == 2
    one_line_error(capsys)
    assert not (tmp_path / "a").exists()


# 16. A rank that fails after the work is done ends the group in seconds; the work is kept.
def test_a_failing_rank_ends_the_group_and_keeps_finished_units(tiny_folder, tmp_path, texts):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(sinks_argv(tiny_folder, texts, one)) == 0
    partial = tmp_path / "two.partial"
    partial.mkdir()
    (partial / "scores.parquet").mkdir()  # rank 0 cannot write its scores once the texts are done
    argv = [*sinks_argv(tiny_folder, texts, two), "--nproc", "2", "--resume"]
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "headhunt", *argv], capture_output=True, text=True, timeout=300
    )
    # The write fails in one line naming the file (the atomic writer's error: exit 2).
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if line.startswith("headhunt")]
    assert len(err) == 1 and "scores.parquet" in err[0], err
    # Both ranks finished their texts; rank 1 waits for rank 0 and is stopped soon after it fails.
    assert time.monotonic() - t0 < 120
    assert len((partial / "texts.jsonl").read_text().splitlines()) == 3
    (partial / "scores.parquet").rmdir()
    assert main([*argv[:-3], "--resume"]) == 0
    for name in ("texts.jsonl", "scores.parquet", "summary.json", "layers.csv"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
