"""Circuit finding with discrete sparse autoencoders (O'Neill & Bui 2024), checked against
activation patching and attribution patching on the model at hand.

Modules: :mod:`~headhunt.sae.prompt_pairs` (prompt pairs), :mod:`~headhunt.sae.activations` (per-head
outputs), :mod:`~headhunt.sae.discrete` (the SAE), :mod:`~headhunt.sae.scoring` (node and edge
scores), :mod:`~headhunt.sae.patching` (ground truth, EAP), :mod:`~headhunt.sae.roc`,
:mod:`~headhunt.sae.circuits` (trials), :mod:`~headhunt.sae.report` (what a run reports; the
run is the ``circuits`` method), :mod:`~headhunt.sae.planted` (a model with a known circuit).
"""

from headhunt.lazy import lazy_attributes

# Lazy attributes: importing a torch-free module of the package (``headhunt.sae.configs``, the
# circuits method's config, read by the CLI's --help and the dashboard) loads no torch.
_EXPORTS = {
    "head_outputs": "headhunt.sae.activations",
    "CircuitConfig": "headhunt.sae.configs",
    "run_sae_trials": "headhunt.sae.circuits",
    "DiscreteSAE": "headhunt.sae.discrete",
    "SAEConfig": "headhunt.sae.discrete",
    "train_sae": "headhunt.sae.discrete",
    "activation_patching": "headhunt.sae.patching",
    "attribution_patching": "headhunt.sae.patching",
    "circuit": "headhunt.sae.scoring",
    "edge_head_scores": "headhunt.sae.scoring",
    "edge_scores": "headhunt.sae.scoring",
    "node_scores": "headhunt.sae.scoring",
    "make_pairs": "headhunt.sae.prompt_pairs",
    "read_task_file": "headhunt.sae.prompt_pairs",
}


__getattr__ = lazy_attributes(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
