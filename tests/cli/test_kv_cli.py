"""`headhunt prune`, `kv-eval` and `export` end to end on the tiny model folder, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from headhunt.cli import main
from headhunt.rundir import RunDir
from headhunt.scores import HeadScores


@pytest.fixture(scope="module")
def scores_run(tmp_path_factory):
    """A finished run whose metric ranks the tiny model's 2 x 4 heads."""
    out = tmp_path_factory.mktemp("scores") / "run"
    run = RunDir.open(out, "retrieval")
    values = np.arange(8, dtype=float).reshape(2, 4) / 8
    HeadScores.from_matrix("retrieval_score", values, n_kv_heads=2).to_parquet(
        run.path("scores.parquet")
    )
    facts = {"n_layers": 2, "n_heads": 4, "n_kv_heads": 2}
    run.finalize(model=facts, parameters={}, timings={})
    return out


def test_prune_writes_a_reloadable_smaller_model(tiny_folder, scores_run, tmp_path, capsys):
    from headhunt.heads.interventions.masking import mask_heads
    from headhunt.heads.interventions.pruning import load_pruned_model
    from headhunt.probes.hooked import load_model

    out = tmp_path / "prune"
    argv = ["prune", "--model", str(tiny_folder), "--scores", str(scores_run), "--keep", "0.5"]
    argv += ["--out", str(out), "--device", "cpu", "--evaluate", "--draws", "1"]
    argv += ["--lengths", "150", "--depths", "50", "--ppl-windows", "2"]
    assert main(argv) == 0
    result = json.loads((out / "prune.json").read_text())
    assert sorted(map(tuple, result["dropped"])) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert result["pruned"]["parameters"] < result["full"]["parameters"]
    table = pd.read_csv(out / "prune_eval.csv")
    assert set(table["order"]) == {"none", "headhunt", "reverse", "random0", "random"}
    ids = torch.randint(5, 60, (1, 12))
    full = load_model(str(tiny_folder), device="cpu")
    with torch.inference_mode(), mask_heads(full, [(0, h) for h in range(4)], mode="output"):
        want = full.model(ids).logits
    got = load_pruned_model(out / "model", device="cpu").model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert "Structural pruning" in capsys.readouterr().out


def test_prune_tiebreaks(tiny_folder, scores_run, tmp_path):
    base = ["prune", "--model", str(tiny_folder), "--scores", str(scores_run), "--keep", "0.75"]
    base += ["--device", "cpu", "--lengths", "150", "--depths", "50"]
    assert main([*base, "--tiebreak", "masking", "--out", str(tmp_path / "m")]) == 0
    scores = HeadScores.read_parquet(tmp_path / "m" / "scores.parquet")
    assert scores.matrix("masking_effect").shape == (2, 4)
    # another run's metric (no ties here: the primary order decides)
    tie = f"{scores_run}:retrieval_score"
    assert main([*base, "--tiebreak", tie, "--out", str(tmp_path / "r")]) == 0
    kept = HeadScores.read_parquet(tmp_path / "r" / "scores.parquet").matrix("kept")
    assert kept[0, :2].sum() == 0 and kept.sum() == 6
    assert main([*base, "--tiebreak", "nonsense", "--out", str(tmp_path / "x")]) == 2


def test_kv_eval_writes_summary_and_figure(tiny_folder, scores_run, tmp_path):
    out = tmp_path / "kv"
    argv = ["kv-eval", "--model", str(tiny_folder), "--scores", str(scores_run), "--out", str(out)]
    argv += ["--device", "cpu", "--fractions", "0,0.5,1", "--lengths", "150", "--depths", "50"]
    argv += ["--needles", "passkey", "--tasks", "mk_niah", "--task-repeats", "1"]
    argv += ["--random-draws", "1", "--sink", "2", "--recent", "16"]
    assert main(argv) == 0
    summary = pd.read_csv(out / "summary.csv")
    assert {"headhunt", "reverse", "random0", "random"} <= set(summary["ranking"])
    needle = summary[(summary["task"] == "needle") & (summary["ranking"] == "headhunt")]
    kv = needle.set_index("fraction")["kv_fraction"]
    assert kv[0.0] < kv[0.5] < kv[1.0] == 1.0
    assert (out / "kv_eval.html").stat().st_size > 10_000
    ranking = json.loads((out / "manifest.json").read_text())["summary"]["ranking"]
    assert ranking["trials"] is None and "no per-trial" in ranking["note"]  # no trials kept
    assert main([*argv, "--resume"]) == 0


