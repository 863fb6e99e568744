"""Small numpy helpers the analyses share: unit rows, and floats a JSON payload can hold."""
from __future__ import annotations

import numpy as np


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def finite(value: float | None) -> float | None:
    """``value`` as a float, or None when it is missing or not finite (NaN, inf)."""
    return None if value is None or not np.isfinite(value) else float(value)
