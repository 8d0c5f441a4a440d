"""Data parallelism over trials and texts with torch.distributed (NCCL on GPUs, gloo on CPU).

``headhunt retrieval --nproc N`` relaunches itself under ``torch.distributed.run`` (you may also
start it with ``torchrun`` yourself). Each process holds one model replica (on ``cuda:LOCAL_RANK``
when there are GPUs), takes every N-th unit of work of the single-process plan, keeps its finished
units in its own shard file (so resuming works per shard), and the results are gathered on rank 0,
which writes the one run directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

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

    def close(self) -> None:
        if self.active and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def init() -> Dist:
    """Join the process group that torchrun set up in the environment, if any."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not torch.distributed.is_initialized():
        gpu = torch.cuda.is_available() and torch.cuda.device_count() > local
        if gpu:
            torch.cuda.set_device(local)
        torch.distributed.init_process_group(backend="nccl" if gpu else "gloo")
    return Dist(rank=rank, world=world, local_rank=local)


def launch(argv: list[str], nproc: int) -> int:
    """Run ``headhunt ARGV`` in ``nproc`` processes under torch.distributed.run."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "headhunt",
        *argv,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.call(cmd, env=env)


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
