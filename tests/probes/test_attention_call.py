"""AttentionCall: what the layer's kernel does, read from the call (mask, kwargs, cache)."""

from __future__ import annotations

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionCall, base_name, check_call


def _call(mask, nq=6, nk=6, **kwargs):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, nq, 8, generator=g)
    k, v = (torch.randn(2, 2, nk, 8, generator=g) for _ in range(2))
    return AttentionCall(0, q, k, v, mask, 8**-0.5, kwargs=kwargs)


def _mask(allowed: torch.Tensor) -> torch.Tensor:
    return allowed[None, None].expand(2, 1, *allowed.shape)


def test_plain_causal_and_window_masks_need_no_intervals():
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    kw = _call(_mask(causal)).kernel_kwargs()
    assert kw["causal"] and "key_lo" not in kw and "window" not in kw
    window = causal & ~torch.ones(6, 6, dtype=torch.bool).tril(-3)  # sees itself + 2 before
    kw = _call(_mask(window), sliding_window=3).kernel_kwargs()
    assert kw["window"] == 3 and "key_lo" not in kw


def test_padding_gives_per_row_intervals_and_empty_pad_rows():
    allowed = torch.ones(2, 6, 6, dtype=torch.bool).tril()
    allowed[0, :, :2] = False  # row 0: two left pads
    call = _call(allowed[:, None])
    kw = call.kernel_kwargs()
    assert not kw["causal"]
    assert kw["key_lo"].tolist() == [[6, 6, 2, 2, 2, 2], [0] * 6]
    assert kw["key_hi"].tolist() == [[-1, -1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]
    probs = call.probs()
    assert probs[0, :, :2].abs().sum() == 0  # pad queries see nothing
    torch.testing.assert_close(probs[0, :, 2:].sum(-1), torch.ones(4, 4))


def test_softcap_and_sinks_in_the_dense_rows():
    call = _call(None, softcap=2.0, s_aux=torch.zeros(4))
    s = call.scores()
    assert s[torch.isfinite(s)].abs().max() < 2.0  # capped
    p = call.probs()
    assert bool((p.sum(-1) < 1).all())  # the sink slot takes the rest of every row
    # Query 0 sees only key 0: its probability is exp(s) / (exp(s) + exp(0)) = sigmoid(s).
    torch.testing.assert_close(
        p[..., 0, 0], torch.sigmoid(s[..., 0, 0]), msg="one key against a zero sink"
    )


def test_masks_headhunt_cannot_describe_are_refused():
    holes = torch.ones(6, 6, dtype=torch.bool).tril()
    holes[5, 2] = False  # row 5 sees keys 0, 1, 3, 4, 5: not one interval
    with pytest.raises(HeadhuntError, match="not one interval"):
        check_call(_call(_mask(holes)))
    with pytest.raises(HeadhuntError, match="a position bias of shape"):  # not one per pair
        check_call(_call(None, position_bias=torch.zeros(1)))


def test_sliding_cache_keys_map_to_absolute_positions():
    # A decode step at position 19 of a layer whose cache kept its last 7 keys (+ the new one).
    call = _call(None, nq=1, nk=8)
    call.query_start = 19
    assert call.key_start == 12 and call.key_positions.tolist() == list(range(12, 20))


def test_kernels_that_drop_softcap_or_sinks_are_not_used():
    module = torch.nn.Module()
    module.headhunt_base = "sdpa"
    assert base_name(module, _call(None)) == "sdpa"
    assert base_name(module, _call(None, softcap=30.0)) == "eager"
    assert base_name(module, _call(None, s_aux=torch.zeros(4))) == "eager"
    module.headhunt_base = "flash_attention_2"
    assert base_name(module, _call(None, softcap=30.0)) == "flash_attention_2"
    assert base_name(module, _call(None, s_aux=torch.zeros(4))) == "eager"


def test_load_model_refuses_a_family_it_cannot_capture(tmp_path):
    from headhunt.probes import load_model
    from headhunt.probes.tiny import tiny_causal_lm, word_tokenizer

    # XLNet as released (attn_type 'bi'): a permutation LM, every token sees every other
    tiny_causal_lm("xlnet").save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(HeadhuntError, match="XLNet's attention .* is bidirectional") as err:
        load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(err.value)


def test_an_additive_mask_that_adds_a_bias_is_measured_with_it():
    """What an additive mask adds on its visible keys (Doge's per-key dynamic mask, an
    ALiBi-like bias) is part of the scores: the dense rows and the kernels' statistics equal
    the softmax of the scores plus the mask, the visible keys still read off the mask."""
    from headhunt.kernels import attention_stats

    low = torch.finfo(torch.float32).min
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    pos = torch.arange(6.0)
    alibi = -0.5 * (pos[:, None] - pos[None, :])
    per_key = torch.randn(2, 4, 1, 6, generator=torch.Generator().manual_seed(3)).expand(2, 4, 6, 6)
    for bias in (alibi.expand(2, 1, 6, 6), per_key):
        mask = bias.masked_fill(~causal, low)
        call = _call(mask)
        check_call(call)
        q, k = call.query, call.key.repeat_interleave(2, 1)
        want = torch.softmax(q @ k.transpose(-1, -2) * 8**-0.5 + mask, -1)
        torch.testing.assert_close(call.probs(), want)
        st = attention_stats(call.query, call.key, **call.kernel_kwargs())
        torch.testing.assert_close(
            st.lse, torch.logsumexp(q @ k.transpose(-1, -2) * 8**-0.5 + mask, -1)
        )
        assert torch.equal(st.argmax, want.argmax(-1))
    plain = _call(torch.zeros(2, 1, 6, 6).masked_fill(~causal, low))
    assert plain.bias is None  # a plain additive mask adds nothing
