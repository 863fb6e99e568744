"""bench/why_feature_drift.py: the share of a feature in the old head's row space and the cosines, by hand."""
from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_a_feature_that_keeps_the_head_directions_but_grows_outside_them():
    drift = runpy.run_path(str(ROOT / "bench" / "why_feature_drift.py"))["drift"]
    head = np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])  # W_old constrains the first two coordinates only
    old = np.array([[3.0, 4, 0, 0], [1, 0, 0, 0]])
    new = np.array([[3.0, 4, 0, 5], [2, 0, 2, 0]])  # the same inside the rows, plus an orthogonal part
    got = drift(old, new, head)
    assert got["share in W_old's rows, old"] == pytest.approx(1.0)
    assert got["share in W_old's rows, new"] == pytest.approx((25 / 50 + 4 / 8) / 2)
    assert got["cos in W_old's rows"] == pytest.approx(1.0)  # inside the rows the two agree exactly


def test_cosines_by_hand_and_a_zero_feature_is_nan():
    from engine.reproduce.outcomes import row_cosines  # the bench's and the reproduce table's one cosine

    got = row_cosines(np.array([[3.0, 4, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]), np.array([[3.0, 4, 0, 5], [2, 0, 2, 0], [1, 0, 0, 0]]))
    np.testing.assert_allclose(got[:2], [25 / (5 * np.sqrt(50)), 2 / np.sqrt(8)], rtol=1e-12)
    assert np.isnan(got[2])


def test_silent_units_by_hand():
    silent_units = runpy.run_path(str(ROOT / "bench" / "why_feature_drift.py"))["silent_units"]
    old = np.array([[1.0, 0, 0], [2, 0, 0]])  # units 1 and 2 never on
    new = np.array([[1.0, 2, 0], [0, 0, 1]])
    got = silent_units(old, new)
    assert got["units silent in old"] == 2 and got["new energy on them"] == pytest.approx((4 + 1) / (1 + 4 + 1))
