"""N-gram / induction scores: exact against a dense reference and TransformerLens, and planted
static n-gram heads (Akyürek) classified with the right order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.heads.inputs.ngram_inputs import (
    natural_chunks,
    planted_kgrams,
    repeated_random,
    token_pool,
)
from headhunt.heads.ngram import (
    NgramConfig,
    dense_reference,
    match_pairs,
    order_table,
    score_ngrams,
    score_sequences,
    summarize,
)
from headhunt.heads.static_ngram import plant_static_ngram_heads, static_ngram_pattern
from headhunt.probes.capture import capture_qk
from headhunt.probes.tiny import tiny_llama


def _dense_attention(model, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Full softmax attention [heads, n, n] per layer from captured q, k (tests only)."""
    qk = capture_qk(model, ids[None])
    n = len(ids)
    out = {}
    for layer, (q, k) in qk.items():
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        s = (q @ k.transpose(-1, -2))[0].double() * model.head_dim**-0.5
        s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), -torch.inf)
        out[layer] = s.softmax(-1)
    return out


def test_match_pairs_equals_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.integers(0, 5, size=40)
        mp = match_pairs(x, 4)
        got = {(int(t), int(p)): int(L) for t, p, L in zip(mp.t, mp.p, mp.length, strict=True)}
        want = {}
        for t in range(len(x)):
            for p in range(t):
                if x[p] == x[t]:
                    L = 1
                    while L < 4 and p - L >= 0 and x[t - L] == x[p - L]:
                        L += 1
                    want[(t, p)] = L
        assert got == want


@pytest.mark.parametrize(
    ("exclude_bos", "exclude_current"), [(False, False), (True, False), (True, True)]
)
def test_scores_equal_dense_reference(tiny, exclude_bos, exclude_current):
    cfg = NgramConfig(exclude_bos=exclude_bos, exclude_current_token=exclude_current)
    pool = token_pool(tiny.tokenizer)
    seqs = [
        *planted_kgrams(pool[:12], n_seqs=2, length=90, bos_id=1, seed=3),
        *repeated_random(pool, n_seqs=1, length=15, repeats=3, bos_id=None, seed=4),
    ]
    seqs.append(torch.tensor([1, 7, 7, 7, 8, 7, 7, 9, 7, 7, 7]))  # runs: j = t matches
    recs = score_sequences(tiny, seqs, cfg)
    for ids, rec in zip(seqs, recs, strict=True):
        for layer, attn in _dense_attention(tiny, ids).items():
            ref = dense_reference(attn, ids, cfg)
            for key in ("tl_prev", "tl_dup", "tl_ind"):
                np.testing.assert_allclose(getattr(rec, key)[layer], ref[key], atol=2e-5)
            with np.errstate(invalid="ignore"):
                mass = rec.full_sum[:, layer] / rec.n_full[:, None]
                f, o = rec.full_pp_sum[:, layer], rec.only_pp_sum[:, layer]
                contrast = (f - o) / (f + o)
            np.testing.assert_allclose(mass, ref["mass"], atol=2e-5)
            np.testing.assert_allclose(contrast, ref["contrast"], atol=1e-4)


def test_transformer_lens_conventions(tiny):
    """Our prev/duplicate/induction equal TransformerLens' head_detector scores on the same
    attention pattern, with and without its exclusion options."""
    from transformer_lens.head_detector import (
        compute_head_attention_similarity_score,
        get_duplicate_token_head_detection_pattern,
        get_induction_head_detection_pattern,
        get_previous_token_head_detection_pattern,
    )

    ids = repeated_random(token_pool(tiny.tokenizer), n_seqs=1, length=12, bos_id=1, seed=5)[0]
    ids[5] = ids[4]  # an immediate repeat: the induction pattern then includes j = t
    attn = _dense_attention(tiny, ids)
    detectors = {
        "tl_prev": get_previous_token_head_detection_pattern,
        "tl_dup": get_duplicate_token_head_detection_pattern,
        "tl_ind": get_induction_head_detection_pattern,
    }
    for ex_bos, ex_cur in [(False, False), (True, False), (False, True), (True, True)]:
        cfg = NgramConfig(exclude_bos=ex_bos, exclude_current_token=ex_cur)
        (rec,) = score_sequences(tiny, [ids], cfg)
        for key, det in detectors.items():
            pattern = det(ids[None])
            for layer in range(tiny.n_layers):
                for head in range(tiny.n_heads):
                    want = compute_head_attention_similarity_score(
                        attn[layer][head].float(),
                        pattern,
                        exclude_bos=ex_bos,
                        exclude_current_token=ex_cur,
                        error_measure="mul",
                    )
                    assert getattr(rec, key)[layer, head] == pytest.approx(want, abs=2e-5)


@pytest.fixture(scope="module")
def planted_model():
    """A tiny Llama (no GQA, head_dim 64) whose heads we overwrite with static n-gram heads."""
    return tiny_llama(n_layers=2, n_heads=4, n_kv_heads=4, d_model=256, seed=1)


PLANTED = {(0, 0): 1, (0, 1): 2, (0, 2): 3, (1, 3): 2}


