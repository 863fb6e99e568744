"""The update gain Γ (CoReS Eq. 3) where it means something, and why it does not elsewhere (numpy only).

Γ = (cross-test - old self-test) / (new self-test - old self-test) measures how much of the new model's own gain
a cross-test keeps. Its denominator is the new model's gain on its own; when that is not clearly above zero the
ratio explodes or flips sign (a 0.1-point gain turns a 2.5-point cross-test gap into "2538.5 %"), so it is shown
only where new self - old self is at least ``MIN_GAIN`` (one point), and only where the cross-test is not below
the old self-test: paper 002 reports Γ where ECC holds (a failing cell's Γ is negative by construction and says
nothing the verdict does not; averaged, it dominates: -1705 % over a study's failing cells). Everywhere else Γ is
named undefined, with the reason. A tie (cross-test equal to the old self-test) gives Γ = 0 under either tie rule.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_GAIN = 0.01  # new self-test - old self-test below one point: Γ is undefined


def gain_cells(C: np.ndarray, *, min_gain: float = MIN_GAIN) -> tuple[np.ndarray, list[list[str | None]]]:
    """Γ of every cross-test (NaN where undefined) and, per cell, why it is undefined (None where defined or not a
    defined cross-test): the new model does not beat the old one on its own by ``min_gain``, or the cross-test is
    below the old self-test (ECC fails)."""
    C = np.asarray(C, dtype=np.float64)
    T = C.shape[0]
    gain = np.full((T, T), np.nan)
    why: list[list[str | None]] = [[None] * T for _ in range(T)]
    for t in range(T):
        for k in range(t):
            if np.isnan(C[t, k]) or np.isnan(C[t, t]) or np.isnan(C[k, k]):
                continue
            denom = C[t, t] - C[k, k]
            if denom < min_gain:
                why[t][k] = (f"undefined: the new model's self-test is {100 * denom:+.1f} points from the old one's "
                             f"(Γ divides by it; needs at least +{100 * min_gain:g})")
            elif C[t, k] < C[k, k]:
                why[t][k] = (f"undefined: the cross-test is {100 * (C[t, k] - C[k, k]):+.1f} points from the old "
                             f"self-test (ECC fails; paper 002 reports Γ only where ECC holds)")
            else:
                gain[t, k] = (C[t, k] - C[k, k]) / denom
    return gain, why


def gain_json(C: np.ndarray, *, min_gain: float = MIN_GAIN) -> list[list[float | None]]:
    """Γ of every cell as JSON rows (None where undefined): what a summary's ``update_gain`` holds."""
    return [[None if np.isnan(v) else float(v) for v in row] for row in gain_cells(C, min_gain=min_gain)[0]]


def mean_gain(matrices: Sequence[np.ndarray], *, min_gain: float = MIN_GAIN) -> float | None:
    """Γ averaged over the cross-tests where it is defined, over every matrix given (None when nowhere)."""
    values = [g[~np.isnan(g)] for g in (gain_cells(C, min_gain=min_gain)[0] for C in matrices)]
    flat = np.concatenate(values) if values else np.array([])
    return float(flat.mean()) if len(flat) else None


def gain_text(C: np.ndarray, names: Sequence[str], *, min_gain: float = MIN_GAIN) -> str:
    """``M2→M1 54.7 %, M3→M1 undefined (new self-test -0.3 points from old)`` over the defined cross-tests."""
    C = np.asarray(C, dtype=np.float64)
    gain, why = gain_cells(C, min_gain=min_gain)
    parts = []
    for t in range(C.shape[0]):
        for k in range(t):
            if not np.isnan(gain[t, k]):
                parts.append(f"{names[t]}→{names[k]} {100 * gain[t, k]:.1f} %")
            elif why[t][k] and C[t, t] - C[k, k] < min_gain:
                parts.append(f"{names[t]}→{names[k]} undefined (new self-test {100 * (C[t, t] - C[k, k]):+.1f} points "
                             f"from old; needs +{100 * min_gain:g})")
            elif why[t][k]:
                parts.append(f"{names[t]}→{names[k]} undefined (fails ECC)")
    return ", ".join(parts)
