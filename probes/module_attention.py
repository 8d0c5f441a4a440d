"""Attention modules that compute attention in their own code, captured through the module.

Older modeling files of transformers (GPT-Neo, GPT-NeoX-Japanese, MPT, BLOOM, Falcon) never
call an attention function through the ``AttentionInterface``, so headhunt's implementation is
never reached.
For the module classes below, headhunt routes the module's own attention through the same seam
as every other model (:func:`headhunt.probes.attention.headhunt_attention`): hooks see one
:class:`~headhunt.probes.attention.AttentionCall` per layer and forward (q, k, v after the
projections, the layer's mask, its scaling and, for ALiBi, its slopes), and the output is
computed by the module's own code on the call's (possibly replaced) q, k, v
(``module.headhunt_kernel``), so an unhooked forward gives what the model gives.

Each adapter states what its module's code does, read from the module (its mask buffer, its
config), never from a table of model names; a module class with no adapter is refused as
before, in one line, by :class:`~headhunt.probes.hooked.HookedModel`. The routed methods are
bound to their module and the kernels take the module as their first argument, so a copy of
the model (``copy.deepcopy``) routes its own modules, not the original's.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from types import MethodType

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
            # the model's config, for a module that keeps none of its own (XLM's)
            module.headhunt_model_config = getattr(model, "config", None)
            if route(module) is False:  # another class of that name: not this adapter's
                continue
            module.headhunt_adapted = True
        routed += 1
    # a model-level pre-hook some adapters need (the padding mask the forward is given)
    hooks = {getattr(m, "headhunt_model_hook", None) for m in model.modules()} - {None}
    registered = getattr(model, "headhunt_model_hooks", set())
    for hook in hooks - registered:
        model.register_forward_pre_hook(hook, with_kwargs=True)
    model.headhunt_model_hooks = registered | hooks
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


def _attn_kernel(module, query, key, value, attention_mask, **_kwargs):
    """The module's own ``_attn`` (its class's, on this module) with an additive mask."""
    out, weights = type(module)._attn(
        module, query, key, value, _additive(attention_mask, query.dtype)
    )[:2]
    return out.transpose(1, 2), weights


def _routed_attn(self, query, key, value, attention_mask=None):
    """``_attn`` through the seam: with a window, the module's ``bias`` buffer (the causal rule
    and the window) joins the model's mask in the call's mask."""
    mask = _visible(attention_mask)
    kwargs = {"scaling": self.headhunt_scaling}
    if self.headhunt_window is not None:
        nq, nk = query.shape[2], key.shape[2]
        buffer = self.bias[:, :, nk - nq : nk, :nk]
        mask = buffer if mask is None else mask & buffer
        kwargs["sliding_window"] = self.headhunt_window
    out, weights = attention.headhunt_attention(self, query, key, value, mask, **kwargs)
    return out.transpose(1, 2), weights


def _route_attn(module: torch.nn.Module, scaling: float, window: int | None = None) -> None:
    """Route a module whose ``_attn(query, key, value, attention_mask)`` gets q, k, v as
    [b, h, n, d] after the projections (and rotary) and the model's additive mask, and returns
    ``(output [b, h, nq, d], weights)``: the call goes through the seam, the original method
    stays the kernel. With ``window``, the module's ``bias`` buffer limits each query to the
    last ``window`` keys."""
    module.headhunt_scaling, module.headhunt_window = scaling, window
    module.headhunt_kernel = _attn_kernel
    module._attn = MethodType(_routed_attn, module)


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


def _mpt_kernel(module, query, key, value, attention_mask, **kwargs):
    """MPT's score code: ``q . k * softmax_scale`` plus its bias over the last nk of its
    positions ``1 - L .. 0`` (the same int32 positions times float32 slopes, so the same bias
    to the bit), masked with the dtype's minimum, softmax in float32."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * kwargs["scaling"]
    slopes = kwargs.get("alibi_slopes")
    if slopes is not None:
        nk = key.shape[2]
        rel = torch.arange(1 - nk, 1, dtype=torch.int32, device=key.device).view(1, 1, 1, nk)
        scores = scores + rel * slopes.view(1, -1, 1, 1)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(query.dtype).min)
    weights = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    return torch.matmul(weights, value).transpose(1, 2), weights


def _mpt_forward(self, hidden_states, position_bias, cache=None, attention_mask=None, **kwargs):
    """``MptAttention.forward`` around the seam: fused ``Wqkv`` (clipped to ``clip_qkv``),
    heads, cache, then the call; the slopes are read off ``position_bias`` itself (its last two
    columns differ by exactly one slope); MPT's boolean mask is True where masked."""
    b, n = hidden_states.shape[:2]
    qkv = self.Wqkv(hidden_states)
    if self.clip_qkv:
        qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    q, k, v = (
        x.reshape(b, n, self.n_heads, self.head_dim).transpose(1, 2) for x in qkv.chunk(3, dim=2)
    )
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    call_kwargs = {"scaling": self.softmax_scale}
    if position_bias is not None:
        call_kwargs["alibi_slopes"] = (position_bias[:, 0, -1] - position_bias[:, 0, -2]).float()
    visible = None if attention_mask is None else ~attention_mask
    out, weights = attention.headhunt_attention(self, q, k, v, visible, **call_kwargs)
    return self.out_proj(out.reshape(b, n, -1)), weights


