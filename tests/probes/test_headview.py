"""The head view at any length (probes/headview.py): a planted head whose answer is known in
closed form, the dense oracle on short prompts (a sliding-window layer of Gemma 3 too), no
N x N tensor anywhere (every tensor the forward and the view create is watched), the
downsampled tracks and the saved file."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionHook
from headhunt.probes.headview import HeadView, downsample, head_view

SINK, LOGIT = 5, 4.0  # the planted head puts logit LOGIT on key SINK, 0 on every other key


class PlantKey(AttentionHook):
    """Head ``head``: every query is e0, key SINK is e0 * LOGIT / scale, every other key 0,
    so query i >= SINK scores LOGIT on key SINK and 0 on its i other keys."""

    def __init__(self, head: int, group: int):
        self.head, self.kv = head, head // group

    def before(self, call) -> None:
        q, k = call.query.clone(), call.key.clone()
        q[:, self.head] = 0
        q[:, self.head, :, 0] = 1
        k[:, self.kv] = 0
        k[:, self.kv, SINK, 0] = LOGIT / call.scaling
        call.query, call.key = q, k


@pytest.fixture(scope="module")
def long_tiny():
    from headhunt.probes.tiny import tiny_llama

    return tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2, max_context=8192)


def ids_of(model, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, model.vocab_size, (n,), generator=g)


def test_a_planted_head_gives_its_closed_form_answer(long_tiny):
    n, layer, head = 300, 1, 2
    plant = PlantKey(head, long_tiny.group_size)
    with long_tiny.hooks(plant, layers=[layer]):
        view = head_view(long_tiny, ids_of(long_tiny, n), layer, head, rows=[100, 3])
    i = np.arange(n)
    e = math.exp(LOGIT)
    # Query i >= SINK sees i + 1 keys: key SINK at logit LOGIT, i keys at 0.
    p_sink = np.where(i >= SINK, e / (e + i), 1 / (i + 1))
    assert (view.argmax[SINK:] == SINK).all()
    assert (view.argmax[:SINK] == 0).all()  # all ties: the lowest index
    np.testing.assert_allclose(view.top_prob, p_sink, rtol=1e-5)
    other = np.where(i >= SINK, 1 / (e + i), 1 / (i + 1))
    entropy = -(p_sink * np.log(p_sink)) - np.where(i >= SINK, i, i + 1) * other * np.log(other)
    entropy[:SINK] = np.log(i[:SINK] + 1)
    np.testing.assert_allclose(view.entropy, entropy, rtol=1e-4, atol=1e-6)
    assert view.col_sum[SINK] == pytest.approx(p_sink[SINK:].sum(), rel=1e-5)
    assert view.looked_at(1)[0] == SINK
    # The exact row of query 100: LOGIT on SINK, uniform elsewhere, nothing in the future.
    row = view.row(100)
    assert row[SINK] == pytest.approx(e / (e + 100), rel=1e-5)
    assert row[101:].max() == 0 and row[:101].sum() == pytest.approx(1, abs=1e-5)
    assert sorted(view.rows) == [3, 100, n - 1]


def test_matches_the_dense_attention_of_the_layer_on_short_prompts(long_tiny, tmp_path):
    from headhunt.views.attention import head_attention

    ids = ids_of(long_tiny, 200, seed=1)
    for layer, head in ((0, 1), (1, 3)):
        view = head_view(long_tiny, ids, layer, head)
        dense = head_attention(long_tiny, ids, layer, head).probs
        assert (view.argmax == dense.argmax(1)).all()
        np.testing.assert_allclose(view.col_sum, dense.sum(0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(view.top_prob, dense.max(1), rtol=1e-4, atol=1e-6)
        for q in (0, 57, 199):
            np.testing.assert_allclose(view.row(q), dense[q], rtol=1e-4, atol=1e-6)


def test_a_sliding_window_layer_of_gemma_matches_its_dense_attention(gemma):
    """Layer 0 of Gemma 3 slides over 512 tokens: a 700-token prompt runs past the window."""
    from headhunt.views.attention import head_attention

    ids = ids_of(gemma, 700, seed=2)
    view = head_view(gemma, ids, 0, 1, rows=[650], tokens=False)
    dense = head_attention(gemma, ids, 0, 1, max_tokens=700).probs
    assert (view.row(650)[: 650 - 511] == 0).all()  # outside the window
    np.testing.assert_allclose(view.row(650), dense[650], rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(view.col_sum, dense.sum(0), rtol=1e-3, atol=1e-4)
    assert (view.argmax == dense.argmax(1)).mean() > 0.99  # float ties may differ


def test_no_tensor_of_the_forward_or_the_view_holds_a_quarter_of_n_by_n(long_tiny, largest_tensor):
    n = 4096
    ids = ids_of(long_tiny, n, seed=3)
    with largest_tensor() as watch:
        view = head_view(long_tiny, ids, 1, 0, rows=[1000], tokens=False)
    assert view.n == n and len(view.row(1000)) == n
    assert 0 < watch.largest < n * n // 4, watch.largest


def test_downsampled_tracks_keep_every_spike_with_its_position():
    values = np.zeros(131_072)
    values[77_777] = 9.0
    values[5] = -3.0
    track = downsample(values, bins=1000)
    assert len(track.first) <= 1000 and not track.exact
    assert track.high.max() == 9 and track.at_high[track.high.argmax()] == 77_777
    assert track.low.min() == -3 and track.at_low[track.low.argmin()] == 5
    assert track.last[-1] == 131_071
    zoom = downsample(values, 77_700, 77_800, bins=1000)
    assert zoom.exact and zoom.first[0] == 77_700 and zoom.high[77] == 9


def test_a_saved_view_loads_back_and_refuses_rows_it_did_not_keep(long_tiny, tmp_path):
    view = head_view(long_tiny, ids_of(long_tiny, 120), 0, 2, rows=[10])
    back = HeadView.load(view.save(tmp_path / "view.npz"))
    for name in ("argmax", "entropy", "col_sum", "lse"):
        np.testing.assert_array_equal(getattr(back, name), getattr(view, name))
    np.testing.assert_array_equal(back.row(10), view.row(10))
    assert back.tokens == view.tokens and back.layer == 0 and back.head == 2
    with pytest.raises(HeadhuntError, match="keeps exact rows only for queries 10, 119"):
        back.row(50)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(HeadhuntError, match="not a head view file"):
        HeadView.load(tmp_path / "junk.npz")


def test_bad_heads_and_lengths_are_refused_in_one_line(long_tiny):
    with pytest.raises(HeadhuntError, match="outside the model"):
        head_view(long_tiny, [1, 2, 3], 2, 0)
    with pytest.raises(HeadhuntError, match="takes at most 8192"):
        head_view(long_tiny, ids_of(long_tiny, 8193), 0, 0)
    with pytest.raises(HeadhuntError, match="outside the prompt"):
        head_view(long_tiny, [1, 2, 3], 0, 0, rows=[3])
