"""MusicGen Melody's decoder reads several token rows per sequence: ``input_ids`` [batch x
codebooks, n] (rows b*K .. b*K + K - 1 are sequence b's codebooks), one embedding per codebook
summed at each position, and K LM heads. Its self-attention is ordinary causal attention over
the n positions of each sequence (batch b, not b x K), so headhunt captures it in the model's
own layout: the family's checks (dense rows, prefill statistics, head masking, decoding with a
cache, n-gram scores) on a left-padded batch of two sequences of 4 codebooks, against the same
model's eager attention. A token, where the n-gram scorer compares tokens, is the tuple of a
position's codes; a method's run (inputs of one token row per sequence) refuses in one line.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headhunt.errors import HeadhuntError

from . import checks
from .conftest import BATCH, LENGTH, PAD, build_pair, padded_batch, vocab

FAMILY = "musicgen_melody"


@pytest.fixture(scope="module")
def pair():
    # the tiny shape's initializer range under MusicGen's name (its 0.02 leaves every row
    # near uniform: masking a head would move the logits by under 1e-4)
    return build_pair(FAMILY, decoder={"initializer_factor": 0.2})


def codebook_batch(hm, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [BATCH x K, LENGTH] in the model's layout (sequence 0 left-padded by PAD in every
    codebook row) and the sequences' mask [BATCH, LENGTH]."""
    k = hm.codebooks
    _, mask = padded_batch(vocab(hm), seed=seed)
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(3, vocab(hm), (BATCH, k, LENGTH), generator=g)
    codes[0, :, :PAD] = 0
    return codes.reshape(BATCH * k, LENGTH), mask


def _eager(pair, ids, mask, **kw):
    with torch.no_grad():
        return pair.eager(ids, attention_mask=mask, output_attentions=True, **kw)


def test_the_model_reads_codebook_rows(pair):
    hm = pair.hooked
    assert hm.codebooks == pair.eager.config.num_codebooks == 4
    assert hm.attention_layers == [0, 1]
    facts = hm.describe()
    assert facts["codebooks"] == 4 and "tuple" in facts["token_rows"]