def _mpt(module: torch.nn.Module) -> None:
    """``MptAttention`` (MosaicML MPT): scores ``q . k * softmax_scale`` plus the model's ALiBi
    tensor ``position_bias`` (``slope * (j - (L - 1))`` over the last keys; Press et al., arXiv
    2108.12409), a boolean mask, softmax in float32."""
    module.headhunt_kernel = _mpt_kernel
    module.forward = MethodType(_mpt_forward, module)


def _bloom_kernel(module, query, key, value, attention_mask, **kwargs):
    """BLOOM's score code: ``alibi + q . k * inv_norm_factor`` with this call's ``alibi``
    tensor (set by the forward), an additive mask, softmax in float32."""
    b, h, nq, d = query.shape
    scores = module.headhunt_alibi.baddbmm(
        batch1=query.reshape(b * h, nq, d),
        batch2=key.reshape(b * h, -1, d).transpose(-1, -2),
        beta=module.beta,
        alpha=kwargs["scaling"],
    ).view(b, h, nq, -1)
    if attention_mask is not None:
        scores = scores + _additive(attention_mask, scores.dtype)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2), weights


def _bloom_forward(self, hidden_states, residual, alibi, attention_mask, layer_past=None, **kw):
    """``BloomAttention.forward`` around the seam (its ``_reshape``, cache, ``dense`` and
    ``dropout_add``), with the modeling file's own slopes."""
    if alibi.dtype != torch.float32:
        raise HeadhuntError(
            f"layer {self.layer_idx}: BLOOM rounds its ALiBi bias to {alibi.dtype}, which "
            "headhunt's kernels do not reproduce (they add the exact bias); load it in float32"
        )
    if self.pretraining_tp > 1 and self.slow_but_exact:
        raise HeadhuntError(
            "BLOOM's slow_but_exact output projection (pretraining_tp > 1) is not captured"
        )
    modeling = sys.modules[type(self).__module__]
    b, n = hidden_states.shape[:2]
    q, k, v = self._reshape(self.query_key_value(hidden_states))
    if layer_past is not None:
        k, v = layer_past.update(k, v, self.layer_idx)
    slopes = modeling._get_alibi_slopes(self.num_heads, hidden_states.device)
    self.headhunt_alibi = alibi
    try:
        out, weights = attention.headhunt_attention(
            self, q, k, v, _visible(attention_mask), scaling=self.inv_norm_factor,
            alibi_slopes=slopes,
        )  # fmt: skip
    finally:
        self.headhunt_alibi = None
    output = self.dense(out.reshape(b, n, -1))
    return modeling.dropout_add(output, residual, self.hidden_dropout, self.training), weights


def _bloom(module: torch.nn.Module) -> None:
    """``BloomAttention`` (BigScience BLOOM): fused ``query_key_value`` laid out [.., heads, 3,
    d], scores ``alibi + q . k / sqrt(d)`` with the model's ``alibi`` tensor (``slope *
    position``, positions counted from each row's first real token: a constant per row away
    from ``slope * (j - p)``), an additive mask, softmax in float32. BLOOM rounds its bias to
    the model's dtype; below float32 that rounding (up to a unit at long context) is not the
    exact bias headhunt's kernels add, so such a model is refused."""
    module.headhunt_kernel = _bloom_kernel
    module.forward = MethodType(_bloom_forward, module)


# ---------------------------------------------------------------------------------- Falcon


def _falcon_kernel(module, query, key, value, attention_mask, **_kwargs):
    """Falcon's own attention without ALiBi: SDPA or the eager formula, as the model's
    attention implementation says."""
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


def _falcon_forward(self, hidden_states, alibi, attention_mask, position_ids=None,
                    layer_past=None, use_cache=False, output_attentions=False,
                    position_embeddings=None, **kwargs):  # fmt: skip
    """``FalconAttention.forward`` around the seam (its ``_split_heads``, rotary, cache and
    ``dense``)."""
    if alibi is not None:
        raise HeadhuntError(
            f"layer {self.layer_idx}: Falcon with ALiBi computes its bias in bfloat16, which "
            "headhunt's kernels do not reproduce (they add the exact bias)"
        )
    rotary = sys.modules[type(self).__module__].apply_rotary_pos_emb
    q, k, v = self._split_heads(self.query_key_value(hidden_states))
    b, n = q.shape[:2]
    kv_heads = self.num_heads if self.new_decoder_architecture else self.num_kv_heads
    q = q.transpose(1, 2).reshape(b, self.num_heads, n, self.head_dim)
    k = k.transpose(1, 2).reshape(b, kv_heads, n, self.head_dim)
    v = v.transpose(1, 2).reshape(b, kv_heads, n, self.head_dim)
    q, k = rotary(q, k, *position_embeddings)
    if layer_past is not None:
        k, v = layer_past.update(k, v, self.layer_idx)
    out, weights = attention.headhunt_attention(
        self, q, k, v, _visible(attention_mask), scaling=1.0 / math.sqrt(self.head_dim)
    )
    return self.dense(out.reshape(b, n, self.num_heads * self.head_dim)), weights


