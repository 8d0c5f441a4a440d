"""Every notebook in notebooks/ executes top to bottom (nbclient, a fresh kernel each)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "notebooks"
NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
TIMEOUT = int(os.environ.get("HEADHUNT_NOTEBOOK_TIMEOUT", "900"))  # per cell, seconds
# Threads of the notebook kernels. The notebooks use small models and short prompts, where one
# thread loses little; on a CPU shared with other jobs, two torch threads fighting for cores
# made training the MQAR model ten times slower (wall clock) than one.
THREADS = os.environ.get("HEADHUNT_NOTEBOOK_THREADS", "1")


def test_the_notebooks_are_there_and_committed_without_outputs():
    import nbformat

    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05"]
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        for cell in book.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, path.name


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    book = nbformat.read(path, as_version=4)
    # Run in a scratch folder: a notebook that writes files leaves nothing in the checkout.
    client = NotebookClient(
        book, timeout=TIMEOUT, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    env = {**os.environ, "OMP_NUM_THREADS": THREADS, "MKL_NUM_THREADS": THREADS}
    try:
        client.execute(env=env)  # raises CellExecutionError with the failing cell's traceback
    finally:
        # The executed copy (outputs included) is kept under artifacts/ (git-ignored) for CI.
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(book, ARTIFACTS / path.name)
    errors = [
        o
        for c in book.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.get("output_type") == "error"
    ]
    assert not errors
