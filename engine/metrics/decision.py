"""The one rule that turns a paired interval into a verdict: check-upgrade's gate and every stored matrix cell.

Three rules, one threshold ``t`` on the mean difference d = cross-test - self-test (fractions):

* strict ECC (default, the papers' rule): ``t = 0``, the cross-test must score *above* the self-test;
* ECC with ties passing (``ties="pass"``): ``t = 0``, equal scores pass (>=);
* non-inferiority (``margin`` > 0 points): ``t = -margin / 100``, the cross-test may lose up to the margin.

Verdict from the point ``d`` and the interval ``[lo, hi]``: ``pass`` when the point passes and so does the
interval's lower end; ``fail`` when the whole interval lies below ``t``; ``unresolved`` otherwise (an exact tie,
the point interval ``[t, t]``, is unresolved and flagged ``tie`` under strict ECC). See :mod:`engine.upgrade.rule`
for why. numpy-free. :class:`Rule` (margin and tie rule, checked) is defined in :mod:`engine.core.vocab`, so a job
payload is checked before it is queued; it is re-exported here.
"""
from __future__ import annotations

from engine.core.vocab import TIE_RULES, Rule  # noqa: F401 (the rule's record lives in core: job payloads check it)

INTERVALS = {"two-way": "queries and gallery items", "queries": "queries"}  # --interval: what the bootstrap resamples
DEFAULT_INTERVAL = "two-way"


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




def unchanged_bound(n: int, level: float) -> float:
    """The largest share of items that could change score when none of ``n`` did (exact binomial, two-sided
    ``level``): ``1 - ((1 - level) / 2) ** (1 / n)``, 3.7 / n at 95 % (a float16 export: 0 of 200 queries flip while
    1 in 10,000 does in the population; a percentile bootstrap would say [0, 0])."""
    return 1 - ((1 - level) / 2) ** (1 / n)
