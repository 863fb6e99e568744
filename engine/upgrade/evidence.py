"""The bookkeeping of the evidence base (``bench/bench_evidence.py``): a decision taken on a sample of a corpus, read
against the same decision taken on the whole corpus; torch-free, pure functions over plain records.

A **draw** is one sampled check of a run (an ordered pair of models on one corpus and relevance): the plan's decision
and both verdicts on the sample, beside the run's truth, the same computed on the whole corpus. :func:`outcome` sorts it:

* ``agree``: the sampled decision is the whole corpus's (by kind: ``ship with adapter`` agrees with itself whatever
  the adapter, ``backfill`` whatever the fraction);
* ``false ship``: the sample ships (as is, or with an adapter, a corpus transform or a cascade) where the whole corpus
  does not, or with a remedy cheaper on :data:`REMEDY_COST`'s ladder than the whole corpus needs (as is where it needs
  an adapter);
* ``false block``: the sample says ``do not ship`` where the whole corpus ships or takes any remedy;
* ``too close``: the sample says ``do not ship yet`` (too close to call) where the whole corpus decides;
* ``costlier``: a safe but dearer remedy than the whole corpus needs, one step or two up :data:`REMEDY_COST`'s ladder
  (an adapter where shipping as is would do, a backfill where an adapter or nothing would do);
* ``other``: any other disagreement (a backfill for an upgrade the whole corpus refuses, a ``do not ship`` where the
  whole corpus itself is too close to call, ...). Every disagreement is listed by :func:`disagreements`.

Rates carry their one-sided Clopper-Pearson upper bound (:func:`clopper_pearson_upper`): 0 false ships in n draws
still allows ``1 - 0.05^(1/n)``. Draws of one run share its truth, so they are not independent; the rates are
therefore also given per run (a run counts once when any of its draws errs).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.upgrade.plan import REMEDY_DECISION

# the decisions that serve the new model now, without a model re-embedding the gallery (issue 42 adds a corpus
# transform and a cascade to the adapter)
SHIP = ("ship as is", "ship with adapter", "transform the gallery", "serve a cascade")
NOT_YET = "do not ship yet"
GAP_BINS = (0.0, 0.5, 1.0, 2.0, math.inf)  # points: |true gap - threshold| in [0, 0.5), [0.5, 1), [1, 2), [2, inf)
CURVE_BINS = (-math.inf, -5.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 5.0, math.inf)  # points: the operating curve's x
VERDICTS = {"guardrail": ("compatible", "not compatible", "too close to call"),
            "success": ("better", "not better", "too close to call")}
OUTCOMES = ("agree", "false ship", "false block", "too close", "costlier", "other")
# the remedies a sample may overpay for, in the plan's cost order at its default horizon (engine.upgrade.plan.cost_key
# over as many queries as the gallery holds items: a cascade's N re-scorings per query then cost more than a re-embedding)
REMEDY_COST = {"ship as is": 0, **{REMEDY_DECISION[r]: i + 1 for i, r in enumerate(
    ("query-side adapter", "corpus transform", "backfill", "full re-embedding", "cascade"))}}


def clopper_pearson_upper(k: int, n: int, level: float = 0.95) -> float:
    """The one-sided exact (Clopper-Pearson) upper bound at ``level`` on a rate seen ``k`` times in ``n``: the p at which
    ``P(X <= k) = 1 - level``, the ``level`` quantile of Beta(k + 1, n - k) (``scipy.stats.beta``). 1 when ``k == n``;
    ``ValueError`` for counts that are not ``0 <= k <= n``, ``n >= 1``."""
    from scipy.stats import beta  # loaded when a bound is asked for: the module's records stay light

    _check_counts(k, n, level)
    return 1.0 if k == n else float(beta.ppf(level, int(k) + 1, int(n) - int(k)))


def _check_counts(k: int, n: int, level: float) -> None:
    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise ValueError(f"a rate needs whole counts 0 <= k <= n with n >= 1, got k={k!r}, n={n!r}")
    if not 0 < level < 1:
        raise ValueError(f"the confidence level must lie strictly between 0 and 1, got {level!r}")


def clopper_pearson_lower(k: int, n: int, level: float = 0.95) -> float:
    """The one-sided exact lower bound at ``level`` on a rate seen ``k`` times in ``n``: one minus the upper bound of
    the rate of the other outcome (``n - k`` times), so the ``1 - level`` quantile of Beta(k, n - k + 1); 0 when
    ``k == 0``. An agreement rate is read against its goal from below."""
    _check_counts(k, n, level)
    return 1.0 - clopper_pearson_upper(int(n) - int(k), n, level)


def rate(k: int, n: int, level: float = 0.95) -> dict[str, Any]:
    """``{"k", "n", "rate", "upper", "lower"}``: a count, its share (None without draws) and its one-sided bounds (None
    likewise): an error rate is read with its upper bound, an agreement rate with its lower one."""
    return {"k": int(k), "n": int(n), "rate": k / n if n else None,
            "upper": clopper_pearson_upper(k, n, level) if n else None,
            "lower": clopper_pearson_lower(k, n, level) if n else None}


def outcome(truth: str, sampled: str) -> str:
    """How a sampled decision reads against the whole corpus's (decision kinds of
    :data:`engine.upgrade.plan.DECISIONS`); see the module docstring."""
    if sampled == truth:
        return "agree"
    if sampled in SHIP and (truth not in REMEDY_COST or REMEDY_COST[sampled] < REMEDY_COST[truth]):
        return "false ship"
    if sampled == "do not ship" and truth in REMEDY_COST:
        return "false block"
    if sampled == NOT_YET:
        return "too close"
    if truth in REMEDY_COST and REMEDY_COST.get(sampled, -1) > REMEDY_COST[truth]:
        return "costlier"
    return "other"


def could_false_ship(truth: str) -> bool:
    """Whether a sample can ship falsely against this truth (anything but ``ship as is``)."""
    return truth != "ship as is"


def could_false_block(truth: str) -> bool:
    """Whether a sample can block falsely against this truth (a ship or any remedy)."""
    return truth in REMEDY_COST


def decision_rates(draws: Sequence[Mapping[str, Any]], level: float = 0.95) -> dict[str, Any]:
    """Agreement, false ship, false block, too close, costlier and other over ``draws`` (each with ``truth`` and
    ``decision``), each with its count, denominator and upper bound; false ship over the draws that could ship falsely,
    false block over those that could block falsely, agreement (and agreement or a costlier remedy) when both decide
    over the draws where neither the sample nor the whole corpus says ``do not ship yet``, the rest over all draws."""
    kinds = [outcome(d["truth"], d["decision"]) for d in draws]
    n = len(kinds)
    decided = [k for k, d in zip(kinds, draws) if NOT_YET not in (d["decision"], d["truth"])]
    return {"draws": n, "agree": rate(kinds.count("agree"), n, level),
            "agree_when_both_decide": rate(decided.count("agree"), len(decided), level),
            "agree_or_costlier_when_both_decide": rate(decided.count("agree") + decided.count("costlier"), len(decided),
                                                       level),
            "false_ship": rate(kinds.count("false ship"), sum(could_false_ship(d["truth"]) for d in draws), level),
            "false_block": rate(kinds.count("false block"), sum(could_false_block(d["truth"]) for d in draws), level),
            "too_close": rate(kinds.count("too close"), n, level), "costlier": rate(kinds.count("costlier"), n, level),
            "other": rate(kinds.count("other"), n, level)}


def run_rates(draws: Sequence[Mapping[str, Any]], level: float = 0.95) -> dict[str, Any]:
    """The same per run (``run`` key): a run errs when any of its draws does; denominators are runs."""
    runs: dict[Any, list[Mapping[str, Any]]] = {}
    for d in draws:
        runs.setdefault(d["run"], []).append(d)
    def count(kind: str) -> int:
        return sum(any(outcome(d["truth"], d["decision"]) == kind for d in ds) for ds in runs.values())
    return {"runs": len(runs), "false_ship": rate(count("false ship"), sum(could_false_ship(ds[0]["truth"])
                                                                            for ds in runs.values()), level),
            "false_block": rate(count("false block"), sum(could_false_block(ds[0]["truth"]) for ds in runs.values()),
                                level),
            "all_agree": rate(sum(all(outcome(d["truth"], d["decision"]) == "agree" for d in ds) for ds in runs.values()),
                              len(runs), level)}


def verdict_error(verdict: str, gap: float, reading: str, threshold: float = 0.0) -> bool:
    """A verdict is false when it passes while the true gap (points) is at or below the threshold, or fails while the
    gap is above it (strict ECC for the guardrail; ``better`` likewise for the success reading)."""
    passed, failed = VERDICTS[reading][:2]
    return (verdict == passed and gap <= threshold) or (verdict == failed and gap > threshold)


def gap_bin(gap: float, edges: Sequence[float] = GAP_BINS) -> int:
    """The index of the bin of ``|gap|`` (points) among ``edges``' consecutive half-open intervals."""
    a = abs(gap)
    return next(i for i in range(len(edges) - 1) if edges[i] <= a < edges[i + 1])


