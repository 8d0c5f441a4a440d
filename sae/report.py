"""What a circuits run reports, computed from its trials: the SAE head scores averaged over
trials, their rank correlation with patching, and the verdict (SAE vs EAP vs patching). The run
itself (its files and lifecycle) is the ``circuits`` method, :mod:`headhunt.methods.circuits`."""

from __future__ import annotations

from typing import Any

import numpy as np

from headhunt.errors import HeadhuntError
from headhunt.probes.hooked import HookedModel
from headhunt.sae import prompt_pairs
from headhunt.sae.circuits import NODE_RULES, SAETrial

METHOD_NAMES = {
    "sae_node": "SAE node |P\\N|",
    "sae_node_norm": "SAE node, normalised",
    "sae_pos_only": "SAE node, positive-only share",
    "sae_changed": "SAE node, changed in pair",
    "sae_edge": "SAE edge",
    "eap": "EAP |score|",
}


# scores.parquet metric -> the SAETrial attribute holding it
SCORES = {key: rule for rule, key in NODE_RULES.items()} | {"sae_edge": "edge"}


def verdict(
    summary: dict[str, dict[str, Any]], timings: dict[str, float], rule_key: str = "sae_node"
) -> dict[str, Any]:
    """SAE (the run's node rule) against EAP and patching, side by side, and which to trust.

    Patching is the reference the AUCs are measured against; of the two fast methods the one
    with the higher mean AUC is the one to trust for this model and task (the SAE method wins
    only if it is better by more than its trial-to-trial spread).
    """
    rows = {
        "patching": {"auc": 1.0, "seconds": timings.get("patching"), "role": "reference"},
        rule_key: {"auc": None, "seconds": timings.get("sae_method"), "role": "fast"},
        "eap": {"auc": None, "seconds": timings.get("eap"), "role": "fast"},
    }
    for k in (rule_key, "eap"):
        if k in summary:
            rows[k]["auc"] = summary[k]["mean"]
    sae, eap = rows[rule_key]["auc"], rows["eap"]["auc"]
    if sae is None:
        return {"methods": rows, "trust": "no ground truth: nothing says which method to trust"}
    if eap is None:
        trust = f"SAE node scores reach AUC {sae:.2f} against patching (EAP was not run)"
    elif sae > eap + summary[rule_key]["std"]:
        trust = f"SAE node scores: AUC {sae:.2f} against patching, EAP {eap:.2f}"
    else:
        trust = (
            f"EAP: AUC {eap:.2f} against patching, SAE node scores {sae:.2f}; use the SAE "
            "for its codes and edges, not to rank heads"
        )
    return {"methods": rows, "trust": trust}


def load_pairs(
    model: HookedModel, params: dict[str, Any], task_file: str | None
) -> prompt_pairs.EncodedPairs:
    """The run's prompt pairs: generated for the task, or read from the task file."""
    need = params["truth"] or params["eap"]
    if task_file:
        pairs = prompt_pairs.encode_pairs(
            model.tokenizer, prompt_pairs.read_task_file(task_file), require_aligned=need
        )
        if need and not pairs.has_answers:
            raise HeadhuntError(
                "the ground truth and EAP need 'answer' and 'wrong' on every line "
                "(or pass --no-truth --no-eap)"
            )
        if len(pairs) < 2:
            raise HeadhuntError("the task file needs at least 2 prompt pairs")
        return pairs
    return prompt_pairs.make_pairs(
        params["task"], model.tokenizer, params["pairs"], seed=params["seed"], require_aligned=True
    )


def mean_scores(trials: list[SAETrial]) -> dict[str, np.ndarray]:
    """Every SAE head score (``sae_node``, ..., ``sae_edge``), averaged over the trials."""
    return {key: np.mean([getattr(t, attr) for t in trials], 0) for key, attr in SCORES.items()}


def spearman(sae_scores, eap_pairs, effect) -> dict[str, float]:
    """Rank correlation of each method's mean score with |patching effect| (no binarising)."""
    if effect is None:
        return {}
    from scipy.stats import spearmanr

    a = np.abs(effect).ravel()
    out = {k: spearmanr(v, a)[0] for k, v in sae_scores.items()}
    if eap_pairs is not None:
        out["eap"] = spearmanr(np.abs(eap_pairs.mean(0)), a)[0]
    return {k: float(v) if np.isfinite(v) else float("nan") for k, v in out.items()}
