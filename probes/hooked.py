"""The hooked model: a Hugging Face causal LM with headhunt's attention hooks installed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.probes import attention
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

    def __post_init__(self) -> None:
        cfg = self.model.config
        self.n_layers: int = cfg.num_hidden_layers
        self.n_heads: int = cfg.num_attention_heads
        self.n_kv_heads: int = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.d_model: int = cfg.hidden_size
        self.head_dim: int = getattr(cfg, "head_dim", None) or self.d_model // self.n_heads
        self.max_context: int = getattr(cfg, "max_position_embeddings", None) or 2048
        base = cfg._attn_implementation  # the kernel our hooks hand over to
        attention.register()
        self.model.set_attn_implementation(attention.IMPLEMENTATION)
        self.modules = attention.attention_modules(self.model)
        if len(self.modules) != self.n_layers:
            raise HeadhuntError(
                f"found {len(self.modules)} attention modules for {self.n_layers} layers"
            )
        for i, m in enumerate(self.modules):
            m.headhunt_layer = i
            m.headhunt_base = base if base in ("sdpa", "eager", "flash_attention_2") else "sdpa"
            m.headhunt_hooks = []
        self.model.eval()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    def kv_head(self, head: int) -> int:
        return head // self.group_size

    def describe(self) -> dict[str, Any]:
        """The model facts a run manifest records."""
        return {
            "spec": self.name,
            "class": type(self.model).__name__,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "d_model": self.d_model,
            "max_context": self.max_context,
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
        }

    @contextlib.contextmanager
    def hooks(self, *hooks: AttentionHook, layers: list[int] | None = None) -> Iterator[None]:
        """Install attention hooks on every layer (or ``layers``) for the duration of the block."""
        chosen = [self.modules[i] for i in (range(self.n_layers) if layers is None else layers)]
        for m in chosen:
            m.headhunt_hooks.extend(hooks)
        try:
            yield
        finally:
            for m in chosen:
                for h in hooks:
                    m.headhunt_hooks.remove(h)

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
        return self.model(input_ids=input_ids.to(self.device), **kwargs)

    def bridge(self):
        """A TransformerLens 4 ``TransformerBridge`` over this same model, for TL-style hooks
        (``blocks.L.attn.hook_pattern``, ``hook_z``, ...).

        Booting switches the wrapped model to eager attention; headhunt's own hooked (SDPA)
        path is put back afterwards, so the bridge and this wrapper can be used side by side.
        """
        from transformer_lens.model_bridge import TransformerBridge

        if not self.model.config.architectures:
            self.model.config.architectures = [type(self.model).__name__]
        bridge = TransformerBridge.boot_transformers(
            self.name, hf_model=self.model, tokenizer=self.tokenizer
        )
        self.model.set_attn_implementation(attention.IMPLEMENTATION)
        return bridge


def load_model(
    spec: str = "smollm2-135m",
    *,
    device: str | None = "auto",
    dtype: str | None = "auto",
    trust_remote_code: bool = False,
) -> HookedModel:
    """Load a model and wrap it with attention hooks.

    Args:
        spec: a registry name (``smollm2-135m``, the embedded default), a local Hugging Face
            folder, a ``.gguf`` file, or a Hugging Face id already in the local cache.
        device: "auto" (CUDA when present), "cpu", "cuda", "cuda:N".
        dtype: "auto" (bf16 on CUDA, fp32 on CPU), "float32", "bfloat16", "float16".
        trust_remote_code: only if you trust the folder's code.
    """
    from headhunt.probes.loading import load_hf

    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    model, tok = load_hf(spec, trust_remote_code=trust_remote_code)
    model = model.to(device=dev, dtype=dt)
    return HookedModel(model=model, tokenizer=tok, name=spec)
