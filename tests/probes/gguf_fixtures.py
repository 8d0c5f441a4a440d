"""Tiny GGUF files for the GGUF loading tests: a 2-layer Llama written with gguf-py's own
writer, its tensors in the quantisations the bundled models use (Q4_1, Q4_K, Q6_K) and a few
more (Q4_0, Q8_0, F16, F32), and a byte-level BPE tokenizer (the SmolLM2 GGUF's kind). Tests
import it by this name: several test folders have a conftest, and which one a bare
``import conftest`` finds depends on the order pytest loaded them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 256, 4, 2, 512, 2


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: one token per byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(keep, chars, strict=True))]


def write_tiny_gguf(path: Path, seed: int = 0, tied: bool = True) -> dict[str, np.ndarray]:
    """Write the tiny GGUF to ``path``; return its planted float32 tensors (the norms) by GGUF
    name, stored as written: what the model's norm weights must equal."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    from headhunt.probes.tiny import random_kquant_blocks

    rng = np.random.default_rng(seed)
    tokens = _byte_tokens() + ["Ġt", "he", "Ġthe", "<|endoftext|>"]
    merges = ["Ġ t", "h e", "Ġt he"]
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name("Tiny GGUF Llama")
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)

    def plain(name, shape, qtype):
        data = rng.standard_normal(shape).astype(np.float32) * 0.05
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    planted = {}

    def norm(name):
        planted[name] = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
        w.add_tensor(name, planted[name])

    head = HIDDEN // HEADS
    plain("token_embd.weight", (len(tokens), HIDDEN), Q.Q4_1)
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight")
        w.add_tensor(
            f"blk.{i}.attn_q.weight",
            random_kquant_blocks(rng, HIDDEN, HIDDEN, Q.Q4_K),
            raw_dtype=Q.Q4_K,
        )
        plain(f"blk.{i}.attn_k.weight", (KV_HEADS * head, HIDDEN), Q.Q8_0)
        plain(f"blk.{i}.attn_v.weight", (KV_HEADS * head, HIDDEN), Q.Q4_0)
        plain(f"blk.{i}.attn_output.weight", (HIDDEN, HIDDEN), Q.F16)
        norm(f"blk.{i}.ffn_norm.weight")
        w.add_tensor(
            f"blk.{i}.ffn_gate.weight",
            random_kquant_blocks(rng, FFN, HIDDEN, Q.Q6_K),
            raw_dtype=Q.Q6_K,
        )
        plain(f"blk.{i}.ffn_up.weight", (FFN, HIDDEN), Q.Q4_1)
        plain(f"blk.{i}.ffn_down.weight", (HIDDEN, FFN), Q.F32)
    norm("output_norm.weight")
    if not tied:
        plain("output.weight", (len(tokens), HIDDEN), Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return planted
