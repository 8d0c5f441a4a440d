"""Attention hooks: see and change every attention call's post-rotary q, k, v.

headhunt registers its own attention implementation with transformers' ``AttentionInterface``.
It calls the hooks installed on each attention module and then the model's original kernel
(SDPA by default), so capture never forces eager attention or an N x N matrix. It sees the
queries after rotary embedding and the whole key cache during cached decoding. Cached calls
(decoding) run SDPA with cuDNN's attention switched off, so GPU runs are reproducible (see
:func:`_without_cudnn_sdpa`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

IMPLEMENTATION = "headhunt"


@dataclass
class AttentionCall:
    """One attention call of one layer.

    Attributes:
        layer: 0-based layer index.
        query: [batch, q_heads, n_q, head_dim], after rotary embedding.
        key: [batch, kv_heads, n_k, head_dim], after rotary, the cache included.
        value: [batch, kv_heads, n_k, head_dim].
        attention_mask: the model's mask as given to its kernel (None when causal is implicit).
        scaling: the softmax scale.
    """

    layer: int
    query: Float[Tensor, "batch q_heads n_q d"]
    key: Float[Tensor, "batch kv_heads n_k d"]
    value: Float[Tensor, "batch kv_heads n_k d"]
    attention_mask: Tensor | None
    scaling: float

    @property
    def q_offset(self) -> int:
        """Absolute position of the first query (the length of the cache before this call)."""
        return self.key.shape[2] - self.query.shape[2]


class AttentionHook:
    """Base class: override what you need. Hooks run in installation order."""

    def before(self, call: AttentionCall) -> None:
        """See the call; may replace ``call.query``/``call.key``/``call.value`` to intervene."""

    def after(self, call: AttentionCall, output: Float[Tensor, "batch n_q q_heads d"]) -> Tensor:
        """See or replace the attention output ([batch, n_q, q_heads, head_dim])."""
        return output


def base_kernel(module: torch.nn.Module):
    """The attention function headhunt hands over to: the module's ``headhunt_base`` ("sdpa",
    "eager", "flash_attention_2", ...). Eager attention is not in transformers' registry: it is
    the ``eager_attention_forward`` of the model's own modeling file."""
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = getattr(module, "headhunt_base", "sdpa")
    if name == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def _causal_mask(query: Tensor, key: Tensor) -> Tensor:
    """Additive causal mask, bottom-right aligned: query i sits at position n_k - n_q + i."""
    n_q, n_k = query.shape[2], key.shape[2]
    pos_q = torch.arange(n_k - n_q, n_k, device=query.device)[:, None]
    allowed = torch.arange(n_k, device=query.device)[None, :] <= pos_q
    return torch.zeros(n_q, n_k, dtype=query.dtype, device=query.device).masked_fill(
        ~allowed, torch.finfo(query.dtype).min
    )


@contextmanager
def _without_cudnn_sdpa(query: Tensor, key: Tensor):
    """Keep SDPA off cuDNN's attention for cached calls (decoding): flash serves them.

    With torch 2.11 on an H200, SDPA picks cuDNN for bf16, and cuDNN's kernel for a single
    query over a long cache gave different outputs when the same batch was decoded twice in one
    process, so greedy answers and retrieval scores changed from run to run; the flash kernel
    gave identical outputs and decoded faster. cuDNN's kernel for whole sequences (no cache)
    gave identical outputs and is faster than flash at long context, so it stays
    (benchmarks/gpu_determinism.py). Only the flag is switched, per call.
    """
    cached = query.shape[2] != key.shape[2]
    if not cached or not torch.backends.cuda.cudnn_sdp_enabled():
        yield
        return
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def _headhunt_attention(module: torch.nn.Module, query, key, value, attention_mask, **kwargs: Any):
    base = base_kernel(module)
    if getattr(module, "headhunt_base", "") == "eager":
        # Masks for our implementation are built as SDPA's: a boolean 4D mask (padding), or
        # None where SDPA's is_causal flag suffices. Eager attention needs them additive.
        if attention_mask is None and query.shape[2] > 1:
            attention_mask = _causal_mask(query, key)
        elif attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = torch.zeros(
                attention_mask.shape, dtype=query.dtype, device=query.device
            ).masked_fill(~attention_mask, torch.finfo(query.dtype).min)
    hooks: list[AttentionHook] = getattr(module, "headhunt_hooks", [])
    if not hooks:
        with _without_cudnn_sdpa(query, key):
            return base(module, query, key, value, attention_mask, **kwargs)
    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    call = AttentionCall(module.headhunt_layer, query, key, value, attention_mask, scaling)
    for hook in hooks:
        hook.before(call)
    with _without_cudnn_sdpa(call.query, call.key):
        output, weights = base(module, call.query, call.key, call.value, attention_mask, **kwargs)
    for hook in hooks:
        output = hook.after(call, output)
    return output, weights


def register() -> None:
    """Register the implementation and its mask builder. Without a mask builder transformers
    treats a custom implementation as mask-free and drops padding masks (left-padded batches
    would attend to their pads)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _headhunt_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every layer, in layer order."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "config")]
    found = [m for m in found if type(m).__name__.endswith("Attention")]
    return sorted(found, key=lambda m: m.layer_idx)