def _falcon(module: torch.nn.Module) -> None:
    """``FalconAttention`` (TII Falcon): fused ``query_key_value`` split by the module's own
    ``_split_heads`` (multi-query: one kv head; the new decoder architecture: its kv heads
    broadcast to every query head), rotary embeddings, scores ``q . k / sqrt(d)``. Falcon with
    ALiBi (Falcon-RW) computes its bias in bfloat16 and scales it with the scores; headhunt's
    kernels add the exact bias, so it is refused in one line."""
    module.headhunt_kernel = _falcon_kernel
    module.forward = MethodType(_falcon_forward, module)


# ------------------------------------------------------------------------ GPT-1


def _openai_kernel(module, query, key, value, attention_mask, **kwargs):
    """GPT-1's score code: ``q . k`` (divided by ``sqrt(d)`` when the module scales), keys its
    causal buffer or the model's mask hide set far below every visible score, softmax."""
    scores = torch.matmul(query, key.transpose(-1, -2))
    if module.scale:
        scores = scores / math.sqrt(value.size(-1))
    if attention_mask is not None:
        scores = scores + _additive(attention_mask, scores.dtype)
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2), weights


class ModuleKVCache:
    """The keys and values of earlier steps, per layer, for attention modules whose model
    keeps no KV cache (GPT-1): :func:`headhunt.probes.capture.greedy_decode` hands one to
    each routed module (``module.headhunt_kv``) for one decoding, so a step feeds only its new
    token and its query sees every earlier key, as a full forward over the sequence computes
    it (each earlier key and value is what that forward would compute again: the same
    weights, tokens, positions and hooks)."""

    def __init__(self) -> None:
        self.keys: dict[int, Tensor] = {}
        self.values: dict[int, Tensor] = {}
        self.real: dict[int, Tensor] = {}

    def update(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's keys and values ([b, h, n, d]); return every one so far."""
        if layer in self.keys:
            key = torch.cat([self.keys[layer], key], 2)
            value = torch.cat([self.values[layer], value], 2)
        self.keys[layer], self.values[layer] = key, value
        return key, value

    def update_real(self, layer: int, real: Tensor) -> Tensor:
        """Append which of this step's keys are real tokens ([b, n], False at pads); return
        the flags of every key so far (XLNet hides pad keys from every later query)."""
        if layer in self.real:
            real = torch.cat([self.real[layer], real], 1)
        self.real[layer] = real
        return real

    def get_seq_length(self, layer: int = 0) -> int:
        return 0 if layer not in self.keys else self.keys[layer].shape[2]


def _openai_attn(self, q, k, v, attention_mask=None, output_attentions=False):
    """GPT-1's ``_attn`` through the seam: keys come transposed ([b, h, d, n]); the module's
    ``bias`` buffer (its causal rule, bottom-right aligned) joins the model's padding mask in
    the call's mask. While headhunt decodes (``headhunt_kv``), earlier steps' keys and values
    come first."""
    k = k.transpose(-1, -2)
    past = getattr(self, "headhunt_kv", None)
    if past is not None:
        k, v = past.update(self.headhunt_layer, k, v)
    nq, nk = q.shape[2], k.shape[2]
    mask = self.bias[:, :, nk - nq : nk, :nk].bool()
    if attention_mask is not None:
        mask = mask & _visible(attention_mask)
    scaling = 1.0 / math.sqrt(v.size(-1)) if self.scale else 1.0
    out, weights = attention.headhunt_attention(self, q, k, v, mask, scaling=scaling)
    return [out.transpose(1, 2)] + ([weights] if output_attentions else [])


def _openai(module: torch.nn.Module) -> bool | None:
    """GPT-1's ``Attention`` (OpenAI GPT, Radford et al. 2018): fused ``c_attn``, a causal
    ``bias`` buffer, scores ``q . k / sqrt(d)``. It carries no layer index: headhunt gives it
    its block's (see ``HookedModel``). The model keeps no KV cache: headhunt decodes it with
    one of its own (:class:`ModuleKVCache`)."""
    if not hasattr(module, "c_attn") or not hasattr(module, "scale"):
        return False
    module.layer_idx = None  # headhunt's own, from the block that holds it
    module.headhunt_kv = None  # a ModuleKVCache while headhunt decodes
    module.headhunt_kernel = _openai_kernel
    module._attn = MethodType(_openai_attn, module)


# ------------------------------------------------------------- BERT- and BART-style


def _self_attention_only(module, other_states) -> None:
    """Refuse, in one line, a module run as cross-attention (given another sequence's states)."""
    if other_states is not None:
        raise HeadhuntError(
            f"layer {module.layer_idx} ({type(module).__name__}) is run as cross-attention; "
            "headhunt captures self-attention"
        )


def _update_self_cache(module, cache, k, v, kwargs):
    """Append to the self-attention cache (an encoder-decoder cache's self-attention half)."""
    from transformers.cache_utils import EncoderDecoderCache

    own = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
    return own.update(k, v, module.layer_idx, kwargs=kwargs)


# ------------------------------------------------------------- BERT-style self-attention


def _bert_kernel(module, query, key, value, attention_mask, **_kwargs):
    """The BERT-style module's own score code: ``q . k / sqrt(d)`` plus the additive mask,
    softmax in the scores' dtype, then ``p @ v``."""
    scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(module.attention_head_size)
    if attention_mask is not None:
        scores = scores + _additive(attention_mask, scores.dtype)
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2), weights


