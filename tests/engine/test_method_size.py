"""Issue 25: no method's ``run`` is over 80 lines (what it computes lives in the analyzers and in
named helpers; the engine does the bookkeeping)."""

from __future__ import annotations

import ast
from pathlib import Path

METHODS = Path(__file__).parents[2] / "headhunt" / "methods"
LIMIT = 80


def long_runs(source: str, limit: int = LIMIT) -> list[str]:
    """``Class.run (N lines)`` for every ``run`` method of ``source`` over ``limit`` lines."""
    out = []
    for cls in ast.walk(ast.parse(source)):
        if isinstance(cls, ast.ClassDef):
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "run":
                    n = fn.end_lineno - fn.lineno + 1
                    if n > limit:
                        out.append(f"{cls.name}.run ({n} lines)")
    return out


def test_no_method_run_is_over_80_lines():
    files = sorted(METHODS.glob("*.py"))
    assert len(files) > 8
    assert [f"{p.name}: {r}" for p in files for r in long_runs(p.read_text())] == []


def test_the_check_sees_a_long_run():
    body = "\n".join(f"        x{i} = {i}" for i in range(LIMIT))
    assert long_runs(f"class M:\n    def run(self):\n{body}\n") == [f"M.run ({LIMIT + 1} lines)"]
