"""A sampled check of Definition 1 (Shen et al. 2020) between an old model k and a new model t.

(1a) d(h_i^k, h_j^t) <= d(h_i^k, h_j^k) for same-class pairs
(1b) d(h_i^k, h_j^t) >= d(reference) for different-class pairs

The papers disagree on the reference of (1b): papers 001/002 (and Shen et al.) use the old model,
d(h_i^k, h_j^k); paper 000 writes the new model, d(h_i^t, h_j^t). ``reference_1b`` selects it;
the default follows Shen et al.
"""
from __future__ import annotations

from typing import Literal

import numpy as np

from engine.metrics.validate import check_features, check_labels


def _distance(a: np.ndarray, b: np.ndarray, kind: str) -> np.ndarray:
    if kind == "cosine":
        na = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
        nb = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        return 1.0 - np.sum(na * nb, axis=1)
    return np.linalg.norm(a - b, axis=1)


def _sample_pairs(labels: np.ndarray, n: int, same: bool, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``n`` ordered pairs (i != j) with equal (``same``) or different labels, uniformly over such pairs."""
    m = len(labels)
    i_all, j_all = [], []
    drawn = 0
    for _ in range(50):  # rejection sampling; bounded so a degenerate label set cannot loop forever
        i = rng.integers(0, m, size=4 * n)
        j = rng.integers(0, m, size=4 * n)
        keep = (i != j) & ((labels[i] == labels[j]) if same else (labels[i] != labels[j]))
        i_all.append(i[keep])
        j_all.append(j[keep])
        drawn += int(keep.sum())
        if drawn >= n:
            break
    return np.concatenate(i_all)[:n], np.concatenate(j_all)[:n]


def definition1_check(
    old: np.ndarray,
    new: np.ndarray,
    labels: np.ndarray,
    *,
    n_pairs: int = 10_000,
    seed: int = 0,
    distance: Literal["cosine", "euclidean"] = "cosine",
    reference_1b: Literal["old", "new"] = "old",
) -> dict[str, float | int]:
    """Fraction of sampled same-class pairs satisfying (1a) and different-class pairs satisfying (1b).

    ``old`` and ``new`` embed the same images in the same row order. Returns the two fractions
    and the number of pairs behind each (0 pairs gives NaN).
    """
    check_features("old features", old)
    check_features("new features", new)
    old, new, labels = np.asarray(old, np.float64), np.asarray(new, np.float64), np.asarray(labels)
    check_labels("labels", labels, len(old))
    if len(new) != len(old):
        raise ValueError(f"old and new features must embed the same images: {len(old)} vs {len(new)} rows")
    if old.shape[1] != new.shape[1]:
        raise ValueError(f"old features are {old.shape[1]}-d and new ones {new.shape[1]}-d; Definition 1 needs one space")
    if distance not in ("cosine", "euclidean") or reference_1b not in ("old", "new"):
        raise ValueError("distance must be 'cosine' or 'euclidean' and reference_1b 'old' or 'new'")
    rng = np.random.default_rng(seed)
    out: dict[str, float | int] = {}
    i, j = _sample_pairs(labels, n_pairs, True, rng)
    cross = _distance(old[i], new[j], distance)
    out["1a_fraction"] = float(np.mean(cross <= _distance(old[i], old[j], distance))) if len(i) else float("nan")
    out["1a_pairs"] = int(len(i))
    i, j = _sample_pairs(labels, n_pairs, False, rng)
    ref = old if reference_1b == "old" else new
    cross = _distance(old[i], new[j], distance)
    out["1b_fraction"] = float(np.mean(cross >= _distance(ref[i], ref[j], distance))) if len(i) else float("nan")
    out["1b_pairs"] = int(len(i))
    return out
