"""Shared by several test modules; moved from tests/test_upgrade.py."""
from __future__ import annotations

import numpy as np

from engine.metrics.compatibility import CellFeatures

CLASSES, PER, DIM = 10, 20, 16


def _clusters(seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(CLASSES, DIM))
    labels = np.repeat(np.arange(CLASSES), PER)
    q_noise, g_noise = rng.normal(size=(2, len(labels), DIM))
    return rng, centers, labels, q_noise, g_noise


def compatible_pair() -> tuple[CellFeatures, CellFeatures]:
    """New = old with its noise halved plus a little fresh noise: the same space, better clustered."""
    rng, centers, labels, qn, gn = _clusters()
    old = CellFeatures(centers[labels] + qn, labels, centers[labels] + gn, labels)
    new = CellFeatures(centers[labels] + 0.5 * qn + 0.05 * rng.normal(size=qn.shape), labels,
                       centers[labels] + 0.5 * gn, labels)
    return old, new


def incompatible_pair() -> tuple[CellFeatures, CellFeatures]:
    """New = old under a random rotation: as good on its own, useless against the old gallery."""
    rng, centers, labels, qn, gn = _clusters()
    old = CellFeatures(centers[labels] + qn, labels, centers[labels] + gn, labels)
    rotation, _ = np.linalg.qr(rng.normal(size=(DIM, DIM)))
    return old, CellFeatures(old.query @ rotation, labels, old.gallery @ rotation, labels)


def close_pair() -> tuple[CellFeatures, CellFeatures]:
    """20 queries, one gallery item per class: old hits the first 10, new (on the old gallery) the last 10.

    Per-query differences are ten -1 and ten +1: mean 0, an interval around 0.
    """
    e = np.eye(2)
    labels = np.tile([0, 1], 10)
    gallery, g_labels = e.copy(), np.array([0, 1])
    own, other = e[labels], e[1 - labels]
    first = (np.arange(20) < 10)[:, None]
    old = CellFeatures(np.where(first, own, other), labels, gallery, g_labels)
    new = CellFeatures(np.where(first, other, own), labels, gallery, g_labels)
    return old, new


def hits(q: CellFeatures, g: CellFeatures) -> np.ndarray:
    """Recall@1 per query by hand: the label of the most cosine-similar gallery item."""
    qn = q.query / np.linalg.norm(q.query, axis=1, keepdims=True)
    gn = g.gallery / np.linalg.norm(g.gallery, axis=1, keepdims=True)
    return (g.gallery_labels[np.argmax(qn @ gn.T, axis=1)] == q.query_labels).astype(float)


def bootstrap_by_hand(d: np.ndarray, *, resamples: int = 20000, level: float = 0.95, seed: int = 123) -> tuple[float, float]:
    """Percentile interval of the mean, resampling query indices (a different draw than the engine's)."""
    idx = np.random.default_rng(seed).integers(0, len(d), size=(resamples, len(d)))
    return tuple(np.quantile(d[idx].mean(1), [(1 - level) / 2, (1 + level) / 2]))

