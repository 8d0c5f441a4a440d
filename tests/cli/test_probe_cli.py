"""`headhunt probe` end to end on a tiny local model folder, resume, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from headhunt.cli import main
from headhunt.probes.states import StateStore
from headhunt.scores import HeadScores

NGRAM = ["--target", "ngram", "--texts", "24", "--length", "30", "--grid", "0.01,1"]


@pytest.fixture
def folder(probe_folder):
    return probe_folder


def test_probe_writes_a_complete_run_directory(folder, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["probe", "--model", folder, "--out", str(out), *NGRAM, "--heads"]
    assert main([*args, "--controls", "control,shuffled,within_type", "--shard-size", "10"]) == 0
    files = {p.name for p in out.iterdir()}
    assert {
        "manifest.json",
        "scores.parquet",
        "probe_curve.html",
        "probe_weights.safetensors",
        "rows.parquet",
        "states",
        "records.jsonl",
    } <= files
    assert "parts" not in files and not (tmp_path / "run.partial").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] == "probe"
    assert manifest["target"]["name"] == "ngram" and manifest["target"]["n_types"] == 8
    assert manifest["capture"]["n_shards"] == 3
    assert set(manifest["timings"]) == {"load", "capture", "probe"}

    scores = HeadScores.read_parquet(out / "scores.parquet").df
    resid = scores[scores["head"] == -1]
    assert set(resid["kv_head"]) == {-1} and sorted(set(resid["layer"])) == [0, 1]
    assert {"accuracy", "control", "selectivity", "shuffled", "within_type", "chance", "C"} <= set(
        resid["metric"]
    )
    heads = scores[scores["head"] >= 0]
    assert len(heads[heads["metric"] == "accuracy"]) == 2 * 4
    assert set(zip(heads["head"], heads["kv_head"], strict=True)) == {
        (0, 0),
        (1, 0),
        (2, 1),
        (3, 1),
    }
    acc = resid[resid["metric"] == "accuracy"]["value"]
    assert acc.between(0, 1).all()

    rows = pd.read_parquet(out / "rows.parquet")
    store = StateStore.open(out / "states")
    assert store.n_rows == len(rows) and store.layer(1).shape == (len(rows), 64)
    assert store.head(0).shape == (len(rows), 4, 16)
    np.testing.assert_array_equal(store.rows()["position"], rows["position"])

    from safetensors.numpy import load_file

    weights = load_file(str(out / "probe_weights.safetensors"))
    assert weights["L01.coef"].shape[1] == 64 and weights["L00.H02.coef"].shape[1] == 16
    assert "plotly" in (out / "probe_curve.html").read_text()[:5000].lower()
    printed = capsys.readouterr().out
    assert "accuracy per layer" in printed and "best heads" in printed

    # An existing run is refused, reprinted with --resume, replaced with --force.
    assert main(args) == 2
    assert "exists" in capsys.readouterr().err
    assert (
        main(
            [*args, "--resume", "--controls", "control,shuffled,within_type", "--shard-size", "10"]
        )
        == 0
    )
    assert "accuracy per layer" in capsys.readouterr().out


def test_interrupted_probe_resumes_without_recapturing(folder, tmp_path, monkeypatch):
    from headhunt.probes import linear, states

    args = ["probe", "--model", folder, *NGRAM, "--controls", "none"]
    fresh = tmp_path / "fresh"
    assert main([*args, "--out", str(fresh)]) == 0

    out = tmp_path / "run"
    real, calls = linear.Prober.fit, []

    def flaky(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(linear.Prober, "fit", flaky)
    assert main([*args, "--out", str(out)]) == 130
    assert not out.exists()
    partial = tmp_path / "run.partial"
    assert len((partial / "records.jsonl").read_text().splitlines()) == 1

    def no_capture(*a, **k):
        raise AssertionError("the states were captured already")

    monkeypatch.setattr(linear.Prober, "fit", real)
    monkeypatch.setattr(states, "_capture_shard", no_capture)
    calls.clear()
    assert main([*args, "--out", str(out), "--resume", "--batch-size", "3"]) == 0
    a = pd.read_parquet(out / "scores.parquet").sort_values(["layer", "head", "metric"])
    b = pd.read_parquet(fresh / "scores.parquet").sort_values(["layer", "head", "metric"])
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    # Other parameters are refused on resume.
    assert main([*args, "--out", str(out), "--resume", "--k", "2"]) == 2


def probe(folder: str, out, *flags: str) -> int:
    return main(["probe", "--model", folder, *flags, "--grid", "0.1", "--out", str(out)])


def test_mqar_needle_and_jsonl_targets(folder, tmp_path):
    assert (
        probe(folder, tmp_path / "mqar", "--target", "mqar", "--texts", "16", "--pairs", "4") == 0
    )
    manifest = json.loads((tmp_path / "mqar" / "manifest.json").read_text())
    assert (
        manifest["target"]["n_rows"] == 64 and manifest["target"]["control_types"] == "the key word"
    )
    needle = ["--target", "needle", "--texts", "12", "--bins", "2", "--length", "160"]
    assert probe(folder, tmp_path / "needle", *needle, "--drop-states") == 0
    assert not (tmp_path / "needle" / "states").exists()
    data = tmp_path / "d.jsonl"
    words = ["river", "lamp", "gate", "city", "park", "key", "bread", "garden",
             "code", "word", "day", "thing"]  # fmt: skip
    data.write_text(
        "\n".join(
            json.dumps({"text": f"the {w} is red", "substring": w, "label": i % 2})
            for i, w in enumerate(words)
        )
    )
    jsonl = ["--target", "jsonl", "--data", str(data), "--folds", "2"]
    assert probe(folder, tmp_path / "jsonl", *jsonl) == 0
    rows = pd.read_parquet(tmp_path / "jsonl" / "rows.parquet")
    assert list(rows["label_name"][:2]) == ["0", "1"]


def jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (
            lambda p: [
                "--target",
                "jsonl",
                "--data",
                jsonl(
                    p / "a.jsonl",
                    [{"text": f"the lamp {i}", "position": 1, "label": "x"} for i in range(20)],
                ),
            ],
            "one class",
        ),
        (
            lambda p: [
                "--target",
                "jsonl",
                "--data",
                jsonl(p / "b.jsonl", [{"text": "the lamp", "position": 7, "label": 1}]),
            ],
            "outside",
        ),
        (
            lambda p: [
                "--target",
                "jsonl",
                "--data",
                jsonl(
                    p / "c.jsonl",
                    [{"text": f"the lamp {i}", "position": 1, "label": i % 2} for i in range(5)],
                ),
            ],
            "only 5 texts",
        ),
        (lambda p: ["--target", "jsonl"], "needs --data"),
        (lambda p: ["--target", "ngram", "--data", "x.jsonl"], "only for --target jsonl"),
        (lambda p: ["--target", "ngram", "--layers", "7"], "do not exist"),
        (
            lambda p: ["--target", "ngram", "--words", "river,lamp,gate,xylophone"],
            "not a single token",
        ),
        (lambda p: ["--target", "ngram", "--controls", "nope"], "unknown controls"),
    ],
)
def test_bad_input_is_one_line_and_leaves_no_run_directory(
    folder, tmp_path, capsys, make_args, message
):
    out = tmp_path / "run"
    code = main(["probe", "--model", folder, "--out", str(out), *make_args(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "run.partial").exists()


@pytest.mark.slow
def test_probe_on_the_embedded_model(tmp_path):
    out = tmp_path / "smol"
    args = "probe --target mqar --texts 12 --pairs 4 --seq-len 16 --layers 0,29 --grid 0.1"
    code = main([*args.split(), "--out", str(out)])
    assert code == 0
    df = pd.read_parquet(out / "scores.parquet")
    acc = df[(df["metric"] == "accuracy")].set_index("layer")["value"]
    assert sorted(acc.index) == [0, 29] and acc.between(0, 1).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["n_layers"] == 30 and manifest["capture"]["layers"] == [0, 29]
