"""Capture what a method asks for, and nothing more.

- :func:`capture_qk`: every layer's post-rotary q and k from one SDPA forward (linear memory).
- :func:`capture_attention_stats`: per-head attention statistics (log-sum-exp, argmax, per-key
  column sums) from :mod:`headhunt.kernels`, computed inside the forward, layer by layer.
- :func:`greedy_decode`: batched greedy decoding with a KV cache; optionally, at every step, the
  argmax key of every layer's and head's attention row, batched over heads (on CUDA one kernel
  pair for all layers of a step, else one call per layer), with no host sync per head.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel


class QKCapture(AttentionHook):
    """Keeps each layer's (q, k) of the last call: q [b, hq, n, d], k [b, hkv, n, d]."""

    def __init__(self, dtype: torch.dtype | None = None):
        self.qk: dict[int, tuple[Tensor, Tensor]] = {}
        self.dtype = dtype

    def before(self, call: AttentionCall) -> None:
        q, k = call.query.detach(), call.key.detach()
        if self.dtype is not None:
            q, k = q.to(self.dtype), k.to(self.dtype)
        self.qk[call.layer] = (q, k)


@torch.inference_mode()
def capture_qk(
    model: HookedModel, input_ids: Int[Tensor, "b n"], layers: Collection[int] | None = None
) -> dict[int, tuple[Float[Tensor, "b hq n d"], Float[Tensor, "b hkv n d"]]]:
    """Post-rotary queries and keys of ``layers`` (default all) from one forward pass."""
    cap = QKCapture()
    with model.hooks(cap, layers=None if layers is None else sorted(layers)):
        model.forward(input_ids, use_cache=False, logits_to_keep=1)
    return cap.qk


