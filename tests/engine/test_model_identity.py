"""Runs that name their model (issue 29, item 2): the manifest holds the model's own name,
architecture, parameter count, dtype and the weights' content hash; --resume refuses another
model's weights at the same path, another dtype or another device type in one line."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from headhunt.cli import main


def sinks_argv(model, out, *extra) -> list[str]:
    return ["sinks", "--model", str(model), "--device", "cpu", "--out", str(out), "--n-texts",
            "3", "--length", "24", "--min-queries", "4", "--eps-tokens", "8", *extra]  # fmt: skip


@pytest.fixture
def model_copy(tiny_folder, tmp_path):
    """A private copy of the tiny model folder (the test overwrites its weights)."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_folder, folder)
    return folder


def test_the_manifest_names_the_model_and_its_weights(model_copy, tmp_path):
    assert main(sinks_argv(model_copy, tmp_path / "run")) == 0
    model = json.loads((tmp_path / "run" / "manifest.json").read_text())["model"]
    weights = model_copy / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert model["weights_sha256"] == digest
    assert model["weights"] == [
        {"file": "model.safetensors", "bytes": weights.stat().st_size, "sha256": digest}
    ]
    assert model["name"] and model["name"] != str(model_copy)  # its own name, not the path
    assert model["architecture"] == "llama"
    assert model["n_parameters"] > 0 and model["dtype"] == "float32"
    assert model["spec"] == str(model_copy)


def _interrupted_after_one_text(argv, monkeypatch):
    from headhunt.engine import RunContext

    real = RunContext.append

    def append_then_stop(self, name, record):
        real(self, name, record)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(RunContext, "append", append_then_stop)
        assert main(argv) == 130


def _refused(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("headhunt")]
    assert len(err) == 1, err
    return err[0]


def test_resume_refuses_another_dtype(model_copy, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _interrupted_after_one_text(sinks_argv(model_copy, out), monkeypatch)
    err = _refused(capsys, sinks_argv(model_copy, out, "--dtype", "bfloat16", "--resume"))
    assert "dtype float32 -> bfloat16" in err and "--force" in err
    assert main(sinks_argv(model_copy, out, "--resume")) == 0  # the same setting resumes


def test_resume_refuses_another_models_weights_at_the_same_path(
    model_copy, tmp_path, monkeypatch, capsys
):
    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path / "run"
    _interrupted_after_one_text(sinks_argv(model_copy, out), monkeypatch)
    weights = model_copy / "model.safetensors"
    tensors = {k: v + 0.01 if v.is_floating_point() else v for k, v in load_file(weights).items()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, weights, metadata={"format": "pt"})
    assert torch.is_tensor(next(iter(tensors.values())))
    err = _refused(capsys, sinks_argv(model_copy, out, "--resume"))
    assert "weights of" in err and "--force" in err
    assert (tmp_path / "run.partial").is_dir()  # the finished work is still there
