"""The import rules that keep data flowing one way: model -> capture (probes/) -> analyzer
(heads/, sae/) -> run directory -> CLI, app, notebooks.

Read from the source files with ``ast`` (imports inside functions count too), so a rule holds
whether or not a test imports the module. Each rule also fails on a planted violation (the
last tests), so a checker that sees nothing cannot pass.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

# Core types every layer may use: the error, Head/HeadScores, the one atomic file writer, the
# one JSONL reader, the config base (every layer's config is a method's config), the lazy
# package attributes.
CORE = ("headhunt.errors", "headhunt.scores", "headhunt.atomic", "headhunt.reading",
        "headhunt.config", "headhunt.lazy")  # fmt: skip
KERNELS = ("headhunt.kernels",)
CAPTURE = ("headhunt.probes",)  # model loading, the hooked model, attention hooks, capture
# Input builders (needle prompts, task items, token sequences): plain data, below capture.
INPUTS = ("headhunt.heads.inputs", "headhunt.sae.prompt_pairs")
ANALYZERS = ("headhunt.heads", "headhunt.sae")
# The command line: the only place argparse is imported.
CLI = ("headhunt.cli", "headhunt.commands")
APP = ("headhunt.app",)
APP_DOOR = ("headhunt.commands.app",)  # `headhunt app` starts it

# Modules that break a rule today, each with its reason; the list only shrinks.
KNOWN: set[tuple[str, str]] = set()


def within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


# (who, may import only from, what the rule says)
ALLOWED: list[tuple[tuple[str, ...], tuple[str, ...], str]] = [
    (CORE, CORE, "core types import nothing of headhunt but core types"),
    (
        INPUTS,
        (*CORE, *INPUTS),
        "input builders import nothing of headhunt but core types and input builders",
    ),
    (KERNELS, (*CORE, *KERNELS), "kernels import no other layer"),
    (
        CAPTURE,
        (*CORE, *KERNELS, *CAPTURE, *INPUTS),
        "model/capture code imports no analyzer or run layer",
    ),
    (
        ANALYZERS,
        (*CORE, *KERNELS, *CAPTURE, *ANALYZERS),
        "analyzers import neither the CLI nor the run directory",
    ),
]


def module_names() -> dict[str, Path]:
    """Every module of the package, named as it installs (pyproject's ``package-dir``)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    out = {}
    for package, folder in config["package-dir"].items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            out[name] = path
        for sub in sorted(p for p in (ROOT / folder).iterdir() if (p / "__init__.py").is_file()):
            for path in sorted(sub.glob("*.py")):
                stem = "" if path.stem == "__init__" else f".{path.stem}"
                out[f"{package}.{sub.name}{stem}"] = path
    return out


def imports(source: str, module: str, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, module imported) for every import in ``source``; relative imports are resolved
    against ``module``. ``from a import b`` yields ``a.b`` too (b may be a submodule)."""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def violations(sources: dict[str, str], packages: frozenset[str] = frozenset()) -> list[str]:
    """The broken import rules of ``sources`` (module name -> source text), one line each."""
    found: dict[tuple[str, int, str], str] = {}  # one line per (import statement, rule)
    for module, source in sources.items():
        for line, target in imports(source, module, module in packages):
            for rule in broken_rules(module, target):
                found.setdefault((module, line, rule), f"{module}:{line} imports {target}: {rule}")
    return list(found.values())


def broken_rules(module: str, target: str) -> Iterator[str]:
    if any(module == m and within(target, (t,)) for m, t in KNOWN):
        return
    if target == "argparse" and not within(module, CLI):
        yield f"argparse only in the CLI {CLI}"
    if within(target, APP) and not within(module, (*APP, *APP_DOOR)):
        yield "nothing imports the app but its command"
    if not within(target, ("headhunt",)):
        return
    for who, allowed, rule in ALLOWED:
        # `from headhunt import scores` names the package first: a parent of an allowed
        # module passes here, its imported member is checked on its own.
        parent = any(within(a, (target,)) for a in allowed)
        if within(module, who) and not within(target, allowed) and not parent:
            yield rule


def test_the_package_keeps_its_import_rules():
    names = module_names()
    sources = {name: path.read_text() for name, path in names.items()}
    packages = frozenset(n for n, p in names.items() if p.name == "__init__.py")
    assert len(sources) > 40  # the walk found the package
    assert violations(sources, packages) == []


def package_imports() -> set[tuple[str, str]]:
    """(module, module it imports) over the whole package."""
    return {
        (name, target)
        for name, path in module_names().items()
        for _, target in imports(path.read_text(), name, path.name == "__init__.py")
    }


def test_known_exceptions_are_still_needed():
    """An exception that no longer happens must leave KNOWN (the list only shrinks)."""
    seen = package_imports()
    stale = [(m, t) for m, t in KNOWN if not any(s == m and within(x, (t,)) for s, x in seen)]
    assert stale == [], f"remove from KNOWN: {stale}"


def test_every_name_imported_from_headhunt_exists():
    """``from headhunt.x import name`` inside a function runs only when the function does: a
    name moved or removed elsewhere must not wait for that call to fail."""
    import importlib

    missing = []
    for module, path in module_names().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.ImportFrom) and (node.module or "").startswith("headhunt")
            ):
                continue
            target = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(target, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        missing.append(f"{module}:{node.lineno} {node.module}.{alias.name}")
    assert missing == []


def test_every_declared_dependency_is_imported():
    """A runtime dependency in pyproject.toml that no module imports is dead weight."""
    from importlib.metadata import packages_distributions

    def norm(dist: str) -> str:
        return re.split(r"[<>=!~ \[;]", dist, maxsplit=1)[0].lower().replace("_", "-")

    declared = {
        norm(d)
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    tops: dict[str, set[str]] = {}
    for top, dists in packages_distributions().items():
        for dist in dists:
            tops.setdefault(norm(dist), set()).add(top)
    imported = {target.split(".")[0] for _, target in package_imports()}
    assert sorted(d for d in declared if not tops.get(d, set()) & imported) == []


@pytest.mark.parametrize(
    ("module", "source", "message"),
    [
        ("headhunt.heads.sinks", "import argparse", "argparse only in the CLI"),
        ("headhunt.heads.sinks", "def f():\n    from headhunt.rundir import RunDir", "run dir"),
        ("headhunt.sae.scoring", "from headhunt.commands import common", "neither the CLI"),
        (
            "headhunt.probes.capture",
            "from headhunt.heads.interventions.masking import HeadMask",
            "no analyzer",
        ),
        ("headhunt.probes.hooked", "import headhunt.sae.roc", "no analyzer"),
        ("headhunt.probes.loading", "from headhunt import rundir", "no analyzer or run"),
        ("headhunt.kernels.api", "from headhunt.probes import hooked", "kernels import no"),
        ("headhunt.kernels.api", "from ..probes import hooked", "kernels import no"),
        ("headhunt.inspect", "from headhunt.app import views", "nothing imports the app"),
        ("headhunt.scores", "from headhunt.probes.hooked import HookedModel", "core"),
        (
            "headhunt.heads.inputs.needles",
            "from headhunt.scores import Head\nimport headhunt.probes",
            "input builders",
        ),
    ],
)
def test_the_checker_sees_a_planted_violation(module, source, message):
    (found,) = violations({module: source})
    assert message in found and found.startswith(f"{module}:")


def test_the_checker_lets_allowed_imports_pass():
    allowed = {
        "headhunt.heads.sinks": "from headhunt.probes.capture import capture_qk\n"
        "from headhunt.scores import HeadScores\nfrom headhunt.kernels import api",
        "headhunt.probes.linear": "from headhunt.scores import HeadScores",
        "headhunt.probes.targets": "from headhunt.heads.inputs.needles import NEEDLES",
        "headhunt.probes.capture": "from headhunt import scores",
        "headhunt.kernels.api": "from .reference import attention_stats_torch",
        "headhunt.commands.app": "import argparse\nfrom headhunt.app import main",
        "headhunt.app.views": "from headhunt.app.data import load",
        "headhunt.cli": "import argparse\nfrom headhunt.heads.sinks import analyze_sinks",
    }
    assert violations(allowed) == []
