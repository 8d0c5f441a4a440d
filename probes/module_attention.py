"""Attention modules that compute attention in their own code, captured through the module.

Older modeling files of transformers (GPT-Neo, GPT-NeoX-Japanese, MPT, BLOOM, Falcon) never call an attention
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

import math
import sys
from collections.abc import Callable

import torch
from torch import Tensor

from headhunt.errors import HeadhuntError
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


# ------------------------------------------------------------- modules with an _attn method


def _route_attn(module: torch.nn.Module, scaling: float, window: int | None = None) -> None:
    """Route a module whose ``_attn(query, key, value, attention_mask)`` gets q, k, v as
    [b, h, n, d] after the projections (and rotary) and the model's additive mask, and returns
    ``(output [b, h, nq, d], weights)``: the call goes through the seam, the original method
    stays the kernel. With ``window``, the module's ``bias`` buffer limits each query to the
    last ``window`` keys, and the call's mask is the model's mask and that buffer together."""
    original: Callable = module._attn
    kwargs = (
        {"scaling": scaling} if window is None else {"scaling": scaling, "sliding_window": window}
    )

    def kernel(_module, query, key, value, attention_mask, **_kwargs):
        out, weights = original(query, key, value, _additive(attention_mask, query.dtype))
        return out.transpose(1, 2), weights

    def routed(query, key, value, attention_mask=None):
        mask = _visible(attention_mask)
        if window is not None:
            nq, nk = query.shape[2], key.shape[2]
            buffer = module.bias[:, :, nk - nq : nk, :nk]
            mask = buffer if mask is None else mask & buffer
        out, weights = attention.headhunt_attention(module, query, key, value, mask, **kwargs)
        return out.transpose(1, 2), weights

    module.headhunt_kernel = kernel
    module._attn = routed


def _gpt_neo(module: torch.nn.Module) -> None:
    """``GPTNeoSelfAttention``: no scaling (raw q . k scores, as Mesh-TensorFlow's GPT-Neo);
    its ``bias`` buffer adds the causal rule and, in local layers, a sliding window of
    ``config.window_size`` keys. Its layer index is ``layer_id``."""
    module.layer_idx = module.layer_id
    local = module.attention_type == "local"
    _route_attn(module, 1.0, int(module.config.window_size) if local else None)


def _gpt_neox_japanese(module: torch.nn.Module) -> None:
    """``GPTNeoXJapaneseAttention``: fused projection, partial rotary, scores
    ``q . k / sqrt(head_size)``, the model's causal mask."""
    _route_attn(module, 1.0 / module.norm_factor)


# ---------------------------------------------------------------------------------- ALiBi


def _mpt(module: torch.nn.Module) -> None:
    """``MptAttention`` (MosaicML MPT): fused ``Wqkv`` (clipped to ``clip_qkv`` when set),
    scores ``q . k * softmax_scale`` plus the model's ALiBi tensor ``position_bias``
    (``slope * (j - (L - 1))`` over the last keys; Press et al., arXiv 2108.12409), a boolean
    mask (True = masked), softmax in float32. The slopes are read off ``position_bias`` itself:
    its last two columns differ by exactly one slope. Its forward is restated here around the
    seam, with its own score code as the kernel (the same int32 positions times float32 slopes,
    so the same bias to the bit)."""

    def kernel(_module, query, key, value, attention_mask, **kwargs):
        scores = torch.matmul(query, key.transpose(-1, -2)) * kwargs["scaling"]
        slopes = kwargs.get("alibi_slopes")
        if slopes is not None:  # MPT's bias over the last nk of its positions 1 - L .. 0
            nk = key.shape[2]
            rel = torch.arange(1 - nk, 1, dtype=torch.int32, device=key.device).view(1, 1, 1, nk)
            scores = scores + rel * slopes.view(1, -1, 1, 1)
        if attention_mask is not None:
            scores = scores.masked_fill(~attention_mask, torch.finfo(query.dtype).min)
        weights = torch.softmax(scores.float(), dim=-1).to(value.dtype)
        return torch.matmul(weights, value).transpose(1, 2), weights

    def forward(hidden_states, position_bias, cache=None, attention_mask=None, **kwargs):
        b, n = hidden_states.shape[:2]
        qkv = module.Wqkv(hidden_states)
        if module.clip_qkv:
            qkv = qkv.clamp(min=-module.clip_qkv, max=module.clip_qkv)
        q, k, v = (
            x.reshape(b, n, module.n_heads, module.head_dim).transpose(1, 2)
            for x in qkv.chunk(3, dim=2)
        )
        if cache is not None:
            k, v = cache.update(k, v, module.layer_idx, kwargs=kwargs)
        call_kwargs = {"scaling": module.softmax_scale}
        if position_bias is not None:
            call_kwargs["alibi_slopes"] = (
                position_bias[:, 0, -1] - position_bias[:, 0, -2]
            ).float()
        visible = None if attention_mask is None else ~attention_mask  # MPT's True is masked
        out, weights = attention.headhunt_attention(module, q, k, v, visible, **call_kwargs)
        return module.out_proj(out.reshape(b, n, -1)), weights

    module.headhunt_kernel = kernel
    module.forward = forward


def _bloom(module: torch.nn.Module) -> None:
    """``BloomAttention`` (BigScience BLOOM): fused ``query_key_value`` laid out [.., heads, 3,
    d], scores ``alibi + q . k / sqrt(d)`` with the model's ``alibi`` tensor (``slope *
    position``, positions counted from each row's first real token), an additive mask,
    softmax in float32. The slopes are the modeling file's own (``_get_alibi_slopes``). BLOOM
    rounds its bias to the model's dtype; below float32 that rounding (up to a unit at long
    context) is not the exact bias headhunt's kernels add, so such a model is refused."""
    slopes_of = sys.modules[type(module).__module__]._get_alibi_slopes
    dropout_add = sys.modules[type(module).__module__].dropout_add

    def kernel(_module, query, key, value, attention_mask, **kwargs):
        b, h, nq, d = query.shape
        alibi = module.headhunt_alibi  # this call's [b * h, 1, nk] bias, set by forward
        scores = alibi.baddbmm(
            batch1=query.reshape(b * h, nq, d),
            batch2=key.reshape(b * h, -1, d).transpose(-1, -2),
            beta=module.beta,
            alpha=kwargs["scaling"],
        ).view(b, h, nq, -1)
        if attention_mask is not None:
            scores = scores + _additive(attention_mask, scores.dtype)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(weights, value).transpose(1, 2), weights

    def forward(hidden_states, residual, alibi, attention_mask, layer_past=None, **kwargs):
        if alibi.dtype != torch.float32:
            raise HeadhuntError(
                f"layer {module.layer_idx}: BLOOM rounds its ALiBi bias to {alibi.dtype}, which "
                "headhunt's kernels do not reproduce (they add the exact bias); load it in float32"
            )
        if module.pretraining_tp > 1 and module.slow_but_exact:
            raise HeadhuntError(
                "BLOOM's slow_but_exact output projection (pretraining_tp > 1) is not captured"
            )
        b, n = hidden_states.shape[:2]
        q, k, v = module._reshape(module.query_key_value(hidden_states))
        if layer_past is not None:
            k, v = layer_past.update(k, v, module.layer_idx)
        slopes = slopes_of(module.num_heads, hidden_states.device)
        module.headhunt_alibi = alibi
        try:
            out, weights = attention.headhunt_attention(
                module, q, k, v, _visible(attention_mask), scaling=module.inv_norm_factor,
                alibi_slopes=slopes,
            )  # fmt: skip
        finally:
            module.headhunt_alibi = None
        output = module.dense(out.reshape(b, n, -1))
        return dropout_add(output, residual, module.hidden_dropout, module.training), weights

    module.headhunt_kernel = kernel
    module.forward = forward


# ---------------------------------------------------------------------------------- Falcon


def _falcon(module: torch.nn.Module) -> None:
    """``FalconAttention`` (TII Falcon): fused ``query_key_value`` split by the module's own
    ``_split_heads`` (multi-query: one kv head; the new decoder architecture: its kv heads
    broadcast to every query head), rotary embeddings, scores ``q . k / sqrt(d)``, then SDPA
    or the eager formula as the model's attention implementation says. Its forward is restated
    here around the seam with that code as the kernel. Falcon with ALiBi (Falcon-RW) computes
    its bias in bfloat16 and scales it with the scores; headhunt's kernels add the exact bias,
    so it is refused in one line."""
    rotary = sys.modules[type(module).__module__].apply_rotary_pos_emb
    scaling = 1.0 / math.sqrt(module.head_dim)

    def kernel(_module, query, key, value, attention_mask, **_kwargs):
        if module.config._attn_implementation == "sdpa":
            causal = module.is_causal and attention_mask is None and query.shape[2] > 1
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=causal
            )
            return out.transpose(1, 2), None
        scores = query @ key.transpose(-1, -2)
        scores /= math.sqrt(module.head_dim)
        if attention_mask is not None:
            scores = scores + _additive(attention_mask, scores.dtype)
        weights = torch.softmax(scores, dim=-1, dtype=query.dtype)
        return (weights @ value).transpose(1, 2), weights

    def forward(hidden_states, alibi, attention_mask, position_ids=None, layer_past=None,
                use_cache=False, output_attentions=False, position_embeddings=None, **kwargs):  # fmt: skip
        if alibi is not None:
            raise HeadhuntError(
                f"layer {module.layer_idx}: Falcon with ALiBi computes its bias in bfloat16, "
                "which headhunt's kernels do not reproduce (they add the exact bias)"
            )
        q, k, v = module._split_heads(module.query_key_value(hidden_states))
        b, n = q.shape[:2]
        kv_heads = module.num_heads if module.new_decoder_architecture else module.num_kv_heads
        q = q.transpose(1, 2).reshape(b, module.num_heads, n, module.head_dim)
        k = k.transpose(1, 2).reshape(b, kv_heads, n, module.head_dim)
        v = v.transpose(1, 2).reshape(b, kv_heads, n, module.head_dim)
        q, k = rotary(q, k, *position_embeddings)
        if layer_past is not None:
            k, v = layer_past.update(k, v, module.layer_idx)
        mask = _visible(attention_mask)
        out, weights = attention.headhunt_attention(module, q, k, v, mask, scaling=scaling)
        return module.dense(out.reshape(b, n, module.num_heads * module.head_dim)), weights

    module.headhunt_kernel = kernel
    module.forward = forward


_ADAPTERS: dict[str, Callable[[torch.nn.Module], None]] = {
    "BloomAttention": _bloom,
    "FalconAttention": _falcon,
    "GPTNeoSelfAttention": _gpt_neo,
    "GPTNeoXJapaneseAttention": _gpt_neox_japanese,
    "MptAttention": _mpt,
}
