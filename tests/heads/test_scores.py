"""The one head-scores table type."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headhunt.errors import HeadhuntError
from headhunt.scores import HeadScores, check_heads, parse_heads


def test_matrix_round_trip_and_gqa_kv_heads():
    values = np.arange(12.0).reshape(3, 4)
    t = HeadScores.from_matrix("score", values, n_kv_heads=2)
    np.testing.assert_array_equal(t.matrix("score"), values)
    assert t.df.loc[(t.df.layer == 1) & (t.df["head"] == 3), "kv_head"].item() == 1
    assert t.heads("score", 9.5) == [(2, 3), (2, 2)]
    assert t.top("score", 2)["value"].tolist() == [11.0, 10.0]


def test_extra_keys_select_and_duplicates_are_refused():
    a = HeadScores.from_matrix("m", np.zeros((2, 2)), source="random")
    b = HeadScores.from_matrix("m", np.ones((2, 2)), source="natural")
    both = HeadScores.concat([a, b])
    np.testing.assert_array_equal(both.matrix("m", source="natural"), np.ones((2, 2)))
    with pytest.raises(ValueError, match="several rows per head"):
        both.matrix("m")
    with pytest.raises(KeyError, match="no metric"):
        both.matrix("other")


def test_per_layer_metric_is_refused_by_matrix():
    df = pd.DataFrame(
        {
            "layer": [0, 1],
            "head": [-1, -1],
            "kv_head": [-1, -1],
            "metric": "acc",
            "value": [0.5, 0.7],
        }
    )
    with pytest.raises(ValueError, match="per-layer"):
        HeadScores(df).matrix("acc")


def test_parquet_round_trip(tmp_path):
    t = HeadScores.from_matrix("m", np.random.default_rng(0).random((2, 3)), trial=4)
    t.to_parquet(tmp_path / "s.parquet")
    back = HeadScores.read_parquet(tmp_path / "s.parquet")
    pd.testing.assert_frame_equal(back.df, t.df)
    assert not list(tmp_path.glob("*.tmp"))


def test_parse_and_check_heads():
    assert parse_heads("3-4, 10-0;1-2\n0-0") == [(3, 4), (10, 0), (1, 2), (0, 0)]
    assert parse_heads("  ") == []
    with pytest.raises(HeadhuntError, match="LAYER-HEAD"):
        parse_heads("3:4")
    with pytest.raises(HeadhuntError, match=r"head 2-0 is outside the model \(2 layers x 4"):
        parse_heads("1-3, 2-0", n_layers=2, n_heads=4)
    assert check_heads([np.array([1, 3])], 2, 4) == [(1, 3)]
    with pytest.raises(HeadhuntError, match="head 0--1 is outside"):
        check_heads([(0, -1)], 2, 4)
