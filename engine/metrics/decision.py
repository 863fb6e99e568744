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

import math

from engine.core.kinds import beats
from engine.core.vocab import Rule  # the rule's record lives in core: job payloads check it

INTERVALS = {"two-way": "queries and gallery items", "queries": "queries",  # --interval: what the interval resamples
             "sequential": "queries in the order given"}  # --sequential: an anytime-valid confidence sequence
DEFAULT_INTERVAL = "two-way"


def decide(diff: float, lo: float, hi: float, rule: Rule = Rule(), *, unchanged: bool = False) -> tuple[str, bool]:
    """``(pass | fail | unresolved, tie)`` of a paired comparison under ``rule`` (see the module docstring).

    ``unchanged``: no item's score changed (a float16 copy; the interval is the exact zero-change bound about 0).
    Every sampled item is then a tie, and the comparison is flagged ``tie``; ECC with ties passing accepts it (equal
    scores pass, item by item: the rule's own reading), while strict ECC and a margin judge the bound's interval.
    """
    t = rule.threshold
    tie = diff == lo == hi == t or (unchanged and diff == t)
    if unchanged and diff == t and beats(t, t, rule.ties):  # ties pass: every item is an exact tie, and passes
        return "pass", True
    if beats(diff, t, rule.ties) and beats(lo, t, rule.ties):
        return "pass", tie
    if hi < t:
        return "fail", tie
    return "unresolved", tie




def equivalent(lo: float, hi: float, margin: float) -> bool:
    """Two one-sided tests (TOST): the paired difference lies within ``+-margin`` points when the whole interval does.

    With the check's two-sided interval at level ``L`` this is TOST at ``(1 - L) / 2`` per side (95 % -> 2.5 % each),
    stricter than the textbook 90 % interval for a 5 % TOST: the report's one interval serves both readings. A margin of
    0 never makes two models equivalent. ``lo``/``hi`` are fractions, ``margin`` points.
    """
    m = margin / 100
    return m > 0 and -m < lo and hi < m


def margin_to_decide(lo: float, hi: float, *, equivalence: bool = False) -> float:
    """The smallest margin in points (rounded up to 0.1) under which the interval ``[lo, hi]`` passes: non-inferiority
    (``lo > -m``) or, with ``equivalence``, TOST (``-m < lo`` and ``hi < m``)."""
    need = max(-lo, hi) if equivalence else -lo
    return max(0.1, math.floor(100 * need * 10 + 1) / 10)


def unchanged_bound(n: int, level: float) -> float:
    """The largest share of items that could change score when none of ``n`` did (exact binomial, two-sided
    ``level``): ``1 - ((1 - level) / 2) ** (1 / n)``, 3.7 / n at 95 % (a float16 export: 0 of 200 queries flip while
    1 in 10,000 does in the population; a percentile bootstrap would say [0, 0])."""
    return 1 - ((1 - level) / 2) ** (1 / n)
