"""The training pieces of the Zoology benchmark (heads/mqar_train.py): a mixed MQAR pool pads
queries without changing the task, the query-only loss equals the cross-entropy of the full
logits at the labelled positions, and the query-only accuracy equals headhunt's MQAR accuracy
(run_mqar), on the planted model trained on MQAR (tests/fixtures/mqar)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.heads.mqar import MQARSpec, generate_mqar, run_mqar
from headhunt.heads.mqar_train import (
    load_mqar_model,
    mqar_pool,
    query_accuracy,
    query_loss,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "mqar"


@pytest.fixture(scope="module")
def trained():
    if not (FIXTURE / "model.safetensors").is_file():
        pytest.skip("the planted MQAR model is built by tests/heads/test_mqar.py")
    return load_mqar_model(FIXTURE)


def _probes(cfg, pairs, n=8, seed=0):
    return [
        generate_mqar(
            MQARSpec(vocab_size=cfg.vocab_size, seq_len=cfg.seq_len, n_pairs=p, shared_vocab=True),
            n,
            seed=seed + p,
        )
        for p in pairs
    ]


def test_pool_pads_queries_and_keeps_every_example(trained):
    _model, cfg, _ = trained
    probes = _probes(cfg, (2, 8))
    pool = mqar_pool(probes)
    assert len(pool) == 16 and pool.query_pos.shape == (16, 8)
    assert pool.n_pairs.tolist() == [2] * 8 + [8] * 8
    assert (pool.target[:8, 2:] == -100).all() and (pool.query_pos[:8, 2:] == 0).all()
    assert torch.equal(pool.target[8:], probes[1].target)
    assert torch.equal(pool.ids[:8], probes[0].ids)
    other = generate_mqar(MQARSpec(vocab_size=cfg.vocab_size, seq_len=32, n_pairs=2), 2)
    with pytest.raises(HeadhuntError, match="one sequence length"):
        mqar_pool([probes[0], other])


def test_query_loss_and_accuracy_match_full_logits_and_run_mqar(trained):
    model, cfg, _ = trained
    probes = _probes(cfg, (2, 8), seed=77)
    pool = mqar_pool(probes)
    ids, qpos, target = pool.batch(torch.randperm(len(pool)))
    hf = model.model
    with torch.no_grad():
        loss = query_loss(hf, ids, qpos, target)
        logits = hf(input_ids=ids).logits
    labelled = target != -100
    rows = torch.arange(len(ids))[:, None].expand_as(qpos)
    ref = torch.nn.functional.cross_entropy(
        logits[rows[labelled], qpos[labelled]], target[labelled]
    )
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    assert loss < 0.5  # the trained model recalls: a pool that broke the task would not

    probe = _probes(cfg, (8,), n=64, seed=5)[0]
    assert query_accuracy(hf, probe, batch_size=16) == pytest.approx(
        run_mqar(model, probe, batch_size=16).accuracy
    )
