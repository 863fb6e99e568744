"""Intervals for AC / AA / ACA, family-wise verdicts and the update gain where it is defined, on hand-computed
cases and against independent computations (no scipy)."""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from engine.metrics.gain import gain_cells, gain_text, mean_gain
from engine.metrics.uncertainty import (
    ac_range,
    familywise_verdicts,
    holm,
    p_values,
    seed_interval,
    t_cdf_two_sided,
    t_quantile,
    verdict_counts,
)

nan = np.nan


@pytest.mark.parametrize("df, value", [(1, 12.706204736), (2, 4.302652730), (3, 3.182446305), (4, 2.776445105),
                                       (10, 2.228138852), (30, 2.042272456)])
def test_t_quantiles_match_the_printed_tables(df, value):
    assert t_quantile(0.95, df) == pytest.approx(value, abs=1e-6)


def test_t_cdf_against_closed_forms_and_a_numerical_integral():
    for x in (0.3, 1.0, 2.5):
        assert t_cdf_two_sided(x, 2) == pytest.approx(x / math.sqrt(2 + x * x))  # df 2: x / sqrt(2 + x^2)
        assert t_cdf_two_sided(x, 1) == pytest.approx(2 * math.atan(x) / math.pi)  # Cauchy
    for df in (3, 5, 8):  # Simpson's rule on the density, 2 * int_0^x f(u) du
        c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
        f = lambda u: c * (1 + u * u / df) ** (-(df + 1) / 2)  # noqa: E731
        x, n = 1.7, 2000
        h = x / n
        integral = h / 3 * (f(0) + f(x) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n)))
        assert t_cdf_two_sided(x, df) == pytest.approx(2 * integral, abs=1e-9)


def test_seed_interval_by_hand():
    out = seed_interval([0.5, 0.7, None, 0.6])
    half = 4.302652730 * 0.1 / math.sqrt(3)  # std (n - 1) of 0.5, 0.6, 0.7 is 0.1
    assert out["n"] == 3 and out["mean"] == pytest.approx(0.6)
    assert out["lo"] == pytest.approx(0.6 - half) and out["hi"] == pytest.approx(0.6 + half)
    assert seed_interval([0.4]) == {"mean": 0.4, "lo": None, "hi": None, "n": 1}
    assert seed_interval([None])["mean"] is None


C3 = np.array([[0.50, nan, nan],
               [0.55, 0.60, nan],
               [0.49, 0.58, 0.70]])
V3 = [[None, None, None], ["pass", None, None], ["unresolved", "fail", None]]


def test_ac_range_counts_sure_passes_low_and_open_cells_high():
    r = ac_range(C3, V3)
    assert (r["pass"], r["fail"], r["unresolved"], r["cells"]) == (1, 1, 1, 3)
    assert r["AC_lo"] == pytest.approx(1 / 3) and r["AC_hi"] == pytest.approx(2 / 3)
    assert r["ACA_lo"] == pytest.approx(0.55 / 3) and r["ACA_hi"] == pytest.approx((0.55 + 0.49) / 3)
    assert verdict_counts(V3) == {"pass": 1, "fail": 1, "unresolved": 1}
    assert ac_range(np.array([[0.5]]), [[None]])["AC_lo"] is None


def paired(diff, lo, hi, confidence=0.95):
    def full(cells):
        m = [[None] * 3 for _ in range(3)]
        for (t, k), v in cells.items():
            m[t][k] = v
        return m
    return {"diff": full(diff), "lo": full(lo), "hi": full(hi), "confidence": confidence,
            "verdict": full({c: ("pass" if lo[c] > 0 else "fail" if hi[c] < 0 else "unresolved") for c in diff})}


def test_p_value_from_an_interval_that_just_touches_zero_is_the_level():
    p = p_values(paired({(1, 0): 0.02}, {(1, 0): 0.0}, {(1, 0): 0.04}))
    assert p[1, 0] == pytest.approx(0.05)  # the interval's end on 0: p = 1 - confidence
    assert np.isnan(p[2, 0]) and np.isnan(p[0, 0])


