"""The rule that turns a paired interval into check-upgrade's verdict, and the queries a too-close call would need.

Three rules, one threshold ``t`` on the mean difference d = cross-test - self-test (fractions):

* strict ECC (default, the papers' rule): ``t = 0``, the cross-test must score *above* the self-test;
* ECC with ties passing (``ties="pass"``): ``t = 0``, equal scores pass (>=);
* non-inferiority (``margin`` > 0 points): ``t = -margin / 100``, the cross-test may lose up to the margin.

Verdict from the point ``d`` and the interval ``[lo, hi]``: ``pass`` when the point passes and so does the
interval's lower end (``lo > t``; ``lo >= t`` with ties passing); ``fail`` when the whole interval lies below
``t`` (``hi < t``); ``unresolved`` otherwise. So an interval that ends on ``t`` is too close to call: with a
few rare flips (a quantised model: 3 queries lost, none gained) the percentile bootstrap's upper end sits on
0 while the population's gap may be just above it (``bench/calibrate_verdict.py``'s quantised family). An
exact tie (every paired difference equal to ``t``, interval the point ``[t, t]``: an unchanged model under
strict ECC) is ``unresolved`` and flagged ``tie``: strict ECC cannot pass it and no sample says it is worse.
The matrices' per-cell verdicts are judged by the same :class:`Rule` and :func:`decide` (they live in
:mod:`engine.metrics.decision`, a floor below, so the stored matrices and this gate give one verdict per pair).
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from engine.metrics.decision import (DEFAULT_INTERVAL, INTERVALS, Rule, decide,  # noqa: F401 (one rule,
                                     unchanged_bound)  # one floor down: the matrices judge with it too
from engine.metrics.paired import cluster_variance

DEFAULT_POWER = 0.8  # the chance that the sized check decides, when the mean and spread stay as observed


def queries_needed(diffs: np.ndarray, *, level: float, rule: Rule = Rule(), power: float = DEFAULT_POWER,
                   groups: np.ndarray | None = None) -> int | None:
    """Queries a normal-approximation interval would need to exclude the rule's threshold with probability ``power``;
    None when no number would. A one-look estimate: it sizes one future check, not a series of reruns (for those,
    the anytime-valid interval of ``--sequential``).

    ``n = ceil(((z_{1-a/2} + z_power) * sd / |mean - t|)^2)`` with ``z_{1-a/2}`` the two-sided normal quantile of
    ``level``, ``z_power`` the one-sided quantile of ``power`` (80 % by default; ``z_power = 0`` would be a 50 % chance,
    the coin flip this number once was), ``sd`` the per-query standard deviation of the paired differences (NaNs
    left out; with ``groups``, ``sqrt(n * cluster-robust variance of the mean)``, so related queries count as the
    information they carry, assuming groups of the same sizes) and ``t`` the rule's threshold; it assumes the mean
    difference and the spread stay as observed. Never below the current ``n + 1``: ``n`` queries did not decide it.
    None when the mean sits exactly on ``t``. When no query changed at all (every difference 0), the number of
    queries whose :func:`unchanged_bound` drops below ``|t|`` (again at least ``n + 1``).
    """
    d = np.asarray(diffs, dtype=np.float64)
    keep = ~np.isnan(d)
    d = d[keep]
    if not len(d):
        raise ValueError("no paired difference: nothing to size")
    if not 0 < power < 1:
        raise ValueError(f"the power must lie strictly between 0 and 1, got {power!r}")
    n = len(d)
    gap = float(d.mean()) - rule.threshold
    if gap == 0:
        return None
    if not np.any(d):  # no query changed: the queries whose zero-change bound (unchanged_bound) is below |gap|
        return max(n + 1, math.ceil(math.log((1 - level) / 2) / math.log(1 - min(abs(gap), 1 - 1e-12))))
    sd = math.sqrt(n * cluster_variance(d, None if groups is None else np.asarray(groups)[keep]))
    z = NormalDist().inv_cdf((1 + level) / 2) + NormalDist().inv_cdf(power)
    return max(n + 1, math.ceil((z * sd / abs(gap)) ** 2))
