"""`--device-map` (accelerate's dispatch): every analysis gives the numbers of the undispatched
model, through accelerate's hooks on a CPU map here and split over two GPUs on a 2-GPU machine."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from headhunt.cli import main
from headhunt.probes.hooked import HookedModel, dispatch, parse_device_map

WORDS = "the secret code of the vault is blue . remember the code and read the answer . "
MODULES = ["model.embed_tokens", "model.rotary_emb", "model.layers.0", "model.layers.1"]
MODULES += ["model.norm", "lm_head"]


def layer_map(first, second) -> dict:
    """Embeddings and layer 0 on ``first``; layer 1, the final norm and the LM head on ``second``."""
    return dict(zip(MODULES, [first, first, first, second, second, second], strict=True))


def commands(tiny_folder, probe_folder, tmp_path) -> dict[str, list[str]]:
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": WORDS * k}) + "\n" for k in (4, 5)))
    task = tmp_path / "task.jsonl"
    words = WORDS.split() * 3
    rows = [
        {"text": " ".join(words[i : i + 9]), "labels": ["red", "blue"], "label": label}
        for i, label in enumerate(["red", "blue"] * 12)
    ]
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = ["--model", str(tiny_folder), "--dtype", "float32"]
    return {
        "sinks": ["sinks", *model, "--texts", str(texts), "--min-queries", "8"],
        "ngram": ["ngram", *model, "--n-seqs", "2", "--repeat-len", "12", "--planted-len", "60"]
        + ["--inputs", "random,planted", "--k-max", "3"],
        "mqar": ["mqar", *model, "--pairs", "2,4", "--tokens-per-pair", "8", "--gaps", "0,6"]
        + ["--examples", "3", "--heads-cell", "2,0", "--head-examples", "3", "--top-k", "2"]
        + ["--random-sets", "1"],
        "retrieval": ["retrieval", *model, "--lengths", "128", "--depths", "0,100"]
        + ["--needles", "passkey", "--max-new-tokens", "3"],
        "calibrate": ["calibrate", *model, "--task", str(task), "--n-calib", "6", "--n-dev", "6"]
        + ["--max-heads", "2", "--exclude-layers", "0", "--bootstrap", "100", "--batch-size", "5"],
        "probe": ["probe", "--model", probe_folder, "--dtype", "float32", "--target", "ngram"]
        + ["--texts", "12", "--length", "30", "--grid", "0.01,1", "--heads"],
    }


FILES = {
    "sinks": ["texts.jsonl", "summary.json"],
    "ngram": ["records-random.jsonl", "records-planted.jsonl"],
    "mqar": ["cells.jsonl", "masking.jsonl"],
    "retrieval": ["trials.jsonl", "retrieval_heads.json"],
    "calibrate": ["records.jsonl", "result.json"],
    "probe": [],
}


def compare_runs(a, b, method: str, exact: bool) -> None:
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    placement = {"device", "device_map"}  # recorded by some commands; the rest must agree
    pa, pb = ({k: v for k, v in m["parameters"].items() if k not in placement} for m in (ma, mb))
    assert pa == pb
    sa, sb = (pd.read_parquet(d / "scores.parquet") for d in (a, b))
    if exact:
        pd.testing.assert_frame_equal(sa, sb)
        for name in FILES[method]:
            assert (a / name).read_text() == (b / name).read_text(), name
    else:
        pd.testing.assert_frame_equal(sa, sb, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", ["sinks", "ngram", "mqar", "retrieval", "calibrate", "probe"])
def test_cli_through_accelerate_hooks_on_the_cpu(tiny_folder, probe_folder, tmp_path, method):
    argv = commands(tiny_folder, probe_folder, tmp_path)[method]
    plain, mapped = tmp_path / "plain", tmp_path / "mapped"
    assert main([*argv, "--device", "cpu", "--out", str(plain)]) == 0
    dm = json.dumps(layer_map("cpu", "cpu"))
    assert main([*argv, "--device-map", dm, "--out", str(mapped)]) == 0
    compare_runs(plain, mapped, method, exact=True)


def test_auto_on_a_machine_without_gpus_is_the_cpu(tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = commands(tiny_folder, "", tmp_path)["sinks"]
    plain, auto = tmp_path / "plain", tmp_path / "auto"
    assert main([*argv, "--device", "cpu", "--out", str(plain)]) == 0
    assert main([*argv, "--device-map", "auto", "--out", str(auto)]) == 0
    compare_runs(plain, auto, "sinks", exact=True)
    assert json.loads((auto / "manifest.json").read_text())["model"]["device"] == "cpu"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("everywhere", "unknown --device-map 'everywhere'"),
        ("{not json", "--device-map is not valid JSON"),
        ('{"": "tpu"}', "unknown device 'tpu'"),
    ],
)
def test_bad_device_map_is_one_line(tiny_folder, tmp_path, capsys, value, message):
    argv = commands(tiny_folder, "", tmp_path)["sinks"]
    assert main([*argv, "--device-map", value, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.partial").exists()


def test_nproc_and_device_map_do_not_combine(tiny_folder, tmp_path, capsys):
    argv = commands(tiny_folder, "", tmp_path)["sinks"]
    code = main([*argv, "--device-map", "auto", "--nproc", "2", "--out", str(tmp_path / "r")])
    assert code == 2 and "do not combine" in capsys.readouterr().err


def test_parse_device_map():
    assert parse_device_map("auto") == "auto"
    assert parse_device_map('{"model": "cpu", "lm_head": 0}') == {"model": "cpu", "lm_head": 0}


def test_dispatch_keeps_the_statistics_and_reports_the_devices():
    from headhunt.probes.capture import capture_attention_stats
    from headhunt.probes.tiny import tiny_llama

    m = tiny_llama()
    ids = torch.randint(0, 40, (2, 48))
    ref = capture_attention_stats(m, ids)
    hm = HookedModel(
        model=dispatch(m.model, layer_map("cpu", "cpu")), tokenizer=m.tokenizer, name="t"
    )
    assert hm.devices == ["cpu"] and hasattr(hm.model, "_hf_hook")  # accelerate's hooks
    got = capture_attention_stats(hm, ids)
    for layer in ref:
        for name in ("lse", "argmax", "col_sum"):
            assert torch.equal(getattr(ref[layer], name), getattr(got[layer], name)), name


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["sinks", "ngram", "mqar", "retrieval", "calibrate", "probe"])
def test_split_over_two_gpus_matches_one_gpu(tiny_folder, probe_folder, tmp_path, method):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    argv = commands(tiny_folder, probe_folder, tmp_path)[method]
    one, split = tmp_path / "one", tmp_path / "split"
    assert main([*argv, "--device", "cuda:0", "--out", str(one)]) == 0
    dm = json.dumps(layer_map("cuda:0", "cuda:1"))
    assert main([*argv, "--device-map", dm, "--out", str(split)]) == 0
    manifest = json.loads((split / "manifest.json").read_text())
    assert manifest["model"]["devices"] == ["cuda:0", "cuda:1"]
    compare_runs(one, split, method, exact=False)
    if method == "sinks":  # the balanced map that transformers computes also runs
        auto = tmp_path / "auto"
        assert main([*argv, "--device-map", "auto", "--out", str(auto)]) == 0
        compare_runs(one, auto, method, exact=False)


def test_dispatch_in_bf16_keeps_the_rotary_frequencies_in_float32():
    from headhunt.probes.tiny import tiny_llama

    m = tiny_llama()
    model = dispatch(m.model, layer_map("cpu", "cpu"), "bfloat16")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32


@pytest.mark.parametrize("where", ["cpu", pytest.param("two_gpus", marks=pytest.mark.gpu)])
def test_circuits_on_a_split_planted_model(tmp_path, monkeypatch, where):
    # The planted model (sae/planted.py) is built in memory, so the command gets it through
    # the engine's ModelSpec.load: once whole, once dispatched over two devices (layer 2, which holds the
    # planted heads, on the second). Capture, SAE, patching and EAP (gradients through the
    # split model) must find the same circuit with the same patching effects.
    from headhunt.engine import ModelSpec
    from headhunt.sae.planted import planted_model

    if where == "two_gpus" and torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    first, second = ("cpu", "cpu") if where == "cpu" else ("cuda:0", "cuda:1")
    task = tmp_path / "pairs.jsonl"
    pairs = planted_model().pairs(10, seed=0).pairs
    task.write_text("\n".join(json.dumps(p.to_dict()) for p in pairs))
    argv = ["circuits", "--task-file", str(task), "--truth-top", "2", "--trials", "2"]
    argv += ["--epochs", "60", "--no-progress", "--no-png", "--dtype", "float32"]

    whole = planted_model().model
    whole.model.to(first)
    monkeypatch.setattr(ModelSpec, "load", lambda self: whole)
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0

    p = planted_model()
    modules = {"model.embed_tokens": first, "model.rotary_emb": first, "model.layers.0": first}
    modules |= {"model.layers.1": first, "model.layers.2": second, "model.norm": second}
    split = HookedModel(
        model=dispatch(p.model.model, modules | {"lm_head": second}, "float32"),
        tokenizer=p.model.tokenizer,
        name="planted-split",
    )
    monkeypatch.setattr(ModelSpec, "load", lambda self: split)
    assert main([*argv, "--out", str(tmp_path / "split")]) == 0

    a, b = (pd.read_parquet(tmp_path / d / "scores.parquet") for d in ("whole", "split"))
    for metric in ("truth", "patching"):
        va = a[a.metric == metric].value.to_numpy()
        vb = b[b.metric == metric].value.to_numpy()
        np.testing.assert_allclose(va, vb, rtol=1e-4, atol=1e-5, err_msg=metric)
    if where == "cpu":  # accelerate's hooks alone change nothing
        pd.testing.assert_frame_equal(a, b)


def test_ablate_through_accelerate_hooks_on_the_cpu(tiny_folder, tmp_path, rank_every_head):
    scores = tmp_path / "scores"
    argv = commands(tiny_folder, "", tmp_path)["retrieval"]
    assert main([*argv, "--device", "cpu", "--out", str(scores)]) == 0
    rank_every_head(scores)
    ablate = ["ablate", "--model", str(tiny_folder), "--dtype", "float32", "--scores", str(scores)]
    ablate += ["--top-k", "2", "--draws", "2", "--lengths", "128", "--depths", "50"]
    ablate += ["--needles", "passkey", "--max-new-tokens", "3"]
    plain, mapped = tmp_path / "plain", tmp_path / "mapped"
    assert main([*ablate, "--device", "cpu", "--out", str(plain)]) == 0
    dm = json.dumps(layer_map("cpu", "cpu"))
    assert main([*ablate, "--device-map", dm, "--out", str(mapped)]) == 0
    assert (plain / "ablation.json").read_text() == (mapped / "ablation.json").read_text()
