"""Sink analysis: planted sinks must be found, the last-keys pitfall must not fire."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.heads.sinks import SinksConfig, TextSinks, analyze_text, plot, summarize
from headhunt.probes.attention import AttentionHook

TEXT = (
    "the secret code of the vault is blue . remember the code and read the answer . "
    "a river runs by the garden gate in the city park on a sunny day . what is the "
    "best thing to do ? read the words and remember the magic number of the lamp . "
    "the bread is on the table , the key is in the garden , and the question was "
    "which value is red or green ."
)


class PlantSink(AttentionHook):
    """Forces query head ``head`` of ``layer`` to put (almost) all its attention on key ``pos``
    for every query that can see it: its query and that key both become c * e_0."""

    def __init__(self, layer: int, head: int, pos: int, c: float = 8.0):
        self.layer, self.head, self.pos, self.c = layer, head, pos, c

    def before(self, call):
        if call.layer != self.layer:
            return
        group = call.query.shape[1] // call.key.shape[1]
        q, k = call.query.clone(), call.key.clone()
        q[:, self.head] = 0
        q[:, self.head, :, 0] = self.c
        k[:, self.head // group, self.pos] = 0
        k[:, self.head // group, self.pos, 0] = self.c
        call.query, call.key = q, k


@pytest.fixture(scope="module")
def ids(tiny):
    return tiny.encode(TEXT)


def test_planted_hidden_and_first_token_sinks_are_found(tiny, ids):
    cfg = SinksConfig(min_queries=8, eps_tokens=32)
    assert len(ids) > 60
    with tiny.hooks(PlantSink(1, 2, 10), PlantSink(0, 1, 0)):
        text = analyze_text(tiny, ids, cfg)
    res = summarize([text], tiny, cfg)
    planted = res.sinks[(res.sinks.layer == 1) & (res.sinks["head"] == 2)]
    assert 10 in planted.position.tolist()
    row = planted[planted.position == 10].iloc[0]
    assert row.s > 0.9 and row.queries == len(ids) - 10
    assert row.token == tiny.tokenizer.decode([int(ids[10])])
    top = res.scores.top("hidden_sink_mass", 1).iloc[0]
    assert (top["layer"], top["head"]) == (1, 2) and top.value > 0.8
    # The planted first-token sink: s_0 ~ 1 in head (0, 1), so Sink_eps of layer 0 >= 1/4.
    assert res.scores.matrix("first_sink_mass")[0, 1] > 0.9
    assert res.layers.loc[0, "sink_eps"] >= 0.25
    assert res.tokens.iloc[0].sink_calls >= 1

    # Without the plant, key 10 is no sink of that head: the finding is the plant's.
    plain = summarize([analyze_text(tiny, ids, cfg)], tiny, cfg)
    s = plain.sinks
    assert 10 not in s[(s.layer == 1) & (s["head"] == 2)].position.tolist()
    assert plain.scores.matrix("first_sink_mass")[0, 1] < 0.9


class PlantPreviousToken(AttentionHook):
    """Makes query head ``head`` of ``layer`` a previous-token head: q_i . k_j peaks at j = i - 1
    (a 2-d rotation code with a large query norm)."""

    def __init__(self, layer: int, head: int):
        self.layer, self.head = layer, head

    def before(self, call):
        if call.layer != self.layer:
            return
        group = call.query.shape[1] // call.key.shape[1]
        n = call.key.shape[2]
        theta = torch.pi / n * torch.arange(n + 1, dtype=torch.float32)
        q, k = call.query.clone(), call.key.clone()
        q[:, self.head] = 0
        q[:, self.head, :, 0], q[:, self.head, :, 1] = theta[:-1].cos(), theta[:-1].sin()
        q[:, self.head] *= 4e4
        k[:, self.head // group] = 0
        k[:, self.head // group, :, 0], k[:, self.head // group, :, 1] = (
            theta[1:].cos(),
            theta[1:].sin(),
        )
        call.query, call.key = q, k


def test_min_queries_rule_stops_the_last_keys_from_passing(tiny, ids):
    # A previous-token head gives key j a mean received attention of ~1 / (n - j): the last
    # keys pass tau = 0.1 without being sinks (the pitfall of the 1 / (N - j) normalisation).
    n = len(ids)
    with tiny.hooks(PlantPreviousToken(1, 1)):
        loose_cfg = SinksConfig(min_queries=1, min_query_share=0.0)
        loose = summarize([analyze_text(tiny, ids, loose_cfg)], tiny)
        strict = summarize([analyze_text(tiny, ids, SinksConfig(min_queries=16))], tiny)
        shared = summarize([analyze_text(tiny, ids, SinksConfig(min_queries=1))], tiny)
    s = loose.sinks[(loose.sinks.layer == 1) & (loose.sinks["head"] == 1)]
    assert sorted(s.position) == list(range(n - 9, n - 1))  # the pitfall is real
    s = strict.sinks[(strict.sinks.layer == 1) & (strict.sinks["head"] == 1)]
    assert len(s) == 0
    assert (strict.sinks.position <= n - 16).all()
    # The share rule alone (10% of n: 8 queries) keeps only the keys seen by 8 or 9 queries.
    need = SinksConfig(min_queries=1).min_count(n)
    assert need == 8
    s = shared.sinks[(shared.sinks.layer == 1) & (shared.sinks["head"] == 1)]
    assert sorted(s.position) == list(range(n - 9, n - need + 1))
    assert SinksConfig().min_count(1024) == 103 and SinksConfig().min_count(100) == 32


def test_record_round_trip_plot_and_bad_input(tiny, ids, tmp_path: Path):
    text = analyze_text(tiny, ids[:40], SinksConfig(min_queries=4), index=3)
    back = TextSinks.from_dict(text.to_dict())
    assert back == text and back.text == 3
    assert len(text.massive) == tiny.n_layers and len(text.massive[0]) == 3 + 3
    res = summarize([back, back], tiny, SinksConfig(min_queries=4))
    assert set(res.scores.metrics) >= {"first_sink_mass", "hidden_sink_mass", "sink_eps"}
    fig = plot(res)
    assert len(fig.data) == 4 and fig.data[0].z.shape == (tiny.n_layers, tiny.n_heads)
    with pytest.raises(HeadhuntError, match="context"):
        analyze_text(tiny, torch.zeros(tiny.max_context + 1, dtype=torch.long))
    with pytest.raises(HeadhuntError, match="tau"):
        SinksConfig(tau=1.5)


@pytest.mark.slow
def test_embedded_model_first_token_and_hidden_sinks(smol):
    essay = (Path(__file__).parents[2] / "heads/data/haystack/a01.txt").read_text()
    ids = smol.encode(essay)[:160]
    cfg = SinksConfig()
    res = summarize([analyze_text(smol, ids, cfg)], smol, cfg)
    # The first token is a sink in most heads; hidden sinks exist but are rarer.
    assert res.summary["first_sink_share_of_heads"] > 0.5
    assert 0 < res.summary["heads_with_hidden_sinks"] < res.summary["first_sink_share_of_heads"]
    assert (res.sinks.position <= len(ids) - cfg.min_count(len(ids))).all()
    assert res.summary["massive_ratio_max"] > 100  # Sun et al.: values 1000s x the median
