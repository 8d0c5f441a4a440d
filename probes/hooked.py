"""The hooked model: a Hugging Face causal LM with headhunt's attention hooks installed."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.probes import attention, module_attention
from headhunt.probes.attention import AttentionHook


def pick_device(device: str | None = None) -> torch.device:
    """ "auto"/None picks CUDA when present, else the CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise HeadhuntError(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HeadhuntError(f"device {device!r} asked for, but CUDA is not available")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise HeadhuntError(f"device {device!r} asked for, but this machine has no MPS (Apple GPU)")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise HeadhuntError(f"device {device!r} is not supported (use auto, cpu, cuda or cuda:N)")
    return dev


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """ "auto"/None: bfloat16 on CUDA, float32 elsewhere (CPU bf16 matmuls are slow)."""
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise HeadhuntError(f"unknown dtype {dtype!r} (use auto, float32, bfloat16 or float16)")
    return table[dtype]


# The load check's prompts: the same three tokens but the last (see HookedModel._check_causal).
_CHECK_PROMPTS = [[1, 2, 3], [1, 2, 2]]


@dataclass
class HookedModel:
    """A causal LM with hooks on every attention layer.

    Attributes:
        model: the Hugging Face model (attention implementation switched to headhunt's, which
            calls the original SDPA/eager kernel after the hooks).
        tokenizer: its tokenizer.
        name: the spec it was loaded from.
        n_layers, n_heads, n_kv_heads, head_dim, d_model, max_context: its shape.
    """

    model: Any
    tokenizer: Any
    name: str
    modules: list = field(repr=False, default_factory=list)
    # Where the weights came from: the model's own name, format, files and content hash (set
    # by load_model; None for a model built in memory).
    source: dict[str, Any] | None = field(repr=False, default=None)
    # The slot where the load check's verdict on this very model is kept (a GGUF's metadata
    # entry: probes/gguf_check.py); None runs the check's forward at every load.
    load_check: Any = field(repr=False, default=None)

    def __post_init__(self) -> None:
        cfg = _text_config(self.model.config)
        # Each unrolled layer's module (its name in the model) where modules run at several
        # depths of one forward (HRM-Text, Dory, Inkling 2 Loop); None for other models.
        self.loop_modules: list[str] | None = None
        # Token rows per sequence: MusicGen Melody's decoder reads one row per audio codebook
        # (``input_ids`` [batch x codebooks, n], the rows of a sequence consecutive, one
        # embedding per codebook summed at each position); 1 for every other model.
        self.codebooks: int = _codebook_rows(self.model)
        if "shared_kv_states" in inspect.signature(self.model.forward).parameters:
            # Gemma 4's assistants: every layer's queries (the drafter's own positions) attend
            # to the keys and values of another model (the last layers of the model it drafts
            # for, under a bidirectional mask over that model's positions); the drafter has no
            # key or value projection: cross-attention, which headhunt does not capture
            raise HeadhuntError(
                f"{type(self.model).__name__} is a drafter whose attention is cross-attention "
                "to the KV states of the model it drafts for (shared_kv_states: no keys of its "
                "own); headhunt captures self-attention: capture that model instead"
            )
        self.attention_free: bool = _is_attention_free(self.model, cfg)
        if self.attention_free:
            self._wrap_attention_free(cfg)
            return
        try:
            self.n_layers: int = cfg.num_hidden_layers
            self.n_heads: int = _one_query_head_count(cfg, self.n_layers, self.model)
            self.d_model: int = cfg.hidden_size
            # Each layer's head size (Gemma 4's global layers have larger heads than its
            # sliding ones); ``head_dim`` is the one size where all layers share it.
            self.head_dims: list[int] = _per_layer_head_dims(cfg, self.n_layers, self.n_heads)
            # Each layer's number of key heads (Gemma 4's larger models give their global
            # layers fewer, with ``attention_k_eq_v``); ``n_kv_heads`` is the one count where
            # all layers share it.
            self.kv_head_counts: list[int] = _per_layer_kv_heads(cfg, self.n_layers, self.n_heads)
            # The text vocabulary (a multimodal model's top-level config has none).
            self.vocab_size: int | None = getattr(cfg, "vocab_size", None)
        except HeadhuntError:
            raise
        except Exception as e:  # recurrent configs lack heads; some vary them per layer
            cross = [
                m for m in attention.attention_modules(self.model) if "Cross" in type(m).__name__
            ]
            if cross:  # BLT: byte encoder and decoder cross-attend to a latent transformer
                raise HeadhuntError(
                    f"{type(self.model).__name__} has cross-attention ({type(cross[0]).__name__}) "
                    "and no one decoder stack; headhunt captures decoder-only self-attention"
                ) from None
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise HeadhuntError(
                f"{type(self.model).__name__}: no single attention shape in its config "
                f"({first[:120]}); headhunt captures models whose layers share one"
            ) from None
        self.max_context: int = _max_context(cfg)
        base = cfg._attn_implementation  # the kernel our hooks hand over to
        if getattr(self.model.config, "is_encoder_decoder", False):
            raise HeadhuntError(
                f"{type(self.model).__name__} is an encoder-decoder model; headhunt captures "
                "decoder-only causal LMs"
            )
        attention.register()
        _compute_every_query(self.model)
        # Modules that compute attention in their own code are routed through the seam where
        # they are (their model keeps its own attention implementation and masks); every other
        # model calls headhunt's implementation through transformers' AttentionInterface.
        self.routed_modules = module_attention.adapt(self.model)
        if not self.routed_modules:
            try:
                self.model.set_attn_implementation(attention.IMPLEMENTATION)
            except (ValueError, NotImplementedError, AttributeError) as e:
                raise HeadhuntError(
                    f"{type(self.model).__name__} does not take a custom attention "
                    f"implementation ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                ) from None
        found = attention.attention_modules(self.model)
        if cfg is not self.model.config:  # a multimodal model: only its text tower is captured
            found = [m for m in found if m.config is cfg]
        found = _index_shared_blocks(self.model, found, self.n_layers)
        # A hybrid model's config names each layer's kind; the layers it says are not softmax
        # attention (linear attention, state-space, short convolution, MLP-only) are passed
        # through, keeping the model's own layer indices. Every other layer must be captured.
        self.layer_kinds: list[str] | None = _layer_kinds(cfg, self.n_layers)
        self._base = base
        indices = [m.layer_idx for m in found if isinstance(m.layer_idx, int)]
        if (
            not self.routed_modules
            and len(set(indices)) < len(indices)
            and len(found) < self.n_layers
            and not self.layer_kinds
        ):
            # HRM-Text: two stacks whose modules share layer indices, each stack reapplied in
            # recurrent cycles: the order of one forward's applications says which is which
            order = _application_order(self.model, found, base)
            if len(order) > len({id(m) for m in order}):
                self._unroll(order)
                self._install()
                self.model.eval()
                self._check_causal(self._check_calls())
                return
        kinds = self.layer_kinds or ["attention"] * self.n_layers
        per_layer: dict[int, list] = {}
        for m in found:
            idx = m.layer_idx
            if isinstance(idx, int) and 0 <= idx < self.n_layers and not passes_through(kinds[idx]):
                per_layer.setdefault(m.layer_idx, []).append(m)
        several = [i for i, ms in per_layer.items() if len(ms) > 1]
        if several and self.layer_kinds is None and len(found) < self.n_layers:
            # HRM-Text: two stacks of layers, each applied again in recurrent cycles, every
            # application a cache slot (a "layer") of its own: no module is one layer
            raise HeadhuntError(
                f"{type(self.model).__name__}: {len(found)} attention modules for "
                f"{self.n_layers} layers, each module run at several layers of one forward "
                "(stacks reapplied in recurrent cycles); headhunt captures one self-attention "
                "module per layer"
            )
        if several or (self.layer_kinds is None and len(found) > self.n_layers):
            raise HeadhuntError(
                f"{type(self.model).__name__}: {len(found)} attention modules for "
                f"{self.n_layers} layers (cross-attention or several attentions per layer?); "
                "headhunt captures one self-attention per layer"
            )
        by_layer = {i: ms[0] for i, ms in per_layer.items()}
        wanted = [i for i in range(self.n_layers) if not passes_through(kinds[i])]
        if not wanted:
            raise HeadhuntError(
                f"{type(self.model).__name__}: no softmax attention layer (its layers are "
                f"{', '.join(sorted(set(kinds)))}); headhunt's head methods need attention heads"
            )
        shared = [m for m in found if not isinstance(m.layer_idx, int) or m.layer_idx < 0]
        if not by_layer and shared:
            raise HeadhuntError(
                f"{type(self.model).__name__}: one attention module object "
                f"({type(shared[0]).__name__}) runs at several layers, with no layer index of "
                "its own; headhunt captures one attention module per layer"
            )
        cross = _cross_attention_name(self.model)
        if not by_layer and cross is not None:  # the decoder of an encoder-decoder model
            raise HeadhuntError(
                f"{type(self.model).__name__}: its decoder layers hold cross-attention ({cross}) "
                "to an encoder; headhunt captures decoder-only self-attention"
            )
        if not by_layer:
            raise HeadhuntError(
                f"{type(self.model).__name__}: no attention module with a layer index (recurrent "
                "layers only, or an older modeling file outside transformers' "
                "AttentionInterface); headhunt cannot hook it"
            )
        lacking = [i for i in wanted if i not in by_layer]
        if lacking:
            if not _uses_attention_interface(self.model):
                raise HeadhuntError(
                    f"{type(self.model).__name__}: its attention does not go through "
                    "transformers' AttentionInterface, so headhunt cannot see it"
                )
            if self.layer_kinds is None:
                raise HeadhuntError(
                    f"{type(self.model).__name__}: {len(by_layer)} attention modules for "
                    f"{self.n_layers} layers (recurrent or state-space layers?); headhunt "
                    "captures one self-attention per layer"
                )
            raise HeadhuntError(
                f"{type(self.model).__name__}: layer {lacking[0]} ({kinds[lacking[0]]}) has no "
                "attention module of its own (one attention block shared by several layers?); "
                "headhunt captures one self-attention module per layer"
            )
        # index = the model's layer; None where the layer is not attention (passed through)
        self.modules = [by_layer.get(i) for i in range(self.n_layers)]
        self.attention_layers: list[int] = sorted(by_layer)
        self._install()
        self.model.eval()
        self._check_or_recall()

    def _install(self) -> None:
        """Make every attention layer's module call headhunt's hooks."""
        base = self._base
        for i in self.attention_layers:
            m = self.modules[i]
            m.headhunt_layer = i
            m.headhunt_base = base if base in ("sdpa", "eager", "flash_attention_2") else "sdpa"
            m.headhunt_hooks = []
            if not getattr(m, "headhunt_prehook", False):
                m.register_forward_pre_hook(attention._record_query_start, with_kwargs=True)
                m.headhunt_prehook = True
        _pass_depth_attention(self.model, base)
        if len({d for d in self.devices if d.startswith("cuda")}) > 1:
            for m in {id(m): m for m in self.attention_modules}.values():
                _run_on_own_device(m)

    def _unroll(self, order: list[torch.nn.Module]) -> None:
        """Make each application of a looped module a layer of its own.

        ``order``: the attention modules in the order one forward applied them (a module
        reapplied in recurrent loops appears once per application). Layer i is the i-th
        application: its position in the unrolled order the model really runs, whatever cache
        slot the model gives it. Each layer keeps its module's shape and kind; at every call
        the module is told which application it is running (:func:`attention.loop_position`,
        which refuses a forward whose order differs from this one)."""
        own = [m.layer_idx if isinstance(m.layer_idx, int) else 0 for m in order]

        def per_application(values: list) -> list:
            return [values[i] if i < len(values) else values[0] for i in own]

        self.head_dims = per_application(self.head_dims)
        self.kv_head_counts = per_application(self.kv_head_counts)
        if self.layer_kinds is not None:
            self.layer_kinds = per_application(self.layer_kinds)
        self.n_layers = len(order)
        self.modules = list(order)
        self.attention_layers = list(range(self.n_layers))
        names = {id(m): n for n, m in self.model.named_modules()}
        self.loop_modules = [names.get(id(m), type(m).__name__) for m in order]
        attention.install_loop(self.model, order)

    def _wrap_attention_free(self, cfg) -> None:
        """A model with no attention at all (Mamba, Mamba-2, Falcon-Mamba, RWKV, xLSTM): its
        behaviour (MQAR or needle accuracy from its logits) is measured as for any model;
        every head measurement is refused in one line (:meth:`hooks`)."""
        try:
            self.n_layers = cfg.num_hidden_layers
            self.d_model = cfg.hidden_size
        except AttributeError as e:
            raise HeadhuntError(
                f"{type(self.model).__name__}: no attention and no layer count in its config "
                f"({str(e).splitlines()[0][:120]})"
            ) from None
        self.n_heads, self.head_dims, self.kv_head_counts = 0, [], []
        self.vocab_size = getattr(cfg, "vocab_size", None)
        self.max_context = _max_context(cfg)
        kinds = getattr(cfg, "layer_types", None)
        self.layer_kinds = list(kinds) if kinds else ["recurrent"] * self.n_layers
        self.routed_modules = []
        self.modules = [None] * self.n_layers
        self.attention_layers = []
        self.model.eval()

    def _refuse_attention_free(self) -> None:
        raise HeadhuntError(
            f"{type(self.model).__name__} has no attention layers: head scores need attention "
            "(its behaviour, e.g. MQAR or needle accuracy, is measured without head hooks)"
        )

    def _check_or_recall(self) -> None:
        """Run the load check (:meth:`_check_calls`, :meth:`_check_causal`), or apply the
        outcome kept for this very model, code, dtype and device (``load_check``:
        probes/gguf_check.py says what the key holds), and keep a passed check's outcome."""
        kept = self.load_check
        outcome = kept.recall() if kept is not None else None
        if outcome is not None and self._apply_check_outcome(outcome):
            return
        self._check_causal(self._check_calls())
        if kept is not None and self.loop_modules is None and not self.routed_modules:
            kept.keep(self._check_outcome())

    def _check_outcome(self) -> dict[str, Any]:
        """What a passed check set on this model: everything :meth:`_apply_check_outcome`
        needs to set it again without the forward."""
        return {
            "attention_layers": list(self.attention_layers),
            "score_bias_layers": list(getattr(self, "score_bias_layers", [])),
            "kv_head_counts": list(self.kv_head_counts),
            "deferred": [
                i
                for i in self.attention_layers
                if getattr(self.modules[i], "headhunt_gated", False)
            ],
        }

    def _apply_check_outcome(self, outcome: dict[str, Any]) -> bool:
        """Set a kept outcome of the check; False (the check runs) where this model was not
        wrapped the way the kept one was."""
        if (
            self.loop_modules is not None
            or self.routed_modules
            or outcome.get("attention_layers") != list(self.attention_layers)
            or len(outcome.get("kv_head_counts", ())) != len(self.kv_head_counts)
        ):
            return False
        self.score_bias_layers = list(outcome["score_bias_layers"])
        self.kv_head_counts = list(outcome["kv_head_counts"])
        for i in outcome["deferred"]:
            attention.defer_after(self.modules[i])
        return True

    def _check_calls(self) -> Tensor | None:
        """One forward of two three-token prompts (a batch: one pass over the weights, which on
        a CPU is most of a large model's check): every layer's attention must go through
        headhunt's implementation exactly once, with a call headhunt can reproduce (else a
        one-line refusal naming the layer). Returns the logits, for :meth:`_check_causal`."""
        seen: dict[int, int] = {}
        kv_heads: dict[int, int] = {}  # layer -> the key heads its call carries
        biased: set[int] = set()  # layers whose call carries a score bias the model builds
        q_heads: dict[int, int] = {}  # layer -> the query heads its call carries
        outputs: dict[int, Tensor] = {}  # what each layer's attention returned
        projected: dict[int, Tensor] = {}  # what its output projection then read

        class Count(AttentionHook):
            indexes_heads = False

            def before(self, call: attention.AttentionCall) -> None:
                seen[call.layer] = seen.get(call.layer, 0) + 1
                kv_heads[call.layer] = call.key.shape[1]
                q_heads[call.layer] = call.query.shape[1]
                if call.bias is not None:
                    biased.add(call.layer)

            def after(self, call: attention.AttentionCall, output: Tensor) -> Tensor:
                outputs[id(call.module)] = output.reshape(*output.shape[:2], -1)
                return output

        handles = []
        applied: list[torch.nn.Module] = []  # the modules in the order the forward ran them
        # (keyed by module: a looped module is several layers; its last application is compared)
        for key, m in {id(m): m for m in self.attention_modules}.items():
            handles.append(m.register_forward_pre_hook(lambda mod, _args: applied.append(mod)))
            proj = attention.output_projection(m)
            if proj is not None and not getattr(m, "headhunt_gated", False):

                def read(_mod, args, key=key):
                    projected[key] = args[0]

                handles.append(proj.register_forward_pre_hook(read))
        # (a codebook model: each prompt's codes in all its codebook rows)
        ids = torch.tensor(_CHECK_PROMPTS, device=self.device).repeat_interleave(self.codebooks, 0)
        with self.hooks(Count()):
            try:
                result = self.forward(ids, use_cache=False)
            except HeadhuntError:
                raise
            except Exception as e:
                raise HeadhuntError(
                    f"{type(self.model).__name__}: a forward pass through headhunt's attention "
                    f"failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                ) from None
            finally:
                for h in handles:
                    h.remove()
        missing = [i for i in self.attention_layers if seen.get(i, 0) == 0]
        if missing and "Cross" in type(self.modules[missing[0]]).__name__:
            raise HeadhuntError(
                f"{type(self.model).__name__}: layer {missing[0]} is a cross-attention layer "
                f"({type(self.modules[missing[0]]).__name__}); headhunt captures self-attention"
            )
        if missing:
            raise HeadhuntError(
                f"{type(self.model).__name__}: layer {missing[0]}'s attention does not go through "
                "transformers' AttentionInterface, so headhunt cannot see it"
            )
        runs = {i: sum(a is self.modules[i] for a in applied) for i in self.attention_layers}
        twice = [i for i in self.attention_layers if seen[i] > 1]
        if twice and all(runs[i] == seen[i] for i in twice) and self.loop_modules is None:
            if not self.routed_modules:
                # Dory, Inkling 2 Loop: a section of layers reapplied in recurrent loops, each
                # application a layer of its own, in the order the forward ran them
                self._unroll(applied)
                self._install()
                return self._check_calls()
            raise HeadhuntError(
                f"{type(self.model).__name__}: layer {twice[0]}'s attention module runs "
                f"{seen[twice[0]]} times per forward (layers reapplied in recurrent loops); "
                "headhunt captures each layer's attention once"
            )
        if twice:
            raise HeadhuntError(
                f"{type(self.model).__name__}: layer {twice[0]} calls attention {seen[twice[0]]} "
                "times per forward (e.g. differential attention); headhunt reads one call"
            )
        odd = {i: n for i, n in q_heads.items() if n != self.n_heads}
        if odd and getattr(self.model.config, "headhunt_pruning", None) is None:
            # A config that keeps another layer kind's head count in fields of its own
            # (Inkling's swa_num_attention_heads): the calls say what each layer has.
            layer, count = min(odd.items())
            raise HeadhuntError(
                f"{type(self.model).__name__}: the number of query heads varies per layer "
                f"(layer {layer} has {count}, the config's num_attention_heads is "
                f"{self.n_heads}); headhunt's score tables hold one set of heads per layer"
            )
        # Layers whose scores carry a bias the model builds (Inkling's position_bias): the
        # kernels measure them on their torch path, on every device (the Triton kernels take no
        # bias), exactly; the run's manifest says so (describe).
        self.score_bias_layers = sorted(biased)
        if self.routed_modules and kv_heads:
            # An older config names its key heads its own way (Falcon's multi_query: one key
            # head for all): the calls say how many keys each query head is grouped over.
            for layer, count in kv_heads.items():
                self.kv_head_counts[layer] = count
        modules = {id(m): m for m in self.attention_modules}
        for key, read in projected.items():
            out = outputs.get(key)
            if out is None or out.shape != read.shape or not torch.equal(out, read):
                # The layer changes its heads' output before projecting it (Qwen3-Next's
                # head-wise sigmoid gate, a sub-norm): what a head writes is what the projection
                # reads, so hooks see and change the output there (see attention.defer_after).
                attention.defer_after(modules[key])
        logits = getattr(result, "logits", None)
        if not isinstance(logits, Tensor) or logits.dim() != 3:
            return None
        return logits[:: self.codebooks]  # one row per prompt (a codebook model's first)

    def _check_causal(self, logits: Tensor | None) -> None:
        """Refuse, in one line, a model whose earlier positions see later tokens (an encoder
        such as BERT loaded as a causal LM): change the last of three tokens and the first two
        positions' logits must not move (``logits``: :meth:`_check_calls`'s forward of both
        prompts). Every score headhunt computes assumes causal attention."""
        if logits is None:  # no logits: a model _check_calls ran is kept, as before
            return
        a, b = logits[0].float(), logits[1].float()
        moved = (a - b).abs().amax(-1)
        # A causal model's first two rows do not move at all (the same kernels on the same
        # inputs); an encoder's move by a share of what the changed row moves (a random-weight
        # BERT: 0.3%, so the bar is 0.1%).
        if float(moved[:2].max()) > 1e-3 * float(moved[2]):
            raise HeadhuntError(
                f"{type(self.model).__name__} is not causal (earlier positions see later tokens: "
                "an encoder such as BERT?); headhunt measures decoder-only causal LMs"
            )

    @property
    def attention_modules(self) -> list[torch.nn.Module]:
        """The attention modules of the attention layers, in layer order."""
        return [self.modules[i] for i in self.attention_layers]

    def score_bias_line(self) -> str | None:
        """One line for a run's output where some layers add a bias the model builds to their
        scores (Inkling's position bias, Doge's per-key mask): which layers, and that the
        kernels measure them on their torch path (None where no layer does)."""
        layers = getattr(self, "score_bias_layers", None)
        if not layers:
            return None
        return (
            f"layers {_ranges(layers)} add a bias the model builds to their scores: measured "
            "exactly on the kernels' torch path, on every device (the Triton kernels take no "
            "bias; slower on a GPU)"
        )

    @property
    def is_hybrid(self) -> bool:
        """Whether some layers are not attention (recurrent, state-space, convolution, MLP)."""
        return len(self.attention_layers) < self.n_layers

    def check_attention_layers(self, layers: Collection[int]) -> list[int]:
        """``layers`` as a sorted list, refusing (one line) any that is not an attention layer."""
        if self.attention_free:
            self._refuse_attention_free()
        bad = sorted({int(x) for x in layers} - set(self.attention_layers))
        if bad:
            kinds = self.layer_kinds or []
            what = f" ({kinds[bad[0]]})" if 0 <= bad[0] < len(kinds) else ""
            raise HeadhuntError(
                f"layer {bad[0]}{what} is not an attention layer of {type(self.model).__name__}; "
                f"its attention layers are {_ranges(self.attention_layers)}"
            )
        return sorted({int(x) for x in layers})

    @functools.cached_property
    def blocks(self) -> torch.nn.ModuleList:
        """The decoder layers (blocks), in layer order: the model's ``ModuleList`` whose item L
        holds attention module L. Forward hooks on ``blocks[L]`` see the residual stream after
        layer L (the way analyzers reach a layer; never a model-family attribute path)."""
        if self.loop_modules is not None:
            raise HeadhuntError(
                f"{type(self.model).__name__} reapplies its layers in loops: a decoder layer "
                "runs at several depths, so the residual stream after one layer is no one "
                "module's output; methods that read it cannot measure this model"
            )
        found = [
            mod
            for mod in self.model.modules()
            if isinstance(mod, torch.nn.ModuleList)
            and len(mod) == self.n_layers
            and all(
                any(m is a for m in block.modules())
                for block, a in zip(mod, self.modules, strict=True)
                if a is not None
            )
        ]
        if len(found) != 1:
            raise HeadhuntError(
                f"cannot find the decoder layers of {type(self.model).__name__} "
                f"({len(found)} lists of {self.n_layers} layers own its attention modules)"
            )
        return found[0]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def devices(self) -> list[str]:
        """Every device holding a parameter (several with a ``device_map``), first layer first."""
        seen: dict[str, None] = {}
        for p in self.model.parameters():
            seen.setdefault(str(p.device), None)
        return list(seen)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @functools.cached_property
    def n_parameters(self) -> int:
        """Parameters of the model (shared ones, such as tied embeddings, counted once)."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def _head_dim(self) -> int | None:
        """The head size all layers share, or None where it varies per layer."""
        return self.head_dims[0] if len(set(self.head_dims)) == 1 else None  # none: no heads

    @property
    def head_dim(self) -> int:
        """The head size all layers share; refused in one line where it varies per layer (a
        caller that needs one size for the whole model, e.g. head-output buffers, then cannot
        measure this model: per-layer sizes are in ``head_dims``)."""
        if self._head_dim is None:
            sizes = sorted(set(self.head_dims))
            raise HeadhuntError(
                f"{type(self.model).__name__}: head sizes vary per layer ({sizes}); this "
                "measurement needs one head size for the whole model"
            )
        return self._head_dim

    @head_dim.setter
    def head_dim(self, size: int) -> None:
        self.head_dims = [size] * self.n_layers

    @property
    def _n_kv_heads(self) -> int | None:
        """The number of key heads all attention layers share, or None where it varies."""
        counts = {self.kv_head_counts[i] for i in self.attention_layers} or {0}
        return counts.pop() if len(counts) == 1 else None

    @property
    def n_kv_heads(self) -> int:
        """The number of key heads all layers share; refused in one line where it varies per
        layer (Gemma 4 with ``attention_k_eq_v``): a caller that groups query heads by key head
        with one group size for the whole model cannot measure it (per-layer counts are in
        ``kv_head_counts``; captures read each layer's keys off its call)."""
        if self._n_kv_heads is None:
            counts = sorted({self.kv_head_counts[i] for i in self.attention_layers})
            raise HeadhuntError(
                f"{type(self.model).__name__}: the number of key heads varies per layer "
                f"({counts}); this measurement groups query heads by key head with one group "
                "size for the whole model"
            )
        return self._n_kv_heads

    @n_kv_heads.setter
    def n_kv_heads(self, count: int) -> None:
        self.kv_head_counts = [count] * self.n_layers

    def score_kv_heads(self) -> int | list[int]:
        """What a score table groups query heads by (``HeadScores.from_matrix``'s
        ``n_kv_heads``): the shared number of key heads, or each layer's where it varies."""
        return self._n_kv_heads if self._n_kv_heads is not None else list(self.kv_head_counts)

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    def kv_head(self, head: int) -> int:
        return head // self.group_size

    def describe(self) -> dict[str, Any]:
        """The model facts a run manifest records: the spec as typed, the model's own name
        (GGUF ``general.name``, config ``_name_or_path``, hub id), its architecture, parameter
        count, shape, dtype, device, and the weight files with their content hash."""
        source = self.source or {}
        cfg = _text_config(self.model.config)
        return {
            "spec": self.name,
            "name": source.get("name") or self.name,
            "architecture": getattr(cfg, "model_type", None) or type(self.model).__name__,
            "n_parameters": self.n_parameters,
            "weights_sha256": source.get("sha256"),
            "weights": source.get("files", []),
            "format": source.get("format", "memory"),
            "class": type(self.model).__name__,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self._n_kv_heads,
            **({"kv_heads": self.kv_head_counts} if self._n_kv_heads is None else {}),
            "head_dim": self._head_dim,
            **({"head_dims": self.head_dims} if self._head_dim is None else {}),
            "d_model": self.d_model,
            "max_context": self.max_context,
            **(
                {"attention_layers": list(self.attention_layers), "layer_kinds": self.layer_kinds}
                if self.is_hybrid
                else {}
            ),
            **(
                {
                    "looped_layers": self.loop_modules,
                    "looped": "modules are reapplied in loops: layer i is the i-th attention "
                    "application in the order the model runs them; looped_layers[i] names the "
                    "module applied (shared weights: a weight edit acts on all its layers)",
                }
                if self.loop_modules is not None
                else {}
            ),
            **(
                {
                    "score_bias_layers": self.score_bias_layers,
                    "score_bias": "a bias the model builds is added to these layers' scores: "
                    "measured on the kernels' torch path on every device (exact; the Triton "
                    "kernels take no bias)",
                }
                if getattr(self, "score_bias_layers", None)
                else {}
            ),
            **(
                {
                    "codebooks": self.codebooks,
                    "token_rows": "input_ids [batch x codebooks, n], one row per codebook; a "
                    "token is the tuple of a position's codes",
                }
                if self.codebooks > 1
                else {}
            ),
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            **({"devices": self.devices} if len(self.devices) > 1 else {}),
        }

    def refuse_codebook_rows(self, what: str) -> None:
        """Refuse, in one line, ``what`` (a method's run) on a model that reads several token
        rows per sequence: its inputs are one token row per sequence. The captures, masking,
        decoding and :func:`headhunt.heads.ngram.score_sequences` take the model's own layout."""
        if self.codebooks > 1:
            raise HeadhuntError(
                f"{type(self.model).__name__} reads {self.codebooks} token rows per sequence "
                "(one embedding per audio codebook, summed at each position): the "
                f"{what} run's inputs are one token row per sequence; capture it from Python "
                "with input_ids [batch x codebooks, n] (score_sequences takes [codebooks, n] "
                "sequences, a token being the tuple of a position's codes)"
            )

    @contextlib.contextmanager
    def hooks(self, *hooks: AttentionHook, layers: list[int] | None = None) -> Iterator[None]:
        """Install attention hooks on every attention layer (or ``layers``, which must be
        attention layers) for the duration of the block."""
        if self.attention_free and (hooks or layers):
            self._refuse_attention_free()
        picked = self.attention_layers if layers is None else self.check_attention_layers(layers)
        for hook in hooks:  # a head mask on a layer that is not attention would do nothing
            acts_on = hook.layers()
            if acts_on:
                self.check_attention_layers(acts_on)
        chosen = list({id(self.modules[i]): self.modules[i] for i in picked}.values())
        for m in chosen:
            m.headhunt_hooks.extend(hooks)
            if self.loop_modules is not None:  # a looped module: only the picked applications
                only = {i for i in picked if self.modules[i] is m}
                m.headhunt_hook_layers.update({id(h): only for h in hooks})
        try:
            yield
        finally:
            for m in chosen:
                for h in hooks:
                    m.headhunt_hooks.remove(h)
                    getattr(m, "headhunt_hook_layers", {}).pop(id(h), None)

    def encode(self, text: str, *, bos: bool = True) -> Int[Tensor, " n"]:
        """Token ids of ``text`` (with the tokenizer's BOS if it has one and ``bos``)."""
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if bos and self.tokenizer.bos_token_id is not None:
            ids = [self.tokenizer.bos_token_id, *ids]
        return torch.tensor(ids, dtype=torch.long)

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, **kwargs: Any):
        """One forward pass on the model's device; 1-D ids are treated as a batch of one."""
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.shape[0] % self.codebooks:
            raise HeadhuntError(
                f"{type(self.model).__name__} reads {self.codebooks} token rows per sequence: "
                f"input_ids must be [batch x {self.codebooks}, n] (each sequence's codebook "
                f"rows together), not {list(input_ids.shape)}"
            )
        keep = kwargs.get("logits_to_keep")
        if keep is None or self._takes_logits_to_keep:
            return self.model(input_ids=input_ids.to(self.device), **kwargs)
        # A forward without ``logits_to_keep`` (xLSTM): every position's logits, then the kept
        # ones, as the model would have kept them (the last k, or the listed positions).
        del kwargs["logits_to_keep"]
        out = self.model(input_ids=input_ids.to(self.device), **kwargs)
        if isinstance(keep, int):
            out.logits = out.logits[:, -keep:] if keep else out.logits
        else:
            out.logits = out.logits[:, torch.as_tensor(keep, device=out.logits.device)]
        return out

    @functools.cached_property
    def _takes_logits_to_keep(self) -> bool:
        return "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def bridge(self):
        """A TransformerLens 4 ``TransformerBridge`` over this model's weights, for TL-style hooks
        (``blocks.L.attn.hook_pattern``, ``hook_z``, ...) and ``run_with_cache``.

        The bridge runs TransformerLens' own (eager) attention on a twin of the model's modules
        that shares every parameter and buffer (no weight is copied): booting a bridge rewires
        the module tree it is given, and on this model that would silently bypass headhunt's
        hooks. headhunt's hooks do not act inside the bridge; use its TL hooks there.
        """
        from transformer_lens.model_bridge import TransformerBridge

        twin = _twin(self.model)
        if not twin.config.architectures:
            twin.config.architectures = [type(twin).__name__]
        return TransformerBridge.boot_transformers(
            self.name, hf_model=twin, tokenizer=self.tokenizer
        )

    def nnsight(self):
        """An nnsight ``TransformersModel`` (the class behind nnsight's ``LanguageModel``) over
        this same model: the same modules and weights, traced with nnsight
        (``with lm.trace(ids): lm.model.layers[L].self_attn.o_proj.input ...``).

        headhunt's attention hooks stay in force inside a trace (``model.hooks(...)``,
        ``mask_heads`` or a capture around ``lm.trace`` apply to it) and the attention kernel
        is still headhunt's (SDPA, no eager patterns). Reading a module's ``.source`` makes
        nnsight run an instrumented copy of that module's forward from then on; it computes
        the same values and keeps calling headhunt's attention.
        """
        from nnsight import TransformersModel

        return TransformersModel(self.model, tokenizer=self.tokenizer, task="text-generation")


# Layer kinds (a config's ``layer_types``, as transformers names them for hybrid models) whose
# layers have no softmax attention: headhunt passes them through. Any other kind (full, sliding,
# chunked attention, a "hybrid" layer with an attention block, a kind headhunt has not met) is
# attention and must be captured, or the model is refused.
PASS_THROUGH_KINDS = frozenset(
    {"linear_attention", "conv", "mamba", "mamba2", "recurrent", "rwkv", "moe", "mlp", "ffn"}
)


# Names of the projections a token self-attention module makes its queries and keys with.
_TOKEN_PROJECTIONS = ("q_proj", "k_proj", "qkv_proj", "query_key_value", "c_attn", "query", "Wqkv")


def _pass_depth_attention(model: torch.nn.Module, base: str) -> None:
    """Let attention that is not over tokens run the model's own kernel, untouched.

    Inkling 2's block attention residuals call the attention interface too: at each position a
    learned query (a parameter, no projection of the tokens) attends over the outputs of the
    earlier blocks at that same position, to mix the residual stream over depth. It is no
    head of any layer's token attention, so headhunt neither captures nor changes it: such a
    module (no layer index, a learned query parameter, no query/key projection of its own)
    hands its calls straight to the kernel the model chose (:func:`attention.headhunt_attention`)."""
    for m in model.modules():
        if hasattr(m, "headhunt_layer") or getattr(m, "layer_idx", None) is not None:
            continue
        learned_query = isinstance(getattr(m, "query", None), torch.nn.Parameter)
        projects = any(isinstance(getattr(m, n, None), torch.nn.Module) for n in _TOKEN_PROJECTIONS)
        if learned_query and not projects and "Attention" in type(m).__name__:
            m.headhunt_depth = True
            m.headhunt_base = base if base in ("sdpa", "eager", "flash_attention_2") else "sdpa"


def _max_context(cfg) -> int:
    """The config's longest input; 2048 where it names none (or says it has no limit: XLNet's
    -1, relative positions)."""
    size = getattr(cfg, "max_position_embeddings", None)
    return size if isinstance(size, int) and size > 0 else 2048


def passes_through(kind: str) -> bool:
    """Whether a layer of this kind has no softmax attention (headhunt passes it through)."""
    return kind in PASS_THROUGH_KINDS


def _layer_kinds(cfg, n_layers: int) -> list[str] | None:
    """Each layer's kind from the config's ``layer_types`` (None when it has none)."""
    try:
        kinds = getattr(cfg, "layer_types", None)
    except Exception:  # a derived property that does not hold for this config
        return None
    if not kinds or len(kinds) < n_layers or not all(isinstance(k, str) for k in kinds):
        return None
    return list(kinds[:n_layers])


def _ranges(layers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as "0-2, 5"."""
    out, start = [], None
    for i, x in enumerate(layers):
        if start is None:
            start = x
        if i + 1 == len(layers) or layers[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)


def _index_shared_blocks(model: torch.nn.Module, found: list, n_layers: int) -> list:
    """Give a layer index to attention modules that carry none (Zamba, Zamba2: one attention
    block whose weights are shared, applied at several depths, each application a module of
    its own told its layer by its forward's ``layer_idx`` argument). A module that sits in
    exactly one decoder layer (an item of the model's list of ``n_layers`` layers) gets that
    layer's index, the one the model hands it; a module object that sits in several layers
    keeps none (refused in one line). :func:`headhunt.probes.attention._record_query_start`
    checks at every call that the index the model passes is the one given here."""
    unindexed = [m for m in found if not isinstance(m.layer_idx, int) or m.layer_idx < 0]
    if not unindexed:
        return found
    lists = [
        mod
        for mod in model.modules()
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n_layers
    ]
    for m in unindexed:
        homes = {
            (id(lst), i)
            for lst in lists
            for i, block in enumerate(lst)
            if any(sub is m for sub in block.modules())
        }
        if len(homes) == 1:
            m.layer_idx = next(iter(homes))[1]
            m.headhunt_indexed = True  # the index is headhunt's: the forward's must match it
    return sorted(found, key=lambda m: (m.layer_idx is None, m.layer_idx or 0))


def _application_order(model: torch.nn.Module, found: list, base: str) -> list:
    """The attention modules in the order one forward (of the load check's prompts) applies
    them, each once per application (none where that forward fails). Run before headhunt's
    hooks are installed: the calls go straight to the model's own kernel."""
    applied: list[torch.nn.Module] = []
    handles = []
    for m in found:
        if not hasattr(m, "headhunt_layer"):
            m.headhunt_layer = -1  # not captured yet: no hooks, the call runs untouched
            m.headhunt_base = base if base in ("sdpa", "eager", "flash_attention_2") else "sdpa"
        handles.append(m.register_forward_pre_hook(lambda mod, _args: applied.append(mod)))
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor(_CHECK_PROMPTS, device=next(model.parameters()).device))
    except Exception:  # no order: the model meets the one-module-per-layer checks instead
        return []
    finally:
        for h in handles:
            h.remove()
    return applied


# Names transformers' decoders give the attention that reads an encoder's states.
_CROSS_ATTENTION_NAMES = ("encoder_attn", "cross_attn", "crossattention", "cross_attention")


def _codebook_rows(model) -> int:
    """Token rows per sequence: the number of input embeddings a model sums at each position
    (MusicGen Melody's decoder: one per audio codebook, ``input_ids`` [batch x codebooks, n]);
    1 for a model with one embedding."""
    try:
        embeddings = model.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        return 1
    if isinstance(embeddings, torch.nn.ModuleList) and len(embeddings) > 1:
        return len(embeddings)
    return 1


def _cross_attention_name(model: torch.nn.Module) -> str | None:
    """The class of the first cross-attention module (an encoder-decoder model's decoder), or
    None."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in _CROSS_ATTENTION_NAMES:
            return type(module).__name__
    return None


def _uses_attention_interface(model: torch.nn.Module) -> bool:
    """Whether the model's modeling file calls attention through transformers'
    ``AttentionInterface`` (older files compute attention in their own code)."""
    import sys

    return hasattr(sys.modules[type(model).__module__], "ALL_ATTENTION_FUNCTIONS")


def _is_attention_free(model: torch.nn.Module, cfg) -> bool:
    """No attention heads in the config and no attention module in the model (state-space and
    recurrent models); a model with either goes through the attention checks instead."""
    try:
        if getattr(cfg, "num_attention_heads", None) is not None:
            return False
    except Exception:  # a head count that varies per layer (dots3): heads, just not one shape
        return False
    return not attention.attention_modules(model)


def _compute_every_query(model: torch.nn.Module) -> None:
    """Gemma 4 runs its KV-shared layers (which write no cache) on the last ``logits_to_keep``
    positions only, a shortcut that leaves the kept logits unchanged. headhunt's captures read
    every query of every layer (statistics, n-gram scores, head outputs) and ask for one logit,
    so the shortcut would hand them a layer with one query; it is turned off: those layers
    compute every position, as they do when the model is asked for hidden states."""
    for module in model.modules():
        slicer = getattr(module, "_maybe_slice_kv_shared_inputs", None)
        if slicer is not None and not getattr(slicer, "headhunt_unsliced", False):
            module._maybe_slice_kv_shared_inputs = _unsliced(slicer)


def _unsliced(slicer):
    """The model's own slicer, told what it is told when hidden states are requested (its
    documented case for keeping every position), so it returns its inputs untouched."""

    def unsliced(*args, **kwargs):
        return slicer(*args, **{**kwargs, "output_hidden_states": True})

    unsliced.headhunt_unsliced = True
    return unsliced


def _layer_config(cfg, layer: int):
    """One layer's config where the config varies it per layer (transformers'
    ``per_layer_config``, Gemma 4), else the config itself."""
    per_layer = getattr(cfg, "per_layer_config", None)
    if per_layer is None:
        return cfg
    return per_layer[layer]


def _per_layer_head_dims(cfg, n_layers: int, n_heads: int) -> list[int]:
    """Each layer's head size, read from that layer's config."""
    sizes = []
    for layer in range(n_layers):
        lc = _layer_config(cfg, layer)
        sizes.append(getattr(lc, "head_dim", None) or cfg.hidden_size // n_heads)
    return sizes


def _one_query_head_count(cfg, n_layers: int, model) -> int:
    """The number of query heads, which every layer must share (a head is a column of every
    score matrix): read per layer where the config keeps it per layer (dots3)."""
    if getattr(cfg, "per_layer_config", None) is None:
        return cfg.num_attention_heads
    counts = [
        getattr(_layer_config(cfg, i), "num_attention_heads", None) or cfg.num_attention_heads
        for i in range(n_layers)
    ]
    if len(set(counts)) > 1:
        # dots3's global layers are DeepSeek sparse attention too (an indexer picks each
        # query's keys): say so, since one head count per layer would not make them capturable
        indexers = sorted(
            {
                type(m.indexer).__name__
                for m in model.modules()
                if isinstance(getattr(m, "indexer", None), torch.nn.Module)
            }
        )
        sparse = (
            f"; its layers with an indexer ({', '.join(indexers)}) are sparse attention by "
            "indices as well"
            if indexers
            else ""
        )
        raise HeadhuntError(
            f"{type(model).__name__}: the number of query heads varies per layer "
            f"({sorted(set(counts))}); headhunt's score tables hold one set of heads per "
            f"layer{sparse}"
        )
    return counts[0]


def _per_layer_kv_heads(cfg, n_layers: int, n_heads: int) -> list[int]:
    """Each layer's number of key heads, read from that layer's config."""
    return [
        getattr(_layer_config(cfg, layer), "num_key_value_heads", None) or n_heads
        for layer in range(n_layers)
    ]


def _text_config(config):
    """The config of the decoder that reads and writes text: the model's own config, or the text
    tower's of a multimodal model (whose vision or audio towers headhunt does not capture)."""
    try:
        return config.get_text_config(decoder=True)
    except ValueError:  # several text decoders: none of them is the model's
        return config


def load_model(
    spec: str = "smollm2-135m",
    *,
    device: str | None = "auto",
    dtype: str | None = "auto",
    trust_remote_code: bool = False,
    device_map: str | dict[str, str | int] | None = None,
    cache: bool = True,
) -> HookedModel:
    """Load a model and wrap it with attention hooks.

    Args:
        spec: a registry name (``smollm2-135m``, the embedded default), a local Hugging Face
            folder, a ``.gguf`` file, or a Hugging Face id already in the local cache.
        device: "auto" (CUDA when present), "cpu", "cuda", "cuda:N".
        dtype: "auto" (bf16 on CUDA, fp32 on CPU), "float32", "bfloat16", "float16".
        trust_remote_code: only if you trust the folder's code.
        device_map: spread the layers over several devices with accelerate (overrides
            ``device``): "auto"/"balanced" (even over the visible GPUs; everything on the CPU
            when there is none), "sequential" (fill GPU 0 first), or an explicit
            ``{module name: device}`` dict (or its JSON text). Hooks then see each layer's q/k
            on that layer's device; inputs go to the first layer's device and logits come back
            there.
        cache: a GGUF's parsed metadata (config, tokenizer, tensor names; no weights) is
            kept in ``$HEADHUNT_CACHE`` after its first load; False writes nothing.
    """
    from headhunt.probes.loading import load_hf

    if device_map is not None:
        dm, dt = _placement(device_map, dtype)
        model, tok = load_hf(
            spec,
            trust_remote_code=trust_remote_code,
            device_map=dm,
            dtype=str(dt).removeprefix("torch."),
            cache=cache,
        )
        if getattr(model, "hf_device_map", None) is None:  # a GGUF is built on the CPU
            model = dispatch(model, dm, dtype)
        return _hooked(model, tok, spec)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    model, tok = load_hf(
        spec,
        trust_remote_code=trust_remote_code,
        gguf_dtype=str(dt).removeprefix("torch."),
        cache=cache,
    )
    model = cast_parameters(model.to(device=dev), dt)
    from headhunt.probes.gguf_check import kept_check

    return _hooked(model, tok, spec, load_check=kept_check(model, dt, dev))


def _hooked(model: Any, tok: Any, spec: str, load_check: Any = None) -> HookedModel:
    source = getattr(model, "headhunt_source", None)
    return HookedModel(model=model, tokenizer=tok, name=spec, source=source, load_check=load_check)


def _twin(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model``'s module tree whose parameters and buffers are the original tensors."""
    import copy

    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo=shared)


def _run_on_own_device(module: torch.nn.Module) -> None:
    """Make a layer's GPU the current device while its attention runs: Triton (the capture
    kernels) launches on the current device and stream, not on the device of its tensors."""
    if getattr(module, "headhunt_own_device", False):
        return
    forward = module.forward

    def on_device(*args: Any, **kwargs: Any) -> Any:
        dev = next(module.parameters()).device  # read at each call: the model may move
        if dev.type != "cuda":
            return forward(*args, **kwargs)
        with torch.cuda.device(dev):
            return forward(*args, **kwargs)

    module.forward = on_device
    module.headhunt_own_device = True


MAP_MODES = ("auto", "balanced", "sequential")


def parse_device_map(device_map: str | dict) -> str | dict[str, str | int]:
    """A mode name, or an explicit ``{module: device}`` map (a dict or its JSON text)."""
    import json

    if isinstance(device_map, dict):
        dm = device_map
    elif device_map in MAP_MODES:
        return device_map
    elif isinstance(device_map, str) and device_map.lstrip().startswith("{"):
        try:
            dm = json.loads(device_map)
        except json.JSONDecodeError as e:
            raise HeadhuntError(f"--device-map is not valid JSON ({e.msg})") from None
    else:
        raise HeadhuntError(
            f"unknown --device-map {device_map!r} (use auto, balanced, sequential or a JSON "
            "module -> device map)"
        )
    if not isinstance(dm, dict) or not dm:
        raise HeadhuntError("--device-map must map module names to devices")
    out: dict[str, str | int] = {}
    for name, dev in dm.items():
        if isinstance(dev, int) or dev == "disk":
            out[name] = dev
            continue
        out[name] = str(pick_device(str(dev)))  # one-line error for unknown or absent devices
    return out


def _placement(device_map: str | dict, dtype: str | None) -> tuple[str | dict, torch.dtype]:
    """The parsed map (a mode becomes ``{"": "cpu"}`` where there is no GPU) and the dtype
    ("auto": bf16 when the first device is a GPU)."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise HeadhuntError(
            "--device-map needs the `accelerate` package: pip install accelerate"
        ) from None
    dm = parse_device_map(device_map)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if isinstance(dm, str) and not gpus:
        dm = {"": "cpu"}  # no GPU: the whole model on the CPU, as --device cpu
    if isinstance(dm, str):
        first = torch.device("cuda:0")
    else:
        devs = [d for d in dm.values() if d != "disk"] or ["cpu"]
        first = torch.device(f"cuda:{devs[0]}" if isinstance(devs[0], int) else devs[0])
    return dm, pick_dtype(dtype, first)


def cast_parameters(model: Any, dtype: torch.dtype) -> Any:
    """``model.to(dtype)`` for the parameters only: float32 buffers such as the rotary
    embedding's ``inv_freq`` stay float32 (in bf16, position x inv_freq is off by radians at
    tens of thousands of tokens), as transformers keeps them when it loads in bf16."""
    keep = [
        (mod, name, buf)
        for mod in model.modules()
        for name, buf in mod._buffers.items()
        if buf is not None and buf.dtype == torch.float32
    ]
    model = model.to(dtype=dtype)
    for mod, name, buf in keep:
        mod._buffers[name] = buf.to(mod._buffers[name].device)
    return model


def dispatch(model: Any, device_map: str | dict, dtype: str | None = "auto") -> Any:
    """Cast an in-memory ``model`` and spread it over devices with accelerate's
    ``dispatch_model`` (:func:`load_model` instead has transformers place the weights as it
    reads them)."""
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    dm, dt = _placement(device_map, dtype)
    model = cast_parameters(model, dt)
    if isinstance(dm, str):
        no_split = list(getattr(model, "_no_split_modules", None) or [])
        max_memory = None
        if dm in ("auto", "balanced"):
            max_memory = get_balanced_memory(model, no_split_module_classes=no_split, dtype=dt)
        dm = infer_auto_device_map(
            model, max_memory=max_memory, no_split_module_classes=no_split, dtype=dt
        )
    import logging

    log = logging.getLogger("accelerate.big_modeling")
    level = log.level
    if all(d == "cpu" for d in dm.values()):
        log.setLevel(logging.ERROR)  # "offloaded to the cpu": not so, the CPU executes them
    try:
        # force_hooks: accelerate's hooks even when the map names one device, so one code path.
        model = dispatch_model(model, device_map=dm, force_hooks=True)
    except (ValueError, KeyError, RuntimeError) as e:
        raise HeadhuntError(f"could not dispatch the model with --device-map: {e}") from None
    finally:
        log.setLevel(level)
    model.hf_device_map = dict(dm)
    return model
