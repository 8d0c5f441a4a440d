"""Structural head pruning on planted tiny models: unused heads go without changing a logit, a
needed head's removal shows, and a saved pruned folder reloads to the masked model's logits."""

import copy
import json

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.heads.interventions.masking import mask_heads
from headhunt.heads.interventions.pruning import (
    heads_to_drop,
    is_pruned_folder,
    load_pruned_model,
    model_size,
    plan_layout,
    prune_model,
    ranked_heads,
    save_pruned,
)
from headhunt.probes.tiny import tiny_llama


def _model(**kw):
    return tiny_llama(n_layers=2, n_heads=6, n_kv_heads=2, d_model=96, **kw)


def _logits(model, ids):
    with torch.inference_mode():
        return model.model(ids, use_cache=False).logits


def _silence(model, heads):
    """Plant unused heads: zero their o_proj columns, so they contribute nothing."""
    hd = model.head_dim
    with torch.no_grad():
        for layer, head in heads:
            model.modules[layer].o_proj.weight[:, head * hd : (head + 1) * hd] = 0


IDS = torch.randint(5, 60, (2, 17))


def test_pruning_unused_heads_changes_no_logit():
    model = _model()
    unused = [
        (0, 1),
        (0, 3),
        (0, 4),
        (0, 5),
        (1, 0),
        (1, 1),
        (1, 2),
    ]  # uneven groups, a KV head gone
    _silence(model, unused)
    before = _logits(model, IDS)
    record = prune_model(model, unused)
    assert record["layers"] == [
        {"kv_heads": [0], "q_heads": [0, 2]},  # KV head 1 lost every query head
        {"kv_heads": [1], "q_heads": [3, 4, 5]},
    ]
    torch.testing.assert_close(_logits(model, IDS), before, atol=1e-6, rtol=1e-5)
    assert model.modules[1].k_proj.out_features == model.head_dim  # k/v rows of KV 0 gone
    assert model.modules[1].q_proj.out_features == 3 * model.head_dim


def test_layouts_pad_uneven_groups_and_drop_empty_kv_heads():
    lay = plan_layout(6, 2, {1, 3, 4})  # KV 0 keeps 0, 2; KV 1 keeps 5
    assert lay.kv_heads == [0, 1] and lay.q_heads == [0, 2, 5, -1] and lay.group == 2
    assert plan_layout(6, 2, {0, 1, 2}).q_heads == [3, 4, 5]
    assert plan_layout(6, 2, set(range(6))).q_heads == [
        -1
    ]  # one zero head keeps the layer runnable


def test_pruning_a_needed_head_changes_logits_as_masking_it():
    model = _model()
    needed = [(1, 4)]
    with mask_heads(model, needed, mode="output"):
        masked = _logits(model, IDS)
    before = _logits(model, IDS)
    prune_model(model, needed)
    after = _logits(model, IDS)
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, masked, atol=1e-6, rtol=1e-5)


def test_saved_folder_reloads_to_the_masked_logits(tmp_path):
    model = _model()
    drop = [(0, 0), (0, 1), (0, 2), (1, 5)]
    with mask_heads(model, drop, mode="output"):
        masked = _logits(model, IDS)
    full_size = model_size(model)
    pruned = copy.deepcopy(model)
    prune_model(pruned, drop)
    folder = save_pruned(pruned, tmp_path / "pruned")
    assert is_pruned_folder(folder) and list(folder.glob("*.safetensors"))
    again = load_pruned_model(folder, device="cpu")
    torch.testing.assert_close(_logits(again, IDS), masked, atol=1e-6, rtol=1e-5)
    size = model_size(again)
    assert size["parameters"] < full_size["parameters"]
    assert (
        size["kv_bytes_per_token"] == full_size["kv_bytes_per_token"] * 3 // 4
    )  # layer 0 lost a KV head
    assert size["pad_heads"] == 1  # layer 1: KV 1 keeps 3, 4 and a pad
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match="headhunt_pruned"):
        AutoModelForCausalLM.from_pretrained(folder)  # a plain load refuses, never loads wrongly


def test_rankings_and_head_lists():
    import numpy as np

    m = np.array([[0.5, 0.0, 0.0], [0.9, 0.0, 0.1]])
    assert ranked_heads(m)[:3] == [(1, 0), (0, 0), (1, 2)]
    assert ranked_heads(m, "reverse")[-3:] == [(1, 2), (0, 0), (1, 0)]
    assert sorted(ranked_heads(m, "random")) == sorted(ranked_heads(m))
    assert heads_to_drop(ranked_heads(m), 0.5) == sorted(ranked_heads(m)[3:])
    with pytest.raises(HeadhuntError, match="keep"):
        heads_to_drop(ranked_heads(m), 0)


def test_ranking_by_kv_group_drops_whole_groups():
    import numpy as np

    m = np.array([[0.0, 0.9, 0.1, 0.2], [0.3, 0.0, 0.0, 0.0]])  # 2 KV groups of 2 per layer
    ranking = ranked_heads(m, n_kv_heads=2)
    assert ranking == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    assert heads_to_drop(ranking, 0.5, group=2) == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert heads_to_drop(ranking, 0.6, group=2) == [(0, 2), (0, 3), (1, 2), (1, 3)]  # 2 groups of 4


def test_dropping_whole_kv_groups_shrinks_without_pads():
    model = _model()
    full = model_size(model)
    prune_model(
        model, [(0, 3), (0, 4), (0, 5), (1, 0), (1, 1), (1, 2)]
    )  # KV 1 of layer 0, KV 0 of 1
    size = model_size(model)
    assert size["pad_heads"] == 0
    assert size["kv_bytes_per_token"] == full["kv_bytes_per_token"] // 2


def test_load_model_reads_a_pruned_folder_and_refuses_head_hooks(tmp_path):
    from headhunt.probes.hooked import load_model

    model = _model()
    drop = [(0, 1), (0, 4), (0, 5), (1, 0), (1, 1), (1, 2)]  # layer 1 loses a whole KV group
    with mask_heads(model, drop, mode="output"):
        masked = _logits(model, IDS)
    pruned = copy.deepcopy(model)
    prune_model(pruned, drop)
    folder = save_pruned(pruned, tmp_path / "pruned")
    again = load_model(str(folder), device="cpu", dtype="float32")
    layers = json.loads((folder / "config.json").read_text())["headhunt_pruning"]["layers"]
    for attn, lay in zip(again.modules, layers, strict=True):  # per-layer counts from the config
        assert attn.q_proj.out_features == len(lay["q_heads"]) * again.head_dim
        assert attn.k_proj.out_features == len(lay["kv_heads"]) * again.head_dim
    assert [len(lay["kv_heads"]) for lay in layers] == [2, 1]
    torch.testing.assert_close(_logits(again, IDS), masked, atol=1e-6, rtol=1e-5)
    with pytest.raises(HeadhuntError, match="layer 0 is pruned"), mask_heads(again, [(0, 0)]):
        _logits(again, IDS)
