"""The planted circuit: the whole SAE method must rank the planted heads first."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headhunt.sae import activations, patching, roc
from headhunt.sae.circuits import NODE_RULES, CircuitConfig, run_sae_trials
from headhunt.sae.planted import planted_model


@pytest.fixture(scope="module")
def planted():
    return planted_model()


def test_the_planted_model_is_what_it_claims(planted):
    pairs = planted.pairs(8, seed=0)
    acts = activations.head_outputs(planted.model, pairs.positive + pairs.negative, progress=False)
    n, H = len(pairs), planted.model.n_heads
    diff = (acts[:n] - acts[n:]).norm(dim=-1).max(0).values
    for i in range(acts.shape[1]):
        if divmod(i, H) in planted.heads:
            assert diff[i] > 0.1  # the planted heads see the marker
            assert acts[n:, i].abs().max() == 0  # and write nothing without it
        else:
            assert diff[i] < 1e-5  # every other head computes the same on both prompts


def test_node_and_edge_scores_rank_the_planted_heads_first(planted):
    pairs = planted.pairs(24, seed=0)
    acts = activations.head_outputs(planted.model, pairs.positive + pairs.negative, progress=False)
    res = patching.activation_patching(planted.model, pairs, progress=False)
    truth = roc.binarize_truth(res.effect.numpy(), top=len(planted.heads)).ravel()
    H = planted.model.n_heads
    assert {divmod(int(i), H) for i in np.flatnonzero(truth)} == set(planted.heads)
    eap = patching.attribution_patching(planted.model, pairs, per_pair=True).flatten(1).numpy()
    config = CircuitConfig(trials=3, epochs=300, seed=0)  # defaults, fewer epochs for CI
    trials = run_sae_trials(acts, config, eap_pairs=eap, truth=truth, progress=False)
    for name in ("sae_node", "sae_node_norm", "sae_edge", "eap"):
        aucs = [t.auc[name] for t in trials]
        assert np.mean(aucs) >= 0.95, (name, aucs)
    for t in trials:  # no head outside the circuit ever gets a positive-only code
        assert t.node[~truth].max() == 0
        assert torch.is_tensor(t.sae.w_enc)


PAPER = {"sae_examples": 10, "position": "mean", "head_norm": "none", "dict_size": 200}


def test_default_settings_find_a_circuit_that_acts_where_the_answer_is_read(planted):
    """The marker on the last word: the planted heads' outputs differ between a positive and
    its negative only at the last position, as the heads that matter in IOI act where the
    answer is predicted. The default settings (last position, centred heads, node rule
    "changed") find them; the paper's, which average over positions, do not."""
    pairs = planted.pairs(24, seed=1, marker_last=True)
    res = patching.activation_patching(planted.model, pairs, progress=False)
    truth = roc.binarize_truth(res.effect.numpy(), top=len(planted.heads)).ravel()
    H = planted.model.n_heads
    assert {divmod(int(i), H) for i in np.flatnonzero(truth)} == set(planted.heads)
    seqs = pairs.positive + pairs.negative
    for settings, expect_found in (({}, True), (PAPER | {"node_rule": "node"}, False)):
        config = CircuitConfig(trials=2, **settings)
        acts = activations.head_outputs(
            planted.model, seqs, position=config.position, progress=False
        )
        trials = run_sae_trials(acts, config, truth=truth, progress=False)
        aucs = [t.auc[NODE_RULES[config.node_rule]] for t in trials]
        assert (min(aucs) >= 0.9) == expect_found, (settings, aucs)
