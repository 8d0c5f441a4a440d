"""headhunt.inspect: the helpers behind the dashboard and notebooks, against references."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from run_fixtures import PLANTED, make_runs, ngram_run, retrieval_run

from headhunt import inspect as hi
from headhunt.errors import HeadhuntError
from headhunt.heads.interventions.masking import HeadMask
from headhunt.heads.retrieval import stop_token_ids
from headhunt.probes.capture import greedy_decode
from headhunt.probes.tiny import tiny_llama
from headhunt.rundir import load_run

TEXT = "the secret code of the vault is blue . remember the code and read the answer"


@pytest.fixture(scope="module")
def eager():
    """The tiny model on the eager kernel, whose HF output_attentions is the reference."""
    return tiny_llama(attn_implementation="eager", seed=3)


def test_head_attention_matches_the_models_own_attention_weights(eager):
    ids = eager.encode(TEXT)
    ref = eager.model(input_ids=ids[None], output_attentions=True).attentions
    for layer, head in [(0, 0), (1, 3), (1, 1)]:
        att = hi.head_attention(eager, TEXT, layer, head)
        want = ref[layer][0, head].detach().numpy()
        np.testing.assert_allclose(att.probs, want, atol=1e-5)
        assert att.ids == ids.tolist() and len(att.tokens) == len(ids)
        np.testing.assert_allclose(att.row(4)[5:], 0)  # causal
    with pytest.raises(HeadhuntError, match="outside the model"):
        hi.head_attention(eager, TEXT, 2, 0)
    with pytest.raises(HeadhuntError, match="keep it under"):
        hi.head_attention(eager, TEXT, 0, 0, max_tokens=5)


def test_sink_marks_follow_the_sinks_analyzer(eager):
    from headhunt.heads.sinks import SinksConfig, analyze_text

    ids = eager.encode(TEXT * 6)  # long enough that the analyzer's own min_queries applies
    marks = hi.sink_marks(eager, ids.tolist(), 1, 2)
    ref = analyze_text(eager, ids, SinksConfig())
    assert marks.min_queries == 32
    assert marks.first_sink_mass == pytest.approx(ref.s0[1][2])
    assert marks.positions == sorted(int(p) for la, h, p, *_ in ref.sinks if (la, h) == (1, 2))
    short = hi.sink_marks(eager, eager.encode(TEXT).tolist(), 1, 2)
    assert short.min_queries == len(eager.encode(TEXT)) // 2


def test_shaded_tokens_escape_and_mark():
    page = hi.shade_tokens_html(["<s>", "a&b", "\n"], [0.5, 1.0, 0.0], query=2, sinks=[1])
    assert "&lt;s&gt;" in page and "a&amp;b" in page and "<script" not in page
    spans = page.split("<span")[1:]
    assert "rgba(255, 120, 0, 0.500)" in spans[0] and "rgba(255, 120, 0, 1.000)" in spans[1]
    assert "border-bottom" in spans[1] and "border-bottom" not in spans[0]
    assert "outline" in spans[2]


def test_answers_equal_greedy_decoding_under_the_same_hooks(tiny):
    trial = hi.needle_trial(tiny, length=100, depth=25, needle="magic", seed=1)
    assert len(trial.input_ids) == 100
    heads = [(0, 1), (1, 0), (1, 3)]
    stop = stop_token_ids(tiny.tokenizer)
    for how, hooks in (("none", ()), ("mask", (HeadMask(heads, "output"),))):
        got = hi.answer_needle(
            tiny,
            trial,
            heads=heads if how != "none" else (),
            how=how,
            mask_mode="output",
            max_new_tokens=6,
        )
        dec = greedy_decode(
            tiny, torch.tensor([trial.input_ids]), max_new_tokens=6, stop_ids=stop, hooks=hooks
        )
        ids = [x for x in dec.tokens[0, : int(dec.lengths[0])].tolist() if x not in stop]
        assert got.text == tiny.tokenizer.decode(ids, skip_special_tokens=True)
    # Masking every head's output changes the answer; ACT with beta = 1 changes nothing.
    every = [(la, h) for la in range(tiny.n_layers) for h in range(tiny.n_heads)]
    before, masked = hi.compare_answers(tiny, trial, every, "mask", mask_mode="output")
    assert masked.text != before.text and masked.heads == every
    _, same = hi.compare_answers(tiny, trial, every, "act", act_beta=1.0)
    assert same.text == before.text
    with pytest.raises(HeadhuntError, match="at least one head"):
        hi.answer_needle(tiny, trial, how="mask")
    with pytest.raises(HeadhuntError, match="needs 64 to 480 tokens"):
        hi.needle_trial(tiny, length=500)  # the tiny model's context is 512


def test_scan_runs_reports_each_broken_folder(tmp_path):
    make_runs(tmp_path, "tiny")
    (tmp_path / "lost-manifest").mkdir()
    (tmp_path / "ngram-tiny" / "scores.parquet").rename(tmp_path / "lost-manifest/scores.parquet")
    entries = {e.name: e for e in hi.scan_runs(tmp_path)}
    assert {n for n, e in entries.items() if e.ok} == {
        "retrieval-tiny",
        "sinks-tiny",
        "circuits-tiny",
    }
    assert "files missing from this run: scores.parquet" in entries["ngram-tiny"].problem
    assert "is corrupt" in entries["corrupt-manifest"].problem
    assert "unreadable" in entries["bad-scores"].problem
    assert "--resume" in entries["half-done.partial"].problem
    assert "no manifest.json" in entries["lost-manifest"].problem
    assert hi.scan_runs(tmp_path / "nowhere") == []
    table = hi.run_table(list(entries.values()))
    assert list(table["status"]).count("ok") == 3
    with pytest.raises(HeadhuntError, match="cannot be read"):
        hi.read_scores(entries["bad-scores"].run)


def test_views_ranks_and_spread_read_back_what_was_written(tmp_path):
    run = load_run(ngram_run(tmp_path / "ng", "tiny"))
    scores = hi.read_scores(run)
    labels = [v.label for v in hi.metric_views(scores)]
    assert "induction [source=random]" in labels
    assert "kgram_contrast [source=natural, order=2]" in labels
    view = hi.metric_views(scores)[labels.index("kgram_contrast [source=natural, order=2]")]
    m = hi.view_matrix(scores, view)
    assert m.shape == (2, 4) and m[PLANTED] == pytest.approx(0.45)
    assert tuple(hi.top_heads(scores, view, 1).loc[0, ["layer", "head"]]) == PLANTED
    table = hi.head_table(scores, *PLANTED)
    ranked = table[~table["metric"].isin(["kgram_queries", "kgram_only_mass"])]
    assert (ranked["rank"] == 1).all() and (ranked["of"] == 8).all()
    # A count shared by every head ranks none; a view without values counts no head.
    assert table[table["metric"] == "kgram_queries"]["rank"].isna().all()
    assert (table[table["metric"] == "kgram_only_mass"]["of"] == 0).all()
    spread = hi.head_spread(run, *PLANTED)
    assert len(spread) == 2 * 2 * 3  # sources x sequences x metrics
    induction = spread[spread.metric == "induction"]
    assert dict(zip(induction["source"], induction["value"], strict=True)) == pytest.approx(
        {"random": 0.7, "natural": 0.8}
    )

    rrun = load_run(retrieval_run(tmp_path / "rt", "tiny"))
    trials = hi.needle_trials(rrun, 0, 3)
    records = [json.loads(x) for x in (rrun.path / "trials.jsonl").read_text().splitlines()]
    assert list(trials["score"]) == [r["scores"][0][3] for r in records]
    assert list(trials["depth %"]) == [0, 50, 100]
    df, rho = hi.compare_runs(
        hi.read_scores(rrun), hi.read_scores(rrun), hi.MetricView("retrieval_score")
    )
    assert rho == pytest.approx(1.0) and len(df) == 8
