"""Uncertainty of the summaries AC / AA / ACA, and family-wise verdicts for a whole matrix (numpy and the standard
library only: the dashboard imports it).

* Over seeds: :func:`seed_interval`, a Student-t interval of the mean over a study's seeds (``n - 1`` degrees of
  freedom; the quantile from the exact CDF for integer degrees of freedom, :func:`t_quantile`).
* Over queries: a matrix stores no per-query outcomes, only each cross-test's paired interval (cross - self on the
  same queries, :mod:`engine.metrics.paired`). :func:`ac_range` turns the per-cell verdicts into the range of AC
  (and ACA) that the unresolved cells leave open: the low end counts only the cells that pass for sure, the high end
  every cell that does not fail for sure.
* Family-wise: T(T-1)/2 cross-tests each at 95 % are not 95 % together. :func:`familywise_verdicts` re-judges every
  cell of a matrix with Holm's step-down on per-cell p-values, or with Bonferroni-level simultaneous intervals; both
  read the p-value / standard error off the stored percentile interval with a normal approximation
  (:func:`p_values`), the only per-cell spread a matrix keeps.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

FAMILYWISE = ("none", "holm", "bonferroni")
VERDICTS = ("pass", "fail", "unresolved")


def t_cdf_two_sided(x: float, df: int) -> float:
    """P(|T| < x) for Student's t with integer ``df`` degrees of freedom (Abramowitz & Stegun 26.7.3-4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if x <= 0:
        return 0.0
    theta = math.atan(x / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) * (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2))
        term = total = 1.0
        for j in range(1, df // 2):
            term *= c2 * (2 * j - 1) / (2 * j)
            total += term
        return s * total
    if df == 1:
        return 2 * theta / math.pi
    term = total = 1.0  # odd: 2/pi (theta + sin cos (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ... up to c^(df-3)))
    for j in range(1, (df - 1) // 2):
        term *= c2 * (2 * j) / (2 * j + 1)
        total += term
    return 2 / math.pi * (theta + s * math.cos(theta) * total)


def t_quantile(confidence: float, df: int) -> float:
    """The two-sided critical value: x with P(|T| < x) = ``confidence`` for Student's t with ``df`` (integer)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1, got {confidence}")
    lo, hi = 0.0, 1.0
    while t_cdf_two_sided(hi, df) < confidence:
        hi *= 2
    for _ in range(200):  # bisection to machine precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf_two_sided(mid, df) < confidence else (lo, mid)
    return (lo + hi) / 2


def seed_interval(values: Sequence[float | None], *, confidence: float = 0.95,
                  bounds: tuple[float, float] | None = None) -> dict:
    """Mean over seeds with its Student-t interval: ``{"mean", "lo", "hi", "n"}``; None and NaN values are left
    out; lo/hi are None with fewer than two seeds (no spread to measure). ``bounds``: the range the quantity
    cannot leave (AC, AA and ACA are shares in [0, 1]); the interval is clipped to it."""
    v = np.array([np.nan if x is None else x for x in values], dtype=np.float64)
    v = v[~np.isnan(v)]
    if not len(v):
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    mean = float(v.mean())
    if len(v) < 2:
        return {"mean": mean, "lo": None, "hi": None, "n": 1}
    lo, hi = t_interval(mean, float(v.std(ddof=1)), len(v), confidence=confidence, bounds=bounds)
    return {"mean": mean, "lo": lo, "hi": hi, "n": int(len(v))}


def t_interval(mean: float, std: float, n: int, *, confidence: float = 0.95,
               bounds: tuple[float, float] | None = None) -> tuple[float, float]:
    """The Student-t interval of a mean of ``n`` values with sample standard deviation ``std`` (n >= 2), clipped to
    ``bounds`` when given."""
    half = t_quantile(confidence, n - 1) * std / math.sqrt(n)
    lo, hi = mean - half, mean + half
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return lo, hi


def _cross_cells(T: int) -> list[tuple[int, int]]:
    return [(t, k) for t in range(T) for k in range(t)]


def verdict_counts(verdicts: Sequence[Sequence[str | None]]) -> dict[str, int]:
    """How many cross-tests pass, fail and are unresolved (None cells are not counted)."""
    flat = [v for t, row in enumerate(verdicts) for k, v in enumerate(row) if k < t and v]
    return {v: flat.count(v) for v in VERDICTS}


def ac_range(C: np.ndarray, verdicts: Sequence[Sequence[str | None]]) -> dict:
    """AC and ACA as the unresolved cells leave them open, over the cross-tests that have a verdict:
    ``{"AC_lo", "AC_hi", "ACA_lo", "ACA_hi", "pass", "fail", "unresolved", "cells"}`` (AC/ACA None with no cell).

    The low end counts the cells that pass for sure, the high end also every unresolved one."""
    C = np.asarray(C, dtype=np.float64)
    cells = [(t, k) for t, k in _cross_cells(C.shape[0]) if verdicts[t][k] and not np.isnan(C[t, k])]
    n = len(cells)
    sure = [C[t, k] for t, k in cells if verdicts[t][k] == "pass"]
    open_ = [C[t, k] for t, k in cells if verdicts[t][k] == "unresolved"]
    counts = {v: sum(verdicts[t][k] == v for t, k in cells) for v in VERDICTS}
    if not n:
        return {"AC_lo": None, "AC_hi": None, "ACA_lo": None, "ACA_hi": None, **counts, "cells": 0}
    return {"AC_lo": len(sure) / n, "AC_hi": (len(sure) + len(open_)) / n,
            "ACA_lo": float(sum(sure)) / n, "ACA_hi": float(sum(sure) + sum(open_)) / n, **counts, "cells": n}


def _matrix(rows: Sequence[Sequence[float | None]]) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)


def p_values(paired: dict) -> np.ndarray:
    """Two-sided p-value of "cross - self = 0" for every cross-test of a stored paired test (NaN elsewhere):
    the standard error read off the stored interval, (hi - lo) / (2 z), and a normal approximation."""
    diff, lo, hi = _matrix(paired["diff"]), _matrix(paired["lo"]), _matrix(paired["hi"])
    z = NormalDist().inv_cdf(0.5 + paired["confidence"] / 2)
    se = (hi - lo) / (2 * z)
    out = np.full(diff.shape, np.nan)
    for t, k in _cross_cells(diff.shape[0]):
        if np.isnan(diff[t, k]) or np.isnan(se[t, k]):
            continue
        if se[t, k] <= 0:  # every resample gave the same difference
            out[t, k] = 1.0 if diff[t, k] == 0 else 0.0
        else:
            out[t, k] = 2 * (1 - NormalDist().cdf(abs(diff[t, k]) / se[t, k]))
    return out


def holm(p: Sequence[float], alpha: float = 0.05) -> np.ndarray:
    """Holm's step-down: which hypotheses are rejected with family-wise error at most ``alpha`` (NaN: not tested)."""
    p = np.asarray(p, dtype=np.float64)
    rejected = np.zeros(p.shape, bool)
    tested = np.flatnonzero(~np.isnan(p))
    m = len(tested)
    for rank, i in enumerate(tested[np.argsort(p[tested], kind="stable")]):
        if p[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def familywise_verdicts(paired: dict, *, method: str = "holm", alpha: float | None = None) -> list[list[str | None]]:
    """Every cross-test's verdict with the family-wise error of the whole matrix at most ``alpha`` (default: one
    minus the stored confidence). ``holm``: a cell passes / fails when Holm rejects "no difference" and its
    difference is above / below 0; ``bonferroni``: each interval widened to level 1 - alpha/m around its difference
    (m = cross-tests with a test), judged as the per-cell verdict is; ``none``: the stored verdicts."""
    if method not in FAMILYWISE:
        raise ValueError(f"unknown family-wise method {method!r}; use one of {', '.join(FAMILYWISE)}")
    if method == "none":
        return [list(row) for row in paired["verdict"]]
    alpha = 1 - paired["confidence"] if alpha is None else alpha
    diff, lo, hi = _matrix(paired["diff"]), _matrix(paired["lo"]), _matrix(paired["hi"])
    T = diff.shape[0]
    out: list[list[str | None]] = [[None] * T for _ in range(T)]
    p = p_values(paired)
    cells = [(t, k) for t, k in _cross_cells(T) if not np.isnan(p[t, k])]
    if method == "holm":
        rejected = holm([p[c] for c in cells], alpha)
        for (t, k), r in zip(cells, rejected):
            out[t][k] = ("pass" if diff[t, k] > 0 else "fail") if r else "unresolved"
        return out
    z_one = NormalDist().inv_cdf(0.5 + paired["confidence"] / 2)
    z_all = NormalDist().inv_cdf(1 - alpha / (2 * max(len(cells), 1)))
    for t, k in cells:
        half = (hi[t, k] - lo[t, k]) / 2 * z_all / z_one
        low, high = diff[t, k] - half, diff[t, k] + half
        out[t][k] = "pass" if low > 0 else ("fail" if high < 0 else "unresolved")
    return out
