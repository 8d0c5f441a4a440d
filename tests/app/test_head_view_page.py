"""The Head view page (AppTest on the fixture runs and the tiny model): a long prompt's tracks,
an exact row, the text around the looked-at keys; a retrieval run's trial opened from Head
detail; a saved view opened from a file; a bad file refused in one line."""

from __future__ import annotations

import numpy as np
from test_pages import clean, goto, start

from headhunt.probes.headview import HeadView


def test_a_haystack_prompt_is_laid_out_without_errors(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Head view", run=runs_root / "sinks-tiny", layer=1, head=2)
    clean(at)
    assert at.header[0].value.startswith("Head view 1-2")
    assert not at.get("plotly_chart")  # nothing runs until the button is pressed
    at.number_input(key="hv_tokens").set_value(900).run()
    at.button(key="hv_go").click().run()
    clean(at)
    assert any("**900 tokens**" in m.value for m in at.markdown)
    assert len(at.get("plotly_chart")) == 3  # tracks, received attention, the exact row
    assert any("hh-context" in h.proto.body for h in at.get("html"))
    top = [d.value for d in at.dataframe if "weight" in d.value.columns][0]
    assert top["weight"].is_monotonic_decreasing and (top["key"] <= 899).all()
    # Another query: its exact row, computed from the kept log-sum-exp.
    at.number_input(key="hv_query").set_value(450).run()
    clean(at)
    assert any(s.value == "Query 450: where it looks" for s in at.subheader)
    top = [d.value for d in at.dataframe if "weight" in d.value.columns][0]
    assert (top["key"] <= 450).all()


def test_a_needle_trial_opens_from_head_detail(monkeypatch, runs_root):
    at = start(monkeypatch, runs_root)
    goto(at, "Head detail", run=runs_root / "retrieval-tiny", layer=1, head=2)
    at.selectbox(key="needle_trial_pick").set_value("L120-D50-passkey-0").run()
    at.button(key="needle_to_head_view").click().run()
    clean(at)
    assert at.header[0].value.startswith("Head view 1-2")
    assert at.radio(key="hv_source").value == "trial"
    assert at.selectbox(key="hv_trial").value == "L120-D50-passkey-0"
    at.button(key="hv_go").click().run()
    clean(at)
    span = [
        __import__("json").loads(x)["span"]
        for x in (runs_root / "retrieval-tiny/trials.jsonl").read_text().splitlines()
    ][1]
    assert any(
        "**120 tokens**" in m.value and f"positions {span[0]}..{span[1] - 1}" in m.value
        for m in at.markdown
    )


def test_a_saved_view_opens_and_a_bad_file_is_one_line(monkeypatch, runs_root, tmp_path):
    n = 5000
    rng = np.random.default_rng(0)
    view = HeadView(
        layer=1,
        head=2,
        model="saved",
        ids=rng.integers(4, 60, n),
        argmax=rng.integers(0, n, n),
        top_prob=rng.uniform(0, 1, n).astype(np.float32),
        entropy=rng.uniform(0, 5, n).astype(np.float32),
        col_sum=rng.uniform(0, 3, n).astype(np.float32),
        col_mean=rng.uniform(0, 1, n).astype(np.float32),
        lse=rng.uniform(0, 1, n).astype(np.float32),
        rows={n - 1: np.full(n, 1 / n, np.float32)},
    )
    path = view.save(tmp_path / "view.npz")
    at = start(monkeypatch, runs_root)
    goto(at, "Head view", run=runs_root / "sinks-tiny")
    at.radio(key="hv_source").set_value("file").run()
    at.text_input(key="hv_file").set_value(str(path)).run()
    at.button(key="hv_open_go").click().run()
    clean(at)
    assert any("**5,000 tokens**" in m.value for m in at.markdown)
    # A query whose row the file does not keep: said in one line, the tracks still shown.
    at.number_input(key="hv_query").set_value(10).run()
    assert "keeps exact rows only for queries 4999" in at.warning[0].value
    at.text_input(key="hv_file").set_value(str(tmp_path / "nope.npz")).run()
    at.button(key="hv_open_go").click().run()
    assert at.error[0].value.startswith("no head view file at")
