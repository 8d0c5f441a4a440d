"""The conformance checks: each compares one capture on a tiny model of a family with the same
model's own eager attention (transformers' ``eager_attention_forward``, ``output_attentions``).

All checks run on a left-padded batch of two rows longer than the sliding window and the
attention chunk (8), so padding, windows, chunks, softcaps and sinks all bite. Pad queries see
no key, so rows are compared on real tokens only.
"""

from __future__ import annotations

import torch

from headhunt.heads.interventions.masking import mask_heads
from headhunt.probes.attention import AttentionHook
from headhunt.probes.capture import capture_stats_and_counts, greedy_decode

from .conftest import LENGTH, MASKED_HEAD, Pair, padded_batch, vocab

ATOL = 2e-5
STEPS = 6


def _eager(pair: Pair, ids, mask, **kw):
    with torch.no_grad():
        return pair.eager(ids, attention_mask=mask, output_attentions=True, **kw)


def _as_eager_returns(probs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Our probabilities in the form the family's eager function returns them. Most return
    the true probabilities (with learned sinks, rows sum to less than 1); Granite SWA returns
    rows normalised over the keys and scales the output by the sink share afterwards, so for
    it the rows are compared normalised (its sink share is checked through the logits)."""
    sums = ref.sum(-1, keepdim=True)
    ones = lambda x: bool(((x - 1).abs() < 1e-5).all())  # noqa: E731
    if ones(sums) and not ones(probs.sum(-1, keepdim=True)):
        return probs / probs.sum(-1, keepdim=True).clamp_min(1e-30)
    return probs


def _true_rows(att: torch.Tensor, call, real_q: torch.Tensor) -> torch.Tensor:
    """Eager's rows as the model's true probabilities: Granite SWA's eager returns them
    normalised over the keys (see :func:`_as_eager_returns`), so they get the sink share of
    the model's own rows (validated through the logits)."""
    if call.sinks is not None and bool(((att.sum(-1) - real_q.float()).abs() < 1e-5).all()):
        return att * call.probs().sum(-1, keepdim=True)
    return att


def _by_layer(hm, attentions) -> list[tuple[int, torch.Tensor]]:
    """Eager's per-layer attention weights as (layer, weights) of the attention layers: a
    hybrid's eager model returns weights for its attention layers only, or one entry per
    layer (None, or a linear-attention layer's own tensor, elsewhere)."""
    if len(attentions) == hm.n_layers:
        return [(i, attentions[i]) for i in hm.attention_layers]
    attentions = [a for a in attentions if a is not None]
    assert len(attentions) == len(hm.attention_layers), (len(attentions), hm.attention_layers)
    return list(zip(hm.attention_layers, attentions, strict=True))


def _argmax_agrees(rows: torch.Tensor, picked: torch.Tensor, what: str) -> None:
    """The eager probability at the captured argmax is the row's maximum (ties allowed)."""
    at = rows.gather(-1, picked[..., None])[..., 0]
    top = rows.amax(-1)
    bad = (top - at) > 1e-6
    assert not bool(bad.any()), f"{what}: argmax off the eager maximum at {bad.nonzero()[:3]}"


class _DecodeRows(AttentionHook):
    """At each decode call, every head's attention row from ``AttentionCall.probs``, placed at
    the keys' absolute positions (a sliding layer's cache holds only its window)."""

    def __init__(self, total: int):
        self.total = total
        self.rows: dict[int, list[torch.Tensor]] = {}

    def before(self, call) -> None:
        if call.query.shape[2] != 1:
            return
        p = call.probs()[:, :, 0]  # [b, h, n_k]
        row = p.new_zeros(*p.shape[:2], self.total)
        row[..., call.key_positions] = p
        self.rows.setdefault(call.layer, []).append(row)


def _eager_decode(pair: Pair, ids, mask, tokens):
    """The eager model decoding ``tokens`` after ``ids`` with its own KV cache: each step's
    logits and attention rows (placed at absolute key positions: the last key is the query)."""
    import inspect

    from headhunt.probes.capture import _cache, cache_for_stateful, cache_kwarg

    total = ids.shape[1] + tokens.shape[1]
    pos = (torch.cat([mask, torch.ones_like(tokens)], 1).cumsum(-1) - 1).clamp_min(0)
    fmask = torch.cat([mask, torch.ones_like(tokens)], 1)
    modules = pair.hooked.attention_modules
    takes = cache_kwarg(pair.eager) in inspect.signature(pair.eager.forward).parameters
    if not takes or (modules and all(hasattr(m, "headhunt_kv") for m in modules)):
        # a model that returns no KV cache (GPT-1, causal XLM) decodes by full forwards
        return _eager_recompute(pair, torch.cat([ids, tokens], 1), fmask, pos, ids.shape[1])
    given = cache_for_stateful(pair.eager)  # RecurrentGemma returns no cache: hand it one
    # Inkling makes a cache only when told to (use_cache None is not its config's default)
    asks = (
        {"use_cache": True}
        if "use_cache" in inspect.signature(pair.eager.forward).parameters
        else {}
    )
    with torch.no_grad():
        out = pair.eager(
            ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=pos[:, : ids.shape[1] - 1],
            **({cache_kwarg(pair.eager): given} if given is not None else {}),
            **asks,
        )
        cache, feed = _cache(out, given), ids[:, -1:]
        logits, rows = [], []
        for t in range(tokens.shape[1]):
            p = ids.shape[1] - 1 + t
            out = pair.eager(
                feed,
                attention_mask=fmask[:, : p + 1],
                position_ids=pos[:, p : p + 1],
                output_attentions=True,
                **{cache_kwarg(pair.eager): cache},
            )
            cache, feed = _cache(out, cache), tokens[:, t : t + 1]
            logits.append(out.logits[:, -1])
            step = {}
            for layer, att in _by_layer(pair.hooked, out.attentions):
                row = att.new_zeros(*att.shape[:2], total)
                row[..., p + 1 - att.shape[-1] : p + 1] = att[:, :, -1]
                step[layer] = row
            rows.append(step)
    return logits, rows


def check_decode(pair: Pair) -> None:
    """Greedy decoding with a KV cache: tokens equal the eager model's greedy choice and, at
    every step and for every layer and head, the attention row (keys at their absolute
    positions) and its argmax key equal the eager model's own cached decoding."""
    hm = pair.hooked
    ids, mask = padded_batch(vocab(hm))
    rows = _DecodeRows(LENGTH + STEPS)
    dec = greedy_decode(
        hm, ids, attention_mask=mask, max_new_tokens=STEPS, capture_argmax=True, hooks=(rows,)
    )
    logits, ref_rows = _eager_decode(pair, ids, mask, dec.tokens)
    for t in range(dec.tokens.shape[1]):
        assert torch.equal(logits[t].argmax(-1), dec.tokens[:, t]), f"token at step {t}"
        for layer, ref in ref_rows[t].items():
            got = _as_eager_returns(rows.rows[layer][t], ref)
            torch.testing.assert_close(got, ref, atol=ATOL, rtol=1e-4)
            _argmax_agrees(ref, dec.argmax[t, layer], f"decode step {t} layer {layer}")


class _Calls(AttentionHook):
    """Keeps each layer's call (q, k and what the kernel does)."""

    def __init__(self):
        self.calls = {}

    def before(self, call) -> None:
        self.calls[call.layer] = call


def check_dense_rows(pair: Pair) -> dict:
    """``AttentionCall.probs`` (the dense helper) equals eager's attention on real queries."""
    hm = pair.hooked
    ids, mask = padded_batch(vocab(hm), seed=1)
    rec = _Calls()
    with hm.hooks(rec):
        hm.forward(ids, attention_mask=mask, use_cache=False)
    ref = _eager(pair, ids, mask).attentions
    real = mask.bool()
    for layer, att in _by_layer(hm, ref):
        att = att.transpose(1, 2)[real]  # [real queries, heads, keys]
        got = rec.calls[layer].probs().transpose(1, 2)[real]
        torch.testing.assert_close(_as_eager_returns(got, att), att, atol=ATOL, rtol=1e-4)
    return rec.calls


def check_every(pair: Pair, zeroed) -> None:
    """Every check a passing family gets (a variant of a family tested in one piece: decode,
    dense rows, masking, n-gram scores and the padded prefill's statistics)."""
    check_dense_rows(pair)
    check_decode(pair)
    check_masking(pair, zeroed)
    check_ngram(pair)
    check_prefill_stats(pair)


def check_prefill_stats(pair: Pair) -> None:
    """Kernel statistics on a padded prefill: lse (through exact probabilities of every pair),
    column sums and means, entropy and argmax equal eager attention's, on real queries, and
    the count of queries that see each key is the eager pattern's."""
    from headhunt.kernels import attention_probs_at

    hm = pair.hooked
    ids, mask = padded_batch(vocab(hm), seed=1)
    rec = _Calls()
    with hm.hooks(rec):
        stats, counts = capture_stats_and_counts(hm, ids, attention_mask=mask, entropy=True)
    ref = _eager(pair, ids, mask).attentions
    real_q = mask.bool()[:, None, :]  # [b, 1, n]
    n = ids.shape[1]
    qi, ki = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    for layer, att in _by_layer(hm, ref):
        s, call = stats[layer], rec.calls[layer]
        att = _true_rows(torch.where(real_q[..., None], att, 0.0), call, real_q)
        a = att
        torch.testing.assert_close(s.col_sum, a.sum(2), atol=1e-4, rtol=1e-4)
        seen_by = (a > 0).sum(2)  # [b, h, keys]: real queries that see each key
        assert torch.equal(counts[layer][:, None].expand_as(seen_by), seen_by), f"layer {layer}"
        mean = s.col_sum / counts[layer][:, None].clamp_min(1)
        torch.testing.assert_close(s.col_mean, mean, atol=1e-5, rtol=1e-4)
        sink = (1 - att.sum(-1)).clamp_min(0)  # the learned sink's share (0 without sinks)
        ent = -(att * att.clamp_min(1e-30).log()).sum(-1) - sink * sink.clamp_min(1e-30).log()
        torch.testing.assert_close(
            torch.where(real_q, s.entropy, 0.0), torch.where(real_q, ent, 0.0), atol=1e-4, rtol=1e-4
        )
        _argmax_agrees(
            torch.where(real_q[..., None], att, 0.0),
            torch.where(real_q, s.argmax, 0),
            f"prefill layer {layer}",
        )
        kw = {k: v for k, v in call.kernel_kwargs().items()}
        p = attention_probs_at(call.query, call.key, s.lse, qi.flatten(), ki.flatten(), **kw)
        p = p.view(*att.shape)
        torch.testing.assert_close(torch.where(real_q[..., None], p, 0.0), a, atol=ATOL, rtol=1e-4)


def check_masking(pair: Pair, zeroed) -> None:
    """Masking a head (query mode) changes the logits exactly as zeroing that head's query in
    the model's own eager attention does; with no mask, logits equal eager's."""
    hm = pair.hooked
    ids, mask = padded_batch(vocab(hm), seed=2)
    real = mask.bool()
    with torch.no_grad():
        plain = hm.model(ids, attention_mask=mask).logits
        with mask_heads(hm, [masked_head(hm)]):
            masked = hm.model(ids, attention_mask=mask).logits
        ref_plain = pair.eager(ids, attention_mask=mask).logits
        with zeroed(pair.eager, [masked_head(hm)]):
            ref_masked = pair.eager(ids, attention_mask=mask).logits
    torch.testing.assert_close(plain[real], ref_plain[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(masked[real], ref_masked[real], atol=1e-4, rtol=1e-4)
    assert (masked[real] - plain[real]).abs().max() > 1e-4, "masking the head changed nothing"


def masked_head(hm) -> tuple[int, int]:
    """The head the masking check zeroes: head 1 of the last attention layer (layer 1 of the
    two-layer models; a hybrid's attention layer wherever it is)."""
    return (hm.attention_layers[-1], MASKED_HEAD[1])


def check_ngram(pair: Pair) -> None:
    """The n-gram / induction scorer (kernel lse + exact pair probabilities inside the
    forward) equals its dense reference on the eager model's own attention pattern."""
    import numpy as np

    from headhunt.heads.ngram import NgramConfig, dense_reference, score_sequences

    hm = pair.hooked
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 9, (LENGTH,), generator=g)  # few token types: many repeats
    cfg = NgramConfig(exclude_bos=False)
    (rec,) = score_sequences(hm, [ids], cfg)
    calls = _Calls()
    with hm.hooks(calls):
        hm.forward(ids[None], use_cache=False)
    ones = torch.ones(1, LENGTH, dtype=torch.long)
    ref = _eager(pair, ids[None], ones).attentions
    for layer, att in _by_layer(hm, ref):
        att = _true_rows(att, calls.calls[layer], ones.bool()[:, None])
        want = dense_reference(att[0], ids, cfg)
        for key in ("tl_prev", "tl_dup", "tl_ind"):
            np.testing.assert_allclose(getattr(rec, key)[layer], want[key], atol=1e-4)


def _eager_recompute(pair: Pair, seq, fmask, pos, n: int):
    """A model that returns no KV cache (GPT-1, causal XLM) decodes by a full forward over the
    sequence so far at every step: each step's logits and its last query's attention rows."""
    logits, rows = [], []
    with torch.no_grad():
        for p in range(n - 1, seq.shape[1] - 1):
            out = pair.eager(
                seq[:, : p + 1],
                attention_mask=fmask[:, : p + 1],
                position_ids=pos[:, : p + 1],
                output_attentions=True,
            )
            logits.append(out.logits[:, -1])
            step = {}
            for layer, att in _by_layer(pair.hooked, out.attentions):
                row = att.new_zeros(*att.shape[:2], seq.shape[1])
                row[..., : p + 1] = att[:, :, -1]
                step[layer] = row
            rows.append(step)
    return logits, rows
