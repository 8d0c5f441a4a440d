"""A planted circuit: a tiny Llama in which only known heads carry the task, by construction.

The task: does the prompt contain the *marker* word? Positives contain it; each negative is its
positive with the marker swapped for a *decoy* word. The model is a random tiny Llama (one KV
head per query head) after weight surgery that reserves three residual coordinates:

- ``r``: only the marker's embedding has it (value c); the decoy has the same embedding except
  that it puts c on ``s`` instead, so both have the same norm and RMSNorm treats them alike.
- ``w``: where the planted heads write.

No component reads ``r``, ``s`` or ``w`` and none writes them, except that the planted heads
(last layer) read only ``r`` through their value projection and write only ``w``, and the LM head
reads ``w`` into the answer token's logit. So every other head computes exactly the same thing
on a positive and on its negative, and the planted heads' outputs are zero on every negative and
non-zero on positives. Activation patching, attribution patching and SAE node scores must all
single them out.

``write_scale`` shrinks what the planted heads write (and scales the LM head's read of ``w`` up
by as much, so the logits and every patching effect stay the same): a circuit of heads whose
outputs are small next to the other heads', as on real models, where head output norms span
two orders of magnitude.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from headhunt.probes.hooked import HookedModel
from headhunt.probes.tiny import WORDS, tiny_llama
from headhunt.sae.prompt_pairs import EncodedPairs, PromptPair, encode_pairs

MARKER, DECOY, ANSWER, WRONG = "secret", "code", "lamp", "river"
R, S, W = 0, 1, 2  # reserved residual coordinates


@dataclass
class Planted:
    """The planted model, its circuit, and how to make its prompts."""

    model: HookedModel
    heads: list[tuple[int, int]]

    def pairs(
        self, n: int, seed: int = 0, length: int = 10, marker_last: bool = False
    ) -> EncodedPairs:
        """``n`` marker / decoy prompt pairs of ``length`` words (all the same length).

        ``marker_last`` puts the marker on the last word, where the answer is read: only the
        last position's planted-head output differs between a positive and its negative (as
        in IOI, where the heads that matter act where the answer is predicted), so a head
        output averaged over positions holds 1 / length of the signal."""
        rng = random.Random(seed)
        filler = [w for w in WORDS if w not in (MARKER, DECOY, ANSWER, WRONG)]
        pairs = []
        for _ in range(n):
            words = [rng.choice(filler) for _ in range(length)]
            at = length - 1 if marker_last else rng.randrange(1, length - 1)
            pos = " ".join([*words[:at], MARKER, *words[at + 1 :]])
            neg = " ".join([*words[:at], DECOY, *words[at + 1 :]])
            pairs.append(PromptPair(pos, neg, [" " + ANSWER], [" " + WRONG]))
        return encode_pairs(self.model.tokenizer, pairs, require_aligned=True)


@torch.no_grad()
def planted_model(
    *,
    n_layers: int = 3,
    n_heads: int = 4,
    d_model: int = 64,
    heads: tuple[tuple[int, int], ...] | None = None,
    write_scale: float = 1.0,
    seed: int = 0,
) -> Planted:
    """Build the planted model. ``heads`` are (layer, head) pairs in the last layer (default:
    heads 1 and n_heads - 1 of the last layer); ``write_scale`` scales what they write (see
    the module docstring)."""
    last = n_layers - 1
    heads = heads or ((last, 1), (last, n_heads - 1))
    if any(layer != last for layer, _ in heads):
        raise ValueError("planted heads must sit in the last layer (nothing may read them)")
    m = tiny_llama(
        n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads, d_model=d_model, seed=seed
    )
    net, tok = m.model, m.tokenizer
    g = torch.Generator().manual_seed(seed + 1)
    d = m.head_dim
    reserved = [R, S, W]
    emb = net.model.embed_tokens.weight
    marker, decoy = tok.convert_tokens_to_ids(MARKER), tok.convert_tokens_to_ids(DECOY)
    emb[:, reserved] = 0
    c = 4 * float(emb.std())
    emb[marker] = emb[decoy]
    emb[marker, R] = c
    emb[decoy, S] = c
    for layer in net.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        for lin in (att.q_proj, att.k_proj, att.v_proj, mlp.gate_proj, mlp.up_proj):
            lin.weight[:, reserved] = 0  # nobody reads the reserved coordinates
        for lin in (att.o_proj, mlp.down_proj):
            lin.weight[reserved, :] = 0  # nobody writes them
    att = net.model.layers[last].self_attn
    for _, h in heads:
        sl = slice(h * d, (h + 1) * d)
        vec = torch.randn(d, generator=g)
        att.v_proj.weight[sl, :] = 0
        att.v_proj.weight[sl, R] = vec  # read only the marker coordinate
        att.o_proj.weight[:, sl] = 0
        att.o_proj.weight[W, sl] = vec * write_scale  # write only coordinate w, sign +
    lm = net.lm_head.weight
    lm[:, reserved] = 0
    lm[tok.convert_tokens_to_ids(ANSWER), W] = 10.0 / write_scale  # w raises the answer's logit
    return Planted(model=m, heads=sorted(heads))
