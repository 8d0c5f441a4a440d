"""The dashboard defects of issue 29's walk, each with a test that fails on the code before
the fix: settings kept across pages, heat-map axes, bad links said on the page, an ablate
run's own result, the heads picker after a new ranking, the on-demand model's shape, and
n-gram views with nothing to rank not offered."""

from __future__ import annotations

import json

import numpy as np
from run_fixtures import PLANTED, retrieval_run
from test_pages import clean, goto, start

from headhunt.rundir import RunDir
from headhunt.scores import HeadScores


def test_intervention_and_head_detail_settings_survive_another_page(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Interventions", run=runs_root / "retrieval-tiny")
    at.radio(key="iv_how").set_value("act").run()
    at.slider(key="iv_beta").set_value(0.7).run()
    at.selectbox(key="iv_needle").set_value("city").run()
    at.checkbox(key="iv_control").check().run()
    at.text_input(key="iv_typed").set_value("0-0").run()
    at.multiselect[0].set_value(["1-2"]).run()
    goto(at, "Runs")
    goto(at, "Interventions")
    clean(at)
    assert at.radio(key="iv_how").value == "act"
    assert at.slider(key="iv_beta").value == 0.7
    assert at.selectbox(key="iv_needle").value == "city"
    assert at.checkbox(key="iv_control").value
    assert at.text_input(key="iv_typed").value == "0-0"
    assert at.multiselect[0].value == ["1-2"]

    # Head detail: the prompt and its computed attention are there on coming back.
    goto(at, "Head detail", layer=1, head=2)
    at.text_area(key="attn_prompt").set_value("the vault is blue .").run()
    at.button(key="attn_go").click().run()
    assert at.get("html")
    goto(at, "Runs")
    goto(at, "Head detail")
    clean(at)
    assert at.text_area(key="attn_prompt").value == "the vault is blue ."
    assert any("vault" in h.proto.body for h in at.get("html"))


def test_heat_map_axes_span_exactly_the_model():
    from headhunt.app.views import clickable
    from headhunt.plots import head_heatmap

    fig = clickable(head_heatmap(np.random.default_rng(0).uniform(size=(30, 9)), "t", "v"))
    assert tuple(fig.layout.yaxis.range) == (-0.5, 29.5)
    assert tuple(fig.layout.xaxis.range) == (-0.5, 8.5)


def test_a_bad_page_layer_or_head_in_a_link_is_said(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root, page="Nope", run="sinks-tiny", layer="7", head="x")
    shown = " ".join(w.value for w in at.warning)
    assert "there is no page 'Nope'" in shown
    assert "layer 7 is outside run `sinks-tiny`'s model (2 layers x 4 heads)" in shown
    assert "head 'x' is not a number" in shown
    # Once the user picks something else, the note goes.
    goto(at, "Heads map")
    assert not any("The link asked" in w.value for w in at.warning)


def ablate_run(out, source) -> None:
    run = RunDir.open(out, "ablate", parameters={"scores": str(source)})
    scores = HeadScores.from_matrix("retrieval_score", np.full((2, 4), 0.1), n_kv_heads=2)
    scores.to_parquet(run.path("scores.parquet"))
    result = {
        "top_k": 2,
        "top_heads": [[1, 2], [0, 1]],
        "baseline": 80.0,
        "top_masked": 20.0,
        "random_masked": [75.0],
        "random_heads": [[[0, 0], [1, 3]]],
        "per_trial": {"baseline": [1, 0.6], "top": [0.4, 0.0], "random0": [1, 0.5]},
        "random_mean": 75.0,
    }
    run.path("ablation.json").write_text(json.dumps(result))
    run.finalize(
        model={"spec": "tiny", "n_layers": 2, "n_heads": 4, "n_kv_heads": 2},
        parameters={"scores": str(source)},
        timings={"ablation_s": 1.0},
    )


def test_an_ablate_run_shows_its_own_result(monkeypatch, tmp_path):
    source = retrieval_run(tmp_path / "retrieval", "tiny")
    ablate_run(tmp_path / "ablate", source)
    at = start(monkeypatch, tmp_path)
    goto(at, "Runs", run=tmp_path / "ablate")
    clean(at)
    table = next(d.value for d in at.dataframe if "needle recall (x100)" in d.value.columns)
    assert list(table["needle recall (x100)"]) == [80.0, 20.0, 75.0]
    assert table.loc[1, "heads masked"] == "1-2, 0-1"
    assert abs(table.loc[1, "SE"] - 20.0) < 1e-9  # std 0.283 (ddof 1) / sqrt(2) x 100
    goto(at, "Heads map")
    assert "the ranking it read from the retrieval run" in at.info[0].value


def test_a_new_ranking_keeps_the_heads_picker_filled(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Interventions", run=runs_root / "sinks-tiny")
    assert at.multiselect[0].value
    box = next(b for b in at.selectbox if b.label == "rank heads by")
    other = next(o for o in box.options if o != box.value)
    box.set_value(other).run()
    clean(at)
    assert at.multiselect[0].value, "the heads picker was emptied"


def test_an_override_model_of_another_shape_is_refused(monkeypatch, runs_root, tmp_path):
    from headhunt.probes.tiny import tiny_llama

    m = tiny_llama(n_layers=3, n_heads=4, n_kv_heads=2)
    m.model.save_pretrained(tmp_path / "three")
    m.tokenizer.save_pretrained(tmp_path / "three")
    at = start(monkeypatch, runs_root)
    goto(at, "Head detail", run=runs_root / "sinks-tiny", layer=1, head=2)
    at.sidebar.text_input(key="model_override").set_value(str(tmp_path / "three")).run()
    at.button(key="attn_go").click().run()
    assert len(at.error) == 1
    assert "has 3 layers x 4 heads, the run `sinks-tiny` 2 x 4" in at.error[0].value
    assert not at.get("html")


def test_ngram_views_with_nothing_to_rank_are_not_offered(monkeypatch, runs_root):
    from headhunt import inspect as hi
    from headhunt.app.data import scores

    at = start(monkeypatch, runs_root)
    goto(at, "Heads map", run=runs_root / "ngram-tiny")
    clean(at)
    s = scores(runs_root / "ngram-tiny")
    states = {v.label: hi.view_state(s, v).kind for v in hi.metric_views(s)}
    hidden = [label for label, kind in states.items() if kind != "map"]
    assert hidden, "the fixture has empty or constant views"
    offered = at.selectbox[0].options
    assert not set(hidden) & set(offered)
    assert set(offered) == {label for label, kind in states.items() if kind == "map"}
    assert any(f"{len(hidden)} view(s) not offered" in e.label for e in at.expander)
    assert PLANTED


def assert_drawn_defaults(widgets) -> None:
    """Each widget's own default (in its message) says what its value says."""
    for w in widgets:
        default = w.proto.default
        if hasattr(w, "indices"):  # a multiselect: indices of the options
            default, value = list(default), w.indices
        elif hasattr(w, "index"):  # a radio or a selectbox
            value = w.index
        elif type(w).__name__ == "Slider":  # one handle: a list of one
            default, value = list(default), [w.value]
        else:
            value = w.value
        assert default == value, (w.key, default, value)


def test_every_kept_widget_draws_the_sessions_value_as_its_default(monkeypatch, runs_root):
    """A value set in the session (by a link, a callback or on coming back to a page) reaches
    the browser only in that run's message; a browser that drew the widget from the next
    run's message took the message's default instead and sent it back (a link's page and
    the Interventions settings were lost now and then in the browser tests on a busy CI
    machine). So every widget the session sets draws the session's value as its default."""
    at = start(monkeypatch, runs_root, page="Interventions", run="sinks-tiny", layer="1", head="2")
    at.radio(key="iv_how").set_value("act").run()
    at.slider(key="iv_beta").set_value(0.7).run()
    at.selectbox(key="iv_needle").set_value("city").run()
    at.number_input(key="iv_length").set_value(900).run()
    at.checkbox(key="iv_control").check().run()
    at.text_input(key="iv_typed").set_value("0-0").run()
    at.multiselect[0].set_value(["1-1"]).run()
    goto(at, "Runs")
    goto(at, "Interventions")
    at.run()  # the run after coming back: no value is set through the session in it
    clean(at)
    sidebar = [at.sidebar.radio(key="page"), at.sidebar.selectbox(key="run")]
    sidebar += [at.sidebar.number_input(key=k) for k in ("layer", "head")]
    page = [at.radio(key="iv_how"), at.slider(key="iv_beta"), at.selectbox(key="iv_needle")]
    page += [at.number_input(key="iv_length"), at.checkbox(key="iv_control")]
    page += [at.text_input(key="iv_typed"), at.multiselect[0]]
    assert_drawn_defaults(sidebar + page)
    assert at.sidebar.number_input(key="layer").value == 1  # the link's, kept
    assert at.radio(key="iv_how").value == "act" and at.number_input(key="iv_length").value == 900

    goto(at, "Head view")
    at.number_input(key="hv_tokens").set_value(777).run()
    goto(at, "Runs")
    goto(at, "Head view")
    at.run()
    assert_drawn_defaults([at.radio(key="hv_source"), at.number_input(key="hv_tokens")])
    assert at.number_input(key="hv_tokens").value == 777