def _bert_forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None,
                  cache=None, output_attentions=False, sinusoidal_pos=None,
                  **kwargs):  # fmt: skip
    """A BERT-style self-attention's forward around the seam (``query``, ``key``, ``value``
    projections, RoFormer's rotary positions where given, the self-attention cache), as a
    decoder-only model runs it."""
    _self_attention_only(self, encoder_hidden_states)
    b, n = hidden_states.shape[:2]
    shape = (b, n, -1, self.attention_head_size)
    q, k, v = (
        proj(hidden_states).view(shape).transpose(1, 2)
        for proj in (self.query, self.key, self.value)
    )
    if sinusoidal_pos is not None:  # RoFormer: rotary on q and k (and v, with rotary_value)
        if self.rotary_value:
            q, k, v = self.apply_rotary_position_embeddings(sinusoidal_pos, q, k, v)
        else:
            q, k = self.apply_rotary_position_embeddings(sinusoidal_pos, q, k)
    if cache is not None:
        k, v = _update_self_cache(self, cache, k, v, kwargs)
    out, weights = attention.headhunt_attention(
        self, q, k, v, _visible(attention_mask), scaling=1.0 / math.sqrt(self.attention_head_size)
    )
    return out.reshape(b, n, -1), weights


def _git_forward(self, hidden_states, attention_mask=None, cache=None, **kwargs):
    """``GitSelfAttention.forward`` (no encoder states argument) around the seam."""
    return _bert_forward(self, hidden_states, attention_mask, None, cache, **kwargs)


def _roformer_forward(self, hidden_states, attention_mask=None, sinusoidal_pos=None,
                      encoder_hidden_states=None, cache=None, output_attentions=False,
                      **kwargs):  # fmt: skip
    """``RoFormerSelfAttention.forward`` (rotary positions as its third argument)."""
    return _bert_forward(
        self, hidden_states, attention_mask, encoder_hidden_states, cache,
        sinusoidal_pos=sinusoidal_pos, **kwargs,
    )  # fmt: skip


def _bert_style(module: torch.nn.Module) -> None:
    """A self-attention module of the BERT lineage that computes attention in its own code (GIT,
    Megatron-BERT, RemBERT, RoFormer with its rotary positions, as decoders):
    ``query``/``key``/``value`` projections, scores
    ``q . k / sqrt(d)`` plus the model's additive mask, softmax; run as cross-attention it is
    refused in one line."""
    module.headhunt_kernel = _bert_kernel
    own = {"GitSelfAttention": _git_forward, "RoFormerSelfAttention": _roformer_forward}.get(
        type(module).__name__, _bert_forward
    )
    module.forward = MethodType(own, module)


# ------------------------------------------------------------- BART-style attention


