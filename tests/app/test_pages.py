"""Every dashboard page through streamlit's AppTest, on fixture run directories (conftest.py):
valid retrieval / sinks / n-gram / circuits runs on the tiny model, a corrupt manifest, an
unreadable scores file, an unfinished run, and an empty runs folder."""

from __future__ import annotations

import json
import time

import pytest
from run_fixtures import PLANTED
from streamlit.testing.v1 import AppTest

from headhunt import inspect as hi
from headhunt.app import views

APP = str(__import__("headhunt.app", fromlist=["x"]).__path__[0] + "/main.py")


def start(monkeypatch, root, **query) -> AppTest:
    monkeypatch.setenv("HEADHUNT_RUNS", str(root))
    at = AppTest.from_file(APP, default_timeout=120)
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


def clean(at: AppTest) -> None:
    """No traceback and no error box on the page."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def goto(at: AppTest, page: str, run=None, layer=None, head=None) -> AppTest:
    if run is not None:
        at.sidebar.selectbox(key="run").set_value(str(run)).run()
    if layer is not None:
        at.sidebar.number_input(key="layer").set_value(layer).run()
    if head is not None:
        at.sidebar.number_input(key="head").set_value(head).run()
    return at.sidebar.radio(key="page").set_value(page).run()


def test_with_no_runs_every_page_says_how_to_make_one(monkeypatch, tmp_path):
    at = start(monkeypatch, tmp_path)
    for page in views.PAGES:
        goto(at, page)
        clean(at)
        shown = " ".join(i.value for i in at.info)
        assert ("No runs found" in shown) or ("No circuits run" in shown), page
        assert any("headhunt" in c.value for c in at.code), page
    assert at.sidebar.selectbox(key="run").options == []


def test_runs_page_lists_good_runs_and_explains_broken_ones(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    clean(at)
    warnings = " | ".join(w.value for w in at.warning)
    assert "corrupt-manifest" in warnings and "manifest.json is corrupt" in warnings
    assert "bad-scores" in warnings and "scores.parquet is unreadable" in warnings
    assert "half-done.partial" in warnings and "--resume" in warnings
    options = at.sidebar.selectbox(key="run").options
    assert sorted(o.split(" ")[0] for o in options) == [
        "circuits-tiny",
        "ngram-tiny",
        "retrieval-tiny",
        "sinks-tiny",
    ]
    table = at.dataframe[0].value
    assert len(table) == 7 and set(table["method"]) >= {"retrieval", "sinks", "ngram", "circuits"}
    assert (table["status"] == "ok").sum() == 4

    goto(at, "Runs", run=runs_root / "retrieval-tiny")
    assert any("retrieval-tiny" in s.value for s in at.subheader)
    assert {m.label: m.value for m in at.metric}["method"] == "retrieval"
    # Compare with a second run: the settings that differ are listed.
    at.selectbox(key="compare_with").set_value(str(runs_root / "sinks-tiny")).run()
    clean(at)
    assert any("Settings that differ" in m.value for m in at.markdown)


def test_a_deep_link_opens_a_head(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root, page="Head detail", run="sinks-tiny", layer="1", head="3")
    clean(at)
    assert at.header[0].value == "Head 1-3"
    assert "sinks-tiny" in at.caption[0].value


@pytest.mark.parametrize(
    ("run", "metric", "extra"),
    [
        ("retrieval-tiny", "retrieval_score", "needle_attention"),
        ("sinks-tiny", "hidden_sink_mass", "first_sink_mass"),
        ("ngram-tiny", "induction [source=random]", "kgram_contrast [source=natural, order=2]"),
        ("circuits-tiny", "sae_node", "truth"),
    ],
)
def test_heads_map_opens_on_the_method_metric_and_ranks_the_planted_head(
    monkeypatch, runs_root, run, metric, extra
):
    at = start(monkeypatch, runs_root)
    goto(at, "Heads map", run=runs_root / run)
    clean(at)
    box = at.selectbox[0]
    assert box.value == metric and extra in box.options
    assert len(at.get("plotly_chart")) >= 1
    top = at.dataframe[0].value
    assert (int(top.loc[0, "layer"]), int(top.loc[0, "head"])) == PLANTED
    if run == "sinks-tiny":  # per-layer metrics get their own chart
        assert any("Per-layer values" in m.value for m in at.markdown)
    box.set_value(extra).run()
    clean(at)
    # The choice survives a trip to another page.
    goto(at, "Runs")
    goto(at, "Heads map")
    assert at.selectbox[0].value == extra


def test_head_detail_shows_scores_spread_and_needle_hits(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Head detail", run=runs_root / "retrieval-tiny", layer=PLANTED[0], head=PLANTED[1])
    clean(at)
    assert at.header[0].value == "Head 1-2"
    scores = at.dataframe[0].value.set_index("metric")
    assert scores.loc["retrieval_score", "rank"] == 1
    assert scores.loc["retrieval_score", "value"] == pytest.approx(0.75)  # mean of 0.8, 0.7
    assert [s.value for s in at.subheader][:3] == [
        "Scores",
        "Spread across trials / texts",
        "Where its argmax landed: the needle",
    ]
    trials = [d.value for d in at.dataframe if "on_needle" in d.value.columns][0]
    records = [
        json.loads(x) for x in (runs_root / "retrieval-tiny/trials.jsonl").read_text().splitlines()
    ]
    assert list(trials["on_needle"]) == [r["on_needle"][1][2] for r in records]
    assert list(trials["counted"]) == [True, True, False]


def test_head_detail_for_every_method_has_no_errors(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    for run in ("sinks-tiny", "ngram-tiny", "circuits-tiny"):
        goto(at, "Head detail", run=runs_root / run, layer=0, head=1)
        clean(at)
        assert at.header[0].value == "Head 0-1"
        assert "Spread across trials / texts" in [s.value for s in at.subheader], run


def test_attention_on_a_prompt_is_computed_on_demand(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Head detail", run=runs_root / "sinks-tiny", layer=1, head=2)
    assert not at.get("html")  # nothing runs until the button is pressed
    at.text_area(key="attn_prompt").set_value("the secret code of the vault is blue .").run()
    at.button(key="attn_go").click().run()
    clean(at)
    page = at.get("html")[0].proto.body
    assert "secret" in page and "vault" in page
    assert any("first-token sink mass s_0" in c.value for c in at.caption)
    top = [d.value for d in at.dataframe if "attention" in d.value.columns][0]
    assert top["attention"].iloc[0] >= top["attention"].iloc[-1]
    # Another query position re-renders without recomputing.
    at.slider(key="attn_query").set_value(3).run()
    clean(at)
    assert any("Attention of query 3" in m.value for m in at.markdown)


def test_interventions_answer_before_and_after(monkeypatch, runs_root, tiny_folder):
    at = start(monkeypatch, runs_root)
    goto(at, "Interventions", run=runs_root / "retrieval-tiny")
    clean(at)
    picked = at.multiselect[0].value
    assert picked[0] == f"{PLANTED[0]}-{PLANTED[1]}" and len(picked) == 3
    at.text_input(key="iv_typed").set_value("0-0").run()
    at.selectbox(key="iv_mode").set_value("output").run()
    at.number_input(key="iv_length").set_value(120).run()
    at.button(key="iv_go").click().run()
    wait_for_answers(at, 2)
    clean(at)
    heads_md = [m.value for m in at.markdown]
    assert "#### Before: unchanged" in heads_md and "#### After: output mask" in heads_md
    answers = [c.value for c in at.code][:2]
    # The page shows exactly what the library answers.
    from headhunt.probes import load_model

    model = load_model(str(tiny_folder))
    trial = hi.needle_trial(model, length=120, depth=50, needle="passkey", seed=0)
    heads = [*hi.parse_heads(",".join(picked)), (0, 0)]
    before, after = hi.compare_answers(model, trial, heads, "mask", mask_mode="output")
    assert answers == [before.text or "(empty answer)", after.text or "(empty answer)"]

    # ACT calibration, with the random-heads control; a bad head is a clear message.
    at.radio(key="iv_how").set_value("act").run()
    at.checkbox(key="iv_control").check().run()
    at.button(key="iv_go").click().run()
    wait_for_answers(at, 3)
    clean(at)
    titles = [m.value for m in at.markdown if m.value.startswith("####")]
    assert titles == [
        "#### Before: unchanged",
        "#### After: ACT beta=0.4",
        "#### Control: random heads: ACT beta=0.4",
    ]
    captions = [c.value for c in at.main.caption if c.value.startswith("heads ")]
    control = hi.parse_heads(captions[-1].removeprefix("heads "))
    assert len(control) == len(heads) and not set(control) & set(heads)
    at.text_input(key="iv_typed").set_value("9-9").run()
    assert "outside the model" in at.error[0].value


def wait_for_answers(at: AppTest, n: int, timeout: float = 120.0) -> None:
    """Rerun until the intervention (a background job) shows its ``n`` answers."""
    deadline = time.monotonic() + timeout
    while sum(m.value.startswith("#### ") for m in at.markdown) < n:
        assert not at.error, at.error[0].value
        assert time.monotonic() < deadline, [m.value for m in at.markdown]
        time.sleep(0.3)
        at.run()


def test_circuits_page_shows_auc_roc_and_edges(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Circuits", run=runs_root / "sinks-tiny")  # the page finds the circuits run
    clean(at)
    auc = at.dataframe[0].value.set_index("method")
    assert auc.loc["SAE node |P\\N|", "ROC AUC mean"] == pytest.approx(0.9)
    assert auc.loc["EAP |score|", "per trial"] == "0.950, 0.950"
    assert any("Circuit" in m.value and "1-2, 0-1" in m.value for m in at.markdown)
    edges = [d.value for d in at.dataframe if "pair" in d.value.columns][0]
    assert edges.loc[0, "mean"] == pytest.approx(0.75)
    assert len(at.get("plotly_chart")) >= 2  # ROC curves and head maps


def test_circuits_page_without_a_circuits_run(monkeypatch, runs_root, tmp_path):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(runs_root / "retrieval-tiny", root / "retrieval-tiny")
    at = start(monkeypatch, root)
    goto(at, "Circuits")
    clean(at)
    assert "No circuits run" in at.info[0].value
    assert "headhunt circuits" in at.code[0].value
