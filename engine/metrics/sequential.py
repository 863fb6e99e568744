"""An anytime-valid interval for the mean paired difference: for teams that add queries and rerun until it decides.

A fixed-n interval is valid for one look. A team that checks, adds queries, and checks again until the lower end
clears the threshold inflates its false-pass rate (peeking every 50 queries up to 2,000 with a 95 % percentile
bootstrap passed a true gap of 0 in 39 of 200 simulated streams, this sequence in none; it is about 1.8x wider at
2,000 queries; tests/test_rule_statistics.py). A *confidence sequence*
``C_1, C_2, ...`` covers the mean at every n at once, ``P(for all n: mean in C_n) >= level``, so any rule that stops
when it likes keeps the level.

:func:`confidence_sequence` is the predictable plug-in empirical-Bernstein confidence sequence (PrPl-EB) of
Waudby-Smith & Ramdas, "Estimating means of bounded random variables by betting", JRSSB 86(1), 2024, Theorem 2 and
eqs. (13)-(15), for observations in [0, 1] (a paired difference ``d`` in [-1, 1] is mapped to ``(d + 1) / 2``):

    mu_t = (1/2 + sum_{i<=t} x_i) / (t + 1),   s2_t = (1/4 + sum_{i<=t} (x_i - mu_i)^2) / (t + 1),
    lambda_t = min(sqrt(2 log(2/a) / (s2_{t-1} t log(1 + t))), c),   v_t = 4 (x_t - mu_{t-1})^2,
    psi(l) = (-log(1 - l) - l) / 4,
    C_t = sum lambda_i x_i / sum lambda_i  +-  (log(2/a) + sum v_i psi(lambda_i)) / sum lambda_i,

with ``mu_0 = 1/2``, ``s2_0 = 1/4``, ``c = 1/2`` (the paper's choice), intersected over t (the running intersection
is a confidence sequence too). It assumes the observations arrive in a fixed order with a common mean (the queries
as the source lists them, new ones appended); it resamples nothing, so the gallery is taken as fixed. numpy only
(no confidence-sequence library is on the project's package list; the closed form is short).
"""
from __future__ import annotations

import math

import numpy as np

BET_CAP = 0.5  # c: the largest bet (WSR 2024 use 1/2 or 3/4)


def _unit_cs(x: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Running-intersection PrPl-EB bounds ``(lo_t, hi_t)`` for t = 1..n of x in [0, 1] (module docstring)."""
    n = len(x)
    t = np.arange(1, n + 1, dtype=np.float64)
    log_term = math.log(2 / (1 - confidence))
    mu = (0.5 + np.cumsum(x)) / (t + 1)  # mu_t, t = 1..n
    mu_prev = np.r_[0.5, mu[:-1]]  # mu_{t-1}
    s2 = (0.25 + np.cumsum((x - mu) ** 2)) / (t + 1)  # s2_t
    s2_prev = np.r_[0.25, s2[:-1]]
    lam = np.minimum(np.sqrt(2 * log_term / (s2_prev * t * np.log1p(t))), BET_CAP)
    v = 4 * (x - mu_prev) ** 2
    psi = (-np.log1p(-lam) - lam) / 4
    weight = np.cumsum(lam)
    centre = np.cumsum(lam * x) / weight
    radius = (log_term + np.cumsum(v * psi)) / weight
    return np.maximum.accumulate(np.maximum(centre - radius, 0.0)), np.minimum.accumulate(np.minimum(centre + radius, 1.0))


def confidence_sequence(d: np.ndarray, *, confidence: float, bounds: tuple[float, float] = (-1.0, 1.0),
                        every: bool = False) -> tuple[float, float] | tuple[np.ndarray, np.ndarray]:
    """The anytime-valid interval ``(lo, hi)`` of the mean of ``d`` after its last observation (NaNs left out, in the
    order given), for values within ``bounds``; with ``every`` the arrays of ``(lo_t, hi_t)`` after each one."""
    a, b = bounds
    d = np.asarray(d, np.float64)
    d = d[~np.isnan(d)]
    if not len(d):
        raise ValueError("no paired difference: no confidence sequence")
    if not 0 < confidence < 1:
        raise ValueError(f"the confidence level must lie strictly between 0 and 1, got {confidence!r}")
    if d.min() < a or d.max() > b:
        raise ValueError(f"a confidence sequence needs values in [{a:g}, {b:g}], got [{d.min():g}, {d.max():g}]")
    lo, hi = _unit_cs((d - a) / (b - a), confidence)
    lo, hi = a + (b - a) * lo, a + (b - a) * hi
    return (lo, hi) if every else (float(lo[-1]), float(hi[-1]))
