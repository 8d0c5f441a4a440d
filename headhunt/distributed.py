"""Data parallelism over units of work with torch.distributed (NCCL on GPUs, gloo on CPU).

``headhunt METHOD --nproc N`` (every method with units of work) relaunches itself in N
processes with the environment ``torchrun --standalone`` gives (you may also start it with
``torchrun`` yourself). Each process holds one model replica (on ``cuda:LOCAL_RANK`` when there
are GPUs), takes every N-th unit of work of the single-process plan (a whole batch, a text, a
grid cell: never a different batching than one process would use), keeps its finished units in
its own shard file (so resuming works per shard), and rank 0 gathers them, in the
single-process order, into the one run directory (see ``headhunt.engine.RunContext``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:
    from headhunt.rundir import RunDir

T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    """This process's place in the group (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def share(self, units: list[T]) -> list[T]:
        """This rank's units: every world-th one, starting at its rank."""
        return units[self.rank :: self.world]

    def device(self, requested: str) -> str:
        """The device for this rank's replica: its own GPU when GPUs are asked for."""
        if requested in ("auto", "cuda") and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        return requested

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (on every rank)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def close(self, finished: bool = False) -> None:
        """Leave the group. ``finished``: every rank got through the same collectives, so they
        meet at a barrier first. A worker of :func:`launch` then keeps the group: it ends with
        ``os._exit`` (``headhunt/__main__.py``), skipping the teardown in which a rank whose
        peer already closed its connections can abort in gloo (seen twice in full-suite runs,
        after complete runs, with the barrier alone)."""
        if self.active and torch.distributed.is_initialized():
            if finished:
                torch.distributed.barrier()
                if os.environ.get("HEADHUNT_RANK_ERRORS"):
                    return
            torch.distributed.destroy_process_group()


def init() -> Dist:
    """Join the process group that torchrun set up in the environment, if any."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not torch.distributed.is_initialized():
        # The same choice on every rank: NCCL when each local process can have its own GPU.
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        gpu = torch.cuda.is_available() and torch.cuda.device_count() >= per_node
        if gpu:
            torch.cuda.set_device(local)
        torch.distributed.init_process_group(backend="nccl" if gpu else "gloo")
    return Dist(rank=rank, world=world, local_rank=local)


def launch(argv: list[str], nproc: int) -> int:
    """Run ``headhunt ARGV`` in ``nproc`` processes on this machine, with the environment
    ``torchrun --standalone`` would give them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT). When one fails, the others get a few seconds to finish or fail on their own
    (every rank usually meets the same bad input), then are stopped: they would wait for it in
    the next collective. Ctrl-C, or the launcher's own death, stops every worker. Returns rank
    0's exit status, else the first failure's. Errors come out in one line: rank 0's, else the
    first failed rank's (no launcher traceback)."""
    import signal
    import socket
    import tempfile
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    errors = Path(tempfile.mkdtemp(prefix="headhunt-ranks-"))
    base = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "HEADHUNT_RANK_ERRORS": str(errors),
    }
    procs: list[subprocess.Popen] = []
    try:
        for r in range(nproc):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "headhunt", *argv],
                    env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                    preexec_fn=_die_with_parent,
                )
            )
        failed_at = None
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S:
                break
            time.sleep(0.1)
    except BaseException:  # Ctrl-C (or anything else) in the launcher: no worker outlives it
        _stop(procs, signal.SIGINT, 5)
        shutil.rmtree(errors, ignore_errors=True)
        raise
    _stop(procs, signal.SIGTERM, 10)
    codes = [p.wait() for p in procs]
    lines = {int(f.stem): f.read_text().strip() for f in errors.glob("*.txt")}
    shutil.rmtree(errors, ignore_errors=True)
    failed = [c for c in codes if c != 0]
    if codes[0] not in (0, -signal.SIGTERM):
        return codes[0]
    code = next((c for c in failed if c != -signal.SIGTERM), failed[0] if failed else 0)
    if code and lines:  # rank 0 was stopped before it could say why: say it for the rank
        print(lines[min(lines)], file=sys.stderr)
    return code


FAILURE_GRACE_S = 3.0


