"""Fixtures of the dashboard tests (the run builders live in run_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_fixtures import make_runs


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory, tiny_folder) -> Path:
    """Four valid runs on the tiny model folder, and three broken run folders."""
    return make_runs(tmp_path_factory.mktemp("runs"), str(tiny_folder))