def test_kv_eval_ranks_by_a_duoattention_pattern_and_takes_its_window(tiny_folder, tmp_path):
    pattern = Path(__file__).parents[1] / "fixtures" / "duo_pattern"  # DuoAttention's layout
    out = tmp_path / "kv-duo"
    argv = ["kv-eval", "--model", str(tiny_folder), "--duo-pattern", str(pattern)]
    argv += ["--out", str(out), "--device", "cpu", "--fractions", "0.5,1", "--lengths", "150"]
    argv += ["--depths", "50", "--needles", "passkey", "--task-repeats", "0", "--random-draws", "0"]
    assert main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parameters"]["sink"] == 8 and manifest["parameters"]["recent"] == 16
    assert manifest["summary"]["rankings"] == ["duo"]
    assert "from " + str(pattern) in manifest["summary"]["window"]["from"]
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["ranking"]) == {"duo"} and set(summary["fraction"]) == {0.5, 1.0}


def test_export_checks_counts(tiny_folder, scores_run, tmp_path, capsys):
    out = tmp_path / "duo"
    assert main(["export", "--scores", str(scores_run), "--format", "duo", "--out", str(out)]) == 0
    assert np.loadtxt(out / "full_attention_heads.tsv", delimiter="\t").shape == (2, 2)
    cfg = tmp_path / "big"
    cfg.mkdir()
    big = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}
    (cfg / "config.json").write_text(json.dumps(big))
    argv = [
        "export",
        "--scores",
        str(scores_run),
        "--format",
        "headkv",
        "--out",
        str(tmp_path / "h"),
    ]
    assert main([*argv, "--model", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "32 x 32" in err[0]
    assert main([*argv, "--model", str(tiny_folder)]) == 0
    lukv = ["export", "--scores", str(scores_run), "--format", "lukv", "--out", str(tmp_path / "l")]
    assert main([*lukv, "--model", str(tiny_folder)]) == 0
    assert np.load(tmp_path / "l" / "budget_curve.npy").shape == (99, 2, 2)
    assert main([*lukv, "--model", str(cfg), "--force"]) == 2


def test_bad_input_is_one_line(tiny_folder, scores_run, tmp_path, capsys):
    base = ["prune", "--model", str(tiny_folder), "--out", str(tmp_path / "p")]
    assert main([*base, "--keep", "0.5"]) == 2  # no --scores
    assert main([*base, "--drop-heads", "7-0"]) == 2  # outside the model
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("headhunt prune: error:") for e in err)
    assert not (tmp_path / "p").exists() and not (tmp_path / "p.partial").exists()


def test_prune_by_kv_group(tiny_folder, scores_run, tmp_path):
    out = tmp_path / "prune-kv"
    argv = ["prune", "--model", str(tiny_folder), "--scores", str(scores_run), "--keep", "0.5"]
    assert main([*argv, "--unit", "kv", "--out", str(out), "--device", "cpu"]) == 0
    result = json.loads((out / "prune.json").read_text())
    # Layer 1's two groups score highest: layer 0 loses both and keeps one zero head (one KV head)
    assert sorted(map(tuple, result["dropped"])) == [(0, h) for h in range(4)]
    assert result["layers"][0] == {"kv_heads": [0], "q_heads": [-1]}
    assert result["pruned"]["kv_bytes_per_token"] == result["full"]["kv_bytes_per_token"] * 3 // 4
