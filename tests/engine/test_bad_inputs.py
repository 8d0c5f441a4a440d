"""One table of bad inputs, one row per flag or file (issue 18, items 13-14): each is refused in
one line with exit status 2, before any model loads (the model named does not exist, so a check
made after loading would report the model instead), and leaves nothing behind.

Add a row for every new flag."""

from __future__ import annotations

import json

import pytest

from headhunt.cli import main

NO_MODEL = "/nonexistent/model"

ROWS = [
    # retrieval
    (["retrieval", "--batch-size", "-3"], "--batch-size must be at least 0"),
    (["retrieval", "--threshold", "nan"], "not a finite number"),
    (["retrieval", "--threshold", "inf"], "not a finite number"),
    (["retrieval", "--repeats", "0"], "repeats and max_new_tokens must be at least 1"),
    (["retrieval", "--max-new-tokens", "0"], "repeats and max_new_tokens must be at least 1"),
    (["retrieval", "--lengths", "12"], "too short"),
    (["retrieval", "--lengths", "1,x"], "comma-separated"),
    (["retrieval", "--depths", "120"], "outside 0..100"),
    (["retrieval", "--depths", "nan"], "comma-separated"),
    (["retrieval", "--needles", "unicorn"], "unknown needle"),
    (["retrieval", "--kv-aggregate", "median"], "unknown --kv-aggregate"),
    (["retrieval", "--haystack", "/nonexistent/hay.txt"], "hay.txt"),
    (["retrieval", "--top", "-1"], "--top must not be negative"),
    (["retrieval", "--nproc", "0"], "--nproc must be at least 1"),
    (["retrieval", "--nproc", "99", "--device", "cpu"], "exceeds the"),
    # sinks
    (["sinks", "--n-texts", "0"], "--n-texts must be at least 1"),
    (["sinks", "--length", "1"], "--length must be at least 2"),
    (["sinks", "--tau", "2"], "tau must be in"),
    (["sinks", "--eps", "0"], "eps must be in"),
    (["sinks", "--min-queries", "0"], "min_queries"),
    (["sinks", "--eps-tokens", "1"], "eps_tokens"),
    (["sinks", "--min-query-share", "1"], "min_query_share"),
    (["sinks", "--texts", "/nonexistent/texts.jsonl"], "no texts file"),
    (["sinks", "--texts", "BINARY"], "cannot read"),
    (["sinks", "--top", "-1"], "--top must not be negative"),
    (["sinks", "--nproc", "99", "--device", "cpu"], "exceeds the"),
    # ngram
    (["ngram", "--order-mass", "-3"], "--order-mass must be in [0, 1]"),
    (["ngram", "--min-queries", "-1"], "--min-queries must be at least 1"),
    (["ngram", "--order-contrast", "2"], "--order-contrast must be in [-1, 1]"),
    (["ngram", "--k-max", "9"], "--k-max must be in 1..8"),
    (["ngram", "--n-seqs", "0"], "--n-seqs must be at least 1"),
    (["ngram", "--n-texts", "0"], "--n-texts must be at least 1"),
    (["ngram", "--repeats", "1"], "--repeat-len and --repeats must be >= 2"),
    (["ngram", "--planted-len", "2"], "--planted-len must be at least 8"),
    (["ngram", "--text-tokens", "1"], "--text-tokens must be at least 2"),
    (["ngram", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["ngram", "--inputs", "bogus"], "unknown --inputs"),
    (["ngram", "--texts", "/nonexistent/t.txt"], "cannot read texts"),
    (["ngram", "--top", "-1"], "--top must not be negative"),
    # mqar
    (["mqar", "--layout", "bogus"], "unknown --layout"),
    (["mqar", "--pairs", "0"], "--pairs must be positive"),
    (["mqar", "--tokens-per-pair", "2"], "--tokens-per-pair must be at least 4"),
    (["mqar", "--gaps", "-1"], "--gaps must be >= 0"),
    (["mqar", "--examples", "0"], "--examples must be at least 1"),
    (["mqar", "--head-examples", "0"], "--examples must be at least 1"),
    (["mqar", "--heads-cell", "4"], "--heads-cell takes N,GAP"),
    (["mqar", "--top-k", "0"], "--top-k >= 1"),
    (["mqar", "--random-sets", "-1"], "--random-sets >= 0"),
    (["mqar", "--mask-mode", "zero"], "--mask-mode must be"),
    (["mqar", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["mqar", "--power-a", "2"], "--power-a must be in (0, 1]"),
    # circuits
    (["circuits", "--dict-size", "1"], "--dict-size must be at least 2"),
    (["circuits", "--lr", "-1"], "--lr must be positive"),
    (["circuits", "--epochs", "0"], "--epochs must be at least 1"),
    (["circuits", "--l1", "-1"], "--l1 must not be negative"),
    (["circuits", "--edge-top-fraction", "5"], "--edge-top-fraction must be in (0, 1]"),
    (["circuits", "--truth-share", "2"], "--truth-share must be in (0, 1]"),
    (["circuits", "--truth-top", "0"], "--truth-top must be at least 1"),
    (["circuits", "--truth-from", "/nonexistent/run"], "no run directory"),
    (["circuits", "--trials", "0"], "trial"),
    (["circuits", "--sae-examples", "0"], "SAE training example"),
    (["circuits", "--subsample", "2"], "subsample must be in"),
    (["circuits", "--pairs", "1"], "--pairs must be at least 2"),
    (["circuits", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["circuits", "--circuit-size", "0"], "--circuit-size must be at least 1"),
    (["circuits", "--circuit-size", "2", "--circuit-threshold", "0.5"], "not both"),
    (["circuits", "--task-file", "/nonexistent/pairs.jsonl"], "no task file"),
    (["circuits", "--task-file", "BINARY"], "not UTF-8"),
    (["circuits", "--top", "-1"], "--top must not be negative"),
    # ablate: the retrieval run it reads
    (["ablate", "--scores", "/nonexistent/run"], "no run directory"),
    (["ablate", "--scores", "NOT_A_RUN"], "not a finished run"),
    (["ablate", "--scores", "CORRUPT_SCORES"], "scores.parquet is unreadable"),
    (["ablate", "--scores", "NO_SCORES"], "scores.parquet is missing"),
    (["ablate", "--scores", "NO_MODEL_RUN"], "does not say which model"),
    (["ablate", "--scores", "RUN", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["ablate", "--scores", "RUN", "--batch-size", "-1"], "--batch-size must be at least 1"),
    (["ablate", "--scores", "RUN", "--top-k", "0"], "--top-k must be at least 1"),
    (["ablate", "--scores", "RUN", "--draws", "0"], "--draws must be at least 1"),
    # prune, kv-eval: the run they rank by and their sweeps
    (["prune"], "give exactly one of --keep"),
    (["prune", "--keep", "0.5"], "give --scores"),
    (["prune", "--scores", "RUN", "--keep", "2"], "--keep must be in [0, 1]"),
    (["prune", "--scores", "RUN", "--keep", "0.5", "--metric", "nope"], "no metric 'nope'"),
    (["prune", "--scores", "RUN", "--keep", "0.5", "--unit", "layer"], "unknown --unit"),
    (["prune", "--drop-heads", "1-1", "--evaluate"], "--evaluate compares rankings"),
    (["kv-eval", "--fractions", "1.5"], "--fractions must be in [0, 1]"),
    (["kv-eval", "--random-draws", "0"], "nothing to rank by"),
    (["kv-eval", "--duo-pattern", "/nonexistent"], "is not a folder"),
    (["kv-eval", "--tasks", "qa"], "unknown task or needle 'qa'"),
    (["kv-eval", "--scores", "/nonexistent/run"], "neither a run directory"),
    (["kv-eval", "--recent", "0"], "--recent must be at least 1"),
    # calibrate
    (["calibrate", "--task", "BINARY"], "cannot read task file"),
    (["calibrate", "--task", "no-such-task"], "no bundled task"),
    # probe: the user's JSONL target (read before the model loads; JSON allows NaN, Infinity)
    (["probe", "--target", "jsonl", "--data", "NAN_LABELS"], "nan_labels.jsonl:2: label must be"),
    (["probe", "--target", "jsonl", "--data", "INF_LABELS"], "inf_labels.jsonl:1: label must be"),
    (["probe", "--target", "jsonl", "--data", "BINARY"], "cannot read"),
    (["probe", "--target", "jsonl"], "--target jsonl needs --data FILE"),
    (["probe"], "--target is required"),
    (["probe", "--target", "ngram", "--data", "x.jsonl"], "--data is only for --target jsonl"),
    (["probe", "--target", "ngram", "--texts", "0"], "--texts must be at least 1"),
    (["probe", "--target", "ngram", "--shard-size", "0"], "--shard-size must be at least 1"),
    # taskheads: the user's JSONL (read before the model loads) and the causal check's grid
    (["taskheads", "--input", "/nonexistent/task.jsonl"], "cannot read"),
    (["taskheads", "--input", "TASK_BAD_ROW"], "task_bad_row.jsonl line 2: not JSON"),
    (["taskheads", "--input", "TASK_NO_ANSWER"], "task_no_answer.jsonl line 1: missing answer"),
    (["taskheads", "--score-examples", "24"], "must leave examples to evaluate"),
    (["taskheads", "--modes", "half"], "unknown --modes"),
    (["taskheads", "--ks", "0"], "--ks must be at least 1"),
    # resuming a run whose files are corrupt
    (["sinks", "--out", "CORRUPT_RUN", "--resume"], "manifest.json is unreadable or corrupt"),
    (["sinks", "--out", "CORRUPT_PARTIAL", "--resume"], "parameters.json is unreadable"),
]


def _layout(tmp_path):
    """The files the rows name."""
    from headhunt.scores import HeadScores

    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    manifest = {"method": "retrieval", "parameters": {}, "model": {"n_layers": 2, "n_heads": 4}}
    scores = HeadScores.from_matrix("retrieval_score", [[0.1, 0.2, 0.3, 0.4]] * 2, n_kv_heads=2)
    runs = {}
    for name, manifest_text, parquet in [
        ("RUN", json.dumps(manifest), "ok"),
        ("NO_MODEL_RUN", json.dumps({**manifest, "model": None}), "ok"),
        ("CORRUPT_SCORES", json.dumps(manifest), b"PAR1 truncated"),
        ("NO_SCORES", json.dumps(manifest), None),
        ("CORRUPT_RUN", "{not json", "ok"),
    ]:
        folder = tmp_path / name.lower()
        folder.mkdir()
        (folder / "manifest.json").write_text(manifest_text)
        if parquet == "ok":
            scores.to_parquet(folder / "scores.parquet")
        elif parquet is not None:
            (folder / "scores.parquet").write_bytes(parquet)
        runs[name] = folder
    (tmp_path / "not_a_run").mkdir()
    runs["NOT_A_RUN"] = tmp_path / "not_a_run"
    partial = tmp_path / "corrupt_partial.partial"
    partial.mkdir()
    (partial / "parameters.json").write_text("{")
    runs["CORRUPT_PARTIAL"] = tmp_path / "corrupt_partial"
    runs["BINARY"] = binary
    line = '{"text": "the code is blue", "position": 2, "label": %s}\n'
    for name, labels in (("NAN_LABELS", ["0.5", "NaN"]), ("INF_LABELS", ["-Infinity", "1.5"])):
        runs[name] = tmp_path / f"{name.lower()}.jsonl"
        runs[name].write_text("".join(line % y for y in labels))
    good = {"context": ["the code is blue"], "question": "what is the code?", "answer": "blue"}
    for name, lines in (("TASK_BAD_ROW", [json.dumps(good), "{oops"]),
                        ("TASK_NO_ANSWER", [json.dumps({**good, "answer": ""})])):  # fmt: skip
        runs[name] = tmp_path / f"{name.lower()}.jsonl"
        runs[name].write_text("\n".join(lines) + "\n")
    return runs


@pytest.mark.parametrize(("argv", "message"), ROWS, ids=[" ".join(r[0]) for r in ROWS])
def test_bad_input_is_refused_in_one_line_before_the_model_loads(tmp_path, capsys, argv, message):
    runs = _layout(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    before_bytes = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    argv = [str(runs.get(a, a)) for a in argv]
    full = [argv[0], "--model", NO_MODEL, "--out", str(tmp_path / "a" / "run"), *argv[1:]]
    try:
        code = main(full)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert message in err
    assert "unknown model" not in err  # the options were checked first
    # Nothing written, nothing removed, no folder made.
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert all(p.read_bytes() == b for p, b in before_bytes.items())
