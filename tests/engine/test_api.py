"""`headhunt.run`: one call makes a method's run directory from Python, on an in-memory model,
identical to the CLI's; a finished run is returned without loading a model."""

from __future__ import annotations

import json

import pytest

import headhunt as hh
from headhunt.cli import main
from headhunt.heads.configs import SinksConfig

WORDS = "the secret code of the vault is blue . remember the code and read the answer . "


@pytest.fixture(scope="module")
def memory_model():
    """The weights of ``tiny_folder``, built in memory (never saved)."""
    from headhunt.probes.tiny import tiny_llama

    return tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2, max_context=1024)


def test_sinks_from_python_equals_the_cli(memory_model, tiny_folder, tmp_path):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": WORDS * k}) + "\n" for k in (4, 5)))
    config = SinksConfig(texts=str(texts), min_queries=8, eps_tokens=16)
    run = hh.run("sinks", config, model=memory_model, out=tmp_path / "api", progress=False)
    assert run.method == "sinks" and run.path == tmp_path / "api"
    assert run.manifest["parameters"]["min_queries"] == 8
    cli = tmp_path / "cli"
    argv = ["sinks", "--model", str(tiny_folder), "--texts", str(texts), "--out", str(cli)]
    assert main([*argv, "--min-queries", "8", "--eps-tokens", "16", "--device", "cpu"]) == 0
    names = {p.name for p in cli.iterdir()}
    assert names == {p.name for p in run.path.iterdir()}
    for name in ("texts.jsonl", "scores.parquet", "sinks.parquet", "layers.csv", "summary.json"):
        assert (cli / name).read_bytes() == (run.path / name).read_bytes(), name

    # Finished: returned as it is, no model loaded (no model of that name could be loaded).
    name = run.manifest["parameters"]["model"]
    with pytest.raises(hh.HeadhuntError):
        hh.load_model(name)
    again = hh.run("sinks", config, model_spec=name, out=run.path, resume=True)
    assert again.manifest == run.manifest


def test_retrieval_takes_a_dict_config(memory_model, tmp_path):
    config = {"lengths": [128], "depths": [50.0], "needles": ["passkey"], "max_new_tokens": 3}
    run = hh.run("retrieval", config, model=memory_model, out=tmp_path / "r", progress=False)
    assert run.manifest["summary"]["trials"] == 1
    assert set(run.scores().df.metric) >= {"retrieval_score", "counted_trials"}
    assert len((run.path / "trials.jsonl").read_text().splitlines()) == 1


def test_misuse_is_one_line(memory_model, tmp_path):
    with pytest.raises(hh.HeadhuntError, match="unknown method"):
        hh.run("nothing", model=memory_model)
    with pytest.raises(hh.HeadhuntError, match="no option 'lenghts'"):
        hh.run("retrieval", {"lenghts": [128]}, model=memory_model)
    with pytest.raises(hh.HeadhuntError, match="--n-texts must be at least 1"):
        hh.run("sinks", SinksConfig(n_texts=0), model=memory_model, out=tmp_path / "s")
    with pytest.raises(hh.HeadhuntError, match="needs model_spec"):
        hh.run("sinks", model=memory_model, out=tmp_path / "s", nproc=2)
    assert list(tmp_path.iterdir()) == []