def holm_by_adjusted_p(p, alpha):
    """Independent: Holm-adjusted p-values, max over earlier ranks of min(1, (m - j) p_(j)), rejected when <= alpha."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [False] * len(p), 0.0
    for j, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - j) * p[i]))
        out[i] = running <= alpha
    return out


def test_holm_by_hand_and_against_adjusted_p_values():
    assert list(holm([0.01, 0.04, 0.03])) == [True, False, False]  # 0.03 > 0.05 / 2 stops the steps
    assert list(holm([0.01, 0.02, 0.04])) == [True, True, True]  # 0.0167, 0.025, 0.05
    assert list(holm([0.2, nan, 0.001])) == [False, False, True]
    rng = np.random.default_rng(5)
    for _ in range(200):
        p = list(rng.uniform(0, 0.08, size=rng.integers(1, 12)))
        assert list(holm(p)) == holm_by_adjusted_p(p, 0.05)


def test_familywise_verdicts_are_stricter_than_the_cells_alone():
    z = NormalDist().inv_cdf(0.975)
    se = 0.01
    # three cells; each alone: 2.2, 2.5 and -3.0 standard errors from 0
    diff = {(1, 0): 2.2 * se, (2, 0): 2.5 * se, (2, 1): -3.0 * se}
    test = paired(diff, {c: d - z * se for c, d in diff.items()}, {c: d + z * se for c, d in diff.items()})
    assert verdict_counts(familywise_verdicts(test, method="none")) == {"pass": 2, "fail": 1, "unresolved": 0}
    # Holm at 0.05 over 3: p = 0.0278, 0.0124, 0.0027 -> 0.0027 <= 0.0167, 0.0124 <= 0.025, 0.0278 <= 0.05: all three
    assert familywise_verdicts(test, method="holm")[1][0] == "pass"
    assert familywise_verdicts(test, method="holm")[2][1] == "fail"
    # Bonferroni: z for 0.05/6 two-sided is 2.394: 2.2 standard errors no longer clear 0, 2.5 and -3.0 do
    b = familywise_verdicts(test, method="bonferroni")
    assert NormalDist().inv_cdf(1 - 0.05 / 6) == pytest.approx(2.394, abs=1e-3)
    assert (b[1][0], b[2][0], b[2][1]) == ("unresolved", "pass", "fail")
    with pytest.raises(ValueError, match="family-wise"):
        familywise_verdicts(test, method="sidak")


def test_update_gain_only_where_the_new_model_is_better_on_its_own():
    C = np.array([[0.50, nan, nan],
                  [0.55, 0.70, nan],
                  [0.60, 0.52, 0.501]])
    gain, why = gain_cells(C)
    assert gain[1, 0] == pytest.approx((0.55 - 0.50) / (0.70 - 0.50))  # 25 %
    assert np.isnan(gain[2, 0]) and "+0.1 points" in why[2][0]  # 0.501 - 0.50: 0.1 point, below 1
    assert np.isnan(gain[2, 1]) and "-19.9 points" in why[2][1]
    assert why[1][0] is None and np.isnan(gain[0, 0])
    assert mean_gain([C]) == pytest.approx(0.25)
    assert mean_gain([np.array([[0.5, nan], [0.6, 0.5]])]) is None
    text = gain_text(C, ["M1", "M2", "M3"])
    assert "M2→M1 25.0 %" in text and "M3→M1 undefined" in text


def test_summary_csv_carries_seed_intervals_and_the_paired_range_of_ac():
    import io

    import pandas as pd

    from engine.results.report import render_summary_table

    s = {"AC": 1 / 3, "AA": 0.6, "ACA": 0.62, "update_gain": [[None, None, None], [0.5, None, None], [None, None, None]],
         "paired": {"verdict": [[None] * 3, ["pass", None, None], ["unresolved", "fail", None]]},
         "spread": {"AC": {"mean": 0.5, "std": 0.1, "n": 3}, "AA": {"mean": 0.6, "std": 0.02, "n": 3}}}
    row = pd.read_csv(io.StringIO(render_summary_table([("psp", s)], fmt="csv"))).iloc[0]
    half = 4.302652730 * 0.1 / math.sqrt(3)
    assert row["AC_ci_lo"] == pytest.approx(0.5 - half) and row["AC_ci_hi"] == pytest.approx(0.5 + half)
    assert row["AA_ci_hi"] == pytest.approx(0.6 + 4.302652730 * 0.02 / math.sqrt(3))
    assert np.isnan(row["ACA_ci_lo"])  # one value: no spread
    assert (row["paired_pass"], row["paired_fail"], row["paired_unresolved"]) == (1, 1, 1)
    assert row["AC_paired_lo"] == pytest.approx(1 / 3) and row["AC_paired_hi"] == pytest.approx(2 / 3)


def test_seed_interval_of_a_share_is_clipped_to_its_range():
    """AC over seeds 0, 1/3, 2/3 ... can have a t-interval below 0; a share's interval is clipped to [0, 1]."""
    from scipy import stats

    from engine.metrics.uncertainty import seed_interval

    values = [0.0, 0.0, 1 / 3]
    half = stats.t.ppf(0.975, 2) * np.std(values, ddof=1) / np.sqrt(3)
    raw = seed_interval(values)
    assert raw["lo"] == pytest.approx(np.mean(values) - half) and raw["lo"] < 0
    clipped = seed_interval(values, bounds=(0.0, 1.0))
    assert clipped["lo"] == 0.0 and clipped["hi"] == pytest.approx(np.mean(values) + half)
