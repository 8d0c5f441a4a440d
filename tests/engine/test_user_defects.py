"""Defects a new user hit (issue 29, item 5): each refused in one line, or fixed, with no
traceback and nothing left behind."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest
import torch

from headhunt.cli import main

NO_MODEL = "/nonexistent/model"


def _one_line_error(capsys, argv: list[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    # Progress bars (on stderr) may precede the error; the error itself is one line.
    err = "\n".join(
        line
        for line in capsys.readouterr().err.splitlines()
        if "it/s]" not in line and "text/s]" not in line and line.strip()
    )
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "unexpected error" not in err, err
    return err


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
def test_an_absent_mps_device_is_refused_in_one_line(tmp_path, capsys):
    err = _one_line_error(
        capsys, ["sinks", "--model", NO_MODEL, "--device", "mps", "--out", str(tmp_path / "r")]
    )
    assert "mps" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("out", ["/", "LONG_NAME", "DEEP_PATH"])
def test_out_paths_the_filesystem_cannot_hold_are_refused_in_one_line(tmp_path, capsys, out):
    out = {
        "/": "/",
        "LONG_NAME": str(tmp_path / ("a" * 300)),
        "DEEP_PATH": str(tmp_path / ("abc/" * 1500)),
    }[out]
    err = _one_line_error(capsys, ["sinks", "--model", NO_MODEL, "--out", out])
    assert "--out" in err
    assert not any(tmp_path.iterdir())


def _sinks_argv(tiny_folder, out) -> list[str]:
    return ["sinks", "--model", str(tiny_folder), "--device", "cpu", "--out", str(out),
            "--n-texts", "2", "--length", "24", "--min-queries", "4", "--eps-tokens", "8"]  # fmt: skip


def test_a_full_disk_names_the_file_and_leaves_no_temporary(
    tiny_folder, tmp_path, capsys, monkeypatch
):
    """ENOSPC in the middle of a durable write: one line naming the file, no .tmp left."""
    from headhunt import atomic

    real, calls = atomic._sync, []

    def full_disk(f):  # every durable write ends in _sync
        calls.append(f.name)
        if len(calls) == 2:  # the first write (parameters.json) fits, the next does not
            raise OSError(errno.ENOSPC, "No space left on device")
        real(f)

    monkeypatch.setattr(atomic, "_sync", full_disk)
    err = _one_line_error(capsys, _sinks_argv(tiny_folder, tmp_path / "run"))
    assert "No space left on device" in err
    assert str(tmp_path) in err  # the file is named
    assert not list(tmp_path.rglob("*.tmp")), list(tmp_path.rglob("*"))


def test_an_interrupt_before_any_work_does_not_claim_work_was_kept(
    tiny_folder, tmp_path, capsys, monkeypatch
):
    from headhunt.engine import ModelSpec

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(ModelSpec, "load", interrupted)
    assert main(_sinks_argv(tiny_folder, tmp_path / "run")) == 130
    err = capsys.readouterr().err
    assert "finished work is kept" not in err and "nothing" in err
    assert not (tmp_path / "run.partial").exists()


def test_an_interrupt_after_work_was_saved_says_it_is_kept(
    tiny_folder, tmp_path, capsys, monkeypatch
):
    from headhunt.engine import RunContext

    real = RunContext.append

    def append_then_interrupt(self, name, record):
        real(self, name, record)
        raise KeyboardInterrupt

    monkeypatch.setattr(RunContext, "append", append_then_interrupt)
    assert main(_sinks_argv(tiny_folder, tmp_path / "run")) == 130
    assert "finished work is kept, rerun with --resume" in capsys.readouterr().err
    assert (tmp_path / "run.partial").is_dir()


def test_tables_in_a_log_are_not_cut_to_80_columns(capsys):
    import pandas as pd

    from headhunt.methods.base import print_table

    wide = pd.DataFrame({f"column_{'x' * 20}_{i}": [1.0 + i] for i in range(5)})
    print_table(wide, title="wide")
    out = capsys.readouterr().out
    assert "…" not in out
    assert all(f"column_{'x' * 20}_{i}" in out for i in range(5))
    assert max(map(len, out.splitlines())) > 80


def test_kvpress_export_refuses_a_full_fraction_outside_0_1(tmp_path, capsys):
    from headhunt.scores import HeadScores

    run = tmp_path / "run"
    run.mkdir()
    manifest = {"method": "retrieval", "parameters": {}, "model": {"n_layers": 2, "n_heads": 4}}
    (run / "manifest.json").write_text(
        json.dumps({**manifest, "model": {**manifest["model"], "n_kv_heads": 2}})
    )
    HeadScores.from_matrix("retrieval_score", [[0.1, 0.2, 0.3, 0.4]] * 2, n_kv_heads=2).to_parquet(
        run / "scores.parquet"
    )
    out = tmp_path / "press"
    argv = ["export", "--scores", str(run), "--format", "kvpress", "--full-fraction", "2"]
    err = _one_line_error(capsys, [*argv, "--out", str(out)])
    assert "--full-fraction" in err
    assert not out.exists()


def test_retrieval_std_is_the_sample_std_the_dashboard_shows():
    """One std for the same trials: the score table's equals pandas' (the spread view's)."""
    import pandas as pd

    from headhunt.heads.retrieval import aggregate

    class Shape:
        n_layers, n_heads, n_kv_heads, attention_layers = 1, 2, 1, [0]

        def score_kv_heads(self):
            return self.n_kv_heads

    values = [[[0.0, 1.0]], [[1.0, 1.0]], [[0.5, 0.0]]]
    records = [{"counted": True, "scores": v, "on_needle": v} for v in values]
    table = aggregate(records, Shape()).df
    std = table[table.metric == "retrieval_score_std"].sort_values("head")["value"].to_numpy()
    expected = [pd.Series([v[0][h] for v in values]).std() for h in range(2)]
    np.testing.assert_allclose(std, expected)


def test_an_encoder_is_refused_in_one_line_at_load(tmp_path, capsys):
    """A BERT folder loads as BertLMHeadModel (bidirectional): refused, not measured."""
    from transformers import BertConfig, BertLMHeadModel

    from headhunt.probes.tiny import tiny_llama

    folder = tmp_path / "bert"
    tok = tiny_llama(n_layers=1, n_heads=2, n_kv_heads=1).tokenizer
    config = BertConfig(
        vocab_size=max(64, len(tok)), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    BertLMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    capsys.readouterr()
    argv = ["sinks", "--model", str(folder), "--device", "cpu", "--out", str(tmp_path / "run")]
    err = _one_line_error(capsys, argv)
    assert "not causal" in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()


def _tied_run(tmp_path, values) -> str:
    from headhunt.scores import HeadScores

    run = tmp_path / "tied"
    run.mkdir()
    model = {"n_layers": 2, "n_heads": 4, "n_kv_heads": 2}
    manifest = {"method": "retrieval", "parameters": {}, "model": model}
    (run / "manifest.json").write_text(json.dumps(manifest))
    HeadScores.from_matrix("retrieval_score", values, n_kv_heads=2).to_parquet(
        run / "scores.parquet"
    )
    return str(run)


@pytest.mark.parametrize("method", ["ablate", "prune"])
def test_a_ranking_made_only_of_ties_is_refused_before_the_model_loads(tmp_path, capsys, method):
    run = _tied_run(tmp_path, [[0.0] * 4] * 2)
    extra = ["--keep", "0.9"] if method == "prune" else []
    argv = [method, "--model", NO_MODEL, "--scores", run, "--out", str(tmp_path / "o"), *extra]
    err = _one_line_error(capsys, argv)
    assert "the same retrieval_score" in err
    if method == "prune":
        assert "--tiebreak masking" in err


def test_a_cut_inside_equal_scores_is_said():
    from headhunt.heads.interventions.pruning import all_tied, tied_cut

    assert tied_cut([0.9, 0.5, 0.5, 0.5, 0.1], 2) == tied_cut([0.9, 0.5, 0.5, 0.5, 0.1], 2)
    cut = tied_cut([0.9, 0.5, 0.5, 0.5, 0.1], 2)
    assert (cut.chosen, cut.block, cut.value) == (1, 3, 0.5)
    assert tied_cut([0.9, 0.5, 0.5, 0.5, 0.1], 4) is None  # between 0.5 and 0.1
    assert tied_cut([0.9, 0.5], 2) is None
    assert all_tied([0.0, 0.0, 0.0]) and not all_tied([0.0, 0.1])


def test_prune_and_ablate_say_when_their_cut_falls_among_ties():
    from headhunt.methods.ablate import say_tied_cut as ablate_says
    from headhunt.methods.prune import PruneConfig
    from headhunt.methods.prune import say_tied_cut as prune_says
    from headhunt.scores import HeadScores

    said = []

    class Ctx:
        def say(self, text):
            said.append(text)

    matrix = np.array([[0.9, 0.0, 0.0, 0.0], [0.8, 0.0, 0.0, 0.7]])
    prune_says(Ctx(), matrix, None, 6, PruneConfig(keep=0.75, scores="x"))
    assert said[-1].startswith("prune: 2 of the 2 query heads dropped are picked among 5")
    prune_says(Ctx(), matrix, None, 3, PruneConfig(keep=0.375, scores="x"))
    assert len(said) == 1  # a cut between 0.7 and 0.0 picks no tie
    scores = HeadScores.from_matrix("retrieval_score", matrix, n_kv_heads=2)
    ablate_says(Ctx(), scores, 4)
    assert said[-1].startswith("ablate: 1 of the top 4 heads are picked among 5 heads")


def test_a_circuits_last_head_among_ties_is_said():
    from headhunt.methods.circuits import CircuitsConfig, _circuit

    ranking = np.array([[0.9, 0.4], [0.4, 0.1]])
    out = _circuit(CircuitsConfig(circuit_size=2), ranking, "sae_node", None)
    assert out["heads"] == [(0, 0), (0, 1)]
    assert "picked among 2 heads of equal sae_node 0.4" in out["tie"]
    assert "tie" not in _circuit(CircuitsConfig(circuit_size=3), ranking, "sae_node", None)
