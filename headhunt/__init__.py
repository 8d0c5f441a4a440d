"""headhunt: find the attention heads that make a language model recall, and test what they do.

The public API gathers the pieces most users need::

    import headhunt as hh
    model = hh.load_model("smollm2-135m")
    scores = hh.score_retrieval(model, hh.RetrievalConfig(lengths=[500, 1000]))
    scores.top("retrieval_score", 10)

and one call makes a whole run directory of any method (in-memory model, nothing saved first),
with the same config class::

    run = hh.run("sinks", hh.SinksConfig(n_texts=2), model=model, out="runs/sinks")
    run.scores().top("hidden_sink_mass", 5)
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# Lazy attributes: `import headhunt` stays fast (no torch) for the CLI's --help and the app.
_EXPORTS = {
    "HeadhuntError": "headhunt.errors",
    "run": "headhunt.engine",
    "ModelSpec": "headhunt.engine",
    "methods": "headhunt.methods",
    "RunDir": "headhunt.rundir",
    "load_run": "headhunt.rundir",
    "find_runs": "headhunt.rundir",
    "HeadScores": "headhunt.scores",
    "load_model": "headhunt.probes.hooked",
    "HookedModel": "headhunt.probes.hooked",
    "AttentionHook": "headhunt.probes.attention",
    "RetrievalConfig": "headhunt.heads.configs",
    "SinksConfig": "headhunt.heads.configs",
    "CalibrateConfig": "headhunt.heads.configs",
    "NgramConfig": "headhunt.heads.configs",
    "AblateConfig": "headhunt.methods.ablate",
    "MQARConfig": "headhunt.methods.mqar",
    "PruneConfig": "headhunt.methods.prune",
    "KVEvalConfig": "headhunt.heads.configs",
    "CircuitsConfig": "headhunt.sae.configs",
    "ProbeRunConfig": "headhunt.methods.probe",
    "TaskHeadsConfig": "headhunt.methods.taskheads",
    "score_retrieval": "headhunt.heads.retrieval",
    "mask_heads": "headhunt.heads.interventions.masking",
}


def __getattr__(name: str) -> Any:
    if name == "methods":
        return import_module("headhunt.methods")
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'headhunt' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