def _bart_kernel(module, query, key, value, attention_mask, **kwargs):
    """The BART-style module's own score code: ``(q * scaling) . k`` plus the additive mask
    (floored at the dtype's minimum), softmax (float32 for float16 scores), then ``p @ v``."""
    scores = torch.matmul(query * kwargs["scaling"], key.transpose(-1, -2))
    if attention_mask is not None:
        scores = scores + _additive(attention_mask, scores.dtype)
        scores = scores.clamp_min(torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
    return torch.matmul(weights, value).transpose(1, 2), weights


def _bart_forward(self, hidden_states, key_value_states=None, cache=None, attention_mask=None,
                  **kwargs):  # fmt: skip
    """A BART-style attention's forward around the seam (``q_proj``, ``k_proj``, ``v_proj``,
    the self-attention cache, ``out_proj``), as a decoder-only model runs it."""
    _self_attention_only(self, key_value_states)
    kwargs.pop("output_attentions", None)
    b, n = hidden_states.shape[:2]
    shape = (b, n, self.num_heads, self.head_dim)
    q, k, v = (
        proj(hidden_states).view(shape).transpose(1, 2)
        for proj in (self.q_proj, self.k_proj, self.v_proj)
    )
    if cache is not None:
        k, v = _update_self_cache(self, cache, k, v, kwargs)
    out, weights = attention.headhunt_attention(
        self, q, k, v, _visible(attention_mask), scaling=self.scaling
    )
    return self.out_proj(out.reshape(b, n, -1)), weights


def _bart_style(module: torch.nn.Module) -> None:
    """A BART-lineage attention module that computes attention in its own code (XGLM; TrOCR,
    whose decoder layers also hold a cross-attention and are refused as such):
    ``q_proj``/``k_proj``/``v_proj``/``out_proj``, scores ``(q * head_dim^-0.5) . k`` plus
    the model's additive mask, softmax; run as cross-attention it is refused in one line."""
    module.headhunt_kernel = _bart_kernel
    module.forward = MethodType(_bart_forward, module)


def _block_sparse(module: torch.nn.Module) -> None:
    """BigBird's block-sparse attention (Zaheer et al., arXiv 2007.14062: random, window and
    global blocks of keys per block of queries) is sparse attention: refused in one line."""
    raise HeadhuntError(
        f"{type(module).__name__}: block-sparse attention (random, window and global key "
        "blocks) is sparse attention headhunt does not capture; its full attention "
        "(attention_type='original_full') is captured"
    )


def _lsh(module: torch.nn.Module) -> None:
    """Reformer's LSH attention (Kitaev et al., arXiv 2001.04451) hashes queries and keys
    into buckets, sorts by bucket and lets each query see only the keys of its chunk and the
    one before: sparse attention by hash-bucket indices, refused in one line."""
    raise HeadhuntError(
        f"{type(module).__name__}: locality-sensitive-hashing attention (each query sees only "
        "the keys sorted into its hash bucket's chunks) is sparse attention by indices, which "
        "headhunt does not capture"
    )


def _cpmant_forward(self, hidden_q, hidden_kv, attention_mask, position_bias, *args, **kwargs):
    """``CpmAntAttention.forward`` as headhunt meets it: the model's own mask ([b, nq, nk],
    True = visible, queries bottom-right aligned with the keys) says whether a query sees a
    later key. Either way the call is refused in one line (nothing routes it through the
    seam); the line says why, from the mask."""
    nq, nk = attention_mask.shape[-2:]
    query_pos = torch.arange(nk - nq, nk, device=attention_mask.device)[:, None]
    later = torch.arange(nk, device=attention_mask.device)[None, :] > query_pos
    seen = attention_mask.bool() & later
    if bool(seen.any()):
        prompt = int(getattr(self.headhunt_model_config, "prompt_length", 0) or 0)
        # the first such pair of input tokens (positions after the learned prompt tokens)
        own = seen.clone()
        own[..., : max(prompt - (nk - nq), 0), :] = False
        own[..., :prompt] = False
        _, q, k = (int(i) for i in (own if bool(own.any()) else seen).nonzero()[0])
        raise HeadhuntError(
            f"layer {self.layer_idx} (CpmAntAttention): CPM-Ant's forward is bidirectional "
            f"over its input (its mask lets input position {nk - nq + q - prompt} see the "
            f"later position {k - prompt}: transformers gives every input token context 1, so the "
            f"input and the {prompt} learned prompt tokens before it attend both ways, a "
            "prefix LM whose generated tokens alone are causal); headhunt measures "
            "decoder-only causal LMs"
        )
    raise HeadhuntError(
        f"layer {self.layer_idx} (CpmAntAttention) adds a bucketed relative-position bias "
        "(with segment types) to its scores in its own code, which no adapter of headhunt's "
        "routes yet; and its forward puts learned prompt tokens (config.prompt_length) before "
        "every sequence and pads by token id 0, ignoring the attention mask"
    )


def _cpmant(module: torch.nn.Module) -> None:
    """CPM-Ant's ``CpmAntAttention`` (OpenBMB CPM-Live): scores ``q . k / sqrt(d)`` plus a
    T5-style bucketed relative-position bias with segment types, computed once per forward
    outside the module (``CpmAntSegmentPositionEmbedding``), over ``config.prompt_length``
    learned prompt tokens put before the input. Its model builds the mask from a ``context``
    flag per token (1: seen by every query, CPM-Live's bidirectional prefix; 0: causal), and
    transformers sets it to 1 for every input token: the prefill is bidirectional, which the
    first call's mask shows, and the module is refused in one line saying so. Were the mask
    causal, the line names what else is not routed (the bias, the prompt tokens)."""
    module.forward = MethodType(_cpmant_forward, module)


def _xlm_kernel(module, query, key, value, attention_mask, **_kwargs):
    """XLM's score code: ``(q / sqrt(d)) . k``, keys the mask hides filled with the dtype's
    minimum, softmax in float32 (cast back), then ``p @ v``."""
    scores = torch.matmul(query / math.sqrt(module.head_dim), key.transpose(2, 3))
    if attention_mask is not None:
        scores = scores.masked_fill(~_visible(attention_mask), torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores.float(), dim=-1).type_as(scores)
    return torch.matmul(weights, value).transpose(1, 2), weights


def _xlm_forward(self, input, mask, kv=None, cache=None, output_attentions=False, **kwargs):
    """A causal XLM's ``MultiHeadAttention.forward`` around the seam. Its mask is the causal
    triangle over the tokens the forward is fed ([b, n, n] of the model's cache and them; the
    padding mask only zeroes hidden states, so a padded row's queries see its pad keys, as in
    the model). While headhunt decodes (``headhunt_kv``), earlier steps' keys and values come
    first, every one visible to the new queries (each is earlier than they are)."""
    _self_attention_only(self, kv)
    b, n = input.shape[:2]
    shape = (b, n, self.n_heads, self.head_dim)
    q, k, v = (
        proj(input).view(shape).transpose(1, 2) for proj in (self.q_lin, self.k_lin, self.v_lin)
    )
    if cache is not None:
        k, v = _update_self_cache(self, cache, k, v, kwargs)
    visible = mask.bool().view(b, 1, n, -1)
    padding = getattr(self, "headhunt_padding", None)
    if padding is not None:  # pad queries see no key (their states are zeroed after the layer)
        visible = visible & padding[:, -n:].to(visible.device)[:, None, :, None]
    past = getattr(self, "headhunt_kv", None)
    if past is not None:
        k, v = past.update(self.headhunt_layer, k, v)
        earlier = visible.new_ones(b, 1, n, k.shape[2] - visible.shape[-1])
        visible = torch.cat([earlier, visible], -1)
        self.headhunt_query_start = k.shape[2] - n  # the model's own cache is empty then
    out, weights = attention.headhunt_attention(
        self, q, k, v, visible, scaling=1.0 / math.sqrt(self.head_dim)
    )
    out = (self.out_lin(out.reshape(b, n, -1)),)
    return out + (weights,) if output_attentions else out


def _xlm_padding(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of a causal XLM: its padding mask, as its forward makes it (the mask
    given, else the first ``lengths`` tokens, counted from the pad ids when not given), for
    its routed attention modules. The model's causal mask leaves pad queries seeing keys;
    their states are zeroed after every layer, so nothing reads those rows: the routed call
    hides them, as headhunt's statistics count real queries only."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    padding = kwargs.get("attention_mask")
    if padding is None and ids is not None:
        lengths = kwargs.get("lengths")
        if lengths is None:
            lengths = (ids != model.config.pad_index).sum(1)
        padding = torch.arange(ids.shape[1], device=ids.device) < lengths[:, None]
    for m in model.modules():
        if getattr(m, "headhunt_model_hook", None) is _xlm_padding:
            m.headhunt_padding = None if padding is None else padding.bool()


def _xlm(module: torch.nn.Module) -> bool | None:
    """XLM's ``MultiHeadAttention`` (Lample & Conneau, arXiv 1901.07291) computes attention in
    its own code. Its model is causal only with ``config.causal``: by default (its masked-LM
    checkpoints) every query sees every key, and generation fills a mask token appended to the
    whole input: refused in one line. A causal XLM is routed: ``q_lin``/``k_lin``/``v_lin``/
    ``out_lin``, scores ``(q / sqrt(d)) . k``, the model's causal mask. Its forward returns no
    KV cache (a cached step of its own takes the whole sequence again), so headhunt decodes it
    with one of its own (:class:`ModuleKVCache`), as GPT-1, fed the new token's padding mask
    column only (``headhunt_step_mask_new``: the model's padding mask is one column per token
    it is fed)."""
    if not type(module).__module__.endswith(".xlm.modeling_xlm"):
        return False  # another class of that name
    config = getattr(module, "headhunt_model_config", None)
    if config is None:
        return False
    if not getattr(config, "causal", False):
        raise HeadhuntError(
            "XLM's attention (MultiHeadAttention) is bidirectional (config.causal is False: a "
            "masked LM, which generates by filling a mask token appended to its input); "
            "headhunt measures decoder-only causal LMs"
        )
    module.layer_idx = module.layer_id
    module.headhunt_kv = None  # a ModuleKVCache while headhunt decodes
    module.headhunt_step_mask_new = True
    module.headhunt_model_hook = _xlm_padding
    module.headhunt_padding = None  # the model's padding mask, set by _xlm_padding
    module.headhunt_kernel = _xlm_kernel
    module.forward = MethodType(_xlm_forward, module)


# ---------------------------------------------------------------------------------- XLNet


def _xlnet_terms(module, query: Tensor, key: Tensor, k_r: Tensor, seg_mat) -> Tensor:
    """XLNet's score terms besides the content term, unscaled, [b, h, nq, nk]: the position
    term ``(q + r_r_bias) . k_r`` at each pair's distance (the model's ``bd`` after its
    ``rel_shift``) and, with segment ids, the segment term ``(q + r_s_bias) . seg_embed``
    (``ef``), from ``query`` (the call's, a masked head's zeroed), the forward's position keys
    ``k_r`` ([nk + 1, b, h, d]: distances nk .. 0) and ``seg_mat`` ([nq, nk, b, 2], one-hot of
    "not the query's segment", or None). Pairs a query cannot see (a later key) get 0."""
    nq, nk = query.shape[2], key.shape[2]
    q = query.permute(2, 0, 1, 3)  # [nq, b, h, d], the model's layout
    full = torch.einsum("ibnd,jbnd->bnij", q + module.r_r_bias, k_r)  # [b, h, nq, nk + 1]
    # query i sits at position nk - nq + i: key j is at distance nk - nq + i - j, which the
    # model's position keys hold in column nk - distance (its rel_shift, on visible pairs)
    column = torch.arange(nk, device=query.device)[None, :] + (nq - torch.arange(nq))[:, None].to(
        query.device
    )
    later = column > nk
    terms = full.gather(-1, column.clamp_max(nk).expand(*full.shape[:2], nq, nk))
    if seg_mat is not None:
        ef = torch.einsum("ibnd,snd->ibns", q + module.r_s_bias, module.seg_embed)
        terms = terms + torch.einsum("ijbs,ibns->bnij", seg_mat, ef)
    return terms.masked_fill(later, 0.0)


def _xlnet_bias(module) -> Callable[[Tensor, Tensor], Tensor]:
    """The call's score bias as a function of its (possibly replaced) q and k: what XLNet adds
    to ``q . k`` before scaling (``r_w_bias . k`` and :func:`_xlnet_terms`), scaled."""
    k_r, seg_mat = module.headhunt_position_keys, module.headhunt_segments

    @torch.no_grad()  # a measurement (it may be made after the forward, when a hook reads it)
    def bias(query: Tensor, key: Tensor) -> Tensor:
        content = torch.einsum("nd,bnjd->bnj", module.r_w_bias, key)[:, :, None]
        return (content + _xlnet_terms(module, query, key, k_r, seg_mat)) * module.scale

    return bias


def _xlnet_kernel(module, query, key, value, attention_mask, **_kwargs):
    """XLNet's score code (``rel_attn_core``): ``(ac + bd + ef) * scale`` with ``ac = (q +
    r_w_bias) . k``, keys the mask hides lowered by 1e30, softmax, then ``p @ v``."""
    ac = torch.einsum("bnid,bnjd->bnij", query + module.r_w_bias[:, None], key)
    terms = _xlnet_terms(
        module, query, key, module.headhunt_position_keys, module.headhunt_segments
    )
    scores = (ac + terms) * module.scale
    if attention_mask is not None:
        scores = scores - 1e30 * (~_visible(attention_mask)).to(scores.dtype)
    weights = torch.softmax(scores, dim=3)
    return torch.einsum("bnij,bnjd->bind", weights, value), weights


def _xlnet_forward(self, h, g, attn_mask_h, attn_mask_g, r, seg_mat, mems=None,
                   target_mapping=None, output_attentions=False):  # fmt: skip
    """``XLNetRelativeAttention.forward``'s content stream around the seam (``attn_type``
    'uni'): q, k, v from ``self.q``/``self.k``/``self.v``, the call's mask the model's own
    (1 = hidden, ``[nq, nk, b, 1]``) with pad queries seeing no key (a pad query sees only
    itself in the model, and no real query sees a pad key, so nothing reads those rows), the
    position and segment terms a bias of the call (:func:`_xlnet_bias`), then the module's
    ``post_attention``. While headhunt decodes (``headhunt_kv``), earlier steps' keys and
    values come first, every one visible, and the position keys cover their distances."""
    if g is not None or target_mapping is not None:
        raise HeadhuntError(
            f"layer {self.layer_idx} (XLNetRelativeAttention): two-stream attention (a query "
            "stream given target_mapping) is a permutation LM's; headhunt captures the content "
            "stream of a causal XLNet (attn_type 'uni', no target_mapping or perm_mask)"
        )
    if mems is not None and mems.dim() > 1:
        raise HeadhuntError(
            f"layer {self.layer_idx} (XLNetRelativeAttention): given mems (earlier hidden "
            "states); headhunt decodes XLNet with a KV cache of its own, without mems"
        )
    n, b = h.shape[:2]
    q, k, v = (
        torch.einsum("ibh,hnd->ibnd", x, w).permute(1, 2, 0, 3)  # [b, heads, n, d]
        for x, w in ((h, self.q), (h, self.k), (h, self.v))
    )
    visible = (attn_mask_h == 0).permute(2, 3, 0, 1)  # [1, 1, n, n]: the model's causal rule
    fed = torch.arange(n, device=h.device)
    if bool((visible & (fed[None, :] > fed[:, None])).any()):
        raise HeadhuntError(
            f"layer {self.layer_idx} (XLNetRelativeAttention): its mask lets a token see a "
            "later one; headhunt measures decoder-only causal LMs"
        )
    padding = self.headhunt_padding
    real = h.new_ones(b, n, dtype=torch.bool) if padding is None else padding[:, -n:]
    real = real.to(h.device)
    # pad keys hidden from every query, pad queries see none
    visible = visible & real[:, None, :, None] & real[:, None, None, :]
    past = self.headhunt_kv
    if past is not None:
        if seg_mat is not None:
            raise HeadhuntError(
                "XLNet given token_type_ids while headhunt decodes it (the segments of earlier "
                "steps are not kept); decode without them"
            )
        k, v = past.update(self.headhunt_layer, k, v)
        earlier = past.update_real(self.headhunt_layer, real)[:, : k.shape[2] - n]
        earlier = earlier[:, None, None, :].expand(b, 1, n, -1) & real[:, None, :, None]
        visible = torch.cat([earlier, visible], -1)
        self.headhunt_query_start = k.shape[2] - n
    nk = k.shape[2]
    if past is not None:  # the model made position terms for the fed tokens only
        r = _xlnet_positions(self, nk, h.device)
    elif r.shape[0] != nk + 1:
        raise HeadhuntError(
            f"layer {self.layer_idx} (XLNetRelativeAttention): {r.shape[0]} relative positions "
            f"for {nk} keys; headhunt reproduces a causal XLNet's (attn_type 'uni', no bi_data)"
        )
    k_r = torch.einsum("ibh,hnd->ibnd", r.type(self.r.dtype), self.r)
    self.headhunt_position_keys = k_r.expand(-1, b, -1, -1)
    self.headhunt_segments = seg_mat
    try:
        out, weights = attention.headhunt_attention(
            self, q, k, v, visible, scaling=self.scale, position_bias=_xlnet_bias(self)
        )
    finally:
        self.headhunt_position_keys = self.headhunt_segments = None
    output_h = self.post_attention(h, out.permute(1, 0, 2, 3))  # [n, b, heads, d]
    outputs = (output_h, None)
    if output_attentions:
        outputs = outputs + (weights.permute(2, 3, 0, 1),)
    return outputs


def _xlnet_positions(module, nk: int, device) -> Tensor:
    """The relative position embeddings of ``nk`` keys (distances ``nk`` .. 0), as XLNet's
    model makes them for a forward over ``nk`` tokens (its own
    ``relative_positional_encoding``, with the model's settings)."""
    from types import SimpleNamespace

    modeling = sys.modules[type(module).__module__]
    config = module.headhunt_model_config
    model = SimpleNamespace(
        d_model=config.d_model,
        attn_type=config.attn_type,
        bi_data=config.bi_data,
        clamp_len=config.clamp_len,
        positional_embedding=modeling.XLNetModel.positional_embedding,
    )
    return modeling.XLNetModel.relative_positional_encoding(model, nk, nk, device=device)


def _xlnet_inputs(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook of a causal XLNet: refuses, in one line, inputs that make its
    attention something else (``perm_mask``, ``target_mapping``: the permutation LM's two
    streams; ``mems``), and takes the padding mask (``attention_mask``, or ``input_mask``'s
    complement; every token is real without either) for its routed modules, which hide pad
    keys themselves: the model is handed none. transformers' XLNet fails on a padded batch of
    more than one row (``attn_mask += data_mask`` cannot broadcast its causal mask over the
    batch in place); for one row it hides pad keys from every query, as the modules do."""
    import inspect

    bound = inspect.signature(model.forward).bind_partial(*args, **kwargs)
    given = {**bound.arguments, **bound.arguments.get("kwargs", {})}
    for name in ("perm_mask", "target_mapping", "mems"):
        if given.get(name) is not None:
            raise HeadhuntError(
                f"XLNet given {name}: headhunt captures a causal XLNet's content stream over "
                "the tokens it is fed (no perm_mask, target_mapping or mems)"
            )
    padding = given.get("attention_mask")
    if padding is None and given.get("input_mask") is not None:
        padding = 1 - given["input_mask"]
    for m in model.modules():
        if getattr(m, "headhunt_model_hook", None) is _xlnet_inputs:
            m.headhunt_padding = None if padding is None else padding.bool()
    for name in ("attention_mask", "input_mask"):
        if name in bound.arguments:
            bound.arguments[name] = None
    return bound.args, bound.kwargs


def _xlnet(module: torch.nn.Module) -> bool | None:
    """XLNet's ``XLNetRelativeAttention`` (Yang et al., arXiv 1906.08237): Transformer-XL's
    relative attention (Dai et al., arXiv 1901.02860), scores ``((q + r_w_bias) . k + (q +
    r_r_bias) . k_r + (q + r_s_bias) . seg) / sqrt(d)``, with ``k_r`` the projected sinusoid of
    each pair's distance and ``seg`` the learned embedding of whether the two tokens share a
    segment. As released (``attn_type`` 'bi') every token sees every other: a permutation LM
    that generates through a query stream over a masked token appended to its input, refused
    in one line. A causal XLNet (``attn_type`` 'uni') is routed: headhunt's call gets the
    content query ``q`` and key ``k``, and the rest as a score bias made from them
    (:func:`_xlnet_bias`: a masked head's bias is that of its zeroed query, as the model
    computes it). Its forward returns ``mems``, earlier hidden states, not a KV cache, and
    padding is not masked in them, so headhunt decodes it with a cache of its own
    (:class:`ModuleKVCache`), fed the new token's padding mask column only."""
    if not type(module).__module__.endswith(".xlnet.modeling_xlnet"):
        return False
    config = module.headhunt_model_config
    if config is None:
        return False
    if config.attn_type != "uni":
        raise HeadhuntError(
            f"XLNet's attention (XLNetRelativeAttention) is bidirectional (attn_type "
            f"{config.attn_type!r}: a permutation LM, which generates through its query stream "
            "over a masked token appended to its input); headhunt measures decoder-only causal "
            "LMs (a causal XLNet, attn_type 'uni', is captured)"
        )
    for flag, what in (
        ("bi_data", "runs every sequence forwards and backwards (bi_data)"),
        ("same_length", "limits each query to as many keys as the forward has tokens "
         "(same_length)"),
    ):  # fmt: skip
        if getattr(config, flag, False):
            raise HeadhuntError(
                f"XLNet {what}, which headhunt's capture and decoding do not reproduce"
            )
    module.layer_idx = None  # headhunt's own, from the block that holds it
    module.headhunt_model_hook = _xlnet_inputs
    module.headhunt_kv = None  # a ModuleKVCache while headhunt decodes
    module.headhunt_step_mask_new = True
    module.headhunt_padding = None  # the model's padding mask, set by _xlnet_inputs
    module.headhunt_position_keys = module.headhunt_segments = None
    module.headhunt_kernel = _xlnet_kernel
    module.forward = MethodType(_xlnet_forward, module)


_ADAPTERS: dict[str, Callable[[torch.nn.Module], None]] = {
    "Attention": _openai,
    "LSHSelfAttention": _lsh,
    "MultiHeadAttention": _xlm,
    "BigBirdBlockSparseAttention": _block_sparse,
    "BloomAttention": _bloom,
    "CpmAntAttention": _cpmant,
    "XLNetRelativeAttention": _xlnet,
    "FalconAttention": _falcon,
    "GitSelfAttention": _bert_style,
    "MegatronBertSelfAttention": _bert_style,
    "RemBertSelfAttention": _bert_style,
    "RoFormerSelfAttention": _bert_style,
    "TrOCRAttention": _bart_style,
    "XGLMAttention": _bart_style,
    "BigBirdSelfAttention": _bert_style,
    "GPTNeoSelfAttention": _gpt_neo,
    "GPTNeoXJapaneseAttention": _gpt_neox_japanese,
    "MptAttention": _mpt,
}
