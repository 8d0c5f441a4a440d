"""MQAR: the generator follows Zoology's layout, renderings keep their positions, recall-head
scores equal a dense reference, and in a tiny attention-only model trained on MQAR the analyzers
find the previous-token and induction heads that carry recall (confirmed by masking)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.heads.evaluations.causal import random_head_sets
from headhunt.heads.inputs.ngram_inputs import repeated_random, token_pool
from headhunt.heads.mqar import (
    MQARSpec,
    WordPools,
    generate_mqar,
    insert_gap,
    masking_check,
    masking_curve,
    render_mqar,
    run_mqar,
    score_recall_heads,
)
from headhunt.heads.ngram import score_ngrams
from headhunt.probes.capture import capture_qk

FIXTURE = Path(__file__).parents[1] / "fixtures" / "mqar"


def test_generator_follows_zoology_layout():
    spec = MQARSpec(vocab_size=64, seq_len=48, n_pairs=6, random_non_queries=False)
    pr = generate_mqar(spec, 50, seed=1)
    N, half = 6, 32
    for b in range(50):
        x, lab = pr.ids[b], pr.labels[b]
        keys, values = x[0 : 2 * N : 2], x[1 : 2 * N : 2]
        assert len(set(keys.tolist())) == N and ((keys >= 1) & (keys < half)).all()
        assert len(set(values.tolist())) == N and ((values >= half) & (values < 64)).all()
        q = pr.query_pos[b]
        assert ((q - 2 * N) % 2 == 0).all() and (q >= 2 * N).all() and (q < 48).all()
        assert torch.equal(x[q], keys) and torch.equal(lab[q], values)
        assert torch.equal(x[pr.key_pos[b]], keys) and torch.equal(x[pr.value_pos[b]], values)
        assert torch.equal(pr.target[b], values)
        rest = torch.ones(48, dtype=torch.bool)
        rest[: 2 * N] = False
        rest[q] = False
        assert (x[rest] == 0).all() and (lab[rest] == -100).all()
    # Filler is replaced by random tokens of the whole vocabulary.
    noisy = generate_mqar(MQARSpec(vocab_size=64, seq_len=48, n_pairs=6), 50, seed=1)
    assert torch.equal(noisy.labels, pr.labels)
    assert (noisy.ids[:, 2 * N :] != 0).float().mean() > 0.9


def test_query_gaps_follow_the_power_law():
    """p(g) ~ a (g+1)^(a-1) with a = 0.01 favours short gaps (about 1/(g+1))."""
    spec = MQARSpec(vocab_size=512, seq_len=128, n_pairs=1)
    pr = generate_mqar(spec, 4000, seed=0)
    g = ((pr.query_pos[:, 0] - 2) // 2).numpy()
    counts = np.bincount(g, minlength=63)
    p = 0.01 * np.arange(1, 64) ** (0.01 - 1)
    p /= p.sum()
    expected = 4000 * p
    assert abs(counts[0] - expected[0]) < 4 * np.sqrt(expected[0])
    assert counts[:4].sum() > 0.4 * 4000 and counts[0] > 2 * counts[3]


def test_bad_specs_are_headhunt_errors():
    with pytest.raises(HeadhuntError, match="need seq_len"):
        MQARSpec(seq_len=16, n_pairs=8)
    with pytest.raises(HeadhuntError, match="even"):
        MQARSpec(seq_len=65)
    with pytest.raises(HeadhuntError, match="distinct keys"):
        MQARSpec(vocab_size=8, seq_len=64, n_pairs=8)
    with pytest.raises(HeadhuntError, match="cannot draw"):
        random_head_sets(2, 2, 4, 1, exclude=[(0, 0)])


def _pools(tok) -> WordPools:
    words = [w for w in tok.get_vocab() if w.isalpha() and w not in ("unk",)]
    ids = sorted(tok.convert_tokens_to_ids(words))
    return WordPools(keys=ids[:12], values=ids[12:25], filler=ids[25:45])


@pytest.mark.parametrize("layout", ["kv", "zoology"])
def test_renderings_keep_the_positions(tiny, layout):
    tok = tiny.tokenizer
    pools = _pools(tok)
    colon, comma = tok.convert_tokens_to_ids([":", ","])
    spec = MQARSpec(seq_len=24, n_pairs=4)
    pr = render_mqar(spec, pools, 6, tokenizer=tok, layout=layout, prefix_gap=5, bos_id=1, seed=2)
    assert (pr.ids[:, 0] == 1).all()
    for b in range(6):
        x = pr.ids[b]
        keys, values, q = x[pr.key_pos[b]], x[pr.value_pos[b]], pr.query_pos[b]
        assert set(keys.tolist()) <= set(pools.keys) and torch.equal(values, pr.target[b])
        assert set(values.tolist()) <= set(pools.values)
        assert (pr.labels[b, q] == pr.target[b]).all() and (pr.labels[b] >= 0).sum() == 4
        if layout == "kv":
            assert (x[pr.key_pos[b] + 1] == colon).all() and (x[q] == colon).all()
            assert torch.equal(x[q - 1], keys) and torch.equal(x[q + 1], values)
            assert (x[q + 2] == comma).all()
        else:
            assert torch.equal(x[q], keys) and torch.equal(pr.value_pos[b], pr.key_pos[b] + 1)
        assert (q > int(pr.value_pos[b].max()) + 5).all()  # the prefix gap sits in between
    with pytest.raises(HeadhuntError, match="layout"):
        render_mqar(spec, pools, 2, tokenizer=tok, layout="nope")


def test_recall_scores_equal_dense_attention(tiny):
    pools = _pools(tiny.tokenizer)
    pr = render_mqar(MQARSpec(seq_len=24, n_pairs=4), pools, 3, tokenizer=tiny.tokenizer, seed=0)
    scores, _ = score_recall_heads(tiny, pr, batch_size=2)
    want = np.zeros((3, tiny.n_layers, tiny.n_heads))
    for b in range(3):
        n = pr.ids.shape[1]
        for layer, (q, k) in capture_qk(tiny, pr.ids[b : b + 1]).items():
            k = k.repeat_interleave(tiny.group_size, 1)
            s = (q @ k.transpose(-1, -2))[0] * tiny.head_dim**-0.5
            s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), -torch.inf)
            A = s.softmax(-1)
            for i, (qi, ki) in enumerate(
                [
                    (pr.query_pos[b], pr.value_pos[b]),
                    (pr.query_pos[b], pr.key_pos[b]),
                    (pr.value_pos[b], pr.key_pos[b]),
                ]
            ):
                want[i, layer] += A[:, qi, ki].sum(-1).numpy()
    want /= pr.query_pos.numel()
    for i, name in enumerate(["query_to_value", "query_to_key", "value_to_key"]):
        np.testing.assert_allclose(scores.matrix(name), want[i], atol=1e-5)


def _trained_model():
    from headhunt.heads.mqar_train import (
        MQARTrainConfig,
        load_mqar_model,
        save_mqar_model,
        train_mqar_model,
    )

    if not (FIXTURE / "model.safetensors").is_file():  # retrain (minutes on a CPU)
        cfg = MQARTrainConfig()
        model, log = train_mqar_model(cfg)
        save_mqar_model(model, cfg, FIXTURE, log=log)
    return load_mqar_model(FIXTURE)


@pytest.fixture(scope="module")
def trained():
    return _trained_model()


def test_trained_model_recall_is_carried_by_previous_token_and_induction_heads(trained):
    """Ground truth (heads/mqar_train.py): layer 0 = two previous-token heads, layer 1 = two
    induction heads, layer 2 not needed for recall. The analyzers must find exactly the first
    four, and masking must confirm them against the heads they do not flag."""
    model, cfg, _meta = trained
    probe = generate_mqar(cfg.spec(), 256, seed=12345)  # held out: training seeds differ
    assert run_mqar(model, probe, batch_size=128).accuracy > 0.95

    # Previous-token heads from the n-gram analyzer (20 random tokens repeated twice); the
    # heads that read the queried key's value from the recall analyzer.
    pool = token_pool(model.tokenizer, cfg.vocab_size)
    seqs = repeated_random(pool, n_seqs=8, length=20, bos_id=None, seed=3)
    ngram = score_ngrams(model, {"random": seqs})
    recall, _ = score_recall_heads(model, probe, batch_size=128)
    prev = ngram.heads("prev_token", 0.2, source="random")
    induction = recall.heads("query_to_value", 0.3)
    assert sorted(prev) == [(0, 0), (0, 1)]
    assert sorted(induction) == [(1, 0), (1, 1)]
    ind = ngram.matrix("induction", source="random")
    assert all(ind[h] > 0.15 for h in induction)  # TransformerLens' score agrees
    assert all(ind[h] < 0.05 for h in prev)
    assert all(recall.matrix("value_to_key")[h] > 0.3 for h in prev)

    flagged = [*prev, *induction]
    for found in (induction, prev):
        check = masking_check(
            model, probe, found, n_random=1, batch_size=128, exclude=flagged, seed=0
        )
        assert check["masked"] < 0.3  # recall collapses without them ...
        assert check["random_mean"] > 0.95  # ... not without as many unflagged heads
    everything = masking_check(model, probe, flagged, n_random=0, batch_size=128)
    assert everything["masked"] < 0.1


def test_masking_curve_on_planted_heads(trained):
    """Ground truth as above: ranked by query -> value attention, the top two are the induction
    heads, and masking them collapses recall where two random heads of the six mostly do not;
    all six masked is the curve's end for both. Sets are exhaustive where few, distinct else."""
    model, cfg, _meta = trained
    probe = generate_mqar(cfg.spec(), 64, seed=12345)
    recall, _ = score_recall_heads(model, probe, batch_size=64)
    ranked = [(int(r.layer), int(r.head)) for r in recall.top("query_to_value", 6).itertuples()]
    assert sorted(ranked[:2]) == [(1, 0), (1, 1)]
    curve = masking_curve(model, probe, ranked, [1, 2, 6], n_random=10, batch_size=64)
    assert curve["baseline"] > 0.95 and curve["n_heads"] == 6
    assert curve["exhaustive"] == [True, False, True]  # 6 singles, 15 pairs > 10, 1 six-set
    assert len(curve["random_sets"][0]) == 6 and curve["random_se"][0] == 0.0
    pairs = curve["random_sets"][1]
    assert len(pairs) == 10 == len({tuple(map(tuple, p)) for p in pairs})
    assert curve["top"][1] < 0.3 < curve["random_mean"][1]
    check = masking_check(model, probe, ranked[:2], n_random=0, batch_size=64)
    assert curve["top"][1] == check["masked"]  # the same masking as the one-shot check
    assert curve["top"][2] == curve["random"][2][0] < 0.1
    with pytest.raises(HeadhuntError, match="each k"):
        masking_curve(model, probe, ranked, [7])


