"""kill -9 at random points of small CPU runs, then --resume: the run directory equals an
uninterrupted run's (issue 18's fault-injection test).

Each method is killed several times in a row before the final resume: three times in the middle
of a durable write (``HEADHUNT_KILL_AT_WRITE=N``: half of the N-th record or atomic file is on
disk, then SIGKILL), and twice at a random moment after the run folder appeared (seeded, so a
failure replays). That is 65 kills over eleven methods and the two behavioural methods of an
attention-free model (Mamba: needle accuracy and MQAR accuracy, no heads), sinks' last one on a
two-process group (the launcher is killed; its workers die with it)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headhunt.cli import main

WORDS = "the secret code of the vault is blue . remember the code and read the answer . "
THINGS = ["code", "key", "word", "number", "gate", "lamp", "river", "bread", "park", "city"]
COLOURS = [("blue", "red"), ("red", "green"), ("green", "blue")]
TIMES = {"seconds", "trials_per_s", "prefill_s"}  # wall times kept inside a method's files
TRIALS = ["--lengths", "128", "--depths", "0,100", "--needles", "passkey", "--max-new-tokens", "3"]


# The attention-free runs: needle and MQAR accuracy from a Mamba folder (no head files).
ATTENTION_FREE = ("retrieval-mamba", "mqar-mamba")


def case_argv(method: str, model: Path, data: Path) -> list[str]:
    if method in ATTENTION_FREE:  # the same trials from the Mamba folder, no head options
        method, model = method.removesuffix("-mamba"), data / "mamba"
    common = ["--model", str(model), "--device", "cpu"]
    if method == "retrieval":
        return ["retrieval", *common, "--lengths", "128", "--depths", "0,50,100",
                "--needles", "passkey,magic", "--max-new-tokens", "3", "--batch-size", "1"]  # fmt: skip
    if method == "sinks":
        return ["sinks", *common, "--texts", str(data / "texts.jsonl"), "--min-queries", "8",
                "--eps-tokens", "16"]  # fmt: skip
    if method == "ngram":
        return ["ngram", *common, "--texts", str(data / "texts.txt"), "--n-seqs", "3",
                "--repeat-len", "12", "--planted-len", "60", "--text-tokens", "40",
                "--n-texts", "2", "--k-max", "3", "--batch-size", "1"]  # fmt: skip
    if method == "mqar":
        heads = ["--heads-cell", "2,0", "--head-examples", "3", "--top-k", "2",
                 "--random-sets", "2"]  # fmt: skip
        return ["mqar", *common, "--pairs", "2,4", "--tokens-per-pair", "8", "--gaps", "0,6",
                "--examples", "3", *(heads if model.name != "mamba" else [])]  # fmt: skip
    if method == "kv-eval":
        return ["kv-eval", *common, "--fractions", "0,0.5,1", "--lengths", "150", "--depths",
                "50", "--needles", "passkey", "--tasks", "mk_niah", "--task-repeats", "1",
                "--random-draws", "2", "--sink", "2", "--recent", "16"]  # fmt: skip
    if method == "ablate":
        return ["ablate", *common, "--scores", str(data / "retrieval"), *TRIALS, "--top-k", "2",
                "--draws", "2", "--batch-size", "1"]  # fmt: skip
    if method == "calibrate":
        return ["calibrate", *common, "--task", str(data / "task.jsonl"), "--n-calib", "6",
                "--n-dev", "6", "--max-heads", "3", "--exclude-layers", "0", "--bootstrap",
                "100", "--batch-size", "4"]  # fmt: skip
    if method == "prune":
        return ["prune", *common, "--scores", str(data / "retrieval"), "--keep", "0.5",
                "--evaluate", "--draws", "1", "--lengths", "150", "--depths", "50",
                "--ppl-windows", "1"]  # fmt: skip
    if method == "probe":
        return ["probe", *common, "--target", "jsonl", "--data", str(data / "probe.jsonl"),
                "--folds", "2", "--grid", "0.1,1", "--heads", "--shard-size", "4",
                "--drop-states"]  # fmt: skip
    if method == "taskheads":
        return ["taskheads", *common, "--input", str(data / "taskheads.jsonl"),
                "--score-examples", "2", "--ks", "1", "--modes", "mean", "--random-draws",
                "1"]  # fmt: skip
    return ["circuits", *common, "--task-file", str(data / "pairs.jsonl"), "--truth-top", "2",
            "--trials", "3", "--epochs", "30", "--batch-size", "4", "--no-progress",
            "--no-png"]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_folder, rank_every_head) -> Path:
    folder = tmp_path_factory.mktemp("fault-data")
    retrieval = ["retrieval", "--model", str(tiny_folder), "--device", "cpu", *TRIALS]
    assert main([*retrieval, "--out", str(folder / "retrieval")]) == 0  # ablate's, prune's ranking
    rank_every_head(folder / "retrieval")  # the random model's own scores are all 0: all ties
    task = [
        {"text": f"the {t} is {c[0]} so it is {c[0]}", "labels": ["blue", "red", "green"],
         "label": c[0]}
        for t in THINGS + THINGS[::-1] for c in COLOURS
    ]  # fmt: skip
    (folder / "task.jsonl").write_text("".join(json.dumps(r) + "\n" for r in task))
    texts = "".join(json.dumps({"text": WORDS * k}) + "\n" for k in (4, 5, 3))
    (folder / "texts.jsonl").write_text(texts)
    (folder / "texts.txt").write_text(WORDS * 6)
    pairs = []
    for i, thing in enumerate(THINGS):
        a, b = COLOURS[i % len(COLOURS)]
        pairs.append(
            {
                "positive": f"the {thing} is {a} . the {thing} is",
                "negative": f"the {thing} is {b} . the {thing} is",
                "answer": f" {a}",
                "wrong": f" {b}",
            }
        )
    (folder / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    rows = [
        {"text": f"the {thing} is {COLOURS[i % 3][0]}", "substring": thing, "label": i % 2}
        for i, thing in enumerate(THINGS + THINGS[::-1])
    ]
    (folder / "probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    docs = ["it was a sunny day in the park .", "the city is by the gate ."]
    examples = [
        {"context": [f"the secret word is {c[0]} .", *docs], "question": "what is the secret word ?",
         "answer": c[0], "lead": "the secret word is"}
        for c in COLOURS
    ]  # fmt: skip
    (folder / "taskheads.jsonl").write_text("".join(json.dumps(r) + "\n" for r in examples))
    from headhunt.probes.tiny import tiny_causal_lm, word_tokenizer

    tok = word_tokenizer()
    tiny_causal_lm("mamba", vocab_size=len(tok)).save_pretrained(folder / "mamba")
    tok.save_pretrained(folder / "mamba")
    return folder


def _without_times(obj):
    if isinstance(obj, dict):
        return {k: _without_times(v) for k, v in obj.items() if k not in TIMES}
    if isinstance(obj, list):
        return [_without_times(v) for v in obj]
    return obj


def assert_same_run(a: Path, b: Path) -> None:
    """Every file equal, but the manifest (timings: parameters and file list compared), HTML
    (random element ids) and wall times inside a method's JSON, CSV and safetensors files;
    folders (a pruned model) file by file."""
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        pa, pb = a / name, b / name
        if pa.is_dir():
            assert_same_run(pa, pb)
        elif name == "manifest.json":
            ma, mb = (json.loads(p.read_text()) for p in (pa, pb))
            assert (ma["parameters"], ma["files"]) == (mb["parameters"], mb["files"])
        elif name.endswith(".html"):
            continue
        elif name.endswith(".jsonl"):
            ra, rb = ([json.loads(x) for x in p.read_text().splitlines()] for p in (pa, pb))
            assert _without_times(ra) == _without_times(rb), name
        elif name.endswith(".json"):
            ja, jb = (json.loads(p.read_text()) for p in (pa, pb))
            assert _without_times(ja) == _without_times(jb), name
        elif name.endswith(".csv"):
            import pandas as pd

            fa, fb = (pd.read_csv(p) for p in (pa, pb))
            pd.testing.assert_frame_equal(fa.drop(columns=TIMES, errors="ignore"),
                                          fb.drop(columns=TIMES, errors="ignore"))  # fmt: skip
        elif name == "eap.safetensors":
            from safetensors.torch import load_file

            assert load_file(str(pa))["per_pair"].equal(load_file(str(pb))["per_pair"])
        else:
            assert pa.read_bytes() == pb.read_bytes(), name


def _start(argv: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "headhunt", *argv],
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "method",
    [
        "retrieval",
        "sinks",
        "ngram",
        "mqar",
        "circuits",
        "kv-eval",
        "probe",
        "ablate",
        "calibrate",
        "prune",
        "taskheads",
        *ATTENTION_FREE,
    ],  # fmt: skip
)
def test_kill_9_then_resume_gives_the_uninterrupted_run(method, tiny_folder, data, tmp_path):
    argv = case_argv(method, tiny_folder, data)
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert main([*argv, "--out", str(ref)]) == 0
    rng = random.Random(method)
    resumed = [*argv, "--out", str(out), "--resume"]

    # Mid-write (each process counts its own writes): the parameters file, then the first
    # record after it, then the second record of a resumed process.
    for n in (1, 2, 2):
        proc = _start(resumed, {"HEADHUNT_KILL_AT_WRITE": str(n)})
        assert proc.wait(timeout=300) == -signal.SIGKILL, f"write {n} was not reached"
    for k in range(2):  # at a random moment of the work
        group = method == "sinks" and k == 1
        proc = _start([*resumed, "--nproc", "2"] if group else resumed)
        deadline = time.monotonic() + 120
        partial = tmp_path / "run.partial"
        while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert main(resumed) == 0
    assert_same_run(ref, out)
    assert not (tmp_path / "run.partial").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref", "run"]