class StatsCapture(AttentionHook):
    """Per-head statistics of each layer's attention (:func:`headhunt.kernels.attention_stats`),
    computed inside the forward, so no layer's q/k outlives its own call. The kernels are told
    everything the layer's own kernel does (mask, window, softcap, sinks:
    :meth:`AttentionCall.kernel_kwargs`).

    ``fused`` (default): where :func:`headhunt.kernels.fused_supported` holds (CUDA with
    Triton, whole-sequence calls), the layer's attention output and row statistics come from
    one fused kernel (:func:`headhunt.kernels.attention_forward`) that replaces the model's own
    kernel for the call (scores in float32, probabilities rounded to the value dtype for
    ``p @ v``, as flash kernels do), and column sums take one more pass. Elsewhere (CPU, decode
    shapes, options the fused kernel lacks) the model's kernel runs unchanged and the
    statistics are computed from the call's q and k in ``before``, as with ``fused=False``
    (if another hook computes the output first, in ``after``).

    ``offload``: copy each layer's statistics into pinned host memory on a side stream as
    soon as they exist, so the GPU holds one layer's statistics at a time instead of every
    layer's (about 3 GiB for an 8B-shaped model at 128k tokens) and the forward never waits
    for the copies; call :meth:`finish` before reading them.
    """

    def __init__(self, fused: bool = True, offload: bool = False, **kwargs):
        self.kwargs = kwargs
        self.fused = fused and kwargs.get("backend", "auto") == "auto"
        self.offload = offload
        self.stats: dict[int, object] = {}
        self.key_counts: dict[int, Tensor] = {}  # layer -> [b, nk] queries that see each key
        self.fused_layers: set[int] = set()  # layers whose last call the fused kernel served
        self._copies: torch.cuda.Stream | None = None

    def _keep(self, layer: int, stats) -> None:
        if self.offload and stats.lse.is_cuda:
            stats = self._to_host(stats)
        self.stats[layer] = stats

    def _to_host(self, stats):
        """Pinned host copies of every tensor of ``stats``, made on a side stream after the
        kernels that wrote them; each device tensor is freed once its copy is done."""
        dev = stats.lse.device
        if self._copies is None:
            self._copies = torch.cuda.Stream(dev)
        self._copies.wait_stream(torch.cuda.current_stream(dev))
        host = {}
        with torch.cuda.stream(self._copies):
            for f in dataclasses.fields(stats):
                t = getattr(stats, f.name)
                if t is not None:
                    host[f.name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    host[f.name].copy_(t, non_blocking=True)
                    t.record_stream(self._copies)
        return dataclasses.replace(stats, **host)

    def finish(self) -> None:
        """Wait for the host copies of ``offload`` (a no-op otherwise)."""
        if self._copies is not None:
            self._copies.synchronize()

    def _fusable(self, call: AttentionCall) -> dict | None:
        """The kernel options of ``call`` when the fused kernel serves it, else None."""
        from headhunt.kernels import fused_supported

        if not (self.fused and call.query.is_cuda):
            return None
        options = call.kernel_kwargs()
        ok = fused_supported(call.query, call.key, call.value, options=options)
        return options if ok else None

    def before(self, call: AttentionCall) -> None:
        from headhunt.kernels import attention_stats

        self.stats.pop(call.layer, None)
        self.fused_layers.discard(call.layer)
        self.key_counts[call.layer] = call.key_counts()
        if self._fusable(call) is None:
            self._keep(
                call.layer,
                attention_stats(call.query, call.key, **call.kernel_kwargs(), **self.kwargs),
            )

    def compute(self, call: AttentionCall) -> Tensor | None:
        from headhunt.kernels import attention_forward

        options = self._fusable(call)
        if options is None:
            return None
        out, stats = attention_forward(call.query, call.key, call.value, **options, **self.kwargs)
        self._keep(call.layer, stats)
        self.fused_layers.add(call.layer)
        return out.transpose(1, 2).contiguous()  # [b, nq, hq, d]; no copy from Triton

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        from headhunt.kernels import attention_stats

        if call.layer not in self.stats:  # fusable, but the fused kernel did not run
            self._keep(
                call.layer,
                attention_stats(call.query, call.key, **call.kernel_kwargs(), **self.kwargs),
            )
        return output


@torch.inference_mode()
def capture_attention_stats(
    model: HookedModel,
    input_ids: Int[Tensor, "b n"],
    layers: Collection[int] | None = None,
    *,
    attention_mask: Int[Tensor, "b n"] | None = None,
    **kwargs,
) -> dict[int, object]:
    """Per-layer :class:`headhunt.kernels.AttentionStats` for every head, in one forward pass.

    ``attention_mask`` ([batch, n], 1 = token, 0 = pad) lets a left-padded batch through:
    pad queries see no key (``lse = -inf``) and pad keys get no attention. Keyword arguments
    go to :class:`StatsCapture` (``fused``; ``offload``: statistics in host memory) and
    :func:`headhunt.kernels.attention_stats` (``key_stats``, ``entropy``, ``backend``).
    Memory grows linearly with the sequence length.
    """
    return capture_stats_and_counts(
        model, input_ids, layers, attention_mask=attention_mask, **kwargs
    )[0]


@torch.inference_mode()
def capture_stats_and_counts(
    model: HookedModel,
    input_ids: Int[Tensor, "b n"],
    layers: Collection[int] | None = None,
    *,
    attention_mask: Int[Tensor, "b n"] | None = None,
    **kwargs,
) -> tuple[dict[int, object], dict[int, Int[Tensor, "b n"]]]:
    """:func:`capture_attention_stats` and, per layer, how many queries see each key (fewer
    than ``n - j`` on a sliding-window or padded layer)."""
    cap = StatsCapture(**kwargs)
    extra = {} if attention_mask is None else {"attention_mask": attention_mask.to(model.device)}
    with model.hooks(cap, layers=None if layers is None else sorted(layers)):
        model.forward(input_ids, use_cache=False, logits_to_keep=1, **extra)  # no [n, vocab]
    cap.finish()
    return cap.stats, cap.key_counts


class DecodeArgmax(AttentionHook):
    """At each single-query (decode) call, the absolute position of the argmax key of every
    head's attention row: ``step[layer]`` is [b, hq] for the last step.

    The row is scored as the layer's kernel scores it (scale, softcap, and only the keys its
    mask lets it see: padding, sliding window, chunk); softcap and softmax are monotonic, so
    the argmax of the logits is the argmax of the attention (a learned sink slot is not a key).
    Key indices are mapped to absolute positions, since a sliding layer's cache may keep only
    its window.

    On CUDA, layers whose query sees its whole cache (no mask beyond it, no softcap) are only
    noted during the forward; reading ``step`` (or :meth:`stacked`) then scores all of them in
    two kernel launches (:func:`headhunt.kernels.decode_argmax_layers`, the
    same scores and tie rule as the split-K path of ``attention_stats``). Per-layer calls cost
    more host time than the whole step's GPU work on a small model. Other layers go through
    ``attention_stats`` at once.

    ``skip_rows`` ([b] bool on the model's device, or None) flags batch rows whose argmax
    is not wanted at the coming steps (e.g. rows that already stopped): they get -1, and
    the many-layer kernel does not read their keys.
    """

    # kernel_kwargs of a call that sees its whole cache: nothing but these (sinks do not
    # move an argmax over keys).
    _WHOLE_CACHE = frozenset({"scale", "causal", "q_offset", "sinks", "row_sinks"})

    def __init__(self, n_layers: int):
        self._step: list[Tensor | None] = [None] * n_layers
        self._pending: dict[int, tuple[Tensor, Tensor, int]] = {}  # layer -> q, k, key start
        self._all: Tensor | None = None  # [layers, b, hq] when one launch served every layer
        self.skip_rows: Tensor | None = None
        self._pending_skip: Tensor | None = None

    def before(self, call: AttentionCall) -> None:
        from headhunt.kernels import attention_stats

        if call.query.shape[2] != 1:
            return
        if call.layer in self._pending:  # a new step before anyone read the last one
            self._flush()
        # Without a mask the query sees its whole cache (kernel_kwargs would say only
        # scale, causality, offset, softcap and sinks): the cheap check first. The many-layer
        # kernel adds no ALiBi or model-built bias: such layers go through attention_stats below
        # (a bias: its torch path, on every device).
        plain = (
            call.attention_mask is None
            and call.softcap is None
            and call.alibi_slopes is None
            and call.bias is None
        )
        kw = None if plain else call.kernel_kwargs()
        if (plain or kw.keys() <= self._WHOLE_CACHE) and self._batched_ok(call):
            self._pending[call.layer] = (call.query, call.key, call.key_start)
            self._pending_skip = self.skip_rows  # the step's flags, should it be read late
            return
        # The kernels' decode path (split-K on CUDA) scores in float32 like the model's own
        # kernel accumulates, and takes the lowest key on ties.
        kw = call.kernel_kwargs() if kw is None else kw
        stats = attention_stats(call.query, call.key, key_stats=False, **kw)
        step = stats.argmax[:, :, 0] + call.key_start
        if self.skip_rows is not None:
            step = step.masked_fill(self.skip_rows.to(step.device)[:, None], -1)
        self._step[call.layer] = step
        self._all = None

    def _batched_ok(self, call: AttentionCall) -> bool:
        """Whether the call can go to the many-layer kernel (CUDA with Triton, a dtype and
        head size it takes, unit stride along d)."""
        from headhunt.kernels import decode_argmax_supported

        return decode_argmax_supported(call.query, call.key)

    @property
    def step(self) -> list[Tensor | None]:
        """Per layer, [b, hq] absolute argmax positions of the last decode step (None for a
        layer not seen)."""
        self._flush()
        return self._step

    def stacked(self, device: torch.device) -> Int[Tensor, "layers b hq"]:
        """``step`` as one [layers, b, hq] tensor on ``device``; a layer not seen (not an
        attention layer of a hybrid model) is -1, a key no head ever picks."""
        step = self.step
        if self._all is not None and self._all.device == device:
            return self._all
        seen = next(s for s in step if s is not None)
        return torch.stack([seen.new_full(seen.shape, -1) if s is None else s for s in step]).to(
            device
        )

    def _flush(self) -> None:
        """Score the noted layers, one launch pair per group that shares shapes, strides,
        dtype, device and key start."""
        from headhunt.kernels import decode_argmax_layers

        if not self._pending:
            return
        groups: dict[tuple, list[int]] = {}
        for layer, (q, k, start) in self._pending.items():
            key = (q.shape, q.stride(), k.shape, k.stride(), q.dtype, k.dtype, k.device, start)
            groups.setdefault(key, []).append(layer)
        self._all = None
        for key, layers in groups.items():
            qs = [self._pending[i][0] for i in layers]
            ks = [self._pending[i][1] for i in layers]
            skip = None if self._pending_skip is None else self._pending_skip.to(key[-2])
            out = decode_argmax_layers(qs, ks, key[-1], skip)
            for i, layer in enumerate(layers):
                self._step[layer] = out[i]
            if layers == list(range(len(self._step))):
                self._all = out
        self._pending = {}


@dataclass
class Decoded:
    """Output of :func:`greedy_decode`.

    Attributes:
        tokens: [batch, steps] generated ids (a row's tokens after its stop token are junk); a
            codebook model's (MusicGen Melody) [batch x codebooks, steps], each codebook row's
            argmax (together the tuple that maximises the product of its heads' probabilities).
        lengths: [batch] number of valid generated tokens per row, stop token included.
        argmax: [steps, layers, batch, heads] argmax key position of each decode step's query
            (step t's query is the token fed at step t; its output is ``tokens[:, t]``), or None;
            -1 at a row's steps past ``lengths`` when decoded with ``skip_stopped_rows``.
        cache: the KV cache after the last step (its size is what a decoding holds).
    """

    tokens: Int[Tensor, "b steps"]
    lengths: Int[Tensor, " b"]
    argmax: Int[Tensor, "steps layers b heads"] | None
    cache: Any = None


@torch.inference_mode()
def greedy_decode(
    model: HookedModel,
    prompts: Int[Tensor, "b n"],
    *,
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    capture_argmax: bool = False,
    skip_stopped_rows: bool = False,
    hooks: tuple[AttentionHook, ...] = (),
    attention_mask: Int[Tensor, "b n"] | None = None,
    cache: Any = None,
) -> Decoded:
    """Greedy decoding of equal-length prompts with a KV cache.

    Prefill runs on all but the last prompt token (SDPA, nothing captured); decoding starts
    from the last prompt token, so every generated token, the first included, comes from a
    single-query step whose attention rows are captured (as in Wu et al.'s reference).
    ``hooks`` (e.g. head masks) stay installed for prefill and decoding alike.
    ``attention_mask`` ([batch, n], 0 = pad) decodes left-padded prompts: pads are never
    attended to and positions count real tokens only, as ``generate`` does. Argmax positions
    index the padded rows. A codebook model takes its own layout: ``prompts`` [batch x
    codebooks, n] with ``attention_mask`` [batch, n]. ``skip_stopped_rows`` captures no argmax for a row once it has
    produced a stop token (-1 at its later steps, whose tokens are junk): the argmax kernel
    then reads no keys for rows that are done, while the batch decodes on for the others.
    ``cache``: the KV cache to fill (None: transformers' own), e.g. the streaming-heads cache
    of KV-cache head pruning (with its hook in ``hooks``).
    """
    dev = model.device
    if skip_stopped_rows and getattr(model, "codebooks", 1) > 1:
        raise HeadhuntError(
            f"{type(model.model).__name__} decodes {model.codebooks} token rows per sequence: "
            "a stopped row is one codebook's, not a sequence's (skip_stopped_rows)"
        )
    prompts = prompts.to(dev)
    mask = None if attention_mask is None else attention_mask.to(dev).long()
    cap = DecodeArgmax(model.n_layers) if capture_argmax else None
    own = _module_caches(model)
    if own is not None:  # GPT-1, causal XLM: one of headhunt's caches in their modules
        if cache is not None:
            raise HeadhuntError(
                f"{type(model.model).__name__} returns no KV cache; the cache given cannot "
                "be filled (headhunt decodes it with a cache of its own)"
            )
        cache = own
    elif cache is None:
        cache = cache_for_stateful(model.model)
    if (
        own is None
        and cache_kwarg(model.model) not in inspect.signature(model.model.forward).parameters
    ):
        raise HeadhuntError(
            f"{type(model.model).__name__} takes no KV cache (its forward has no cache "
            "argument); headhunt decodes with one"
        )
    try:
        if own is not None:
            for m in model.attention_modules:
                m.headhunt_kv = own
        return _greedy_decode(
            model, prompts, mask, max_new_tokens, stop_ids, cap, skip_stopped_rows, hooks, cache
        )
    finally:
        if own is not None:
            for m in model.attention_modules:
                m.headhunt_kv = None


def _module_caches(model: HookedModel) -> Any:
    """A :class:`~headhunt.probes.module_attention.ModuleKVCache` when every attention module
    of the model can keep one (those headhunt routes in a model that returns no KV cache:
    GPT-1's, whose forward takes none, causal XLM's, whose cached step takes the whole
    sequence again); else None."""
    modules = model.attention_modules
    if not modules or not all(hasattr(m, "headhunt_kv") for m in modules):
        return None
    from headhunt.probes.module_attention import ModuleKVCache

    return ModuleKVCache()


def _greedy_decode(
    model, prompts, mask, max_new_tokens, stop_ids, cap, skip_stopped_rows, hooks, cache
) -> Decoded:
    dev = model.device
    b = prompts.shape[0]
    stop = torch.tensor(sorted(stop_ids), device=dev, dtype=torch.long)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    lengths = torch.zeros(b, dtype=torch.long, device=dev)
    tokens, argmax = [], []
    with model.hooks(*hooks):
        n = prompts.shape[1]
        m, pos = _mask_and_positions(mask, n - 1)
        out = _step(model, prompts[:, :-1], m, pos, cache)
        past, cur = _cache(out, cache), prompts[:, -1:]
        extra = (cap,) if cap is not None else ()
        with model.hooks(*extra):
            for t in range(max_new_tokens):
                if mask is not None and t > 0:  # (a codebook model: b x codebooks token rows)
                    mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
                m, pos = _mask_and_positions(mask, n + t)
                pos = None if pos is None else pos[:, -1:]
                if cap is not None and skip_stopped_rows:
                    # Rows that stopped before this step. `done` is replaced below, never
                    # changed in place, so this is still the state before step t when the
                    # argmax is taken (the row whose token t is its stop token is scored).
                    cap.skip_rows = done
                out = _step(model, cur, m, pos, past)
                past = _cache(out, past)
                nxt = out.logits[:, -1].argmax(-1)
                tokens.append(nxt)
                lengths += (~done).long()
                done = done | torch.isin(nxt, stop)
                finished = bool(done.all())  # the one host sync per step
                if cap is not None:
                    # After the sync, so the argmax kernels run while the host prepares the
                    # next step. Layers may sit on several devices (--device-map): gather on
                    # the first.
                    argmax.append(cap.stacked(dev))
                if finished:
                    break
                cur = nxt[:, None]
    return Decoded(
        tokens=torch.stack(tokens, 1),
        lengths=lengths,
        argmax=torch.stack(argmax) if argmax else None,
        cache=past,
    )


def responses(
    tokenizer, tokens: Int[Tensor, "b steps"], lengths: Sequence[int], stop_ids: Collection[int]
) -> list[str]:
    """Each row's greedy response as text: its first ``lengths[j]`` tokens less the stop
    tokens, special tokens skipped (what a task then scores)."""
    out = []
    for j, n in enumerate(lengths):
        ids = [x for x in tokens[j, : int(n)].tolist() if x not in stop_ids]
        out.append(tokenizer.decode(ids, skip_special_tokens=True))
    return out


def _mask_and_positions(mask: Tensor | None, length: int) -> tuple[Tensor | None, Tensor | None]:
    """The first ``length`` columns of a padding mask and the positions that count real
    tokens only (pads get position 0), or (None, None) without a mask."""
    if mask is None:
        return None, None
    m = mask[:, :length]
    return m, (m.cumsum(-1) - 1).clamp_min(0)


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name a causal LM's forward takes its KV cache under (``past_key_values`` before
    transformers 5.2x, ``cache`` after)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _step(model: HookedModel, ids: Tensor, mask, positions, cache):
    """One cached forward, the cache passed under the name this model's forward uses (a
    model that takes none decodes with the cache headhunt put in its modules)."""
    if isinstance(cache, _module_kv_cache_class()):
        if getattr(model.attention_modules[0], "headhunt_step_mask_new", False):
            # XLM reads one padding-mask column per token it is fed, and without a mask
            # guesses one by counting pad ids: every fed token given, as real when no mask is
            mask = ids.new_ones(ids.shape) if mask is None else mask[:, -ids.shape[1] :]
        kw = {"attention_mask": mask, "logits_to_keep": 1}
        if positions is None:  # no mask: the positions a full forward would give
            start = cache.get_seq_length(model.attention_layers[0])
            positions = torch.arange(start, start + ids.shape[1], device=ids.device)[None]
        kw["position_ids"] = positions.expand(ids.shape[0], -1)
        return model.forward(ids, **kw)
    kw = {cache_kwarg(model.model): cache, "attention_mask": mask, "use_cache": True}
    kw["logits_to_keep"] = 1
    if positions is not None:
        kw["position_ids"] = positions
    return model.model(ids, **kw)


