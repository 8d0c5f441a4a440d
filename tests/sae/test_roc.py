"""Binarised ground truth, ROC AUC and ROC plots."""

from __future__ import annotations

import numpy as np
import pytest

from headhunt.errors import HeadhuntError
from headhunt.sae import roc


def test_binarize_by_share_and_top():
    effect = np.array([[4.0, -3.0], [2.0, 1.0]])  # |effect| total 10
    # 50%: 4 alone is 40%, 4 + 3 = 70% >= 50%: two heads
    assert roc.binarize_truth(effect).tolist() == [[True, True], [False, False]]
    assert roc.binarize_truth(effect, share=0.4).tolist() == [[True, False], [False, False]]
    assert roc.binarize_truth(effect, share=0.85).sum() == 3
    assert roc.binarize_truth(effect, top=3).tolist() == [[True, True], [True, False]]


def test_binarize_errors():
    with pytest.raises(HeadhuntError, match="not both"):
        roc.binarize_truth(np.ones(4), share=0.5, top=2)
    with pytest.raises(HeadhuntError, match="share"):
        roc.binarize_truth(np.ones(4), share=1.5)
    with pytest.raises(HeadhuntError, match="size"):
        roc.binarize_truth(np.ones(4), top=4)
    with pytest.raises(HeadhuntError, match="zero"):
        roc.binarize_truth(np.zeros(4))


def test_roc_auc_values():
    truth = np.array([True, True, False, False, False])
    assert roc.roc_auc([5, 4, 3, 2, 1], truth) == 1.0
    assert roc.roc_auc([1, 2, 3, 4, 5], truth) == 0.0
    assert roc.roc_auc([1, 1, 1, 1, 1], truth) == 0.5  # ties count one half
    # one circuit head above all three others, one above two of three: (3 + 2) / 6
    assert np.isclose(roc.roc_auc([5, 2.5, 3, 2, 1], truth), 5 / 6)
    with pytest.raises(HeadhuntError, match="both"):
        roc.roc_auc([1, 2], np.array([True, True]))


def test_roc_curve_and_figure(tmp_path):
    truth = np.array([True, False, True, False])
    c = roc.roc_curve(np.array([0.9, 0.1, 0.4, 0.5]), truth)
    assert c.fpr[0] == 0 and c.tpr[-1] == 1 and np.isclose(c.auc, 0.75)
    fig = roc.roc_figure({"a": c}, "t")
    assert roc.write_figure(fig, tmp_path / "r.html") is None
    assert "AUC 0.750" in (tmp_path / "r.html").read_text()


@pytest.mark.slow
def test_png_through_kaleido(tmp_path):
    fig = roc.roc_figure({"a": roc.roc_curve(np.array([1, 0]), np.array([True, False]))}, "t")
    note = roc.write_figure(fig, tmp_path / "r.html", tmp_path / "r.png")
    # kaleido needs a Chrome; where there is none the note says so and the HTML is still there
    assert (tmp_path / "r.html").is_file()
    if note is None:
        assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    else:
        assert note.startswith("PNG not written")
