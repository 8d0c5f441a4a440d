"""headhunt.atomic: every format by its suffix, read back equal; a failed write leaves the old
file and no temporary."""

from __future__ import annotations

import errno
import json

import numpy as np
import pandas as pd
import pytest
import torch

from headhunt.atomic import write_atomic, write_file
from headhunt.errors import HeadhuntError
from headhunt.scores import HeadScores


def test_each_suffix_reads_back(tmp_path):
    frame = pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]})
    write_file(tmp_path / "x.json", {"v": np.arange(3), "p": tmp_path})
    assert json.loads((tmp_path / "x.json").read_text()) == {"v": [0, 1, 2], "p": str(tmp_path)}
    write_file(tmp_path / "x.jsonl", [{"i": 0}, {"i": 1}])
    assert (tmp_path / "x.jsonl").read_text() == '{"i": 0}\n{"i": 1}\n'
    write_file(tmp_path / "x.csv", frame)
    assert pd.read_csv(tmp_path / "x.csv").equals(frame)
    write_file(tmp_path / "x.parquet", frame)
    assert pd.read_parquet(tmp_path / "x.parquet").equals(frame)
    scores = HeadScores.from_matrix("m", np.eye(2), n_kv_heads=1)
    write_file(tmp_path / "s.parquet", scores)
    assert HeadScores.read_parquet(tmp_path / "s.parquet").df.equals(scores.df)
    write_file(tmp_path / "x.tsv", np.eye(2), fmt="%.1f")
    assert (tmp_path / "x.tsv").read_text() == "1.0\t0.0\n0.0\t1.0\n"
    write_file(tmp_path / "x.html", "<p>hi</p>")
    assert (tmp_path / "x.html").read_text() == "<p>hi</p>"
    write_file(tmp_path / "t.safetensors", {"w": torch.arange(4.0)})
    write_file(tmp_path / "n.safetensors", {"w": np.arange(4.0)})
    from safetensors.numpy import load_file

    assert load_file(str(tmp_path / "t.safetensors"))["w"].tolist() == [0, 1, 2, 3]
    assert load_file(str(tmp_path / "n.safetensors"))["w"].tolist() == [0, 1, 2, 3]
    write_file(tmp_path / "x.png", b"\x89PNG")
    assert (tmp_path / "x.png").read_bytes() == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "x.json"
    write_file(path, {"old": 1})

    def full_disk(tmp):
        tmp.write_text('{"new"')
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(HeadhuntError, match="No space left"):
        write_atomic(path, full_disk)
    assert json.loads(path.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_a_folder_replaces_the_old_one_whole(tmp_path):
    def fill(files):
        def write(tmp):
            tmp.mkdir()
            for name in files:
                (tmp / name).write_text(name)

        return write

    write_atomic(tmp_path / "model", fill(["a", "b"]))
    write_atomic(tmp_path / "model", fill(["c"]))
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["c"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_an_unknown_suffix_is_refused(tmp_path):
    with pytest.raises(HeadhuntError, match="no writer for x.bin"):
        write_file(tmp_path / "x.bin", {"a": 1})
