"""Issue 18.1-7 through streamlit's AppTest: no stale, contradictory or empty view without an
explanation (interventions keyed to their settings, the Runs table following the sidebar,
spreads over what the score averages, empty and constant maps explained, per-layer metrics on
their own axes, circuits pairs and ties, bad links and folders, cross-method comparison,
legends and metric definitions)."""

from __future__ import annotations

import json
import time

import pytest
from run_fixtures import PLANTED
from test_pages import clean, goto, start

from headhunt import inspect as hi


def wait_for(at, done, timeout: float = 120.0):
    """Rerun the page until ``done(at)`` (a background job finishes between reruns)."""
    deadline = time.monotonic() + timeout
    while not done(at):
        assert time.monotonic() < deadline, [m.value for m in at.markdown]
        time.sleep(0.3)
        at.run()
    return at


def answers_shown(at) -> list[str]:
    return [m.value for m in at.markdown if m.value.startswith("#### ")]


def test_an_intervention_result_belongs_to_its_run_and_settings(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Interventions", run=runs_root / "retrieval-tiny")
    at.number_input(key="iv_length").set_value(120).run()
    assert at.multiselect[0].value[0] == f"{PLANTED[0]}-{PLANTED[1]}"
    at.button(key="iv_go").click().run()
    clean(at)
    wait_for(at, lambda a: answers_shown(a))
    assert answers_shown(at)[1] == "#### After: query mask"

    # Another run: no answer from the first run, and its own top heads in the picker.
    at.sidebar.selectbox(key="run").set_value(str(runs_root / "sinks-tiny")).run()
    clean(at)
    assert not answers_shown(at)
    other = at.multiselect[0].value
    assert other and other[0] == f"{PLANTED[0]}-{PLANTED[1]}"

    # Back to the first run: its result is still there (the work was not lost) ...
    at.sidebar.selectbox(key="run").set_value(str(runs_root / "retrieval-tiny")).run()
    assert answers_shown(at)
    # ... and any change of the settings hides it until the button is pressed again.
    at.slider(key="iv_depth").set_value(25).run()
    assert not answers_shown(at)
    assert any("only for the settings that produced it" in c.value for c in at.caption)
    at.selectbox(key="iv_mode").set_value("output").run()
    assert not answers_shown(at)


def test_the_runs_table_marks_the_run_open_in_the_sidebar(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    for name in ("sinks-tiny", "ngram-tiny"):
        at.sidebar.selectbox(key="run").set_value(str(runs_root / name)).run()
        clean(at)
        table = at.dataframe[0].value
        assert list(table.loc[table["open"] != "", "run"]) == [name]
        # A fresh table per open run: no row selection is left from the previous one.
        assert at.session_state[f"runs_table::{runs_root / name}"]["selection"]["rows"] == []


def test_the_spread_is_over_what_the_score_averages(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Head detail", run=runs_root / "retrieval-tiny", layer=PLANTED[0], head=PLANTED[1])
    clean(at)
    scores = at.dataframe[0].value.set_index("metric")
    summary = next(d.value for d in at.dataframe if "mean" in d.value.columns)
    summary = summary.set_index("metric")
    for metric in ("retrieval_score", "needle_attention"):
        assert summary.loc[metric, "count"] == 2  # the counted trials, not all 3
        assert summary.loc[metric, "mean"] == pytest.approx(scores.loc[metric, "value"])
    assert any("answered wrong" in c.value for c in at.caption)

    goto(at, "Head detail", run=runs_root / "ngram-tiny")
    clean(at)
    table = at.dataframe[0].value
    summary = next(d.value for d in at.dataframe if "mean" in d.value.columns)
    assert set(summary["source"]) == {"random", "natural"}  # one row per input kind
    for row in summary[summary["metric"].isin(["induction", "prev_token"])].itertuples():
        want = table[(table["metric"] == row.metric) & (table["source"] == row.source)]
        assert row.mean == pytest.approx(float(want["value"].iloc[0]))


@pytest.mark.parametrize(
    ("label", "says"),
    [
        ("kgram_only_mass [source=random, order=2]", "No head has a value"),
        (
            "kgram_queries [source=random, order=1]",
            "counts the run's inputs, the same for every head",
        ),
    ],
)
def test_empty_and_constant_views_are_explained_not_drawn(monkeypatch, runs_root, label, says):
    at = start(monkeypatch, runs_root)
    goto(at, "Heads map", run=runs_root / "ngram-tiny")
    clean(at)
    # Not offered (no map, no "top heads" with fake ranks), and said why in the page.
    assert label not in at.selectbox[0].options
    assert any(label in m.value and says in m.value for m in at.markdown)

    goto(at, "Head detail", layer=0, head=0)
    table = at.dataframe[0].value
    counts = table[table["metric"] == "kgram_queries"]
    assert counts["rank"].isna().all()  # a run-level count ranks no head


def test_per_layer_metrics_of_different_scales_get_their_own_axes(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Heads map", run=runs_root / "sinks-tiny")
    clean(at)
    chart = next(c for c in at.get("plotly_chart") if "massive_ratio" in c.proto.spec)
    spec = json.loads(chart.proto.spec)
    axes = {t["name"]: t["yaxis"] for t in spec["data"]}
    assert axes["sink_eps"] != axes["massive_ratio"]
    assert any("massive_ratio" in c.value and "ratio" in c.value for c in at.caption)


def test_circuits_page_names_pairs_shows_ties_and_truth_vs_circuit(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Circuits", run=runs_root / "circuits-tiny")
    clean(at)
    edges = next(d.value for d in at.dataframe if "pair" in d.value.columns)
    assert edges.loc[0, "pair"] == "1-2 & 0-1" and edges.loc[0, "rank"] == 1
    tied = edges[edges["mean"] == 0.5]
    assert len(tied) == 3 and set(tied["rank"]) == {2} and set(tied["tied"]) == {3}
    captions = " ".join(c.value for c in at.caption)
    assert "3 pairs tie at 0.5" in captions
    assert "mean of the per-trial AUCs" in captions and "trial-mean score" in captions
    truth = next(m.value for m in at.markdown if m.value.startswith("**Ground truth vs circuit"))
    assert "2/2 ground-truth heads are in the circuit" in truth


def test_a_link_to_a_missing_or_broken_run_says_so(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root, page="Heads map", run="no-such-run")
    clean(at)
    assert "there is no run `no-such-run`" in at.warning[0].value
    assert "Showing" in at.warning[0].value
    at = start(monkeypatch, runs_root, page="Heads map", run="corrupt-manifest")
    assert "manifest.json is corrupt" in at.warning[0].value


def test_a_missing_runs_folder_is_not_an_empty_one(monkeypatch, tmp_path):
    at = start(monkeypatch, tmp_path / "typo")
    assert "does not exist" in at.sidebar.error[0].value
    assert "does not exist" in at.main.error[0].value
    assert not at.info  # not "No runs found" as for an empty folder


def test_runs_of_different_methods_compare_on_shared_heads(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Runs", run=runs_root / "retrieval-tiny")
    at.selectbox(key="compare_with").set_value(str(runs_root / "ngram-tiny")).run()
    clean(at)
    shared = next(m.value for m in at.markdown if m.value.startswith("**Heads in both top-10"))
    assert f"{PLANTED[0]}-{PLANTED[1]}" in shared
    assert any("Spearman" in c.value for c in at.caption)


def test_metrics_have_definitions_and_shading_has_a_legend(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Heads map", run=runs_root / "retrieval-tiny")
    assert any(c.value.startswith("retrieval_score: ") and "[" in c.value for c in at.caption)
    for metric in ("retrieval_score", "first_sink_mass", "induction", "sae_node", "sink_eps"):
        assert hi.metric_info(metric) is not None, metric
    page = hi.shade_tokens_html(["a", "b"], [0.2, 0.8], query=1, sinks=[0])
    assert "attention weight: 0" in page and "0.8" in page and "sink token" in page


@pytest.mark.parametrize(
    ("patch", "says"),
    [
        ({"model": "abc"}, "has model 'abc', not a mapping"),
        ({"model": {"spec": "x", "n_layers": "many", "n_heads": 4}}, "model.n_layers 'many'"),
        ({"parameters": [1, 2]}, "has parameters [1, 2], not a mapping"),
        ({"method": 3}, "has method 3, not a name"),
    ],
)
def test_a_manifest_with_wrong_types_is_listed_with_the_reason(monkeypatch, tmp_path, patch, says):
    from run_fixtures import retrieval_run

    root = tmp_path / "runs"
    good = retrieval_run(root / "good", "tiny")
    bad = retrieval_run(root / "bad", "tiny")
    manifest = json.loads((bad / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps({**manifest, **patch}))
    at = start(monkeypatch, root, run="bad")
    assert not at.exception, [e.value for e in at.exception]
    assert any("bad" in w.value and says in w.value for w in at.warning), [
        w.value for w in at.warning
    ]
    assert at.sidebar.selectbox(key="run").value == str(good)
    for page in ("Heads map", "Head detail", "Interventions", "Circuits"):
        goto(at, page)
        assert not at.exception, (page, [e.value for e in at.exception])


def test_a_probe_run_draws_whole_layer_probes_per_layer_and_head_probes_as_a_map(
    monkeypatch, tmp_path
):
    """Probe runs write a layer's residual-stream probe with head = -1 (not a head)."""
    import numpy as np
    import pandas as pd
    from run_fixtures import KV, H, L, _model

    from headhunt.rundir import RunDir
    from headhunt.scores import HeadScores

    run = RunDir.open(tmp_path / "runs" / "probe", "probe", parameters={"target": "mqar"})
    layers = pd.DataFrame(
        {"layer": range(L), "head": -1, "kv_head": -1, "metric": "accuracy", "value": [0.2, 0.9]}
    )
    heads = HeadScores.from_matrix("accuracy", np.arange(L * H).reshape(L, H) / 10, n_kv_heads=KV)
    HeadScores.concat([HeadScores(layers), heads]).to_parquet(run.path("scores.parquet"))
    run.finalize(model=_model("tiny"), parameters={"target": "mqar"}, timings={})
    at = start(monkeypatch, tmp_path / "runs")
    goto(at, "Heads map")
    clean(at)
    top = at.dataframe[0].value
    assert (int(top.loc[0, "layer"]), int(top.loc[0, "head"])) == (L - 1, H - 1)
    assert any("Per-layer values" in m.value for m in at.markdown)
    goto(at, "Head detail", layer=1, head=3)
    clean(at)
    assert list(at.dataframe[0].value["of"]) == [L * H]  # the whole-layer probes are not heads
