"""The method registry: name -> the module and class that implement it.

Adding a method is one module here (a :class:`~headhunt.methods.base.Method` subclass and its
config) and one line in :data:`METHODS`; the CLI subcommand, ``headhunt.run``, resume and
``--nproc`` come from the engine, and the dashboard's views from the method's declarations
(its ``metric``, ``spread`` and ``panels``).
"""

from __future__ import annotations

from importlib import import_module

from headhunt.errors import HeadhuntError
from headhunt.methods.base import Method, MethodConfig, option

METHODS: dict[str, str] = {
    "retrieval": "headhunt.methods.retrieval:Retrieval",
    "ablate": "headhunt.methods.ablate:Ablate",
    "sinks": "headhunt.methods.sinks:Sinks",
    "calibrate": "headhunt.methods.calibrate:Calibrate",
    "ngram": "headhunt.methods.ngram:Ngram",
    "mqar": "headhunt.methods.mqar:MQAR",
    "prune": "headhunt.methods.prune:Prune",
    "kv-eval": "headhunt.methods.kv_eval:KVEval",
    "circuits": "headhunt.methods.circuits:Circuits",
    "probe": "headhunt.methods.probe:Probe",
    "taskheads": "headhunt.methods.taskheads:TaskHeads",
}


def get(name: str) -> Method:
    """The registered method ``name``."""
    if name not in METHODS:
        raise HeadhuntError(f"unknown method {name!r} (known: {', '.join(METHODS)})")
    module, cls = METHODS[name].split(":")
    return getattr(import_module(module), cls)()


def find(name: str) -> Method | None:
    """The registered method ``name``, or None (a run of a method this version does not know
    is still shown: its scores, without a method's own views)."""
    return get(name) if name in METHODS else None


__all__ = ["METHODS", "Method", "MethodConfig", "find", "get", "option"]
