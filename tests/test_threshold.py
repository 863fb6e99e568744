"""The re-mapped similarity threshold: the lowest new score with the old threshold's precision."""
from __future__ import annotations

import numpy as np
import pytest

from engine.metrics.threshold import matched_threshold, precision_recall_at


def test_a_hand_made_case():
    # old: scores >= 0.5 are {0.9 R, 0.7 R, 0.6 N, 0.5 R} -> precision 3/4, recall 3/4 (4 relevant)
    old_s = [0.9, 0.7, 0.6, 0.5, 0.4, 0.1]
    old_r = [1, 1, 0, 1, 1, 0]
    # new: descending 0.95 R, 0.9 N, 0.8 R, 0.7 R, 0.3 N, 0.2 R -> precision at each cut 1, 1/2, 2/3, 3/4, 3/5, 4/6
    new_s = [0.3, 0.95, 0.8, 0.2, 0.9, 0.7]
    new_r = [0, 1, 1, 1, 0, 1]
    m = matched_threshold(np.array(old_s), np.array(old_r), np.array(new_s), np.array(new_r), 0.5)
    assert (m.precision, m.recall_old) == (0.75, 0.75)
    assert m.t_new == 0.7 and m.precision_new == 0.75 and m.recall_new == 0.75  # the lowest cut with >= 3/4


def test_equals_a_brute_force_search_over_every_threshold():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(5, 60))
        old_s, new_s = rng.integers(0, 12, n) / 10, rng.integers(0, 12, n) / 10  # many ties
        old_r, new_r = rng.random(n) < 0.4, rng.random(n) < 0.4
        t_old = float(rng.choice(old_s))
        m = matched_threshold(old_s, old_r, new_s, new_r, t_old)
        p = old_r[old_s >= t_old].mean()
        assert m.precision == pytest.approx(p)
        good = [t for t in np.unique(new_s) if new_r[new_s >= t].mean() >= p - 1e-12]
        if not good:
            assert m.t_new is None
        else:
            assert m.t_new == min(good)
            assert m.precision_new == pytest.approx(new_r[new_s >= min(good)].mean())
            assert m.recall_new == pytest.approx(new_r[new_s >= min(good)].sum() / max(new_r.sum(), 1))


def test_precision_recall_and_bad_inputs_in_one_line():
    assert precision_recall_at(np.array([0.2, 0.8]), np.array([0, 1]), 0.5) == (1.0, 1.0)
    with pytest.raises(ValueError, match="no old pair scores at or above the threshold 2"):
        matched_threshold(np.array([0.1]), np.array([1]), np.array([0.1]), np.array([1]), 2.0)
    with pytest.raises(ValueError, match="old pairs: 2 scores but 1 relevance flags"):
        matched_threshold(np.array([0.1, 0.2]), np.array([1]), np.array([0.1]), np.array([1]), 0.1)
    with pytest.raises(ValueError, match="new pairs: scores must be finite"):
        matched_threshold(np.array([0.1]), np.array([1]), np.array([np.nan]), np.array([1]), 0.1)
    with pytest.raises(ValueError, match="relevance flags must be 0/1"):
        matched_threshold(np.array([0.1]), np.array([2]), np.array([0.1]), np.array([1]), 0.1)


def test_threshold_at_precision_is_the_lowest_score_keeping_it():
    from engine.metrics.threshold import threshold_at_precision

    s = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    r = np.array([1, 1, 0, 1, 0])  # precision at 0.9, 0.8, 0.7, 0.6, 0.5: 1, 1, 2/3, 3/4, 3/5
    assert threshold_at_precision(s, r, 0.75) == 0.6 and threshold_at_precision(s, r, 0.9) == 0.8
    assert threshold_at_precision(s, np.zeros(5, int), 0.5) is None
    with pytest.raises(ValueError, match="precision must lie in"):
        threshold_at_precision(s, r, 0)
