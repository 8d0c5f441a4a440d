"""Attention modules that compute attention in their own code, captured through the module.

Older modeling files of transformers (GPT-Neo, MPT, BLOOM, Falcon) never call an attention
function through the ``AttentionInterface``, so headhunt's implementation is never reached.
For the module classes below, headhunt routes the module's own attention through the same seam
as every other model (:func:`headhunt.probes.attention.headhunt_attention`): hooks see one
:class:`~headhunt.probes.attention.AttentionCall` per layer and forward (q, k, v after the
projections, the layer's mask, its scaling and, for ALiBi, its slopes), and the output is
computed by the module's own code on the call's (possibly replaced) q, k, v
(``module.headhunt_kernel``), so an unhooked forward gives what the model gives.

Each adapter states what its module's code does, read from the module (its mask buffer, its
config), never from a table of model names; a module class with no adapter is refused as
before, in one line, by :class:`~headhunt.probes.hooked.HookedModel`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from headhunt.probes import attention

__all__ = ["adapt"]


def adapt(model: torch.nn.Module) -> int:
    """Route the attention of every module of ``model`` whose class has an adapter through
    headhunt's seam (once per module); returns how many modules are routed so."""
    routed = 0
    for module in model.modules():
        route = _ADAPTERS.get(type(module).__name__)
        if route is None:
            continue
        if not getattr(module, "headhunt_adapted", False):
            route(module)
            module.headhunt_adapted = True
        routed += 1
    return routed


def _visible(mask: Tensor | None) -> Tensor | None:
    """A boolean (True = visible) view of a boolean or additive mask."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def _additive(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """An additive (0 / dtype's minimum) version of a boolean (True = visible) mask."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, torch.finfo(dtype).min
    )


# ---------------------------------------------------------------------------------- GPT-Neo


def _gpt_neo(module: torch.nn.Module) -> None:
    """``GPTNeoSelfAttention``: ``_attn(query, key, value, attention_mask)`` gets q, k, v as
    [b, h, n, d] after the projections, with no scaling (raw q . k scores, Mesh-TensorFlow's
    GPT-Neo), and the model's mask; the module's ``bias`` buffer adds the causal rule and, in
    local layers, a sliding window of ``config.window_size`` keys. The call's mask is the model's
    mask and that buffer together, so the window is in every row's visible interval."""
    original: Callable = module._attn
    module.layer_idx = module.layer_id
    local = module.attention_type == "local"
    window = int(module.config.window_size) if local else None

    def kernel(_module, query, key, value, attention_mask, **_kwargs):
        out, weights = original(query, key, value, _additive(attention_mask, query.dtype))
        return out.transpose(1, 2), weights

    def routed(query, key, value, attention_mask=None):
        mask = _visible(attention_mask)
        if local:
            nq, nk = query.shape[2], key.shape[2]
            buffer = module.bias[:, :, nk - nq : nk, :nk]
            mask = buffer if mask is None else mask & buffer
        kwargs = {"scaling": 1.0} if window is None else {"scaling": 1.0, "sliding_window": window}
        out, weights = attention.headhunt_attention(module, query, key, value, mask, **kwargs)
        return out.transpose(1, 2), weights

    module.headhunt_kernel = kernel
    module._attn = routed


_ADAPTERS: dict[str, Callable[[torch.nn.Module], None]] = {
    "GPTNeoSelfAttention": _gpt_neo,
}