def _module_kv_cache_class():
    from headhunt.probes.module_attention import ModuleKVCache

    return ModuleKVCache


def cache_for_stateful(model: torch.nn.Module) -> Any:
    """A KV cache to hand a model that returns none (None for every other model, which makes
    its own). RecurrentGemma keeps its recurrent state inside its modules and returns no
    cache, yet its attention layers read and write the cache they are given: headhunt gives
    it transformers' ``DynamicCache`` for its config, the one the model builds for itself, and
    keeps decoding with it. Known by the forward's declared output, a dataclass without a
    cache field."""
    import inspect

    out = inspect.signature(model.forward).return_annotation
    fields = getattr(out, "__dataclass_fields__", None)
    if fields is None or "cache" in fields or "past_key_values" in fields:
        return None
    if cache_kwarg(model) not in inspect.signature(model.forward).parameters:
        return None
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _cache(output, given: Any = None):
    """The KV cache of a model output (or ``given``, the cache the forward was handed, when the
    model returns none: :func:`cache_for_stateful`). The cache is the fourth positional argument
    of a causal LM's forward, named ``past_key_values`` before transformers 5.2x and ``cache``
    after."""
    for name in ("cache", "past_key_values"):
        if output.get(name) is not None:
            return output[name]
    if given is not None:
        return given
    raise HeadhuntError(
        "the model returns no KV cache from a cached forward (it keeps its decoding state "
        "inside its modules); headhunt decodes with transformers' cache"
    )
