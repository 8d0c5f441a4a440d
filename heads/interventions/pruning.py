"""Structural head pruning: query heads removed from the weights, saved as a Hugging Face folder.

Removing query head h of a layer deletes its rows of ``q_proj`` (and bias) and its columns of
``o_proj``; a KV head's rows of ``k_proj``/``v_proj`` go when all its query heads go. The
result computes exactly what the unpruned model computes with those heads' outputs zeroed
before ``o_proj`` (``mask_heads(..., mode="output")``), up to float rounding.

GQA: transformers runs a layer with one group size (query heads per KV head). When a layer's
surviving query heads split unevenly over its KV heads (3 + 2, say), the smaller groups are
padded with *zero heads* (query rows and ``o_proj`` columns of zeros, so their output is exactly
0): the KV cache keeps one entry per surviving KV head, and the report counts the padding in
the parameters. A layer whose every head goes keeps one zero head (transformers cannot run a
layer of zero heads).

Per-layer head counts: the saved folder's layout, and loading it (``load_model(folder)``), are
:mod:`headhunt.probes.pruned`'s.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float

from headhunt.errors import HeadhuntError
from headhunt.heads.interventions.kvcache import kv_scores
from headhunt.probes.hooked import HookedModel
from headhunt.probes.pruned import (  # noqa: F401 (is_pruned_folder, load_pruned: re-exported)
    CONFIG_KEY,
    MODEL_TYPE,
    LayerLayout,
    apply_layout,
    is_pruned_folder,
    load_pruned,
)
from headhunt.scores import Head, check_heads


def ranked_heads(
    matrix: Float[np.ndarray, "layers heads"],
    order: str = "top",
    seed: int = 0,
    *,
    n_kv_heads: int | None = None,
    secondary: Float[np.ndarray, "layers heads"] | None = None,
) -> list[Head]:
    """All heads, in the order they are kept: ``top`` (highest score first), ``reverse``
    (lowest first) or ``random``. Ties (and NaN, ranked last) are broken by ``secondary`` (a
    second per-head signal, in the same direction: higher is kept first by ``top``), then by a
    seeded random order, so many equal scores do not favour early layers.

    With ``n_kv_heads``, whole KV groups are ranked (a group scores its best query head's
    score) and each group's query heads follow one another, so cutting the list at a multiple
    of the group size drops whole KV heads (see :func:`heads_to_drop`).
    """
    layers, heads = matrix.shape
    group = 1 if n_kv_heads is None else heads // n_kv_heads
    units = matrix if group == 1 else kv_scores(matrix, n_kv_heads)
    flat = np.where(np.isnan(units), -np.inf, units).ravel()
    second = np.zeros(flat.size)
    if secondary is not None:
        if secondary.shape != matrix.shape:
            raise HeadhuntError(
                f"the tie-break scores cover {secondary.shape}; the ranking's cover {matrix.shape}"
            )
        sec = secondary if group == 1 else kv_scores(secondary, n_kv_heads)
        second = np.where(np.isnan(sec), -np.inf, sec).ravel()
    tiebreak = np.random.default_rng(seed).permutation(flat.size)
    if order == "top":
        idx = np.lexsort((tiebreak, -second, -flat))
    elif order == "reverse":
        idx = np.lexsort((tiebreak, second, flat))
    elif order == "random":
        idx = tiebreak
    else:
        raise HeadhuntError(f"unknown order {order!r} (top, reverse or random)")
    per_layer = heads // group
    return [
        (int(i) // per_layer, (int(i) % per_layer) * group + g) for i in idx for g in range(group)
    ]


@dataclass(frozen=True)
class TiedCut:
    """A cut of a ranking that falls inside a block of equal scores: ``chosen`` of the
    ``block`` heads scoring ``value`` fall on the first side, picked by the tie-break."""

    chosen: int
    block: int
    value: float


def tied_cut(values: Sequence[float], n_first: int) -> TiedCut | None:
    """Whether cutting a ranking after its first ``n_first`` entries (``values``: the scores in
    rank order) splits a block of equal scores; None when the cut falls between two scores."""
    v = np.asarray(values, dtype=float)
    if not 0 < n_first < v.size or v[n_first - 1] != v[n_first]:
        return None
    same = v == v[n_first - 1]
    return TiedCut(int(same[:n_first].sum()), int(same.sum()), float(v[n_first - 1]))


def all_tied(values: Sequence[float]) -> bool:
    """Every score equal (a ranking that orders nothing, e.g. all zero)."""
    v = np.asarray(values, dtype=float)
    return v.size > 1 and bool(np.all(v == v[0]))


def heads_to_drop(ranking: Sequence[Head], keep: float, group: int = 1) -> list[Head]:
    """The heads past the first ``keep`` share of ``ranking``, counted in units of ``group``
    heads (a KV group's query heads, when the ranking is by KV group)."""
    if not 0 < keep <= 1:
        raise HeadhuntError(f"--keep {keep} must be in (0, 1]: the fraction of heads kept")
    return sorted(ranking[round(keep * len(ranking) / group) * group :])


def plan_layout(n_heads: int, n_kv_heads: int, dropped: Collection[int]) -> LayerLayout:
    """The layout of a layer after dropping query heads ``dropped``."""
    group = n_heads // n_kv_heads
    kept = {
        kv: [h for h in range(kv * group, (kv + 1) * group) if h not in dropped]
        for kv in range(n_kv_heads)
    }
    kv_heads = [kv for kv, hs in kept.items() if hs] or [0]
    size = max(1, *(len(kept[kv]) for kv in kv_heads))
    q_heads = []
    for kv in kv_heads:
        q_heads += kept[kv] + [-1] * (size - len(kept[kv]))
    return LayerLayout(kv_heads=kv_heads, q_heads=q_heads)


def prune_model(model: HookedModel, drop: Collection[Head]) -> dict[str, Any]:
    """Remove ``drop`` ((layer, query head) pairs) from ``model``'s weights, in place.

    Returns the ``headhunt_pruning`` record (also set on ``model.model.config``). The
    :class:`HookedModel` keeps its original ``n_heads``; head-indexed hooks (masks, captures)
    do not apply to a pruned model.
    """
    if getattr(model.model.config, CONFIG_KEY, None):
        raise HeadhuntError("this model is already pruned; prune the original model instead")
    if getattr(model, "loop_modules", None) is not None:
        raise HeadhuntError(
            "removing heads from the weights of a looped model is not supported: a module's "
            "weights serve every layer it is applied at; mask the heads (per layer) instead"
        )
    if model.is_hybrid:
        raise HeadhuntError(
            "removing heads from the weights of a hybrid model (layers that are not attention) "
            "is not supported; mask them in output mode instead (the same computation)"
        )
    by_layer: dict[int, set[int]] = {}
    for layer, head in check_heads(drop, model.n_layers, model.n_heads):
        by_layer.setdefault(layer, set()).add(head)
    layouts = [
        plan_layout(model.n_heads, model.n_kv_heads, by_layer.get(i, set()))
        for i in range(model.n_layers)
    ]
    for attn, layout in zip(model.modules, layouts, strict=True):
        apply_layout(attn, layout, model.head_dim, copy=True)
    record = {
        "original": {"n_heads": model.n_heads, "n_kv_heads": model.n_kv_heads},
        "dropped": sorted([list(h) for h in {(int(a), int(b)) for a, b in drop}]),
        "layers": [{"kv_heads": lay.kv_heads, "q_heads": lay.q_heads} for lay in layouts],
    }
    cfg = model.model.config
    cfg.head_dim = model.head_dim  # explicit: hidden_size / num_attention_heads no longer applies
    setattr(cfg, CONFIG_KEY, record)
    return record


def save_pruned(model: HookedModel, folder: str | Path) -> Path:
    """Write a pruned model as a Hugging Face folder (safetensors, config, tokenizer),
    atomically: a temporary folder renamed into place."""
    from headhunt.atomic import write_atomic

    return write_atomic(folder, lambda tmp: fill_pruned_folder(model, tmp))


def fill_pruned_folder(model: HookedModel, folder: Path) -> None:
    """Write a pruned model's Hugging Face folder (safetensors, config recording each layer's
    heads, tokenizer) into ``folder`` as it is; :func:`save_pruned` and the run engine make it
    atomic."""
    if not getattr(model.model.config, CONFIG_KEY, None):
        raise HeadhuntError("the model is not pruned (call prune_model first)")
    impl = model.model.config._attn_implementation
    try:
        model.model.config._attn_implementation = "sdpa"  # not headhunt's hook implementation
        model.model.save_pretrained(folder, safe_serialization=True)
    finally:
        model.model.config._attn_implementation = impl
    model.tokenizer.save_pretrained(folder)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg[CONFIG_KEY]["model_type"], cfg["model_type"] = cfg["model_type"], MODEL_TYPE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_pruned_model(
    folder: str | Path, *, device: str | None = "auto", dtype: str | None = "auto"
) -> HookedModel:
    """A pruned folder as a :class:`HookedModel` (``load_model`` recognises such folders)."""
    from headhunt.probes.hooked import load_model

    if not is_pruned_folder(folder):
        raise HeadhuntError(f"{folder} is not a headhunt-pruned model folder")
    return load_model(str(folder), device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Measuring a pruned model


def model_size(model: HookedModel) -> dict[str, float]:
    """Parameters, their bytes, and KV-cache bytes per token of context."""
    params = sum(p.numel() for p in model.model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in model.model.parameters())
    kv = sum(m.k_proj.out_features + m.v_proj.out_features for m in model.modules)
    return {
        "parameters": int(params),
        "parameter_bytes": int(nbytes),
        "kv_bytes_per_token": int(kv * model.dtype.itemsize),
        "pad_heads": int(sum(lay["q_heads"].count(-1) for lay in _layouts(model))),
    }


def _layouts(model: HookedModel) -> list[dict]:
    record = getattr(model.model.config, CONFIG_KEY, None)
    return record["layers"] if record else []


@torch.inference_mode()
def prefill_seconds(model: HookedModel, ids: torch.Tensor, repeats: int = 3) -> float:
    """Median seconds of one forward pass over ``ids`` (after one warm-up pass)."""
    ids = ids.to(model.device)
    times = []
    for i in range(repeats + 1):
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.model(ids, use_cache=False, logits_to_keep=1)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


@torch.inference_mode()
def perplexity(model: HookedModel, windows: torch.Tensor) -> float:
    """exp(mean next-token cross-entropy) over [n, length] token windows."""
    losses = []
    for row in windows:
        out = model.model(row[None].to(model.device), use_cache=False)
        logits = out.logits[0, :-1].float()
        losses.append(torch.nn.functional.cross_entropy(logits, row[1:].to(logits.device)))
    return float(torch.exp(torch.stack(losses).mean()))


def text_windows(model: HookedModel, text: str, n: int, length: int, seed: int = 0) -> torch.Tensor:
    """``n`` windows of ``length`` tokens from ``text`` at seeded random offsets."""
    ids = model.tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) < length + 1:
        raise HeadhuntError(f"the text has {len(ids)} tokens; windows of {length} need more")
    rng = random.Random(seed)
    starts = sorted(rng.randrange(0, len(ids) - length) for _ in range(n))
    return torch.tensor([ids[s : s + length] for s in starts])
