"""Pure functions over a T x T compatibility matrix C (row t = query model, column k = gallery model).

C holds NaN above the diagonal and wherever a cell is undefined (e.g. models whose features are not
comparable). Undefined cells are left out of every count and mean. Values are in one unit (the
engine stores fractions in [0, 1]); the functions do not rescale.

Definitions (papers 000, 001, 002; see ``../shared/papers``):
* ECC for a cross-test (t > k): C[t, k] > C[k, k] (strict by default; ``ties="pass"`` accepts equality).
* AC  = fraction of the cross-tests that pass ECC.
* AA  (AM in CoReS) = mean of the lower triangle, diagonal included.
* ACA = sum of the passing cross-tests / number of cross-tests (failing ones count 0).
* AC_tau and AA_tau: the same on the leading tau x tau block.
* Update gain (CoReS Eq. 3): (C[t, k] - C[k, k]) / (C[t, t] - C[k, k]).
"""
from __future__ import annotations

import numpy as np

from engine.core.kinds import STRICT, beats, check_ties


def _square(C: np.ndarray) -> np.ndarray:
    C = np.asarray(C, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] != C.shape[1]:
        raise ValueError(f"a compatibility matrix must be square (T x T), got shape {C.shape}")
    return C


def _cross(T: int) -> tuple[np.ndarray, np.ndarray]:
    return np.tril_indices(T, -1)


def ecc_pass(C: np.ndarray, *, ties: str = STRICT) -> np.ndarray:
    """T x T array: 1.0 where a cross-test passes ECC, 0.0 where it fails, NaN elsewhere or undefined."""
    C = _square(C)
    check_ties(ties)  # a bad rule is refused even for a matrix without cross-tests
    out = np.full(C.shape, np.nan)
    t, k = _cross(C.shape[0])
    cross, self_test = C[t, k], C[k, k]
    passed = beats(cross, self_test, ties)
    out[t, k] = np.where(np.isnan(cross) | np.isnan(self_test), np.nan, passed.astype(float))
    return out


def average_compatibility(C: np.ndarray, *, ties: str = STRICT) -> float:
    """AC: the fraction of defined cross-tests that pass ECC (NaN when there is none)."""
    e = ecc_pass(C, ties=ties)
    vals = e[_cross(e.shape[0])]
    vals = vals[~np.isnan(vals)]
    return float(vals.mean()) if len(vals) else float("nan")


def average_accuracy(C: np.ndarray) -> float:
    """AA (a.k.a. AM): the mean of the defined lower-triangle cells, diagonal included."""
    C = _square(C)
    vals = C[np.tril_indices(C.shape[0])]
    vals = vals[~np.isnan(vals)]
    return float(vals.mean()) if len(vals) else float("nan")


def average_compatibility_accuracy(C: np.ndarray, *, ties: str = STRICT) -> float:
    """ACA: sum of the passing cross-tests divided by the number of defined cross-tests."""
    C = _square(C)
    e = ecc_pass(C, ties=ties)
    idx = _cross(C.shape[0])
    passed, vals = e[idx], C[idx]
    defined = ~np.isnan(passed)
    if not defined.any():
        return float("nan")
    return float(np.sum(vals[defined] * passed[defined]) / defined.sum())


def ac_curve(C: np.ndarray, *, ties: str = STRICT) -> np.ndarray:
    """AC_tau for tau = 1..T (tau = 1 has no cross-test: NaN)."""
    C = _square(C)
    return np.array([average_compatibility(C[:tau, :tau], ties=ties) for tau in range(1, C.shape[0] + 1)])


def aa_curve(C: np.ndarray) -> np.ndarray:
    """AA_tau for tau = 1..T."""
    C = _square(C)
    return np.array([average_accuracy(C[:tau, :tau]) for tau in range(1, C.shape[0] + 1)])


def update_gain(C: np.ndarray) -> np.ndarray:
    """CoReS update gain for every cross-test; the new model's self-test C[t, t] is the upper bound.

    NaN on and above the diagonal, and where C[t, t] == C[k, k] (the gain is undefined).
    """
    C = _square(C)
    out = np.full(C.shape, np.nan)
    t, k = _cross(C.shape[0])
    denom = C[t, t] - C[k, k]
    with np.errstate(divide="ignore", invalid="ignore"):
        out[t, k] = np.where(denom != 0, (C[t, k] - C[k, k]) / denom, np.nan)
    return out


def summarize(C: np.ndarray, *, ties: str = STRICT) -> dict[str, float | list[float | None]]:
    """AC, AA, ACA and the AC_tau / AA_tau curves of one matrix, JSON-ready (None for NaN)."""
    clean = lambda a: [None if np.isnan(v) else float(v) for v in a]  # noqa: E731
    scalar = lambda v: None if np.isnan(v) else float(v)  # noqa: E731
    return {
        "AC": scalar(average_compatibility(C, ties=ties)),
        "AA": scalar(average_accuracy(C)),
        "ACA": scalar(average_compatibility_accuracy(C, ties=ties)),
        "AC_curve": clean(ac_curve(C, ties=ties)),
        "AA_curve": clean(aa_curve(C)),
    }
