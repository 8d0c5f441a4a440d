"""Circuit finding with discrete sparse autoencoders (O'Neill & Bui 2024), checked against
activation patching and attribution patching on the model at hand.

Modules: :mod:`~headhunt.sae.tasks` (prompt pairs), :mod:`~headhunt.sae.activations` (per-head
outputs), :mod:`~headhunt.sae.discrete` (the SAE), :mod:`~headhunt.sae.scoring` (node and edge
scores), :mod:`~headhunt.sae.patching` (ground truth, EAP), :mod:`~headhunt.sae.roc`,
:mod:`~headhunt.sae.circuits` (trials), :mod:`~headhunt.sae.report` (what a run reports; the
run is the ``circuits`` method), :mod:`~headhunt.sae.planted` (a model with a known circuit).
"""

from headhunt.sae.activations import head_outputs
from headhunt.sae.circuits import CircuitConfig, run_trials
from headhunt.sae.discrete import DiscreteSAE, SAEConfig, train_sae
from headhunt.sae.patching import activation_patching, attribution_patching
from headhunt.sae.scoring import circuit, edge_head_scores, edge_scores, node_scores
from headhunt.sae.tasks import make_pairs, read_task_file

__all__ = [
    "CircuitConfig",
    "DiscreteSAE",
    "SAEConfig",
    "activation_patching",
    "attribution_patching",
    "circuit",
    "edge_head_scores",
    "edge_scores",
    "head_outputs",
    "make_pairs",
    "node_scores",
    "read_task_file",
    "run_trials",
    "train_sae",
]
