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
The matrices' per-cell verdict (:func:`engine.metrics.paired.verdict`) still calls both of these a fail.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

TIE_RULES = ("fail", "pass")
INTERVALS = {"two-way": "queries and gallery items", "queries": "queries"}  # --interval: what the bootstrap resamples
DEFAULT_INTERVAL = "two-way"


@dataclass(frozen=True)
class Rule:
    """How check-upgrade judges the compatibility interval: a margin in points and the tie rule."""

    margin: float = 0.0
    ties: str = "fail"

    def __post_init__(self) -> None:
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or not 0 <= self.margin < 100:
            raise ValueError(f"the margin is in points and must lie in [0, 100), got {self.margin!r}")
        if self.ties not in TIE_RULES:
            raise ValueError(f"unknown tie rule {self.ties!r}; use 'fail' (strict >) or 'pass' (>=)")

    @property
    def threshold(self) -> float:
        """The mean difference (a fraction) the cross-test must clear."""
        return -self.margin / 100

    @property
    def name(self) -> str:
        """The rule in words, as the output names it."""
        op = ">=" if self.ties == "pass" else ">"
        if self.margin > 0:
            return f"non-inferiority margin {self.margin:g} points (cross-test {op} self-test - {self.margin:g} points)"
        if self.ties == "pass":
            return "ECC with ties passing (cross-test >= self-test)"
        return "strict ECC (cross-test > self-test, the papers' rule)"


def decide(diff: float, lo: float, hi: float, rule: Rule = Rule()) -> tuple[str, bool]:
    """``(pass | fail | unresolved, tie)`` of a paired comparison under ``rule`` (see the module docstring)."""
    t = rule.threshold
    tie = diff == lo == hi == t
    strict = rule.ties == "fail"
    point_ok = diff > t if strict else diff >= t
    if point_ok and (lo > t if strict else lo >= t):
        return "pass", tie
    if hi < t:
        return "fail", tie
    return "unresolved", tie


def queries_needed(diffs: np.ndarray, *, level: float, rule: Rule = Rule()) -> int | None:
    """Queries a normal-approximation interval would need to exclude the rule's threshold; None when no number would.

    ``n = ceil((z * sd / |mean - t|)^2)`` with ``z`` the two-sided normal quantile of ``level``, ``sd`` the sample
    standard deviation of the paired differences (NaNs left out) and ``t`` the rule's threshold; it assumes the
    mean difference and the per-query spread stay as observed. None when the mean sits exactly on ``t``. When no
    query changed at all (every difference 0), the number of queries whose :func:`unchanged_bound` drops below
    ``|t|``.
    """
    d = np.asarray(diffs, dtype=np.float64)
    d = d[~np.isnan(d)]
    if not len(d):
        raise ValueError("no paired difference: nothing to size")
    gap = float(d.mean()) - rule.threshold
    if gap == 0:
        return None
    if not np.any(d):  # no query changed: the queries whose zero-change bound (unchanged_bound) is below |gap|
        return math.ceil(math.log((1 - level) / 2) / math.log(1 - min(abs(gap), 1 - 1e-12)))
    sd = float(d.std(ddof=1)) if len(d) > 1 else 0.0
    z = NormalDist().inv_cdf((1 + level) / 2)
    return max(1, math.ceil((z * sd / abs(gap)) ** 2))


def unchanged_bound(n: int, level: float) -> float:
    """The largest share of queries that could change score when none of ``n`` did (exact binomial, two-sided ``level``).

    ``1 - ((1 - level) / 2) ** (1 / n)`` (3.7 / n at 95 %): the interval of a mean difference of scores in [0, 1]
    when the features differ but no sampled query's score does (a float16 export: 0 of 200 queries flip, while
    1 in 10,000 does in the population; a percentile bootstrap would say [0, 0]).
    """
    return 1 - ((1 - level) / 2) ** (1 / n)
