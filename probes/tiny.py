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
