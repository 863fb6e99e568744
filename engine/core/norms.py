"""Unit rows whose norm cannot overflow or underflow (numpy; the torch twin is ``retrieval.unit_rows``).

A float32 row near the float32 maximum has a sum of squares beyond float32 (its norm comes out inf and the row
becomes 0); a row of tiny values has one that rounds to 0 (the row is not scaled to unit length). Such rows are
divided by their largest absolute value first, which changes neither their direction nor, for every other row,
a single bit of the result.
"""
from __future__ import annotations

import numpy as np

EPS = 1e-12  # the floor of F.normalize: a norm below it is not trusted (and an all-zero row stays zero)


def rescale_bad_rows(x: np.ndarray, norm: np.ndarray) -> np.ndarray | None:
    """``x`` with each row whose ``norm`` overflowed or underflowed divided by its max-abs; None when none did."""
    bad = (~np.isfinite(norm) | (norm < EPS))[..., 0]
    if not bad.any():
        return None
    rows = x[bad]
    scale = np.abs(rows).max(axis=-1, keepdims=True)
    usable = np.isfinite(scale) & (scale > 0)  # all-zero rows stay zero; NaN/inf rows are the caller's checks' business
    x = x.copy()
    x[bad] = np.where(usable, rows / np.where(usable, scale, 1), rows)
    return x


def tame_rows(x: np.ndarray, lo: float = 2.0**-60, hi: float = 2.0**60) -> np.ndarray:
    """``x`` with each nonzero finite row whose max-abs lies outside [lo, hi] divided by that max-abs (others as
    they are): sums and differences of its entries (a centring) then cannot overflow. Same object when none does."""
    x = np.asarray(x)
    if x.dtype.kind != "f" or x.size == 0:
        return x
    scale = np.abs(x).max(axis=-1, keepdims=True)
    extreme = np.isfinite(scale) & (scale > 0) & ((scale > hi) | (scale < lo))
    if not extreme.any():
        return x
    return np.where(extreme, x / np.where(extreme, scale, 1).astype(x.dtype), x)


def unit_rows_np(x: np.ndarray, dtype: type | None = None) -> np.ndarray:
    """Rows of ``x`` (cast to ``dtype`` when given) scaled to unit L2 norm; zero rows stay zero."""
    x = np.asarray(x, dtype=dtype)
    with np.errstate(over="ignore", under="ignore"):  # the rows whose squares overflow or underflow are redone
        norm = np.linalg.norm(x, axis=-1, keepdims=True)
        fixed = rescale_bad_rows(x, norm)
        if fixed is not None:
            x, norm = fixed, np.linalg.norm(fixed, axis=-1, keepdims=True)
    return x / np.maximum(norm, x.dtype.type(EPS) if x.dtype.kind == "f" else EPS)
