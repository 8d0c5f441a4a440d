"""Node and edge scores from codes, and circuits cut from scores."""

from __future__ import annotations

import numpy as np
import pytest

from headhunt.errors import HeadhuntError
from headhunt.sae import scoring


def test_node_scores_by_hand():
    # head 0: same codes on both sides; head 1: two positive-only codes; head 2: one of three
    pos = np.array([[1, 5, 7], [1, 6, 7], [2, 5, 8]])
    neg = np.array([[1, 9, 7], [2, 9, 9]])
    s = scoring.node_scores(pos, neg)
    assert s.count.tolist() == [0, 2, 1]
    # head 1: P = {5, 6}, N = {9}: 2 of 3 distinct codes; head 2: P = {7, 8}, N = {7, 9}: 1 of 3
    assert np.allclose(s.normalised, [0, 2 / 3, 1 / 3])
    # share of positive prompts whose code no negative has: head 1 all three, head 2 one (8)
    assert np.allclose(s.pos_only, [0, 1, 1 / 3])
    assert np.isnan(s.changed).all()  # 3 positives, 2 negatives: no pairs


def test_changed_counts_pairs_whose_code_moves():
    pos = np.array([[1, 5], [1, 6], [2, 6], [3, 3]])
    neg = np.array([[1, 6], [1, 5], [2, 6], [4, 3]])
    s = scoring.node_scores(pos, neg)
    # head 0 moves in pair 3 only; head 1 in pairs 0 and 1, though P and N hold the same codes
    assert np.allclose(s.changed, [1 / 4, 2 / 4])
    assert s.count.tolist() == [1, 0]


def test_edge_scores_by_hand():
    pos = np.array([[0, 0, 1], [1, 1, 1], [0, 0, 1]])
    neg = np.array([[0, 1, 1], [1, 0, 1]])
    e = scoring.edge_scores(pos, neg)
    assert e.shape == (3, 3)
    assert np.array_equal(e, e.T) and np.all(np.diag(e) == 0)
    # (0,1): positive pairs {(0,0), (1,1)}, negatives {(0,1), (1,0)}: both new
    assert e[0, 1] == 2
    # (0,2): positives {(0,1), (1,1)}, negatives {(0,1), (1,1)}: none
    assert e[0, 2] == 0
    # (1,2): positives {(0,1), (1,1)}, negatives {(1,1), (0,1)}: none
    assert e[1, 2] == 0


def test_edge_scores_match_a_set_computation():
    rng = np.random.default_rng(0)
    pos, neg = rng.integers(0, 4, (9, 6)), rng.integers(0, 4, (7, 6))
    e = scoring.edge_scores(pos, neg)
    for i in range(6):
        for j in range(6):
            if i == j:
                continue
            p = set(zip(pos[:, i], pos[:, j], strict=True))
            n = set(zip(neg[:, i], neg[:, j], strict=True))
            assert e[i, j] == len(p - n)


def test_edge_head_scores_count_pairs_and_share_ties():
    e = np.zeros((4, 4))
    e[0, 1] = e[1, 0] = 5
    e[2, 3] = e[3, 2] = 3
    # 6 pairs, top half = 3: (0,1), (2,3), then 1 of the 4 pairs tied at 0, shared equally
    h = scoring.edge_head_scores(e, 0.5)
    assert np.isclose(h.sum(), 2 * 3)
    assert np.allclose(h, [1.5, 1.5, 1.5, 1.5])  # one full pair + two quarter pairs each
    e[2, 3] = e[3, 2] = 0
    h = scoring.edge_head_scores(e, 0.5)
    assert np.isclose(h[0], h[1]) and h[0] > h[2]


def test_edge_head_scores_do_not_depend_on_head_order():
    rng = np.random.default_rng(1)
    e = rng.integers(0, 3, (7, 7)).astype(float)
    e = np.triu(e, 1) + np.triu(e, 1).T
    perm = rng.permutation(7)
    h = scoring.edge_head_scores(e)
    hp = scoring.edge_head_scores(e[np.ix_(perm, perm)])
    assert np.allclose(h[perm], hp)


def test_circuit_by_size_and_threshold():
    s = np.array([[0.1, 0.9, 0.0], [0.5, 0.9, 0.2]])
    assert scoring.circuit(s, size=3) == [(0, 1), (1, 1), (1, 0)]
    assert scoring.circuit(s, threshold=0.3) == [(0, 1), (1, 1), (1, 0)]
    assert scoring.circuit(s, threshold=0.95) == []
    with pytest.raises(HeadhuntError):
        scoring.circuit(s)
    with pytest.raises(HeadhuntError):
        scoring.circuit(s, size=2, threshold=0.1)
    with pytest.raises(HeadhuntError):
        scoring.circuit(s, size=7)


def test_bad_codes():
    with pytest.raises(HeadhuntError):
        scoring.node_scores(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(HeadhuntError):
        scoring.edge_scores(np.zeros((0, 3)), np.zeros((2, 3)))
    with pytest.raises(HeadhuntError):
        scoring.edge_head_scores(np.zeros((3, 3)), 0)


def test_head_labels():
    assert scoring.head_labels(2, 2) == ["0.0", "0.1", "1.0", "1.1"]