def _die_with_parent() -> None:
    """In a worker, before exec: ask Linux to kill it when the launcher dies (even by kill -9)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except Exception:  # not Linux: Ctrl-C handling in the launcher still applies
        pass


def _stop(procs: list[subprocess.Popen], sig: int, wait_s: float) -> None:
    """Send ``sig`` to the workers still running, then kill whichever has not exited in
    ``wait_s`` seconds."""
    import time

    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    deadline = time.monotonic() + wait_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def report_rank_error(line: str) -> None:
    """A worker's one-line error, kept for the launcher (only rank 0 prints its own)."""
    folder, rank = os.environ.get("HEADHUNT_RANK_ERRORS"), os.environ.get("RANK")
    if folder and rank is not None:
        with contextlib.suppress(OSError):
            (Path(folder) / f"{int(rank)}.txt").write_text(line + "\n")


def cpu_limit() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def strip_option(argv: list[str], name: str) -> list[str]:
    """``argv`` without ``name VALUE`` / ``name=VALUE``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def launch_if_asked(
    nproc: int, argv: list[str], *, device: str = "auto", device_map: str | None = None
) -> int | None:
    """Relaunch ``headhunt ARGV`` (without --nproc) in ``nproc`` processes when that is above 1
    and this process is not already one of a group; returns the group's exit status, or None
    when this process is to do the work itself."""
    from headhunt.errors import HeadhuntError

    if nproc < 1:
        raise HeadhuntError(f"--nproc must be at least 1, got {nproc}")
    if nproc == 1 or "WORLD_SIZE" in os.environ:
        return None
    if device_map:
        raise HeadhuntError(
            "--nproc and --device-map do not combine (one model replica per process "
            "or one model over all GPUs)"
        )
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    on_gpus = gpus and device in ("auto", "cuda")
    if on_gpus and nproc > gpus:
        raise HeadhuntError(
            f"--nproc {nproc} needs {nproc} GPUs (one each); {gpus} visible "
            "(use fewer processes, or --device cpu)"
        )
    cores = cpu_limit()
    if not on_gpus and nproc > cores:
        raise HeadhuntError(
            f"--nproc {nproc} exceeds the {cores} CPU cores this process may use "
            "(each process holds a model replica)"
        )
    return launch(strip_option(argv, "--nproc"), nproc)


def open_run(dist: Dist, out: str, method: str, **kwargs: Any) -> RunDir:
    """``RunDir.open`` on rank 0; the other ranks get a ``RunDir`` on the same work folder
    (rank 0 owns its lifecycle). When rank 0 cannot open it, rank 0 raises the one-line error
    and the others exit with status 2 quietly."""
    from headhunt.errors import HeadhuntError
    from headhunt.rundir import RunDir

    run, failure = None, None
    if dist.is_main:
        try:
            run = RunDir.open(out, method, **kwargs)
        except HeadhuntError as e:
            if not dist.active:
                raise
            failure = str(e)
    failure, work, complete = dist.gather((failure, run and str(run.work), run and run.complete))[0]
    if failure:
        if dist.is_main:
            raise HeadhuntError(failure)
        raise SystemExit(2)
    if run is None:
        final = Path(out).expanduser().resolve()
        run = RunDir(out=final, work=Path(work), method=method, complete=bool(complete))
    return run


def shard_name(dist: Dist, name: str) -> str:
    """This rank's records file: ``cells.jsonl`` in one process, ``cells.rank1.jsonl`` in a
    group."""
    if not dist.active:
        return name
    stem, _, ext = name.rpartition(".")
    return f"{stem}.rank{dist.rank}.{ext}"


def _shard_files(run: RunDir, name: str) -> list[Path]:
    stem, _, ext = name.rpartition(".")
    return [run.work / name, *sorted(run.work.glob(f"{stem}.rank*.{ext}"))]


def shard_records(run: RunDir, name: str) -> list[dict[str, Any]]:
    """Every record saved so far under ``name``, by one process or by any rank's shard."""
    out: list[dict[str, Any]] = []
    for path in _shard_files(run, name):
        if path.is_file():
            out += run.records(path.name)
    return out


def merge_records(run: RunDir, name: str, records: list[dict[str, Any]]) -> None:
    """Replace ``name`` and its rank shards with ``records`` in the given (single-process)
    order, so the run directory does not depend on how the work was split or resumed."""
    from headhunt.atomic import write_file

    # The merged file is in place before any shard goes: a crash in between leaves records
    # twice (each read keys them), never none.
    write_file(run.work / name, records)
    for path in _shard_files(run, name)[1:]:
        path.unlink(missing_ok=True)