def test_dense_rows_and_masking(pair, zeroed):
    hm = pair.hooked
    ids, mask = codebook_batch(hm, seed=1)
    rec = checks._Calls()
    with hm.hooks(rec):
        hm.forward(ids, attention_mask=mask, use_cache=False)
    real = mask.bool()
    for layer, att in checks._by_layer(hm, _eager(pair, ids, mask).attentions):
        assert att.shape[0] == BATCH  # the attention's batch is the sequences'
        got = rec.calls[layer].probs().transpose(1, 2)[real]
        torch.testing.assert_close(got, att.transpose(1, 2)[real], atol=checks.ATOL, rtol=1e-4)
    rows = real.repeat_interleave(hm.codebooks, 0)  # [BATCH x K, LENGTH]: each codebook's
    head = checks.masked_head(hm)
    with torch.no_grad():
        plain = hm.model(ids, attention_mask=mask).logits
        with checks.mask_heads(hm, [head]):
            masked = hm.model(ids, attention_mask=mask).logits
        ref_plain = pair.eager(ids, attention_mask=mask).logits
        with zeroed(pair.eager, [head]):
            ref_masked = pair.eager(ids, attention_mask=mask).logits
    torch.testing.assert_close(plain[rows], ref_plain[rows], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(masked[rows], ref_masked[rows], atol=1e-4, rtol=1e-4)
    assert (masked[rows] - plain[rows]).abs().max() > 1e-4, "masking the head changed nothing"


def test_prefill_stats(pair):
    from headhunt.kernels import attention_probs_at
    from headhunt.probes.capture import capture_stats_and_counts

    hm = pair.hooked
    ids, mask = codebook_batch(hm, seed=2)
    rec = checks._Calls()
    with hm.hooks(rec):
        stats, counts = capture_stats_and_counts(hm, ids, attention_mask=mask, entropy=True)
    real_q = mask.bool()[:, None, :]
    qi, ki = torch.meshgrid(torch.arange(LENGTH), torch.arange(LENGTH), indexing="ij")
    for layer, att in checks._by_layer(hm, _eager(pair, ids, mask).attentions):
        s, call = stats[layer], rec.calls[layer]
        a = torch.where(real_q[..., None], att, 0.0)
        torch.testing.assert_close(s.col_sum, a.sum(2), atol=1e-4, rtol=1e-4)
        assert torch.equal(counts[layer][:, None].expand(-1, a.shape[1], -1), (a > 0).sum(2))
        ent = -(a * a.clamp_min(1e-30).log()).sum(-1)
        torch.testing.assert_close(
            torch.where(real_q, s.entropy, 0.0), torch.where(real_q, ent, 0.0), atol=1e-4, rtol=1e-4
        )
        checks._argmax_agrees(a, torch.where(real_q, s.argmax, 0), f"prefill layer {layer}")
        p = attention_probs_at(
            call.query, call.key, s.lse, qi.flatten(), ki.flatten(), **call.kernel_kwargs()
        )
        torch.testing.assert_close(
            torch.where(real_q[..., None], p.view(*a.shape), 0.0), a, atol=checks.ATOL, rtol=1e-4
        )


def test_decode(pair):
    """Greedy decoding with a KV cache in the model's layout: each codebook row's token is the
    eager model's argmax at every step, and every head's attention row (and its argmax key)
    equals the eager model's own cached step."""
    from headhunt.probes.capture import _cache, cache_kwarg, greedy_decode

    hm, steps = pair.hooked, checks.STEPS
    ids, mask = codebook_batch(hm, seed=3)
    rows = checks._DecodeRows(LENGTH + steps)
    dec = greedy_decode(
        hm, ids, attention_mask=mask, max_new_tokens=steps, capture_argmax=True, hooks=(rows,)
    )
    assert dec.tokens.shape == (BATCH * hm.codebooks, steps)
    assert dec.argmax.shape[2] == BATCH  # one argmax per sequence and head
    fmask = torch.cat([mask, mask.new_ones(BATCH, steps)], 1)
    with torch.no_grad():
        out = pair.eager(ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
        cache, feed = _cache(out), ids[:, -1:]
        for t in range(steps):
            p = LENGTH - 1 + t
            out = pair.eager(
                feed,
                attention_mask=fmask[:, : p + 1],
                output_attentions=True,
                **{cache_kwarg(pair.eager): cache},
            )
            cache, feed = _cache(out), dec.tokens[:, t : t + 1]
            assert torch.equal(out.logits[:, -1].argmax(-1), dec.tokens[:, t]), f"step {t}"
            for layer, att in checks._by_layer(hm, out.attentions):
                ref = att.new_zeros(*att.shape[:2], LENGTH + steps)
                ref[..., p + 1 - att.shape[-1] : p + 1] = att[:, :, -1]
                torch.testing.assert_close(rows.rows[layer][t], ref, atol=checks.ATOL, rtol=1e-4)
                checks._argmax_agrees(ref, dec.argmax[t, layer], f"step {t} layer {layer}")


def test_ngram_tokens_are_codebook_tuples(pair):
    """The n-gram scores of a [codebooks, n] sequence equal their dense reference on the eager
    attention with a token = the tuple of a position's codes. Planted: codebook 0 repeats one
    code throughout while the others vary, so scoring codebook 0 alone would find duplicates
    and an induction pattern the tuples do not have (the scores differ from that reference)."""
    from headhunt.heads.ngram import NgramConfig, dense_reference, score_sequences, tuple_ids

    hm = pair.hooked
    g = torch.Generator().manual_seed(4)
    seq = torch.randint(3, 5, (hm.codebooks, LENGTH), generator=g)  # 16 tuples: repeats
    seq[0] = 3
    cfg = NgramConfig(exclude_bos=False)
    (rec,) = score_sequences(hm, [seq], cfg)
    att = _eager(pair, seq, torch.ones(1, LENGTH, dtype=torch.long)).attentions
    tokens = tuple_ids(seq)
    assert len(set(tokens.tolist())) > 4 and torch.equal(tokens[1:] == tokens[:-1], (
        seq[:, 1:] == seq[:, :-1]).all(0))  # fmt: skip
    differs = False
    for layer, a in checks._by_layer(hm, att):
        want = dense_reference(a[0], tokens, cfg)
        first_codebook = dense_reference(a[0], seq[0], cfg)
        for key in ("tl_prev", "tl_dup", "tl_ind"):
            np.testing.assert_allclose(getattr(rec, key)[layer], want[key], atol=1e-4)
            differs |= not np.allclose(getattr(rec, key)[layer], first_codebook[key], atol=1e-3)
    assert differs
    with pytest.raises(HeadhuntError) as err:
        score_sequences(hm, [seq[0]], cfg)  # one row: not a sequence of this model
    assert "\n" not in str(err.value) and "[4, n]" in str(err.value)


def test_inputs_in_another_layout_are_refused_in_one_line(pair):
    from headhunt.probes.capture import greedy_decode

    hm = pair.hooked
    ids, mask = codebook_batch(hm, seed=5)
    refused = (
        lambda: hm.forward(ids[0]),  # one row: not a sequence of this model
        lambda: greedy_decode(
            hm, ids, attention_mask=mask, max_new_tokens=2, skip_stopped_rows=True
        ),
    )
    for call, words in zip(refused, ("[batch x 4, n]", "skip_stopped_rows"), strict=True):
        with pytest.raises(HeadhuntError) as err:
            call()
        assert "\n" not in str(err.value) and words in str(err.value)


def test_a_methods_run_refuses_in_one_line(pair, tmp_path):
    import headhunt as hh

    config = {"inputs": ["random"], "n_seqs": 2, "repeat_len": 10, "bos": False}
    with pytest.raises(HeadhuntError) as err:
        hh.run("ngram", config, model=pair.hooked, out=tmp_path / "run", progress=False)
    message = str(err.value)
    assert "\n" not in message and "4 token rows per sequence" in message
