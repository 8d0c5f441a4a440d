"""Long on-demand computations (interventions) in a background thread of the server.

Streamlit stops a page's script on every click, so work done inside it is lost when the user
changes page or run mid-way. A :class:`Job` runs in its own thread instead and is kept in the
session (``st.session_state``), keyed by everything its result depends on (run, heads,
intervention, prompt settings): leaving and coming back finds it running or finished, and a
page shows a result only under the settings that produced it.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from headhunt.errors import HeadhuntError

KEEP = 8  # finished jobs kept per session (older ones are dropped, oldest first)


@dataclass
class Job:
    """One computation: its key, its steps, where it is, and its result or error."""

    key: Hashable
    steps: list[str]
    done: int = 0
    result: Any = None
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    @property
    def running(self) -> bool:
        return self.finished is None

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def step(self) -> None:
        """Mark the current step as done (called by the computation between its steps)."""
        self.done += 1

    @property
    def status(self) -> str:
        if not self.running:
            return f"done in {self.elapsed:.1f} s"
        now = self.steps[min(self.done, len(self.steps) - 1)]
        return f"step {self.done + 1} of {len(self.steps)}: {now} ({self.elapsed:.0f} s so far)"


def _jobs(name: str) -> dict[Hashable, Job]:
    return st.session_state.setdefault(f"_jobs::{name}", {})


def find(name: str, key: Hashable) -> Job | None:
    """The job computed (or computing) for exactly this key, if any."""
    return _jobs(name).get(key)


def running_elsewhere(name: str, key: Hashable) -> Job | None:
    """A job of this kind still running for other settings (its result will wait for them)."""
    return next((j for k, j in _jobs(name).items() if k != key and j.running), None)


def start(name: str, key: Hashable, steps: list[str], fn: Callable[[Job], Any]) -> Job:
    """Run ``fn(job)`` in a thread; its return value becomes ``job.result``, a HeadhuntError
    its one-line ``job.error`` (any other error: its type and message)."""
    job = Job(key, steps)
    jobs = _jobs(name)
    jobs.pop(key, None)
    jobs[key] = job
    for old in [k for k, j in jobs.items() if not j.running][:-KEEP]:
        del jobs[old]

    def work() -> None:
        try:
            job.result = fn(job)
        except HeadhuntError as e:
            job.error = str(e)
        except Exception as e:  # the page must report it, not lose it in a thread
            job.error = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        finally:
            job.finished = time.monotonic()

    threading.Thread(target=work, name=f"headhunt-{name}", daemon=True).start()
    return job
