"""The Compatibility page's read model (``engine.read.matrices``) on stored matrices written by hand: the numbers
below are worked out in the comments (the Student-t quantile from scipy), never by calling the engine twice."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from engine.read.matrices import (criterion, gain_shown, paired_range, seed_verdicts, stacked_mean, summary_row,
                                  verdict_total, view_row)

NAN = np.nan


def stored(values, *, no_positive=None, paired=None, **summary) -> dict:
    """A stored matrix as ``app.queries.matrices`` returns it (only the fields the read model reads)."""
    C = np.array(values, dtype=float)
    return {"view": "encoder", "values": C,
            "no_positive": np.zeros(C.shape) if no_positive is None else np.array(no_positive), "summary": {**summary, **({"paired": paired} if paired else {})}}


# seed 0: the new model's queries on the old gallery (0.6) beat the old self-test (0.5): ECC holds, Γ = 0.1 / 0.2
SEED0 = stored([[0.5, NAN], [0.6, 0.7]], no_positive=[[0, 0], [2, 0]], AC=1.0, AA=0.6, ACA=0.6)
# seed 1: 0.4 < 0.5, ECC fails (no Γ); one query without a positive on the diagonal, one below it
SEED1 = stored([[0.5, NAN], [0.4, 0.7]], no_positive=[[1, 0], [1, 0]], AC=0.0, AA=0.5, ACA=0.0)


def test_a_method_over_two_seeds_without_paired_tests():
    row = summary_row("bct", "encoder", [SEED0, SEED1], "none")
    assert (row["method"], row["view"], row["seeds"], row["steps"]) == ("bct", "encoder", 2, 2)
    assert row["AC %"] == pytest.approx(50.0, abs=1e-9)
    assert row["AC % std"] == pytest.approx(100 * math.sqrt(0.5), abs=1e-9)  # sample std of (1, 0)
    assert row["AC % 95% CI"] == "0.0 – 100.0"  # 0.5 +- 12.7 * 0.354, clipped to the share's [0, 1]
    assert row["AA %"] == pytest.approx(55.0, abs=1e-9)
    assert row["cells ✓/✗/?"] == "1/1/–"  # the criterion on point estimates, not tested
    assert row["AC % range (paired)"] is None
    assert row["mean Γ %"] == "50.0"  # only seed 0's cross-test passes ECC: (0.6 - 0.5) / (0.7 - 0.5)
    assert row["queries without a positive"] == 4  # 2 + (1 + 1): the lower triangle with its diagonal


def test_the_interval_over_three_seeds_is_students():
    seeds = [stored([[0.5, NAN], [0.6, 0.7]], AA=aa) for aa in (0.50, 0.55, 0.60)]
    half = stats.t.ppf(0.975, 2) * 0.05 / math.sqrt(3)  # mean 0.55, sample std 0.05
    lo, hi = 100 * (0.55 - half), 100 * (0.55 + half)
    assert (f"{lo:.1f}", f"{hi:.1f}") == ("42.6", "67.4")
    assert summary_row("m", "encoder", seeds, "none")["AA % 95% CI"] == "42.6 – 67.4"


def test_the_stored_tie_rule_judges_a_tied_cross_test():
    tied = [[0.5, NAN], [0.5, 0.7]]
    assert criterion(stored(tied))[1, 0] == 0.0  # a row stored before the rule was kept: strict
    assert criterion(stored(tied, ties="pass"))[1, 0] == 1.0
    assert gain_shown([np.array(tied)]).startswith("undefined: no cross-test passes ECC")


def test_paired_verdicts_count_and_leave_ac_open():
    verdicts = [[None, None, None], ["pass", None, None], ["unresolved", "fail", None]]
    m = stored([[0.5, NAN, NAN], [0.6, 0.7, NAN], [0.5, 0.6, 0.8]], paired={"verdict": verdicts, "confidence": 0.95})
    assert verdict_total([m], "none") == "1/1/1"
    assert paired_range([m], "none") == "33.3 – 66.7"  # one sure pass of three; the unresolved one may pass too
    assert verdict_total([m, SEED0], "none") == "2/1/–"  # one seed without a paired test: its criterion, "not tested"


def test_the_mean_matrix_leaves_cells_no_seed_defines_undefined():
    mean = stacked_mean([np.array([[1.0, NAN], [NAN, NAN]]), np.array([[3.0, NAN], [2.0, NAN]])])
    np.testing.assert_allclose(mean, [[2.0, NAN], [2.0, NAN]])


def test_each_seeds_verdict_per_cross_test():
    paired = {"verdict": [[None, None], ["unresolved", None]], "confidence": 0.95}
    seeds = [("0", SEED0), ("1", stored([[0.5, NAN], [0.4, 0.7]], paired=paired))]
    assert seed_verdicts(seeds, ["v1", "v2"]) == [
        {"cross-test": "v2 → v1", "seed 0": "✓ 60.0", "seed 1": "✗ 40.0 (paired ?)", "seeds passing": "1 of 2"}]


def test_a_view_row_counts_the_failing_cross_tests():
    row = view_row("bct", SEED1)
    assert row["AC %"] == 0.0 and row["failing cross-tests"] == 1
    assert math.isnan(view_row("bct", stored([[0.5]]))["AC %"])  # not stored: NaN, not 0
