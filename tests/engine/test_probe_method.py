"""The probe method through the run engine: its probes (one per layer and head) dealt over two
processes give the one-process run directory, and ``headhunt.run`` probes an in-memory model."""

from __future__ import annotations

import headhunt

NGRAM = ["--target", "ngram", "--texts", "24", "--length", "30", "--grid", "0.01,1"]


def test_two_processes_deal_the_probes_and_match_one(probe_folder, tmp_path, one_and_two_processes):
    argv = ["probe", "--model", probe_folder, "--device", "cpu", *NGRAM, "--heads"]
    one, two = one_and_two_processes([*argv, "--drop-states", "--shard-size", "10"], tmp_path)
    assert len((two / "records.jsonl").read_text().splitlines()) == 2 + 2 * 4  # layers + heads


def test_probe_from_python_on_an_in_memory_model(tmp_path):
    from headhunt.probes.targets import MQAR_KEYS, MQAR_VALUES, NGRAM_WORDS
    from headhunt.probes.tiny import tiny_llama, word_tokenizer

    tok = word_tokenizer(extra_words=sorted(set(NGRAM_WORDS + MQAR_KEYS + MQAR_VALUES)))
    model = tiny_llama(tokenizer=tok, max_context=1024)
    config = {"target": "ngram", "texts": 24, "length": 30, "grid": [0.01, 1.0]}
    run = headhunt.run("probe", config, model=model, out=tmp_path / "r", progress=False)
    assert run.method == "probe" and run.manifest["target"]["name"] == "ngram"
    assert run.manifest["parameters"]["dtype"] is None  # no loading options for a model in memory
    acc = run.scores().df.query("metric == 'accuracy'")["value"]
    assert len(acc) == model.n_layers and acc.between(0, 1).all()
