"""A subset of bench/calibrate_verdict.py: 40 synthetic upgrades of two families at small n, judged by check_upgrade.

The coverage of the 95 % interval and both false-verdict rates must stay within binomial bounds of the issue's
targets (coverage >= 93 %, false rates <= 5 %): a count the target rate would produce with probability below
0.5 % fails the test.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

BENCH = Path(__file__).resolve().parents[1] / "bench" / "calibrate_verdict.py"


def _bench():
    spec = importlib.util.spec_from_file_location("calibrate_verdict", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def binomial_tail(n: int, p: float, k: int, *, upper: bool) -> float:
    """P(X >= k) (upper) or P(X <= k) for X ~ Binomial(n, p)."""
    ks = range(k, n + 1) if upper else range(0, k + 1)
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in ks)


def test_binomial_tail_by_hand():
    assert binomial_tail(2, 0.5, 1, upper=True) == pytest.approx(0.75)
    assert binomial_tail(3, 0.1, 0, upper=False) == pytest.approx(0.729)


@pytest.mark.slow
def test_coverage_and_false_rates_stay_near_the_targets():
    cv = _bench()
    outcomes = cv.run(configs=4, replicates=5, seed=3, families=("noise", "rotation"), sizes=((200, 200), (400, 400)), big=0)
    assert len(outcomes) == 40 and all(o.verdict is not None for o in outcomes)
    r = cv.rates(outcomes)
    covered, n = r["coverage"]
    assert n == 40 and binomial_tail(n, 0.93, covered, upper=False) > 0.005, r
    for key in ("false_compatible", "false_not_compatible"):
        k, m = r[key]
        assert m == 0 or binomial_tail(m, 0.05, k, upper=True) > 0.005, (key, r)
    assert {o.family for o in outcomes} == {"noise", "rotation"}
    assert min(o.gap for o in outcomes) < 0 < max(o.gap for o in outcomes)  # both sides of the threshold are exercised


def test_the_true_gap_of_an_unchanged_model_is_zero_and_a_new_dimension_is_refused():
    cv = _bench()
    rng = np.random.default_rng(0)
    same = cv.FAMILIES["rotation"][0](rng, 0)  # 0 degrees: the old model itself
    assert cv.true_gap(same, 100, 100, rng, draws=5) == (0.0, 0.0)
    (outcome,) = cv.run_config(same, 100, 100, 1, rng, truth_draws=5)
    assert (outcome.verdict, outcome.lo, outcome.hi) == ("too close to call", 0.0, 0.0)  # a tie under strict ECC
    (refused,) = cv.run_config(cv.FAMILIES["dimension change"][0](rng, 24), 100, 100, 1, rng)
    assert refused.verdict is None and math.isnan(refused.gap)


def test_the_grouped_interval_keeps_its_level_on_symmetric_groups_of_unequal_spread():
    """2,000 samples of 20 groups of 10 queries whose shared errors are symmetric about the true mean (+3 points) with
    spreads that differ ~50-fold between groups (log-normal): the interval misses the mean above and below each a
    count the nominal 2.5 % would produce with probability above 0.5 % (the sign-flip test is exact here)."""
    from engine.metrics.paired import paired_bootstrap

    rng = np.random.default_rng(12)
    groups = np.repeat(np.arange(20), 10)
    below = above = 0
    for i in range(2000):
        spread = np.exp(rng.normal(size=20))
        d = 0.03 + (spread * rng.standard_t(4, size=20))[groups] * 0.05 + 0.1 * rng.normal(size=200)
        _, lo, hi = paired_bootstrap(d, np.zeros(200), resamples=400, seed=(i, 1, 0), groups=groups)
        below, above = below + (hi < 0.03), above + (lo > 0.03)
    for k in (below, above):  # scipy: math.comb(2000, k) overflows a float
        assert binom.sf(k - 1, 2000, 0.025) > 0.005 and binom.cdf(k, 2000, 0.025) > 0.005, (below, above)


@pytest.mark.slow
def test_related_queries_with_groups_keep_false_compatible_at_the_nominal_rate_on_every_path():
    """bench/calibrate_verdict.py --grouped, small: topics of 10 paraphrases, true gap exactly 0, judged in memory and
    from sources with and without --query-groups. With the groups, false "compatible" on every path is a count the
    nominal 2.5 % would produce with probability above 0.5 %; without them the query-only paths are far above it."""
    cv = _bench()
    outcomes = cv.run_grouped(30, seed=1, resamples=500)
    count = {(o.path, o.groups): 0 for o in outcomes}
    for o in outcomes:
        count[(o.path, o.groups)] += o.verdict == "compatible"
    assert len(outcomes) == 30 * 2 * len(cv.GROUPED_PATHS)
    for path in cv.GROUPED_PATHS:
        assert binomial_tail(30, 0.025, count[(path, True)], upper=True) > 0.005, (path, count)
    ungrouped = sum(count[(p, False)] for p in cv.GROUPED_PATHS if "queries" in p)
    assert binomial_tail(60, 0.025, ungrouped, upper=True) < 0.005, count  # single queries: far too many passes
