"""Akyürek et al.'s hard-wired static n-gram head, planted into a real model's attention.

The static n-gram layer with context k lets query t attend uniformly to every key j < t whose
preceding k tokens equal the k tokens ending at t (``x[t-i] == x[j-1-i]``, i = 0..k-1); rows
with no match get nothing. :func:`plant_static_ngram_heads` makes chosen heads of a
:class:`~headhunt.probes.hooked.HookedModel` compute exactly that pattern through the model's
own softmax kernel, by replacing their post-rotary q and k (an :class:`AttentionHook`):

- each slot i of q_t is the one-hot of ``x[t-i]`` and slot i of k_j the one-hot of
  ``x[j-1-i]``, so ``q_t . k_j`` counts the matching slots;
- a sink dimension gives key 0 the score ``k - 1/2``;
- everything is multiplied by ``sharpness``.

A full match (score k) beats the sink by ``sharpness / 2`` and the sink beats every partial
match by as much, so with sharpness 40 the pattern is exact to ~1e-8: uniform over the full
matches, and all mass on key 0 when a row has none (the softmax stand-in for Akyürek's zero
row; key 0 is never a k-gram match). Ground truth for the scorer in :mod:`headhunt.heads.ngram`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel
from headhunt.scores import Head, check_heads


def static_ngram_pattern(ids: Sequence[int] | Tensor, k: int) -> Float[Tensor, "n n"]:
    """Akyürek's static n-gram attention (rows with no match are all zero). Dense: tests only."""
    x = torch.as_tensor(ids).tolist()
    n = len(x)
    A = torch.zeros(n, n)
    for t in range(k - 1, n):
        js = [j for j in range(k, t) if all(x[t - i] == x[j - 1 - i] for i in range(k))]
        if js:
            A[t, js] = 1.0 / len(js)
    return A


class StaticNgramHeads(AttentionHook):
    """Replaces the q and k of chosen heads so that their attention is the static k-gram pattern.

    Args:
        heads: {(layer, query head): k}.
        vocab: the token ids the one-hot slots cover; other tokens get a zero slot (never match).
        head_dim: the model's head dimension (k * len(vocab) + 1 must fit).
        group_size: query heads per KV head; the planted head's KV head is rewritten, so the
            other query heads of its group must not be planted with another k.
        sharpness: score gap multiplier (see the module docstring).
    """

    def __init__(
        self,
        heads: Mapping[Head, int],
        vocab: Sequence[int],
        head_dim: int,
        group_size: int = 1,
        sharpness: float = 40.0,
    ):
        self.heads = {(int(a), int(b)): int(k) for (a, b), k in heads.items()}
        self.vocab = np.asarray(sorted(set(int(v) for v in vocab)), dtype=np.int64)
        self.group = group_size
        self.sharpness = sharpness
        self.ids: Tensor | None = None
        for k in self.heads.values():
            if k < 1 or k * len(self.vocab) + 1 > head_dim:
                raise HeadhuntError(
                    f"a static {k}-gram head over {len(self.vocab)} tokens needs head_dim >= "
                    f"{k * len(self.vocab) + 1} (model has {head_dim})"
                )
        groups: dict[tuple[int, int], set[int]] = {}
        for (layer, head), k in self.heads.items():
            groups.setdefault((layer, head // group_size), set()).add(k)
        if any(len(s) > 1 for s in groups.values()):
            raise HeadhuntError("heads sharing a KV head cannot be planted with different k")

    def _slots(self, ids: Int[Tensor, "b n"], k: int, shift: int) -> Float[Tensor, "b n kv"]:
        """One-hot of x[pos - shift - i] in slot i (zero when out of range or out of vocab)."""
        b, n = ids.shape
        V = len(self.vocab)
        lookup = torch.full((int(max(self.vocab.max(), ids.max())) + 1,), -1, dtype=torch.long)
        lookup[torch.from_numpy(self.vocab)] = torch.arange(V)
        code = lookup[ids.cpu()]  # [b, n], -1 for tokens outside the vocab
        out = torch.zeros(b, n, k * V)
        for i in range(k):
            src = torch.arange(n) - shift - i
            valid = src >= 0
            c = torch.full((b, n), -1, dtype=torch.long)
            c[:, valid] = code[:, src[valid]]
            bi, pi = torch.nonzero(c >= 0, as_tuple=True)
            out[bi, pi, i * V + c[bi, pi]] = 1.0
        return out

    def before(self, call: AttentionCall) -> None:
        planted = [(h, k) for (layer, h), k in self.heads.items() if layer == call.layer]
        if not planted:
            return
        if self.ids is None:
            raise HeadhuntError(
                "StaticNgramHeads needs the input ids (use plant_static_ngram_heads)"
            )
        if call.query.shape[2] != self.ids.shape[1] or call.key.shape[2] != self.ids.shape[1]:
            raise HeadhuntError("static n-gram heads work on full forward passes only")
        q, key = call.query.clone(), call.key.clone()
        d = q.shape[-1]
        V = len(self.vocab)
        c = self.sharpness / call.scaling  # the kernel multiplies q.k by scaling
        for h, k in planted:
            qs = self._slots(self.ids, k, 0)  # x[t - i]
            ks = self._slots(self.ids, k, 1)  # x[j - 1 - i]
            qv = torch.zeros(*qs.shape[:2], d)
            kv = torch.zeros(*ks.shape[:2], d)
            qv[..., : k * V] = qs * c
            kv[..., : k * V] = ks
            qv[..., k * V] = c * (k - 0.5)  # the sink score of key 0
            kv[:, 0, k * V] = 1.0
            q[:, h] = qv.to(q)
            key[:, h // self.group] = kv.to(key)
        call.query, call.key = q, key


@contextlib.contextmanager
def plant_static_ngram_heads(
    model: HookedModel,
    heads: Mapping[Head, int],
    vocab: Sequence[int],
    sharpness: float = 40.0,
) -> Iterator[StaticNgramHeads]:
    """Inside the block, the chosen heads of ``model`` are static n-gram heads.

    The input ids are read by a forward pre-hook on the Hugging Face model, so any caller
    (an analyzer that knows nothing of the planting) runs them. Install analyzers' hooks
    inside this block so they see the planted q and k.

    Example:
        >>> with plant_static_ngram_heads(model, {(0, 0): 1, (0, 1): 2}, vocab=pool):
        ...     scores = score_ngrams(model, {"planted": seqs})
    """
    check_heads(heads, model.n_layers, model.n_heads)
    hook = StaticNgramHeads(heads, vocab, model.head_dim, model.group_size, sharpness)

    def grab(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        hook.ids = None if ids is None else ids.detach()

    handle = model.model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with model.hooks(hook):
            yield hook
    finally:
        handle.remove()
