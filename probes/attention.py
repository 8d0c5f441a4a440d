"""Attention hooks: see and change every attention call's post-rotary q, k, v.

headhunt registers its own attention implementation with transformers' ``AttentionInterface``.
It calls the hooks installed on each attention module and then the model's original kernel
(SDPA by default), so capture never forces eager attention or an N x N matrix; a hook may
instead compute the layer's output itself (``AttentionHook.compute``: the statistics capture's
fused kernel does, on CUDA). It sees the queries after rotary embedding and the whole key cache
during cached decoding. Cached calls (decoding) run SDPA with cuDNN's attention switched off,
so GPU runs are reproducible (see :func:`_without_cudnn_sdpa`).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Collection, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headhunt.errors import HeadhuntError

IMPLEMENTATION = "headhunt"

# Keyword arguments of an attention call whose meaning headhunt reproduces (or that do not
# change what the kernel computes). Any other one refuses the call: it could change the
# attention in a way the captures would not follow.
UNDERSTOOD_KWARGS = frozenset(
    {
        "dropout",  # 0 in eval mode; checked below
        "scaling",
        "sliding_window",  # the mask carries the window (transformers builds it per layer type)
        "softcap",
        "s_aux",  # learned sink logits (gpt-oss and its descendants)
        "sinks",  # a sink logit per query row, [b, hq, nq, 1] (Inkling 2): checked below
        "alibi_slopes",  # ALiBi (BLOOM, MPT): per-head linear position bias, set by the module
        "position_bias",  # a score bias the model builds (Inkling; XLNet's, a function of q, k)
        "is_causal",
        "position_ids",
        "cache_position",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "use_cache",
        "return_dict",
        "logits_to_keep",  # which positions the LM head scores (a wrapper passes it down)
        "layer_idx",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
    }
)


@dataclass
class AttentionCall:
    """One attention call of one layer, and what the model's kernel really does with it.

    Everything is derived from the call itself (its keyword arguments, the mask the model built
    for this layer, the module), never from a table of model names.

    Attributes:
        layer: 0-based layer index.
        query: [b, hq, nq, d], after rotary embedding.
        key: [b, hkv, nk, d], after rotary, the cache included.
        value: [b, hkv, nk, d].
        attention_mask: the model's mask as given to its kernel (None when causal is implicit):
            boolean (True = visible) or additive, [b or 1, 1, nq, >= nk].
        scaling: the softmax scale.
        module: the attention module (None for a call built by hand).
        kwargs: the other keyword arguments the model gave its kernel.
        query_start: absolute position of query 0 in the (padded) input rows, i.e. the tokens
            the layer had seen before this call; None means ``n_k - n_q`` (keys start at 0).
    """

    layer: int
    query: Float[Tensor, "b hq nq d"]
    key: Float[Tensor, "b hkv nk d"]
    value: Float[Tensor, "b hkv nk d"]
    attention_mask: Tensor | None
    scaling: float
    module: Any = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    query_start: int | None = None

    # ---------------------------------------------------------------- what the kernel does

    @property
    def q_offset(self) -> int:
        """Query 0's position minus key 0's position: keys end at the last query (bottom-right
        alignment), whether the cache holds the whole past or only a sliding window."""
        return self.key.shape[2] - self.query.shape[2]

    @property
    def query_position(self) -> int:
        """Absolute position of query 0 in the (padded) input rows: ``query_start`` when the
        loop recorded it, else ``q_offset`` (keys start at position 0)."""
        return self.q_offset if self.query_start is None else self.query_start

    @property
    def key_start(self) -> int:
        """Absolute position of key 0 (above 0 when a sliding layer's cache kept only its
        window)."""
        return self.query_position - self.q_offset

    @property
    def key_positions(self) -> Int[Tensor, " nk"]:
        """Absolute position of every key."""
        return torch.arange(self.key.shape[2], device=self.key.device) + self.key_start

    @property
    def causal(self) -> bool:
        """Whether the layer is causal (a bidirectional layer says so on its module)."""
        flag = self.kwargs.get("is_causal")
        if flag is None:
            flag = getattr(self.module, "is_causal", True)
        return bool(flag)

    @property
    def window(self) -> int | None:
        """The sliding window (query at p sees keys j with p - window < j <= p), or None."""
        w = self.kwargs.get("sliding_window", getattr(self.module, "sliding_window", None))
        return int(w) if w else None

    @property
    def chunk(self) -> int | None:
        """The attention chunk of a chunked layer (Llama 4: keys of the query's chunk only)."""
        if _layer_type(self.module) != "chunked_attention":
            return None
        size = getattr(getattr(self.module, "config", None), "attention_chunk_size", None)
        return int(size) if size else None

    @property
    def softcap(self) -> float | None:
        """Logit softcap: score -> softcap * tanh(score / softcap), after scaling."""
        cap = self.kwargs.get("softcap")
        return float(cap) if cap else None

    @property
    def sinks(self) -> Float[Tensor, " hq"] | None:
        """Learned sink logit per query head: one extra logit in every row's softmax."""
        s = self.kwargs.get("s_aux")
        return None if s is None else s.detach()

    @property
    def alibi_slopes(self) -> Float[Tensor, " hq"] | None:
        """ALiBi slope per query head (Press et al., arXiv 2108.12409): the scaled score of
        query position p and key position j gets ``slope * (j - p)`` added, before any softcap.
        Only a module headhunt captures through its own code passes it
        (:mod:`headhunt.probes.module_attention`)."""
        s = self.kwargs.get("alibi_slopes")
        return None if s is None else s.detach()

    @property
    def bias(self) -> Float[Tensor, "bb hb nq nk"] | None:
        """An additive score bias the model builds and hands its kernel (``position_bias``:
        Inkling's relative-position bias, conditioned on the hidden states), ``[b or 1, hq or
        1, nq, nk]``, added to the scaled scores before the mask. The kernels take it on their
        torch path (the Triton kernels do not), query block by query block; the tensor is the
        model's own (headhunt makes no copy of it). A bias made from the call's own query and
        key (``position_bias`` a function of them: XLNet's Transformer-XL relative-position and
        segment terms, :mod:`headhunt.probes.module_attention`) is made again when a hook has
        replaced them (a masked head's zeroed query), so it is always that of the q, k the
        kernel gets."""
        bias = self.kwargs.get("position_bias")
        if callable(bias):
            made = self.__dict__.get("_bias_from")
            if made is None or made[0] is not self.query or made[1] is not self.key:
                made = (self.query, self.key, bias(self.query, self.key))
                self.__dict__["_bias_from"] = made
                self.__dict__.pop("_bias", None)
            bias = made[2]
        if "_bias" in self.__dict__:
            return self.__dict__["_bias"]
        if bias is not None:
            bias = bias.detach()
            if bias.dim() == 3:  # [hq, nq, nk]: shared by the batch
                bias = bias[None]
        in_mask = self._mask_bias()
        if in_mask is not None:
            bias = in_mask if bias is None else bias + in_mask
        self.__dict__["_bias"] = bias
        return bias

    def _mask_bias(self) -> Float[Tensor, "bb hb nq nk"] | None:
        """What an additive mask adds on the keys it leaves visible (Doge's dynamic mask
        attention, arXiv 2508.02124: a learned score of each key's value, per head, the same
        for every query): that part, 0 on masked keys, or None for a plain mask (0 or the
        dtype's minimum only). A copy of the mask's size, made once per mask tensor."""
        mask = self.attention_mask
        if mask is None or mask.dtype == torch.bool or mask.dim() != 4:
            return None
        memo = self._mask_memo()
        if "bias" not in memo:
            nq, nk = self.query.shape[2], self.key.shape[2]
            m = mask[:, :, -nq:, :nk]
            allowed = m > torch.finfo(m.dtype).min / 2
            biased = bool((m[allowed] != 0).any())
            memo["bias"] = torch.where(allowed, m, 0).detach() if biased else None
        return memo["bias"]

    @property
    def row_sinks(self) -> Float[Tensor, "bb hq nq"] | None:
        """A sink logit per query row (Inkling 2's ``sinks``, made from each query's hidden
        state by a projection: ``[b, hq, nq, 1]`` as the model passes it, here ``[b, hq,
        nq]``): one extra logit in that row's softmax, whose share is dropped, as ``sinks``
        (``s_aux``) is one per head. The kernels take it on their torch path."""
        s = self.kwargs.get("sinks")
        if s is None:
            return None
        s = s.detach()
        return s[..., 0] if s.dim() == 4 and s.shape[-1] == 1 else s

    def visible_keys(self) -> tuple[Int[Tensor, "b nq"], Int[Tensor, "b nq"]] | None:
        """First and last visible key index of every row from the mask (None: no mask, so
        causal, bottom-right, or everything for a bidirectional layer). A row that sees no key
        (a left pad) gets ``(n_k, -1)``. Cached per call, and per mask for the other layers
        that get the same mask tensor (see :class:`_MaskMemo`)."""
        if "_visible" not in self.__dict__:
            vis = None
            if self.attention_mask is not None:
                memo = self._mask_memo()
                if "intervals" not in memo:
                    memo["intervals"] = _mask_intervals(
                        self.attention_mask,
                        self.query.shape[2],
                        self.key.shape[2],
                        self.layer,
                        _key_selection(self.module),
                    )
                vis = memo["intervals"]
            if vis is not None:  # a mask shared by the batch: one row per batch row
                vis = tuple(t.expand(self.query.shape[0], -1) for t in vis)
            self.__dict__["_visible"] = vis
        return self.__dict__["_visible"]

    def _mask_memo(self) -> dict[Any, Any]:
        """What was derived from this call's mask for these query and key counts."""
        return _MASK_MEMO.get(self.attention_mask, self.query.shape[2], self.key.shape[2])

    def kernel_kwargs(self, batch: int | None = None) -> dict[str, Any]:
        """Keyword arguments of :func:`headhunt.kernels.attention_stats` (and
        ``attention_probs_at``) that reproduce this call's attention: scale, causality, offset,
        softcap, sinks and, where the mask is more than causal (+ window), the per-row visible
        key interval ``key_lo``/``key_hi`` (of batch row ``batch`` only, when given)."""
        kw: dict[str, Any] = {"scale": self.scaling, "causal": self.causal}
        kw["q_offset"] = self.q_offset
        if self.softcap is not None:
            kw["softcap"] = self.softcap
        if self.sinks is not None:
            kw["sinks"] = self.sinks
        if self.alibi_slopes is not None:
            kw["alibi_slopes"] = self.alibi_slopes
        if self.bias is not None:
            bias = self.bias
            kw["bias"] = bias[batch : batch + 1] if batch is not None and len(bias) > 1 else bias
        if self.row_sinks is not None:
            rs = self.row_sinks
            kw["row_sinks"] = rs[batch : batch + 1] if batch is not None and len(rs) > 1 else rs
        vis = self.visible_keys()
        if vis is None:
            return kw
        lo, hi = vis
        # Whether the mask is plain causal (or causal + window): one comparison (two host
        # syncs) per mask and layer kind, not per layer.
        memo, key = self._mask_memo(), ("plain", self.causal, self.window)
        if key not in memo:
            memo[key] = "mask"
            for window in (None, self.window):
                exp_lo, exp_hi = self._plain_intervals(window)
                if bool((lo == exp_lo).all()) and bool((hi == exp_hi).all()):
                    memo[key] = window
                    break
        if memo[key] != "mask":
            if memo[key] is not None:
                kw["window"] = memo[key]
            return kw
        kw["causal"] = False  # the mask says everything: causality is inside the intervals
        if batch is not None:
            lo, hi = lo[batch : batch + 1], hi[batch : batch + 1]
        kw["key_lo"], kw["key_hi"] = lo, hi
        return kw

    def _plain_intervals(self, window: int | None) -> tuple[Tensor, Tensor]:
        """Rows' visible intervals for causal attention (+ window) with no padding."""
        nq, nk = self.query.shape[2], self.key.shape[2]
        pos = torch.arange(nq, device=self.query.device) + self.q_offset
        if not self.causal:
            return torch.zeros_like(pos), torch.full_like(pos, nk - 1)
        lo = torch.zeros_like(pos) if window is None else (pos - window + 1).clamp_min(0)
        return lo[None], pos[None]

    def key_counts(self) -> Int[Tensor, "b nk"]:
        """How many of this call's queries see each key (the ``col_mean`` normaliser): with a
        sliding window a key is seen by at most ``window`` queries, a pad key by none."""
        b, nq, nk = self.query.shape[0], self.query.shape[2], self.key.shape[2]
        vis = self.visible_keys()
        lo, hi = self._plain_intervals(None) if vis is None else vis
        lo, hi = lo.expand(b, nq), hi.expand(b, nq)
        seen = lo <= hi
        # +1 at each row's first key, -1 after its last: a running sum counts the rows.
        diff = torch.zeros(b, nk + 1, dtype=torch.long, device=lo.device)
        diff.scatter_add_(1, torch.where(seen, lo, nk), seen.long())
        diff.scatter_add_(1, torch.where(seen, hi + 1, nk), -seen.long())
        return diff.cumsum(1)[:, :nk]

    # ---------------------------------------------------------------- small dense rows

    def scores(
        self, rows: slice | None = None, heads: Sequence[int] | None = None
    ) -> Float[Tensor, "b hq rows nk"]:
        """Attention logits as the model's kernel computes them (scaled, softcapped), float32,
        with keys a row cannot see at -inf. Dense: for decode steps, short prompts and tests.

        Args:
            rows: the query rows (default all).
            heads: the query heads (default all).
        """
        q, k = self.query, self.key
        b, hq, nq, d = q.shape
        hkv, nk = k.shape[1], k.shape[2]
        rows = rows or slice(0, nq)
        qr = q[:, :, rows]
        r = qr.shape[2]
        if heads is None:  # GQA by grouping the queries of a kv head, never copying keys
            qg = qr.reshape(b, hkv, (hq // hkv) * r, d)
            s = torch.matmul(qg, k.transpose(-1, -2)).view(b, hq, r, nk)
        else:
            idx = torch.as_tensor(heads, device=q.device)
            s = torch.matmul(qr[:, idx], k[:, idx // (hq // hkv)].transpose(-1, -2))
        s = s.float() * self.scaling
        if self.alibi_slopes is not None:  # slope * (key - query), in query-relative positions
            slopes = self.alibi_slopes.float().to(s.device)
            slopes = slopes if heads is None else slopes[torch.as_tensor(heads, device=s.device)]
            p = torch.arange(nq, device=s.device)[rows] + self.q_offset
            rel = torch.arange(nk, device=s.device)[None, :] - p[:, None]
            s = s + slopes[None, :, None, None] * rel.float()
        if self.bias is not None:  # the model's own bias, these rows (and heads) only
            bias = self.bias[:, :, rows]
            if heads is not None and bias.shape[1] > 1:
                bias = bias[:, torch.as_tensor(heads, device=bias.device)]
            s = s + bias.float().to(s.device)
        if self.softcap is not None:
            s = torch.tanh(s / self.softcap) * self.softcap
        return s.masked_fill(~self.visible(rows)[:, None], float("-inf"))

    def probs(
        self, rows: slice | None = None, heads: Sequence[int] | None = None
    ) -> Float[Tensor, "b hq rows nk"]:
        """The model's attention probabilities (float32). With learned sinks a row sums to
        less than 1 (the sink slot takes the rest); a row that sees no key is all zeros."""
        s = self.scores(rows, heads)
        sinks, row_sinks = self.sinks, self.row_sinks
        hq = self.query.shape[1]
        idx = (torch.arange(hq) if heads is None else torch.as_tensor(heads)).to(s.device)
        if sinks is not None:
            sink = sinks.float().to(s.device)[idx][None, :, None, None]
            s = torch.cat([s, sink.expand(*s.shape[:-1], 1)], -1)
        elif row_sinks is not None:  # one per row: these rows' (and heads')
            sink = row_sinks.float().to(s.device)[:, idx][:, :, rows or slice(None), None]
            s = torch.cat([s, sink.expand(*s.shape[:-1], 1)], -1)
            sinks = row_sinks
        m = s.amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)
        e = torch.exp(s - m)
        p = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        return p[..., : self.key.shape[2]] if sinks is not None else p

    def visible(self, rows: slice | None = None) -> Bool[Tensor, "b rows nk"]:
        """Which keys each row sees (batch 1 when the same for every row of the batch)."""
        nq, nk = self.query.shape[2], self.key.shape[2]
        rows = rows or slice(0, nq)
        vis = self.visible_keys()
        j = torch.arange(nk, device=self.query.device)
        if vis is None:
            lo, hi = self._plain_intervals(None)
        else:
            lo, hi = vis
        lo, hi = lo[:, rows, None], hi[:, rows, None]
        return (j >= lo) & (j <= hi)


def _layer_type(module: Any) -> str | None:
    """The layer's type in its config's ``layer_types`` ("full_attention", "sliding_attention",
    "chunked_attention", ...), None when the config has none."""
    types = getattr(getattr(module, "config", None), "layer_types", None)
    idx = getattr(module, "layer_idx", None)
    if types is None or idx is None or idx >= len(types):
        return None
    return types[idx]


class _MaskMemo:
    """What was derived from recent mask tensors (row intervals, whether they are plain).

    transformers builds one mask per layer type and forward and hands the same tensor to
    every layer of that type, so deriving it once saves each other layer the work and its
    host syncs. Entries are found by the tensor's identity (held by a weak reference, so a
    memo never keeps a mask alive nor mistakes a new tensor at a reused address for it), its
    version counter where it has one (an in-place change makes a new entry; tensors made
    under ``inference_mode`` have none, and transformers never changes a mask in place) and
    the query and key counts.
    """

    def __init__(self, size: int = 8):
        self.size = size
        self.entries: OrderedDict[tuple, tuple[weakref.ref, dict[Any, Any]]] = OrderedDict()

    def get(self, mask: Tensor, nq: int, nk: int) -> dict[Any, Any]:
        try:
            version = mask._version
        except RuntimeError:  # an inference tensor has no version counter
            version = None
        key = (id(mask), version, nq, nk)
        hit = self.entries.get(key)
        if hit is not None and hit[0]() is mask:
            self.entries.move_to_end(key)
            return hit[1]
        memo: dict[Any, Any] = {}
        self.entries[key] = (weakref.ref(mask), memo)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return memo


_MASK_MEMO = _MaskMemo()


def _key_selection(module: torch.nn.Module | None) -> str | None:
    """What makes a layer's keys other than one interval of positions, where its module says
    so by what it holds: a key compressor (DeepSeek-V4's compressed attention: each key
    summarises a window of tokens) or an indexer that picks each query's keys (DeepSeek
    sparse attention, Qwen4-Exp's query-sparse attention: sparse attention by indices)."""
    compressor = getattr(module, "compressor", None)
    if isinstance(compressor, torch.nn.Module):
        return (
            f"compressed keys: {type(compressor).__name__} makes each key from several tokens, "
            "and an indexer may then pick among them"
        )
    indexer = getattr(module, "indexer", None)
    if isinstance(indexer, torch.nn.Module):
        return f"sparse attention by indices: {type(indexer).__name__} picks each query's keys"
    keep = getattr(module, "keep_window_size", None)
    if keep is not None:  # Doge's dynamic mask attention
        return (
            f"dynamic mask attention: past keep_window_size={keep} keys each query keeps "
            "only its top-k keys by a learned score"
        )
    return None


def _mask_intervals(
    mask: Tensor | None, nq: int, nk: int, layer: int, why: str | None = None
) -> tuple[Int[Tensor, "b nq"], Int[Tensor, "b nq"]] | None:
    """Per (batch, query) first and last visible key of a boolean or additive 4-D mask.

    Refuses (one line) a mask that differs between heads and a row whose visible keys are not
    one interval: the kernels describe a row by its first and last key. What an additive mask
    adds on its visible keys is a bias (:meth:`AttentionCall.bias`), not part of this.
    """
    if mask is None:
        return None
    if mask.dim() != 4:
        raise HeadhuntError(f"layer {layer}: a {mask.dim()}-D attention mask (expected 4-D)")
    mask = mask[:, :, -nq:, :nk]
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    if allowed.shape[1] != 1 and bool((allowed != allowed[:, :1]).any()):
        raise HeadhuntError(
            f"layer {layer}: the attention mask differs between heads"
            + (f" ({why})" if why else "")
        )
    allowed = allowed[:, 0]
    # First / last visible key (argmax of a 0/1 row finds its first 1), in blocks of rows so
    # the temporaries stay small next to the mask itself at long context.
    los, his, seens = [], [], []
    for r in range(0, nq, 2048):
        a = allowed[:, r : r + 2048]
        seen = a.any(-1)
        lo = a.to(torch.uint8).argmax(-1)
        hi = nk - 1 - a.flip(-1).to(torch.uint8).argmax(-1)
        if bool((seen & (a.sum(-1) != hi - lo + 1)).any()):
            raise HeadhuntError(
                f"layer {layer}: a query's visible keys are not one interval "
                f"({why or 'a mask'}; headhunt's kernels take one interval per query)"
            )
        los.append(lo)
        his.append(hi)
        seens.append(seen)
    lo, hi, seen = torch.cat(los, 1), torch.cat(his, 1), torch.cat(seens, 1)
    lo = torch.where(seen, lo, nk)
    hi = torch.where(seen, hi, -1)
    return lo.long(), hi.long()


class AttentionHook:
    """Base class: override what you need. Hooks run in installation order."""

    # Whether the hook reads or changes heads by their index in the model's config (masks,
    # captures). A pruned layer's head slots are not those indices, so it refuses such hooks.
    indexes_heads: bool = True

    def layers(self) -> Collection[int] | None:
        """The layers the hook acts on by index (a head mask's), or None for any: installing
        it on a model refuses layers that are not attention layers (a hybrid's others)."""
        return None

    def before(self, call: AttentionCall) -> None:
        """See the call; may replace ``call.query``/``call.key``/``call.value`` to intervene."""

    def compute(self, call: AttentionCall) -> Float[Tensor, "b nq hq d"] | None:
        """Compute the attention output in place of the layer's kernel, or decline (None).

        Runs after every hook's ``before``; the first hook that returns a tensor supplies the
        output ([b, nq, hq, d], the layout and dtype of the kernel's output), the base kernel
        is skipped (the layer gets no attention weights) and ``after`` hooks run as usual. A
        hook that computes must reproduce the layer's attention exactly (mask, window,
        softcap, sinks: :meth:`AttentionCall.kernel_kwargs`) or refuse with a HeadhuntError.
        """
        return None

    def after(self, call: AttentionCall, output: Float[Tensor, "b nq hq d"]) -> Tensor:
        """See or replace the attention output ([b, nq, hq, d])."""
        return output


def base_kernel(module: torch.nn.Module, call: AttentionCall | None = None):
    """The attention function headhunt hands over to: the module's ``headhunt_base`` ("sdpa",
    "eager", "flash_attention_2", ...), unless it would silently drop part of the call: SDPA
    does no logit softcap and no learned sinks, flash attention no sinks, so such calls run the
    model's own eager function. Eager attention is not in transformers' registry: it is the
    ``eager_attention_forward`` of the model's own modeling file."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    own = getattr(module, "headhunt_kernel", None)
    if own is not None:  # a module captured through its own code keeps computing with it
        return own
    name = base_name(module, call)
    if name == "eager":
        return _eager_function(module)
    return ALL_ATTENTION_FUNCTIONS[name]


def base_name(module: torch.nn.Module, call: AttentionCall | None = None) -> str:
    """The name of the kernel :func:`base_kernel` picks for ``call``."""
    if getattr(module, "headhunt_kernel", None) is not None:
        return "own"
    name = getattr(module, "headhunt_base", "sdpa")
    if call is None or name == "eager":
        return name
    if (
        call.sinks is not None
        or call.row_sinks is not None
        or (call.softcap is not None and name == "sdpa")
    ):
        return "eager"
    return name


def _eager_function(module: torch.nn.Module):
    import sys

    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise HeadhuntError(
            f"{type(module).__name__}: its modeling file has no eager_attention_forward, which "
            "headhunt needs for this layer's softcap or sinks"
        )
    return fn


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


def check_call(call: AttentionCall) -> None:
    """Refuse (one line) a call whose attention headhunt cannot reproduce exactly."""
    unknown = sorted(
        k for k, v in call.kwargs.items() if k not in UNDERSTOOD_KWARGS and v is not None
    )
    if unknown:
        raise HeadhuntError(
            f"layer {call.layer} ({type(call.module).__name__}) passes {', '.join(unknown)} to "
            "its attention kernel, which headhunt does not reproduce"
        )
    if call.kwargs.get("dropout"):
        raise HeadhuntError(f"layer {call.layer}: attention dropout is on (call model.eval())")
    if call.key_start < 0:
        raise HeadhuntError(
            f"layer {call.layer}: {call.key.shape[2]} keys for a query at position "
            f"{call.query_start} ({_key_selection(call.module) or 'a cache layout'}; headhunt "
            "maps each key to one position)"
        )
    bias = call.bias
    if bias is not None:
        b, hq, nq = call.query.shape[:3]
        nk = call.key.shape[2]
        if (
            bias.dim() != 4
            or bias.shape[0] not in (1, b)
            or bias.shape[1] not in (1, hq)
            or tuple(bias.shape[2:]) != (nq, nk)
        ):
            raise HeadhuntError(
                f"layer {call.layer}: a position bias of shape {tuple(bias.shape)} for {nq} "
                f"queries over {nk} keys; headhunt adds one bias per (query, key)"
            )
    rs = call.row_sinks
    if rs is not None:
        b, hq, nq = call.query.shape[:3]
        if rs.dim() != 3 or rs.shape[0] not in (1, b) or tuple(rs.shape[1:]) != (hq, nq):
            raise HeadhuntError(
                f"layer {call.layer}: sinks of shape {tuple(call.kwargs['sinks'].shape)} for "
                f"{hq} heads and {nq} queries; headhunt reproduces one sink logit per query "
                "row ([b, heads, queries, 1]) or per head (s_aux)"
            )
        if call.sinks is not None:
            raise HeadhuntError(f"layer {call.layer}: two kinds of sink logits in one call")
    if call.attention_mask is None and 1 < call.query.shape[2] < call.key.shape[2]:
        # SDPA's is_causal is top-left aligned: only a static cache's first prefill gets here.
        raise HeadhuntError(
            f"layer {call.layer}: a cached call without a mask (static cache?); headhunt "
            "captures with a dynamic cache"
        )
    call.visible_keys()  # refuses masks that are not per-row intervals


def headhunt_attention(module: torch.nn.Module, query, key, value, attention_mask, **kwargs: Any):
    """The seam: every captured attention call comes here, with transformers' attention-function
    arguments (q, k, v as [b, heads, n, d], the layer's mask); returns ``(output [b, nq, hq, d],
    weights)``. transformers calls it through the ``AttentionInterface``; a module that computes
    attention in its own code calls it from :mod:`headhunt.probes.module_attention`."""
    if getattr(module, "headhunt_depth", False):  # attention over depth, not tokens: untouched
        return base_kernel(module)(module, query, key, value, attention_mask, **kwargs)
    hooks: list[AttentionHook] = getattr(module, "headhunt_hooks", [])
    only = getattr(module, "headhunt_hook_layers", None)
    if only:  # a looped module: hooks installed on some of its applications only
        here = module.headhunt_layer
        hooks = [h for h in hooks if here in only.get(id(h), (here,))]
    call = AttentionCall(
        module.headhunt_layer,
        query,
        key,
        value,
        attention_mask,
        kwargs.get("scaling") or query.shape[-1] ** -0.5,
        module=module,
        kwargs=kwargs,
        query_start=getattr(module, "headhunt_query_start", None),
    )
    output = weights = None
    if hooks:
        check_call(call)
        for hook in hooks:
            hook.before(call)
        for hook in hooks:  # the first hook that computes the output replaces the kernel
            output = hook.compute(call)
            if output is not None:
                break
    if output is None:
        output, weights = _run_base_kernel(module, call, kwargs)
    if getattr(module, "headhunt_gated", False):
        # the layer gates (or normalises) the heads' output before projecting it: the
        # ``after`` hooks run on what its output projection reads (see defer_after)
        module.headhunt_pending = (call, list(hooks)) if hooks else None
        return output, weights
    for hook in hooks:
        output = hook.after(call, output)
    return output, weights


# Names of a layer's output projection (the linear map that reads every head's output).
_OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "dense", "c_proj", "wo", "o")


def output_projection(module: torch.nn.Module) -> torch.nn.Module | None:
    """The attention module's output projection (None when it has none of the known names)."""
    for name in _OUTPUT_PROJECTIONS:
        proj = getattr(module, name, None)
        if isinstance(proj, torch.nn.Module):
            return proj
    return None


def defer_after(module: torch.nn.Module) -> None:
    """Run the ``after`` hooks of ``module``'s attention calls on the input of its output
    projection instead of on the kernel's output.

    Gated attention (Qwen3-Next, Qwen3.5: ``output * sigmoid(gate)`` per head and channel)
    changes each head's output after the kernel; what the head writes into the residual stream
    is the gated output the projection reads. Masking, mean ablation, pruning and ACT therefore
    act there, as the model computes it, and captures of head outputs read it there.
    ``HookedModel`` defers a layer whose projection input differs from its kernel output."""
    if getattr(module, "headhunt_gated", False):
        return
    proj = output_projection(module)
    if proj is None:
        raise HeadhuntError(
            f"{type(module).__name__}: changes its heads' output before an output projection "
            "headhunt cannot find"
        )

    def run_after(_proj, args):
        pending = getattr(module, "headhunt_pending", None)
        if pending is None:
            return None
        module.headhunt_pending = None
        call, hooks = pending
        x = args[0]
        out = x.reshape(*x.shape[:2], call.query.shape[1], -1)  # [b, nq, hq, d]
        for hook in hooks:
            out = hook.after(call, out)
        return (out.reshape(x.shape), *args[1:])

    proj.register_forward_pre_hook(run_after)
    module.headhunt_gated = True
    module.headhunt_pending = None


def _run_base_kernel(module: torch.nn.Module, call: AttentionCall, kwargs: dict) -> tuple:
    """The model's own attention kernel on the call's (possibly replaced) q, k, v."""
    mask = call.attention_mask
    if base_name(module, call) == "eager":
        # Masks for our implementation are built as SDPA's: a boolean 4D mask (padding), or
        # None where SDPA's is_causal flag suffices. Eager attention needs them additive.
        if mask is None and call.query.shape[2] > 1 and call.causal:
            mask = _causal_mask(call.query, call.key)
        elif mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=call.query.dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(call.query.dtype).min
            )
    with _without_cudnn_sdpa(call.query, call.key):
        return base_kernel(module, call)(module, call.query, call.key, call.value, mask, **kwargs)


class _LoopOrder:
    """The order in which one forward applies a looped model's attention modules (a module
    once per application), and how far the running forward has got."""

    def __init__(self, order: list[torch.nn.Module]):
        self.order = order
        self.next = 0
        self.query_start: int | None = None


def install_loop(model: torch.nn.Module, order: list[torch.nn.Module]) -> None:
    """Tell each module of a looped model which application it runs: the i-th attention call
    of a forward is layer i (HRM-Text's stacks, Dory's and Inkling 2 Loop's reapplied layers).
    The count restarts at every forward of the model."""
    loop = _LoopOrder(order)
    for m in {id(m): m for m in order}.values():
        m.headhunt_loop = loop
        m.headhunt_hook_layers = {}
        if not getattr(m, "headhunt_loop_hook", False):
            m.register_forward_pre_hook(_loop_position, with_kwargs=True, prepend=True)
            m.headhunt_loop_hook = True

    def restart(_mod, _args):
        loop.next, loop.query_start = 0, None

    if getattr(model, "headhunt_loop_restart", None) is not None:
        model.headhunt_loop_restart.remove()
    model.headhunt_loop_restart = model.register_forward_pre_hook(restart)


def _loop_position(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of a looped module: its layer is this application's position in the
    order the load check saw; a forward that applies the modules in another order (another
    number of loops) is refused, since its layers would not be the ones described."""
    loop = module.headhunt_loop
    at = loop.next
    if at >= len(loop.order) or loop.order[at] is not module:
        raise HeadhuntError(
            f"{type(module).__name__} (layer {module.layer_idx} of its stack) ran as attention "
            f"application {at}, not in the order of {len(loop.order)} applications headhunt "
            "unrolled at load (another number of loops?); reload the model"
        )
    loop.next = at + 1
    module.headhunt_layer = at


def _record_query_start(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of an attention module: the tokens its layer's cache has seen before
    this call, i.e. the absolute position of the call's first query (a sliding layer's cache
    may keep fewer keys than that).

    A module whose layer index headhunt gave it (one application of a block shared by several
    layers: Zamba) must be told the same index by the model's forward, else its call would be
    scored as another layer's."""
    if getattr(module, "headhunt_indexed", False):
        told = kwargs.get("layer_idx", args[1] if len(args) > 1 else None)
        if told is not None and told != module.layer_idx:
            raise HeadhuntError(
                f"{type(module).__name__} at layer {module.layer_idx} was called as layer "
                f"{told}: one attention module runs at several layers; headhunt captures one "
                "attention module per layer"
            )
    loop = getattr(module, "headhunt_loop", None)
    if loop is not None and module.headhunt_layer > 0:
        # a looped model writes later applications to cache slots of their own (or none):
        # every application of one forward starts where the first did
        module.headhunt_query_start = loop.query_start
        return
    names = [n for n in ("cache", "past_key_values", "past_key_value") if n in kwargs]
    if not names:  # the cache is not passed by name: assume keys start at position 0
        module.headhunt_query_start = None
        return
    cache = kwargs[names[0]]
    seen = 0
    if cache is not None and hasattr(cache, "get_seq_length"):
        from transformers.cache_utils import CacheLayerMixin

        layers = getattr(cache, "layers", None) or []
        idx = module.layer_idx
        reuses = idx < len(layers) and not isinstance(layers[idx], CacheLayerMixin)
        # transformers before 5.24 gives a layer that reuses another layer's keys (Gemma 3n's
        # `is_kv_shared_layer`) no cache slot at all: the cache ends before it
        reuses = reuses or (idx >= len(layers) > 0 and getattr(module, "is_kv_shared_layer", False))
        if reuses:
            # a layer that reads another layer's cache (KV sharing) keeps none; every layer of
            # one forward starts at the same position, which the layers before it recorded
            seen = getattr(cache, "headhunt_query_start", 0)
        else:
            seen = int(cache.get_seq_length(module.layer_idx))
            cache.headhunt_query_start = seen
    module.headhunt_query_start = seen
    if loop is not None:
        loop.query_start = seen


def register() -> None:
    """Register the implementation and its mask builder. Without a mask builder transformers
    treats a custom implementation as mask-free and drops padding masks (left-padded batches
    would attend to their pads)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, headhunt_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every layer, in layer order."""
    found = [
        m
        for m in model.modules()
        if hasattr(m, "layer_idx")
        and (hasattr(m, "config") or getattr(m, "headhunt_adapted", False))
    ]
    found = [m for m in found if type(m).__name__.endswith(("Attention", "MLA"))]
    # a module shared by several layers (layer index None) sorts last
    return sorted(found, key=lambda m: (m.layer_idx is None, m.layer_idx or 0))
