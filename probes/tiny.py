"""Tiny randomly initialised models built locally: fixtures for tests and planted ground truth."""

from __future__ import annotations

import torch

from headhunt.probes.hooked import HookedModel

WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "it",
    "for",
    "on",
    "that",
    "with",
    "as",
    "at",
    "by",
    "this",
    "be",
    "from",
    "or",
    "are",
    "an",
    "which",
    "secret",
    "passkey",
    "code",
    "number",
    "vault",
    "blue",
    "red",
    "green",
    "garden",
    "gate",
    "word",
    "words",
    "magic",
    "best",
    "thing",
    "do",
    "city",
    "park",
    "sunny",
    "day",
    "what",
    "question",
    "answer",
    "read",
    "remember",
    "key",
    "value",
    "river",
    "bread",
    "lamp",
]


def word_tokenizer(extra_words: list[str] | None = None):
    """A whitespace word-level tokenizer over a small fixed vocabulary (digits, common words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab_words = (
        specials + list("0123456789") + [".", ",", "?", ":", "\n"] + WORDS + (extra_words or [])
    )
    vocab = {w: i for i, w in enumerate(dict.fromkeys(vocab_words))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation(),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )


def tiny_llama(
    *,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    d_model: int = 64,
    vocab_size: int | None = None,
    max_context: int = 512,
    seed: int = 0,
    tokenizer=None,
    attn_implementation: str = "sdpa",
) -> HookedModel:
    """A randomly initialised Llama (GQA when ``n_kv_heads < n_heads``) wrapped with hooks."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else word_tokenizer()
    cfg = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=d_model,
        intermediate_size=2 * d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=max_context,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        attn_implementation=attn_implementation,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.config.architectures = ["LlamaForCausalLM"]
    return HookedModel(model=model, tokenizer=tokenizer, name=f"tiny-llama-{n_layers}x{n_heads}")


# Shape of every tiny model of :func:`tiny_causal_lm`: small enough for a CPU test, with GQA,
# two layers (a sliding or chunked layer next to a full one where the family has both), and a
# window / chunk short enough that test sequences run past it.
TINY_SHAPE: dict[str, object] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_layers": 2,
    "n_layer": 2,
    "n_layers": 2,
    "depth": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "sliding_window": 8,
    "attention_chunk_size": 8,
    "num_local_experts": 4,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "intermediate_size_mlp": 96,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "rotary_dim": 8,
    "d_model": 64,
    "n_embd": 64,
    "n_positions": 256,
    "decoder_layers": 2,
    "encoder_layers": 2,
    "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "decoder_ffn_dim": 96,
    "encoder_ffn_dim": 96,
    "ffn_dim": 96,
    "num_heads": 4,
    "n_heads": 4,
    "initializer_range": 0.2,
    "use_cache": True,
    "tie_word_embeddings": False,
}


def tiny_config(model_type: str, vocab_size: int = 64, **overrides):
    """A tiny config of a transformers model family (``model_type`` of its config class):
    the family's defaults with :data:`TINY_SHAPE` set wherever the config has that field, and
    two layers of different kinds (e.g. sliding then full) where the family mixes them.

    Sub-configs (the text, vision and audio towers of a multimodal model, an attention
    sub-config) are made tiny the same way; an override given as a dict for a sub-config's
    name is merged into that sub-config."""
    from transformers import CONFIG_MAPPING

    return _tiny(CONFIG_MAPPING[model_type], vocab_size, overrides)


def _tiny(cls, vocab_size: int, overrides: dict):
    try:
        default = cls()
    except Exception:  # defaults that do not validate alone (the overrides make them valid)
        default = cls(**overrides)
    known = set(default.to_dict())
    kw = {k: v for k, v in TINY_SHAPE.items() if k in known}
    if "vocab_size" in known:
        kw["vocab_size"] = vocab_size
    if "kv_lora_rank" in known:  # MLA expands its latent to one key per query head
        kw["num_key_value_heads"] = kw.get("num_attention_heads", 4)
        kw.pop("head_dim", None)  # derived from the rope / nope parts (rope's size in some)
    if "add_cross_attention" in known:  # an encoder family used as a causal LM
        kw["is_decoder"] = True
    kinds = list(dict.fromkeys(getattr(default, "layer_types", None) or []))
    if len(kinds) > 1:
        n = int(kw.get("num_hidden_layers", 2))
        kw["layer_types"] = [kinds[i % len(kinds)] for i in range(n)]
    kw.update({"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2})
    for name in getattr(cls, "sub_configs", None) or {}:
        sub = getattr(default, name, None)
        if hasattr(sub, "to_dict"):  # built from its own class, with any override merged in
            kw[name] = _tiny(type(sub), vocab_size, dict(overrides.pop(name, None) or {}))
    kw.update(overrides)
    try:
        return cls(**kw)
    except AttributeError:  # layer_types is read-only here (derived from other fields)
        if "layer_types" in overrides or "layer_types" not in kw:
            raise
        del kw["layer_types"]
    return cls(**kw)


def tiny_causal_lm(model_type: str, *, seed: int = 0, vocab_size: int = 64, **overrides):
    """A randomly initialised causal LM of any transformers family, built offline from its
    config class (float32, eval mode, plain transformers: wrap it in :class:`HookedModel`)."""
    from transformers import AutoModelForCausalLM

    from headhunt.probes.loading import causal_lm_sub_config

    cfg = tiny_config(model_type, vocab_size=vocab_size, **overrides)
    name = causal_lm_sub_config(cfg)  # MusicGen: its causal LM is built from its decoder's
    torch.manual_seed(seed)
    if name is not None:
        lm = AutoModelForCausalLM._model_mapping[type(cfg)]
        return lm._from_config(getattr(cfg, name), dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval()


def random_kquant_blocks(rng, rows: int, cols: int, qtype):
    """Random Q4_K or Q6_K blocks for a [rows, cols] GGUF tensor (gguf-py quantises these only
    in C): random bytes with the float16 scales set to 0.01, so every dequantised value is
    finite. A uint8 array of the file's layout, [rows, cols / block * bytes per block]."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    if qtype == GGMLQuantizationType.Q4_K:  # d, dmin first
        raw[..., 0:2] = scale
        raw[..., 2:4] = scale
    elif qtype == GGMLQuantizationType.Q6_K:  # d last
        raw[..., size - 2 :] = scale
    else:
        raise ValueError(f"random_kquant_blocks makes Q4_K or Q6_K blocks, not {qtype!r}")
    return raw.reshape(rows, cols // block * size)
