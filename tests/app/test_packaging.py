"""`make setup` builds the package with setuptools: the build must print no warning of the
project's own making (issue 18.17: package-data folders, the license table), and the wheel must
carry every data file the analyzers read."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_wheel_builds_without_warnings_and_carries_the_data(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    log = out.stdout + out.stderr
    assert "Warning" not in log, log[-3000:]
    (wheel,) = tmp_path.glob("headhunt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {
        str(p.relative_to(ROOT)).replace("heads/", "headhunt/heads/", 1)
        for p in (ROOT / "heads" / "data").rglob("*")
        if p.is_file()
    }
    assert data and data <= names, sorted(data - names)[:5]
