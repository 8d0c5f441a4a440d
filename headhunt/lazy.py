"""Lazy package attributes. A package whose public names live in modules that import torch
gives them on first use, so that importing one of its torch-free modules (a method's config,
read by the CLI's ``--help`` and the dashboard) loads no torch. A core module: it imports
nothing of headhunt."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_attributes(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package`` that imports each name of ``exports``
    (name -> the module defining it) when it is first asked for."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