def test_masking_curve_draws_from_both_attention_layers_of_a_hybrid():
    """Planted: LFM2 conv, attention, conv, attention (Zoology's hybrid at four layers), every
    attention head's output projection zeroed but (1, 2) and (3, 0)'s, scaled up; the probe's
    targets are the model's own predictions (accuracy 1). Masking any other heads changes
    nothing, so the curve's random sets come from both attention layers and the top pair, one
    head of each layer, is the only pair that leaves less than the rest."""
    import dataclasses

    from headhunt.heads.mqar_train import mqar_tokenizer
    from headhunt.probes.hooked import HookedModel
    from headhunt.probes.tiny import tiny_causal_lm

    kinds = ["conv", "full_attention", "conv", "full_attention"]
    hf = tiny_causal_lm(
        "lfm2", vocab_size=64, num_hidden_layers=4, layer_types=kinds, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=128,
    )  # fmt: skip
    model = HookedModel(model=hf, tokenizer=mqar_tokenizer(64), name="tiny-lfm2-hybrid2")
    assert model.attention_layers == [1, 3]
    live = [(3, 0), (1, 2)]
    d = model.head_dim
    with torch.no_grad():
        for layer in (1, 3):
            o = hf.model.layers[layer].self_attn.out_proj.weight
            keep = {h for la, h in live if la == layer}
            for h in range(4):
                o[:, h * d : (h + 1) * d] *= 20.0 if h in keep else 0.0
    probe = generate_mqar(MQARSpec(vocab_size=64, seq_len=48, n_pairs=6), 16, seed=0)
    logits = model.forward(probe.ids, use_cache=False).logits
    rows = torch.arange(len(probe))[:, None]
    probe = dataclasses.replace(probe, target=logits[rows, probe.query_pos].argmax(-1))
    others = [(la, h) for la in (1, 3) for h in range(4) if (la, h) not in live]
    ranked = live + others
    curve = masking_curve(model, probe, ranked, [1, 2, 8], n_random=12, batch_size=16)
    assert curve["baseline"] == 1.0 and curve["n_heads"] == 8
    singles = curve["random_sets"][0]
    assert {la for s in singles for la, _ in s} == {1, 3} and curve["exhaustive"][0]
    for sets, accs in zip(curve["random_sets"][:2], curve["random"][:2], strict=True):
        for heads, acc in zip(sets, accs, strict=True):
            if not {tuple(h) for h in heads} & set(live):
                assert acc == 1.0  # dead heads masked: the model is unchanged
    assert curve["top_sets"][1] == sorted(live)
    assert curve["top"][1] < 0.5 < curve["random_mean"][1]
    with pytest.raises(HeadhuntError, match="attention heads"):
        masking_curve(model, probe, [(0, 0), *ranked[1:]], [1])


