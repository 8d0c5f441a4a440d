"""Cached loaders: the only place the app touches run directories and models.

Run data is cached with ``st.cache_data`` keyed by the run's path and its manifest's mtime (a
rewritten run is read again); models with ``st.cache_resource`` (loaded once per process and
shared by every session). Everything here calls :mod:`headhunt.inspect` or the library.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import streamlit as st

from headhunt import inspect as hi
from headhunt.rundir import MANIFEST, Run, load_run
from headhunt.scores import HeadScores

ENV_RUNS = "HEADHUNT_RUNS"


def default_runs_root() -> str:
    """``--runs DIR`` after ``streamlit run app.py --``, else $HEADHUNT_RUNS, else ./runs."""
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--runs" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--runs="):
            return arg.split("=", 1)[1]
    return os.environ.get(ENV_RUNS, "runs")


@st.cache_data(ttl=10, show_spinner=False)
def scan(root: str) -> list[hi.RunEntry]:
    """The run catalog (re-scanned at most every 10 s, or on "Reload runs")."""
    return hi.scan_runs(root)


def _stamp(path: Path) -> float:
    try:
        return (path / MANIFEST).stat().st_mtime
    except OSError:
        return 0.0


def run(path: str | Path) -> Run:
    return _run(str(path), _stamp(Path(path)))


@st.cache_data(show_spinner=False, max_entries=64)
def _run(path: str, stamp: float) -> Run:
    return load_run(path)


def scores(path: str | Path) -> HeadScores:
    """The run's scores (raises HeadhuntError with a clear message when unreadable)."""
    return _scores(str(path), _stamp(Path(path)))


@st.cache_data(show_spinner="reading scores ...", max_entries=32)
def _scores(path: str, stamp: float) -> HeadScores:
    return hi.read_scores(load_run(path))


def views(path: str | Path) -> list[hi.MetricView]:
    return hi.metric_views(scores(path))


def spread(path: str | Path, layer: int, head: int):
    return _spread(str(path), _stamp(Path(path)), layer, head)


@st.cache_data(show_spinner=False, max_entries=256)
def _spread(path: str, stamp: float, layer: int, head: int):
    return hi.head_spread(load_run(path), layer, head)


def needle_trials(path: str | Path, layer: int, head: int):
    return _needle_trials(str(path), _stamp(Path(path)), layer, head)


@st.cache_data(show_spinner=False, max_entries=256)
def _needle_trials(path: str, stamp: float, layer: int, head: int):
    return hi.needle_trials(load_run(path), layer, head)


def circuit(path: str | Path) -> hi.CircuitView:
    return _circuit(str(path), _stamp(Path(path)))


@st.cache_data(show_spinner="reading the circuits run ...", max_entries=16)
def _circuit(path: str, stamp: float) -> hi.CircuitView:
    return hi.circuit_view(load_run(path))


@st.cache_resource(show_spinner="loading the model (once per server) ...", max_entries=2)
def model(spec: str):
    """A model, loaded once and shared by every session of this server."""
    from headhunt.probes import load_model

    return load_model(spec)


@st.cache_resource
def model_lock(spec: str) -> threading.Lock:
    """Hooks are installed on the shared model object: two sessions computing at once would
    see each other's masks, so on-demand computations on one model take turns."""
    return threading.Lock()
