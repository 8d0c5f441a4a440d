"""Project files cite papers and public repositories, never files outside the repository (the
developers' own notes, a machine's paths): a reader of a clone must be able to follow every
reference. Each rule also fails on a planted violation, so a checker that sees nothing cannot
pass."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
# A path into the developers' notes beside the checkout, or into a development machine.
OUTSIDE = re.compile(r"(?<![\w/.])(?:\.\./)?shared/[\w./-]+|\b(?:ANCHORS|NOTES)\.md\b|/work/\w")
SUFFIXES = {".py", ".md", ".toml", ".sh", ".ipynb", "Makefile"}


def outside_references(text: str) -> list[str]:
    """The references in ``text`` to files outside the repository."""
    return OUTSIDE.findall(text)


def project_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        names = out.splitlines()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    here = Path(__file__).resolve()
    return [
        ROOT / n
        for n in names
        if (Path(n).suffix in SUFFIXES or Path(n).name in SUFFIXES)
        and (ROOT / n).resolve() != here
        and "benchmarks/results" not in n  # raw logs as the machines printed them
    ]


def test_no_project_file_cites_a_file_outside_the_repository():
    bad = {}
    for path in project_files():
        if not path.is_file():
            continue
        found = outside_references(path.read_text(errors="replace"))
        if found:
            bad[str(path.relative_to(ROOT))] = found[:3]
    assert not bad, f"references to files outside the repository: {bad}"


@pytest.mark.parametrize(
    "text",
    [
        "faithful to the reference (shared/ANCHORS.md)",
        "see ../shared/NOTES.md",
        "the ANCHORS.md pitfall",
        "copy it to /work/main/.stage first",
    ],
)
def test_planted_outside_references_are_found(text):
    assert outside_references(text)


@pytest.mark.parametrize(
    "text",
    ["HazyResearch/zoology, zoology/data/multiquery_ar.py", "arXiv 2312.04927", "a shared cache"],
)
def test_citations_of_public_sources_pass(text):
    assert not outside_references(text)
