"""Loading a headhunt-pruned model folder (written by ``headhunt prune``), and the layer
resizing that pruning and loading share.

A pruned layer keeps a subset of its query heads (``q_heads``: the original index of each slot,
-1 for a zero pad head) and of its KV heads (``kv_heads``); transformers' Llama-family configs
hold one head count for every layer, so the folder's ``config.json`` keeps the original counts
(and an explicit ``head_dim``) and records each layer's layout under ``headhunt_pruning``. Its
``model_type`` is ``headhunt_pruned`` (the original is kept in the record), so a plain
``AutoModelForCausalLM.from_pretrained`` refuses the folder in one line instead of
re-initialising every resized projection at random with only a warning.

:func:`load_pruned` builds the original architecture from the config with transformers classes
(never remote code), shrinks each layer to its layout and loads the safetensors weights;
``load_model(folder)`` calls it for such folders. A pruned layer's head slots are not the
model's head indices, so its attention refuses headhunt's head-indexed hooks (masks, captures,
the KV-cache intervention) in one line: a pruned model runs forward passes and generation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import attention_modules

CONFIG_KEY = "headhunt_pruning"
MODEL_TYPE = "headhunt_pruned"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
# Parameters an attention module may have besides the projections: shared over heads.
SHARED = ("q_norm", "k_norm")


@dataclass
class LayerLayout:
    """One pruned layer: ``kv_heads`` (original KV heads kept, in order) and ``q_heads`` (for
    each slot, the original query head, or -1 for a zero pad head); slots are grouped by KV
    head, ``group`` slots each."""

    kv_heads: list[int]
    q_heads: list[int]

    @property
    def group(self) -> int:
        return len(self.q_heads) // len(self.kv_heads)

    @property
    def pads(self) -> int:
        return self.q_heads.count(-1)


def _rows(weight: torch.Tensor, blocks: Sequence[int], head_dim: int, dim: int) -> torch.Tensor:
    """Blocks of ``head_dim`` rows (dim 0) or columns (dim 1); block -1 is zeros."""
    parts = []
    for b in blocks:
        if b < 0:
            shape = list(weight.shape)
            shape[dim] = head_dim
            parts.append(weight.new_zeros(shape))
        else:
            parts.append(weight.narrow(dim, b * head_dim, head_dim))
    return torch.cat(parts, dim=dim)


def _linear(in_f: int, out_f: int, like: nn.Linear) -> nn.Linear:
    lin = nn.Linear(in_f, out_f, bias=like.bias is not None)
    return lin.to(device=like.weight.device, dtype=like.weight.dtype)


def _check_module(attn: nn.Module) -> None:
    for name in PROJECTIONS:
        if not isinstance(getattr(attn, name, None), nn.Linear):
            raise HeadhuntError(
                f"{type(attn).__name__} has no separate {name} linear layer: structural pruning "
                "supports Llama-family attention (q_proj, k_proj, v_proj, o_proj)"
            )
    other = {n.split(".")[0] for n, _ in attn.named_parameters()} - {*PROJECTIONS, *SHARED}
    if other:
        raise HeadhuntError(
            f"{type(attn).__name__} has per-module parameters {sorted(other)} that pruning "
            "does not know how to cut"
        )


def apply_layout(attn: nn.Module, layout: LayerLayout, head_dim: int, *, copy: bool) -> None:
    """Resize one attention module to ``layout`` (copying the kept weights when ``copy``;
    otherwise only the shapes, for loading)."""
    _check_module(attn)
    q, k, v, o = (getattr(attn, n) for n in PROJECTIONS)
    d_model = q.in_features
    new_q = _linear(d_model, len(layout.q_heads) * head_dim, q)
    new_k = _linear(d_model, len(layout.kv_heads) * head_dim, k)
    new_v = _linear(d_model, len(layout.kv_heads) * head_dim, v)
    new_o = _linear(len(layout.q_heads) * head_dim, o.out_features, o)
    if copy:
        with torch.no_grad():
            new_q.weight.copy_(_rows(q.weight, layout.q_heads, head_dim, 0))
            new_k.weight.copy_(_rows(k.weight, layout.kv_heads, head_dim, 0))
            new_v.weight.copy_(_rows(v.weight, layout.kv_heads, head_dim, 0))
            new_o.weight.copy_(_rows(o.weight, layout.q_heads, head_dim, 1))
            for new, old, blocks in (
                (new_q, q, layout.q_heads),
                (new_k, k, layout.kv_heads),
                (new_v, v, layout.kv_heads),
            ):
                if old.bias is not None:
                    new.bias.copy_(_rows(old.bias[:, None], blocks, head_dim, 0)[:, 0])
            if o.bias is not None:
                new_o.bias.copy_(o.bias)
    attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj = new_q, new_k, new_v, new_o
    attn.num_key_value_groups = layout.group
    if not getattr(attn, "headhunt_pruned", False):
        attn.register_forward_pre_hook(_refuse_head_hooks)
        attn.headhunt_pruned = True
    for name, value in (
        ("num_heads", len(layout.q_heads)),
        ("num_key_value_heads", len(layout.kv_heads)),
    ):
        if hasattr(attn, name):
            setattr(attn, name, value)


def _refuse_head_hooks(module: nn.Module, args: tuple) -> None:
    """Forward pre-hook of a pruned attention module: headhunt's hooks index heads by the
    model's head numbers, which a pruned layer's slots are not. Hooks that index no head
    (``indexes_heads = False``: the load-time call check, which counts calls) pass."""
    hooks = getattr(module, "headhunt_hooks", None) or []
    if any(h.indexes_heads for h in hooks):
        raise HeadhuntError(
            f"layer {getattr(module, 'headhunt_layer', '?')} is pruned: head masks, captures and "
            "KV-cache plans index the original heads; run them on the unpruned model"
        )


def is_pruned_folder(folder: str | Path) -> bool:
    path = Path(folder) / "config.json"
    try:
        return CONFIG_KEY in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


def load_pruned(folder: str | Path, *, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of a folder written by :func:`save_pruned`, with transformers
    classes only (no remote code): build from the config, shrink each layer, load weights."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    if not is_pruned_folder(folder):
        raise HeadhuntError(f"{folder} is not a headhunt-pruned model folder")
    fields = json.loads((folder / "config.json").read_text())
    record = fields[CONFIG_KEY]
    fields["model_type"] = record["model_type"]
    cfg = AutoConfig.for_model(**fields)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    modules = attention_modules(model)
    if len(modules) != len(record["layers"]):
        raise HeadhuntError(
            f"{folder}: {len(record['layers'])} layer layouts for {len(modules)} layers"
        )
    for attn, lay in zip(modules, record["layers"], strict=True):
        apply_layout(attn, LayerLayout(lay["kv_heads"], lay["q_heads"]), cfg.head_dim, copy=False)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise HeadhuntError(f"{folder} holds no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    result = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
    if set(result.missing_keys) - tied or result.unexpected_keys:
        raise HeadhuntError(
            f"{folder}: weights do not match the pruned layout (missing "
            f"{sorted(set(result.missing_keys) - tied)[:3]}, unexpected {result.unexpected_keys[:3]})"
        )
    if tied:
        model.tie_weights()
    model.eval()
    return model.to(dtype), AutoTokenizer.from_pretrained(folder, local_files_only=True)
