"""Shared by several test modules; moved from tests/test_sharded.py."""
import numpy as np


def _exact_rows(rng, labels, classes: int, d: int = 64) -> np.ndarray:
    """Class prototypes with a fixed magnitude pattern; an item flips 30% of its prototype's signs (norm stays 16)."""
    proto_rng = np.random.default_rng(1234)
    mag = np.ones((classes, d))
    for row in mag:
        row[proto_rng.choice(d, 24, replace=False)] = 3
    sign = proto_rng.choice([-1, 1], (classes, d))
    flip = np.where(rng.random((len(labels), d)) < 0.3, -1, 1)
    return (mag[labels % classes] * sign[labels % classes] * flip).astype(np.float32)


def _cell(seed: int = 0, n: int = 300, nq: int = 80, classes: int = 20):
    rng = np.random.default_rng(seed)
    gl = rng.integers(0, classes, n)
    ql = rng.integers(0, classes + 3, nq)  # classes 20..22 have no gallery item: queries without positives
    return _exact_rows(rng, ql, classes), ql, _exact_rows(rng, gl, classes), gl

