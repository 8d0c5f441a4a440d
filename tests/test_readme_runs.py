"""README's commands run, in order, as written (issue 29, item 5.4): `make run`'s command, then
every `headhunt ...` line of README's bash blocks, each through the CLI in one fresh folder, so
each command reads only what an earlier one wrote there. It fails when a command is renamed,
loses or misspells a flag, reads a run nothing wrote, or exits with an error.

What differs from a newcomer's shell, so that CI can afford it (about a minute), and nothing else:

- **The model**: the registry name ``smollm2-135m`` resolves to a tiny random Llama (4 layers x
  8 heads, d_model 64, 8k context) whose word-level tokenizer knows the words the commands
  need (the haystack's words, IOI's names, the probe targets' words, the sentiment labels).
  Every flag is parsed and used as written.
- **Sizes**: a few defaults of the longest commands are smaller (the ``SHRUNK`` table: fewer
  needle depths and needles, random draws, MQAR cells, task-head ks, KV-cache fractions, prompt pairs, SAE
  trials, epochs and features; circuits' plots as HTML only); README's own flags are not
  touched, so a value README writes wins.
- **A ranking**: a random model answers no needle, so every head's retrieval score is 0, and
  ablate and prune refuse a ranking made only of ties; after the first command the run's scores
  are given distinct values (``rank_every_head``'s, widened to 32 heads: ablate's 10 heads and 10 random others; calibrate leaves out layers 0, 1
  and the last).
- **My own task**: README's `taskheads --input my_task.jsonl` reads the user's file; the test
  writes a small one in README's format.
- **The dashboard**: `app` would replace the process with Streamlit's server; the test stops at
  the command Streamlit would run and checks it names the runs folder the commands filled.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
from test_readme_path import readme_commands

# Defaults made smaller for CI (config class -> field -> value); README's flags still win.
SHRUNK = {
    "headhunt.heads.configs.NeedlePrompts": {"depths": [50.0], "needles": ["passkey"]},
    "headhunt.heads.configs.NeedleTrialGrid": {"max_new_tokens": 4},
    "headhunt.heads.configs.KVEvalConfig": {
        "lengths": [256],
        "fractions": [0.0, 1.0],
        "random_draws": 1,
        "task_repeats": 1,
    },
    "headhunt.methods.ablate.AblateConfig": {"draws": 1},
    "headhunt.methods.mqar.MQARConfig": {
        "pairs": [4, 8],
        "gaps": [0, 64],
        "examples": 4,
        "head_examples": 8,
        "random_sets": 2,
    },
    "headhunt.methods.taskheads.TaskHeadsConfig": {
        "ks": [1, 4],
        "random_draws": 1,
        "random_from": ["all"],
    },
    "headhunt.sae.configs.CircuitsConfig": {"pairs": 8, "trials": 2, "dict_size": 16, "png": False},
    "headhunt.sae.configs.CircuitConfig": {"epochs": 20},
}


def shrink(monkeypatch) -> None:
    import importlib

    for path, values in SHRUNK.items():
        module, name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        by_name = {f.name: f for f in dataclasses.fields(cls)}
        for field_name, value in values.items():
            f = by_name[field_name]  # a renamed field fails here, not silently
            if f.default_factory is not dataclasses.MISSING:
                monkeypatch.setattr(f, "default_factory", lambda v=value: list(v))
            else:
                monkeypatch.setattr(f, "default", value)


@pytest.fixture(scope="module")
def word_model(tmp_path_factory):
    """A tiny random Llama whose word tokenizer knows every word README's commands need."""
    from headhunt.heads.inputs.needles import default_haystack_text
    from headhunt.probes.targets import MQAR_KEYS, MQAR_VALUES, NGRAM_WORDS
    from headhunt.probes.tiny import tiny_llama, word_tokenizer
    from headhunt.sae import prompt_pairs

    words = {w.lower() for w in re.findall(r"[A-Za-z]{3,}", default_haystack_text())}
    words |= set(NGRAM_WORDS + MQAR_KEYS + MQAR_VALUES + ["positive", "negative"])
    words |= set(prompt_pairs.NAMES + prompt_pairs.ARG_NAMES + prompt_pairs.FUNC_NAMES)
    tok = word_tokenizer(extra_words=sorted(words))
    m = tiny_llama(n_layers=4, n_heads=8, n_kv_heads=2, tokenizer=tok, max_context=8192)
    folder = tmp_path_factory.mktemp("readme-model")
    m.model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def distinct_ranking(run) -> None:
    """Distinct retrieval scores for the 4 x 8 heads: two above retrieval's 0.1 threshold."""
    import numpy as np

    from headhunt.scores import HeadScores

    values = np.array([[0.5, 0.3, *np.linspace(0.09, 0.0, 30)]]).reshape(4, 8)
    HeadScores.from_matrix("retrieval_score", values, n_kv_heads=2).to_parquet(
        run / "scores.parquet"
    )


def my_task(path) -> None:
    """README's `my_task.jsonl`: documents (context), a question and its answer per line."""
    rows = [
        {
            "context": [f"the {k} code is {v} .", "the river is long .", "a gate is open ."],
            "question": f"what is the {k} code ?",
            "answer": v,
        }
        for k, v in [("red", "seven"), ("blue", "four"), ("green", "nine"), ("gold", "two")] * 4
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_readme_commands_run_in_order_as_written(word_model, tmp_path, monkeypatch, capsys):
    from headhunt.cli import main
    from headhunt.commands import app
    from headhunt.probes import loading

    real = loading.resolve_spec
    monkeypatch.setattr(
        loading,
        "resolve_spec",
        lambda spec: ("folder", word_model) if spec == "smollm2-135m" else real(spec),
    )
    shrink(monkeypatch)
    served = []

    def execve(path, argv, env):  # `headhunt app` replaces itself with Streamlit's server
        served.append((argv, env))
        raise SystemExit(0)

    monkeypatch.setattr(app.os, "execve", execve)
    monkeypatch.chdir(tmp_path)
    my_task(tmp_path / "my_task.jsonl")

    commands = readme_commands()
    assert commands[0][0] == "retrieval" and commands[-1][0] == "app"
    for i, argv in enumerate(commands):
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr()
        assert code == 0, f"`headhunt {' '.join(argv)}` exited {code}: {out.err.strip()[-500:]}"
        if i == 0:
            distinct_ranking(tmp_path / "runs" / "retrieval")

    for argv in commands[:-1]:  # every command left its finished run (or export folder)
        out = argv[argv.index("--out") + 1]
        assert (tmp_path / out).is_dir() and not (tmp_path / f"{out}.partial").exists(), out
    ((argv, env),) = served
    runs = argv[argv.index("--runs") + 1]
    assert runs == env["HEADHUNT_RUNS"] == str((tmp_path / "runs").resolve())
    made = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(made) >= 10 and all(
        (tmp_path / "runs" / m / "manifest.json").is_file() for m in made
    )
    assert os.environ.get("HEADHUNT_RUNS") != runs  # the test's own process is untouched