def bin_label(i: int, edges: Sequence[float] = GAP_BINS) -> str:
    """``< 0.5``, ``0.5-1``, ``1-2``, ``>= 2`` (points) for the default edges."""
    lo, hi = edges[i], edges[i + 1]
    if lo <= 0 and not math.isinf(lo):
        return f"< {hi:g}"
    if math.isinf(hi):
        return f">= {lo:g}"
    return f"{lo:g}-{hi:g}"


def verdict_bins(draws: Sequence[Mapping[str, Any]], reading: str, level: float = 0.95) -> list[dict[str, Any]]:
    """Per bin of the true gap: draws, false verdicts and too-close calls of ``reading`` (``guardrail``: keys
    ``verdict``/``true_gap``; ``success``: ``better``/``true_better``), each with its upper bound."""
    verdict_key, gap_key = ("verdict", "true_gap") if reading == "guardrail" else ("better", "true_better")
    rows = []
    for i in range(len(GAP_BINS) - 1):
        got = [d for d in draws if d.get(verdict_key) in VERDICTS[reading] and gap_bin(d[gap_key]) == i]
        wrong = sum(verdict_error(d[verdict_key], d[gap_key], reading) for d in got)
        close = sum(d[verdict_key] == "too close to call" for d in got)
        rows.append({"bin": bin_label(i), "draws": len(got), "error": rate(wrong, len(got), level),
                     "too_close": rate(close, len(got), level)})
    return rows