def test_insert_gap_shifts_queries():
    pr = generate_mqar(MQARSpec(vocab_size=64, seq_len=32, n_pairs=4), 3, seed=0)
    gapped = insert_gap(pr, 10, 64, seed=1)
    assert gapped.ids.shape[1] == 42
    assert torch.equal(gapped.ids[:, :8], pr.ids[:, :8])
    assert torch.equal(gapped.query_pos, pr.query_pos + 10)
    rows = torch.arange(3)[:, None]
    assert torch.equal(gapped.ids[rows, gapped.query_pos], pr.ids[rows, pr.query_pos])


@pytest.mark.slow
def test_embedded_model_recalls_kv_pairs_and_has_recall_heads(smol):
    from headhunt.heads.mqar import word_pools

    pools = word_pools(smol.tokenizer)
    pr = render_mqar(
        MQARSpec(seq_len=32, n_pairs=4),
        pools,
        4,
        tokenizer=smol.tokenizer,
        layout="kv",
        bos_id=smol.tokenizer.bos_token_id,
        seed=0,
    )
    scores, res = score_recall_heads(smol, pr, batch_size=4)
    assert res.accuracy_pool > 0.3  # far above chance (1 in 257 values)
    assert scores.top("query_to_value", 1)["value"].iloc[0] > 0.3