def test_planted_heads_compute_the_static_pattern(planted_model):
    pool = token_pool(planted_model.tokenizer)[:16]
    ids = planted_kgrams(pool, n_seqs=1, length=150, k_max=4, bos_id=1, seed=2)[0]
    with plant_static_ngram_heads(planted_model, PLANTED, pool):
        attn = _dense_attention(planted_model, ids)
    for (layer, head), k in PLANTED.items():
        want = static_ngram_pattern(ids, k).double()
        got = attn[layer][head]
        rows = want.sum(1) > 0
        assert rows.sum() > 10
        torch.testing.assert_close(got[rows], want[rows], atol=1e-6, rtol=0)
        # Rows with no match put their mass on key 0 (softmax stand-in for a zero row).
        assert got[~rows, 0].min() > 1 - 1e-6


def test_planted_static_heads_get_their_order(planted_model):
    pool = token_pool(planted_model.tokenizer)[:16]
    seqs = planted_kgrams(pool, n_seqs=6, length=200, k_max=4, bos_id=1, seed=0)
    with plant_static_ngram_heads(planted_model, PLANTED, pool):
        scores = score_ngrams(planted_model, {"planted": seqs}, NgramConfig(k_max=4))
    table = order_table(scores, "planted", min_order=0).set_index(["layer", "head"])
    for (layer, head), k in PLANTED.items():
        row = table.loc[(layer, head)]
        assert row["order"] == k, (layer, head, row.to_dict())
        assert row["contrast"] > 0.99 and row["mass"] > 0.99
        assert abs(row["next_contrast"]) < 0.05  # no preference one order up
    for layer in range(2):
        for head in range(4):
            if (layer, head) not in PLANTED:
                assert table.loc[(layer, head), "order"] == 0
    contrast = {k: scores.matrix("kgram_contrast", source="planted", order=k) for k in range(1, 5)}
    # The 2-gram head prefers full 2-gram matches over 1-gram-only ones; the 1-gram
    # (induction) head does not.
    assert contrast[2][0, 1] > 0.99 and abs(contrast[2][0, 0]) < 0.05


def test_static_induction_head_on_repeated_random_tokens(planted_model):
    """A static 1-gram head attends to the token after the earlier occurrence: TransformerLens'
    induction score is (second-half rows) / (all rows), or 1 with key 0 excluded."""
    pool = token_pool(planted_model.tokenizer)[:60]
    seqs = repeated_random(pool, n_seqs=3, length=20, repeats=2, bos_id=1, seed=0)
    with plant_static_ngram_heads(planted_model, {(0, 0): 1}, pool):
        plain = score_ngrams(planted_model, {"random": seqs})
        no_bos = score_ngrams(planted_model, {"random": seqs}, NgramConfig(exclude_bos=True))
    assert plain.matrix("induction", source="random")[0, 0] == pytest.approx(20 / 41, abs=1e-5)
    assert no_bos.matrix("induction", source="random")[0, 0] == pytest.approx(1.0, abs=1e-5)
    # Only row 1 (whose key 0 is its previous token) scores as previous-token attention.
    assert plain.matrix("prev_token", source="random")[0, 0] == pytest.approx(1 / 41, abs=1e-5)


def test_bad_input_is_a_headhunt_error(tiny):
    with pytest.raises(HeadhuntError, match="k must be in"):
        NgramConfig(k_max=9)
    no_repeat = [torch.arange(10, 30)]
    recs = score_sequences(tiny, no_repeat)
    with pytest.raises(HeadhuntError, match="too short"):
        summarize(recs, NgramConfig())
    with pytest.raises(HeadhuntError, match="longer than the model's context"):
        score_sequences(tiny, [torch.zeros(tiny.max_context + 1, dtype=torch.long)])
    with pytest.raises(HeadhuntError, match="distinct tokens"):
        repeated_random(np.arange(5), length=10)


def test_natural_chunks_and_inputs_shapes(tiny):
    text = "the secret code of the vault is blue . " * 20
    chunks = natural_chunks(tiny.tokenizer, [text], n_tokens=32, n_chunks=3, bos_id=1)
    assert len(chunks) == 3 and all(len(c) == 33 and c[0] == 1 for c in chunks)
    x = planted_kgrams(np.arange(10, 30), n_seqs=4, length=120, k_max=3).numpy()
    assert x.shape == (4, 120) and not (x[:, 1:] == x[:, :-1]).any()


@pytest.mark.slow
def test_embedded_model_has_induction_and_previous_token_heads(smol):
    pool = token_pool(smol.tokenizer)
    seqs = repeated_random(pool, n_seqs=2, length=50, bos_id=smol.tokenizer.bos_token_id)
    scores = score_ngrams(smol, {"random": seqs})
    ind = scores.top("induction", 3, source="random")
    prev = scores.top("prev_token", 3, source="random")
    # Pretrained LMs have strong induction and previous-token heads (max possible "mul"
    # induction score here: 50 of 101 rows).
    assert ind["value"].iloc[0] > 0.3
    assert prev["value"].iloc[0] > 0.5
