"""A method brings its own views: a toy method, one class here and one registry line, gets its
default metric, a head's spread, its panels and its metrics' definitions in the views and the
dashboard, with nothing in ``headhunt/views`` or the app naming it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

import headhunt as hh
from headhunt import inspect as hi
from headhunt.methods import METHODS
from headhunt.methods.base import (
    Method,
    MethodConfig,
    MetricInfo,
    option,
    read_jsonl,
    spread_frame,
)

RECORDS = "toy.jsonl"


@dataclass
class ToyConfig(MethodConfig):
    n_texts: int = option(3, "texts", min=1)


class Toy(Method):
    """Per text and head, a made-up "focus" value (text i gives head h of layer l the value
    (i + 1) * (l * heads + h) / 100); a head's score is its mean over the texts."""

    name = "toy"
    Config = ToyConfig
    metric = "toy_focus"  # not the table's first metric: the views must ask the method
    help = "a toy method"
    description = "A toy method."
    units = "texts"
    panels = frozenset({"toy panel"})
    glossary = {"toy_focus": MetricInfo("made-up focus of a head, mean over texts", "share")}

    def run(self, model, config: ToyConfig, ctx):
        from headhunt.scores import HeadScores

        grid = np.arange(model.n_layers * model.n_heads).reshape(model.n_layers, model.n_heads)
        plan = list(range(config.n_texts))
        for i in ctx.todo(plan, ctx.done(RECORDS, key=lambda r: r["text"])):
            ctx.append(RECORDS, {"text": i, "focus": ((i + 1) * grid / 100).tolist()})
        ctx.wait()
        records = ctx.collect(RECORDS, plan, key=lambda r: r["text"])
        if records is None:
            return None
        focus = np.mean([r["focus"] for r in records], axis=0)
        count = np.full(focus.shape, float(len(records)))
        return HeadScores.concat(
            [
                HeadScores.from_matrix("toy_count", count, n_kv_heads=model.n_kv_heads),
                HeadScores.from_matrix("toy_focus", focus, n_kv_heads=model.n_kv_heads),
            ]
        )

    def show(self, run, top: int) -> None:
        print(run.scores().top(self.metric, top))

    def spread(self, run, layer: int, head: int):
        return spread_frame(
            {"unit": f"text {r['text']}", "metric": "toy_focus", "value": r["focus"][layer][head]}
            for r in read_jsonl(run.path / RECORDS)
        )


@pytest.fixture
def toy_run(monkeypatch, tmp_path):
    """A finished toy run under ``tmp_path/runs`` (the toy registered for this test only)."""
    from headhunt.probes.tiny import tiny_llama

    monkeypatch.setitem(METHODS, "toy", f"{__name__}:Toy")
    model = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2)
    return hh.run("toy", ToyConfig(), model=model, out=tmp_path / "runs" / "toy", progress=False)


def test_a_registered_method_brings_its_default_metric_spread_panels_and_glossary(toy_run):
    (entry,) = hi.scan_runs(toy_run.path.parent)
    assert entry.ok and entry.method == "toy" and entry.panels == {"toy panel"}
    scores = hi.read_scores(toy_run)
    views = hi.metric_views(scores)
    assert [v.metric for v in views] == ["toy_count", "toy_focus"]
    assert hi.default_view("toy", views).metric == "toy_focus"
    assert hi.describe("toy_focus") == "toy_focus: made-up focus of a head, mean over texts [share]"
    assert "no definition recorded" in hi.describe("toy_count")

    spread = hi.head_spread(toy_run, 1, 2)  # head 6 of the grid: 0.06, 0.12, 0.18
    assert list(spread["unit"]) == ["text 0", "text 1", "text 2"]
    assert list(spread["value"]) == pytest.approx([0.06, 0.12, 0.18])
    assert spread["counted"].all() and (spread["source"] == "").all()
    summary = hi.spread_summary(spread)
    assert summary.loc[0, "mean"] == pytest.approx(scores.matrix("toy_focus")[1, 2])


def test_an_unregistered_method_keeps_its_scores_without_method_views(toy_run, monkeypatch):
    monkeypatch.delitem(METHODS, "toy")
    (entry,) = hi.scan_runs(toy_run.path.parent)
    assert entry.ok and entry.panels == frozenset()
    views = hi.metric_views(hi.read_scores(toy_run))
    assert hi.default_view("toy", views).metric == "toy_count"  # the first view
    assert hi.head_spread(toy_run, 1, 2).empty
    assert hi.metric_info("toy_focus") is None


def test_the_dashboard_shows_the_toy_methods_views(toy_run, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from headhunt import app

    monkeypatch.setenv("HEADHUNT_RUNS", str(toy_run.path.parent))
    at = AppTest.from_file(app.__path__[0] + "/main.py", default_timeout=120)
    at.query_params.update(page="Heads map", run="toy", layer="1", head="2")
    at.run()
    assert not at.exception and not at.error
    assert at.selectbox(key="w_view::" + str(toy_run.path)).value == "toy_focus"
    assert any(c.value.startswith("toy_focus: made-up focus") for c in at.caption)
    at.sidebar.radio(key="page").set_value("Head detail").run()
    assert not at.exception and not at.error
    assert "Spread across trials / texts" in [s.value for s in at.subheader]
    summary = at.dataframe[-1].value
    assert list(summary["metric"]) == ["toy_focus"] and summary.loc[0, "count"] == 3


def test_asking_every_method_for_its_views_imports_no_torch(tmp_path):
    """The dashboard lists runs and reads spreads without importing torch or transformers."""
    code = f"""
import sys
from pathlib import Path
from headhunt import inspect
from headhunt.methods import METHODS, find
from headhunt.rundir import Run
for name in METHODS:
    m = find(name)
    assert m.metric and isinstance(m.panels, frozenset)
    assert m.spread(Run(Path({str(tmp_path)!r}), {{"method": name}}), 0, 0).empty
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_registered_method_gets_its_subcommand(monkeypatch, tiny_folder, tmp_path, capsys):
    """One registry line gives the toy its ``headhunt toy`` with a flag per config field and
    the shared model / output options; the run directory equals ``headhunt.run``'s."""
    from headhunt.cli import build_parser, main

    monkeypatch.setitem(METHODS, "toy", f"{__name__}:Toy")
    assert "toy" in build_parser().format_help()
    out = tmp_path / "cli"
    argv = ["toy", "--model", str(tiny_folder), "--device", "cpu", "--n-texts", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "run directory:" in capsys.readouterr().out
    api = hh.run("toy", ToyConfig(n_texts=2), model_spec=str(tiny_folder), out=tmp_path / "api")
    assert api.manifest["parameters"]["n_texts"] == 2
    for name in ("toy.jsonl", "scores.parquet"):
        assert (out / name).read_bytes() == (api.path / name).read_bytes(), name
    assert main([*argv, "--n-texts", "0", "--out", str(tmp_path / "bad")]) == 2
