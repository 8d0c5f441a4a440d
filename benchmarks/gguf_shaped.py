"""Write a GGUF of a real model's shape with random quantised weights, for timing loads of a
model too big to ship (no 1.5B GGUF is reachable offline): Qwen2-1.5B's layer shapes (28
layers, hidden 1536, 12 query / 2 key-value heads, FFN 8960, q/k/v biases) in Q4_K_M's main
block type (Q4_K; the embedding Q6_K, norms and biases float32), and a byte-level BPE
vocabulary of Qwen2's size (151,936 tokens): the SmolLM2 GGUF's 49,152 tokens and merges, then
merges of two existing tokens, each making a new token, until the size is reached (a real
tokenizer's amount of metadata for a first load to parse, and the same embedding shape).
``--vocab 0`` keeps SmolLM2's vocabulary alone (the file of the results' first runs).

    python benchmarks/gguf_shaped.py /tmp/q15/qwen2-shape-151k.gguf
    HEADHUNT_CACHE=/tmp/empty python benchmarks/gguf_load.py /tmp/q15/qwen2-shape-151k.gguf

The blocks are random bytes with small float16 scales (every dequantised value finite): the
load's cost depends on the shapes and block types, not on the values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN = 28, 1536, 12, 2, 8960
QWEN2_VOCAB = 151_936  # Qwen2's embedding rows (151,643 BPE tokens and its special tokens)


def _field(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode() for i in f.data]


def grow_vocabulary(tokens, merges, types, size: int, rng) -> None:
    """Append tokens until there are ``size``: each new token is two existing normal tokens
    joined, with that merge appended (so every merge's parts and result are in the vocabulary,
    and the original merges keep their ranks: common words are spelled as before)."""
    known = set(tokens)
    normal = [t for t, kind in zip(tokens, types, strict=True) if kind == 1 and len(t) <= 6]
    while len(tokens) < size:
        a, b = normal[rng.integers(len(normal))], normal[rng.integers(len(normal))]
        if a + b in known:
            continue
        known.add(a + b)
        tokens.append(a + b)
        merges.append(f"{a} {b}")
        types.append(1)


def main(out: Path, vocab: int) -> None:
    import gguf
    from gguf import GGMLQuantizationType as Q

    from headhunt.probes.loading import REGISTRY
    from headhunt.probes.tiny import random_kquant_blocks

    src = gguf.GGUFReader(REGISTRY["smollm2-135m"].path())
    tokens = _field(src, "tokenizer.ggml.tokens")
    merges = _field(src, "tokenizer.ggml.merges")
    types = [
        int(src.fields["tokenizer.ggml.token_type"].parts[i][0])
        for i in src.fields["tokenizer.ggml.token_type"].data
    ]
    eos = int(src.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])
    rng = np.random.default_rng(0)
    if vocab:
        grow_vocabulary(tokens, merges, types, vocab, rng)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), arch="qwen2")
    w.add_name("Random Qwen2-1.5B-shaped GGUF")
    w.add_context_length(32768)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_eos_token_id(eos)
    w.add_bos_token_id(eos)

    def vec(name, n):
        w.add_tensor(name, (0.01 * rng.standard_normal(n)).astype(np.float32))

    head = HIDDEN // HEADS
    w.add_tensor(
        "token_embd.weight",
        random_kquant_blocks(rng, len(tokens), HIDDEN, Q.Q6_K),
        raw_dtype=Q.Q6_K,
    )
    for i in range(LAYERS):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", HIDDEN)
        for name, rows in (
            ("attn_q", HIDDEN),
            ("attn_k", KV_HEADS * head),
            ("attn_v", KV_HEADS * head),
        ):
            w.add_tensor(
                p + name + ".weight",
                random_kquant_blocks(rng, rows, HIDDEN, Q.Q4_K),
                raw_dtype=Q.Q4_K,
            )
            vec(p + name + ".bias", rows)
        w.add_tensor(
            p + "attn_output.weight",
            random_kquant_blocks(rng, HIDDEN, HIDDEN, Q.Q4_K),
            raw_dtype=Q.Q4_K,
        )
        vec(p + "ffn_norm.weight", HIDDEN)
        w.add_tensor(
            p + "ffn_gate.weight", random_kquant_blocks(rng, FFN, HIDDEN, Q.Q4_K), raw_dtype=Q.Q4_K
        )
        w.add_tensor(
            p + "ffn_up.weight", random_kquant_blocks(rng, FFN, HIDDEN, Q.Q4_K), raw_dtype=Q.Q4_K
        )
        w.add_tensor(
            p + "ffn_down.weight", random_kquant_blocks(rng, HIDDEN, FFN, Q.Q6_K), raw_dtype=Q.Q6_K
        )
    vec("output_norm.weight", HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out, out.stat().st_size)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--vocab", type=int, default=QWEN2_VOCAB, help="tokens (0: SmolLM2's own 49,152)"
    )
    args = parser.parse_args()
    main(args.out, args.vocab)