def operating_curve(draws: Sequence[Mapping[str, Any]], reading: str = "guardrail",
                    edges: Sequence[float] = CURVE_BINS) -> list[dict[str, Any]]:
    """The share of each verdict against the (signed) true gap, per sample fraction: one row per (fraction, bin,
    verdict) with the bin's mean true gap, its draws and the share (bins without draws left out)."""
    verdict_key, gap_key = ("verdict", "true_gap") if reading == "guardrail" else ("better", "true_better")
    rows = []
    for fraction in sorted({d["fraction"] for d in draws}):
        for i in range(len(edges) - 1):
            got = [d for d in draws if d["fraction"] == fraction and edges[i] <= d[gap_key] < edges[i + 1]
                   and d.get(verdict_key) in VERDICTS[reading]]
            if not got:
                continue
            mean_gap = sum(d[gap_key] for d in got) / len(got)
            for v in VERDICTS[reading]:
                rows.append({"fraction": fraction, "bin": i, "gap": mean_gap, "draws": len(got), "verdict": v,
                             "share": sum(d[verdict_key] == v for d in got) / len(got)})
    return rows


def disagreements(draws: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every draw whose decision is neither the whole corpus's nor ``do not ship yet`` (``too close``), with its
    outcome and whether the sample's guardrail and success intervals cover the whole corpus's differences."""
    out = []
    for d in draws:
        kind = outcome(d["truth"], d["decision"])
        if kind in ("agree", "too close"):
            continue
        covers = {r: (None if d.get(f"{r}_lo") is None else d[f"{r}_lo"] <= d[g] <= d[f"{r}_hi"])
                  for r, g in (("guardrail", "true_gap"), ("success", "true_better"))}
        out.append({**d, "outcome": kind, "guardrail_covers": covers["guardrail"], "success_covers": covers["success"]})
    return out
