"""Attention-free models (Mamba, Mamba-2, Falcon-Mamba, RWKV, xLSTM): their behaviour (MQAR
accuracy from the logits) is measured as for any model; every head measurement is refused in
one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.heads.inputs.mqar_inputs import MQARSpec, generate_mqar
from headhunt.heads.interventions.masking import HeadMask
from headhunt.heads.mqar import run_mqar
from headhunt.probes.hooked import HookedModel
from headhunt.probes.tiny import tiny_causal_lm

FAMILIES = {
    "mamba": {},
    "mamba2": {"expand": 1, "n_groups": 1},
    "falcon_mamba": {},
    "rwkv": {},
    "xlstm": {},  # its forward takes no logits_to_keep: headhunt keeps the asked-for logits
}
REFUSAL = "has no attention layers: head scores need attention"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_mqar_accuracy_is_measured_and_head_scores_refused(family):
    model = tiny_causal_lm(family, **FAMILIES[family])
    hm = HookedModel(model=model, tokenizer=None, name=family)
    assert hm.attention_free and hm.attention_layers == [] and hm.n_heads == 0
    facts = hm.describe()
    assert facts["n_heads"] == 0 and facts["attention_layers"] == [] and facts["head_dim"] is None
    probe = generate_mqar(MQARSpec(vocab_size=64, seq_len=32, n_pairs=4), 6, seed=0)

    # planted: the target of every query is the model's own prediction there (from its logits
    # at every position, computed here without headhunt), so accuracy is 1 exactly when each
    # query is read at its own position, and a target moved off it must then be missed
    with torch.no_grad():
        logits = model(input_ids=probe.ids, use_cache=False).logits
    picked = logits.gather(1, probe.query_pos[..., None].expand(-1, -1, logits.shape[-1]))
    own = dataclasses.replace(probe, target=picked.argmax(-1))
    got = run_mqar(hm, own, batch_size=4)
    assert got.correct.shape == probe.target.shape and got.accuracy == 1.0
    wrong = dataclasses.replace(own, target=(own.target + 1) % 64)
    assert run_mqar(hm, wrong, batch_size=4).accuracy == 0.0

    for refused in (
        lambda: run_mqar(hm, probe, score_heads=True),
        lambda: run_mqar(hm, probe, hooks=[HeadMask([(0, 0)], "query")]),
        lambda: hm.check_attention_layers([0]),
    ):
        with pytest.raises(HeadhuntError, match=REFUSAL) as err:
            refused()
        assert "\n" not in str(err.value)


def test_a_head_method_refuses_before_it_runs(tmp_path):
    from headhunt.engine import execute
    from headhunt.methods import get

    hm = HookedModel(model=tiny_causal_lm("mamba"), tokenizer=None, name="mamba")
    method = get("ngram")
    with pytest.raises(HeadhuntError, match=REFUSAL) as err:
        execute(method, method.Config(), out=tmp_path / "run", model=hm, show=False)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family", ["mamba", "rwkv"])
def test_mqar_cli_measures_accuracy_without_heads(family, tmp_path, capsys):
    """`headhunt mqar` on an attention-free model folder: the accuracy grid (argmax over the
    vocabulary, as for any model), no recall heads, no masking, an empty scores table; the run
    reprints and resumes."""
    import json
    import os

    import pandas as pd

    from headhunt.cli import main
    from headhunt.probes.tiny import word_tokenizer

    tok = word_tokenizer()
    model = tiny_causal_lm(family, vocab_size=len(tok), **FAMILIES[family])
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    out = tmp_path / "run"
    argv = ["mqar", "--model", str(folder), "--out", str(out), "--device", "cpu"]
    argv += ["--pairs", "2,4", "--tokens-per-pair", "8", "--gaps", "0,6", "--examples", "3"]
    assert main(argv) == 0
    files = set(os.listdir(out))
    assert {"manifest.json", "scores.parquet", "accuracy.csv", "summary.json", "mqar.html"} <= files
    assert "masking.json" not in files
    acc = pd.read_csv(out / "accuracy.csv")
    assert len(acc) == 4 and (acc.queries == 3 * acc.n_pairs).all()
    assert acc.accuracy.between(0, 1).all()
    assert len(pd.read_parquet(out / "scores.parquet")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["n_heads"] == 0
    printed = capsys.readouterr().out
    assert "MQAR accuracy" in printed and "No attention layers" in printed
    assert main([*argv, "--resume"]) == 0
    from headhunt.views.runs import scan_runs

    (entry,) = [e for e in scan_runs(tmp_path) if e.path == out]
    assert entry.ok, entry.problem  # the dashboard lists it (0 heads is not a broken manifest)


@pytest.mark.parametrize(
    ("family", "sizes", "own_state"),
    [("mamba", {}, True), ("xlstm", {}, False), ("xlstm", {"hidden_size": 128}, True)],
)
def test_needle_decoding_equals_recomputing(family, sizes, own_state, monkeypatch):
    """The needle trials of a model with no attention decode through its own generate (its
    own recurrent state): the tokens equal greedy argmax over full forwards without any state,
    and a row's length runs through its first stop token. A tiny xLSTM, whose own cache has
    the wrong shape for its layers, recomputes every step instead; a 128-wide one uses its
    state."""
    from headhunt.heads import retrieval
    from headhunt.heads.retrieval import generate_greedy
    from headhunt.probes.tiny import word_tokenizer

    recomputed = []
    plain = retrieval._greedy_without_state
    monkeypatch.setattr(
        retrieval, "_greedy_without_state", lambda *a: recomputed.append(1) or plain(*a)
    )
    tok = word_tokenizer()
    model = tiny_causal_lm(family, vocab_size=len(tok), **FAMILIES[family], **sizes)
    hm = HookedModel(model=model, tokenizer=tok, name=family)
    prompts = torch.randint(4, len(tok), (2, 24), generator=torch.Generator().manual_seed(0))
    seq = prompts
    with torch.no_grad():
        for _ in range(5):
            nxt = model(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], 1)
    want = seq[:, prompts.shape[1] :]
    tokens, lengths = generate_greedy(hm, prompts, 5, {int(want[0, 2])})
    assert torch.equal(tokens[0, :3], want[0, :3]) and int(lengths[0]) == 3
    free, n = generate_greedy(hm, prompts, 5, set())
    assert torch.equal(free, want) and n.tolist() == [5, 5]
    assert bool(recomputed) != own_state


def test_retrieval_cli_measures_needle_accuracy_without_heads(tmp_path, capsys):
    """`headhunt retrieval` on a Mamba folder: every trial decoded and scored for its answer,
    the needle accuracy (answered trials / trials) with its standard error in the manifest, an
    empty scores table, no head files; the run reprints and the dashboard lists it."""
    import json
    import os

    import pandas as pd

    from headhunt.cli import main
    from headhunt.probes.tiny import word_tokenizer
    from headhunt.views.runs import scan_runs

    tok = word_tokenizer()
    tiny_causal_lm("mamba", vocab_size=len(tok)).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    out = tmp_path / "run"
    argv = ["retrieval", "--model", str(tmp_path / "model"), "--out", str(out)]
    argv += ["--lengths", "128", "--depths", "0,50", "--needles", "passkey,magic"]
    argv += ["--max-new-tokens", "3", "--device", "cpu"]
    assert main(argv) == 0
    files = set(os.listdir(out))
    assert {"manifest.json", "scores.parquet", "trials.jsonl"} <= files
    assert not files & {"retrieval_heads.json", "duo_attention.tsv", "retrieval_heatmap.html"}
    summary = json.loads((out / "manifest.json").read_text())["summary"]
    trials = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert summary["trials"] == len(trials) == 4
    answered = sum(r["recall"] > 0.5 for r in trials)
    assert summary["needle_accuracy"] == answered / 4 and summary["counted_trials"] == answered
    assert all(r["response"] is not None for r in trials)
    assert len(pd.read_parquet(out / "scores.parquet")) == 0
    assert "Needle accuracy" in capsys.readouterr().out
    assert main([*argv, "--resume"]) == 0
    (entry,) = [e for e in scan_runs(tmp_path) if e.path == out]
    assert entry.ok, entry.problem
