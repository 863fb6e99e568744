"""Pair-verification accuracy, paper 002's metric M for CIFAR-100/10 and LFW (Sec. 5.1), as its code computes it.

Paper 002 draws 3,000 positive and 3,000 negative pairs at random from a test set; one image of a
pair is the query (embedded by the query model), the other the gallery image (embedded by the
gallery model); "same class?" is decided from the cosine distance. The paper does not say how the
threshold is chosen; its released code (``cores/eval.py``, ``verification``, copied from
insightface) does, and this module follows it:

* pairs: draw two images uniformly at random, keep the pair if its kind (same / different class)
  still needs pairs, until both kinds have ``n_pairs``; pair order is the draw order. Here the
  generator is **seeded** (the released code is not), the first image comes from the query set and
  the second from the gallery set, and under ``same_set`` a pair of an image with itself is
  redrawn (it would be a trivially positive pair of the self-test);
* features L2-normalised, distance = squared Euclidean (= 2 - 2 cos);
* thresholds ``0, 0.001, ..., 3.999``; "same" when distance < threshold;
* 10 contiguous folds in pair order (scikit-learn ``KFold(10, shuffle=False)``): on each fold the
  threshold with the best accuracy on the other nine (the smallest one on a tie) is applied;
* M = the mean of the ten fold accuracies.

Each pair's correct/incorrect outcome is also returned, so an ECC cell can be tested pair by pair.
"""
from __future__ import annotations

import numpy as np

N_PAIRS = 3000  # positive pairs, and as many negative pairs (paper 002, Sec. 5.1)
N_FOLDS = 10
PAIR_SEED = 0
THRESHOLDS = np.arange(0, 4, 0.001)
_DRAW = 1 << 16


def sample_pairs(query_labels: np.ndarray, gallery_labels: np.ndarray, *, n_pairs: int = N_PAIRS, seed: int = PAIR_SEED,
                 same_set: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(query index, gallery index, same class)`` of ``n_pairs`` positive and ``n_pairs`` negative pairs, in draw order."""
    ql, gl = np.asarray(query_labels), np.asarray(gallery_labels)
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be >= 1, got {n_pairs}")
    if not len(ql) or not len(gl):
        raise ValueError("pair verification needs at least one query and one gallery image")
    classes, g_counts = np.unique(gl, return_counts=True)
    q_counts = np.bincount(np.searchsorted(classes, ql[np.isin(ql, classes)]), minlength=len(classes))
    own = len(ql) if same_set else 0  # an image paired with itself is never drawn
    positives = int(np.sum(q_counts * g_counts)) - own
    if positives <= 0:
        raise ValueError("pair verification needs a class with two images (one query, one gallery); there is none")
    if len(ql) * len(gl) - own - positives <= 0:
        raise ValueError("pair verification needs images of two different classes; there is only one class")
    rng = np.random.default_rng(seed)
    need = {True: n_pairs, False: n_pairs}
    qs, gs, same = [], [], []
    while need[True] or need[False]:
        i, j = rng.integers(0, len(ql), _DRAW), rng.integers(0, len(gl), _DRAW)
        if same_set:
            i, j = i[i != j], j[i != j]
        kind = ql[i] == gl[j]
        # keep a draw while its kind still needs pairs: the first need[kind] draws of each kind, in draw order
        rank = np.where(kind, np.cumsum(kind), np.cumsum(~kind))
        take = np.where(kind, rank <= need[True], rank <= need[False])
        qs.append(i[take]), gs.append(j[take]), same.append(kind[take])
        need = {True: need[True] - int(np.sum(kind & take)), False: need[False] - int(np.sum(~kind & take))}
    return np.concatenate(qs), np.concatenate(gs), np.concatenate(same)


def _fold_bounds(n: int, folds: int) -> list[tuple[int, int]]:
    """Contiguous folds as scikit-learn's ``KFold(shuffle=False)`` makes them (the first n % folds one longer)."""
    sizes = np.full(folds, n // folds) + (np.arange(folds) < n % folds)
    ends = np.cumsum(sizes)
    return list(zip(ends - sizes, ends))


def _best_threshold(dist: np.ndarray, same: np.ndarray) -> float:
    """The grid threshold with the highest accuracy on these pairs (the smallest on a tie)."""
    pos, neg = np.sort(dist[same]), np.sort(dist[~same])
    correct = np.searchsorted(pos, THRESHOLDS, side="left") + len(neg) - np.searchsorted(neg, THRESHOLDS, side="left")
    return float(THRESHOLDS[int(np.argmax(correct))])


def verification_outcomes(query: np.ndarray, gallery: np.ndarray, same: np.ndarray, *, folds: int = N_FOLDS) -> tuple[float, np.ndarray]:
    """``(accuracy, correct per pair)`` of paired features: row i of ``query`` and of ``gallery`` form pair i."""
    q = np.asarray(query, dtype=np.float64)
    g = np.asarray(gallery, dtype=np.float64)
    same = np.asarray(same, dtype=bool)
    if q.shape != g.shape or q.ndim != 2 or len(same) != len(q):
        raise ValueError(f"pair features must be two (n, d) arrays and n labels, got {q.shape}, {g.shape}, {same.shape}")
    if len(q) < folds:
        raise ValueError(f"pair verification needs at least {folds} pairs, got {len(q)}")
    q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    g /= np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-12)
    dist = np.sum((q - g) ** 2, axis=1)
    correct = np.zeros(len(q), bool)
    accuracies = []
    for a, b in _fold_bounds(len(q), folds):
        train = np.r_[0:a, b:len(q)]
        thr = _best_threshold(dist[train], same[train])
        correct[a:b] = (dist[a:b] < thr) == same[a:b]
        accuracies.append(correct[a:b].mean())
    return float(np.mean(accuracies)), correct


def pair_verification(query: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray, *,
                      same_set: bool = False, n_pairs: int = N_PAIRS, seed: int = PAIR_SEED) -> tuple[float, np.ndarray]:
    """Pair-verification accuracy of one cell and each pair's outcome (pairs sampled with ``seed``)."""
    qi, gi, same = sample_pairs(query_labels, gallery_labels, n_pairs=n_pairs, seed=seed, same_set=same_set)
    return verification_outcomes(np.asarray(query)[qi], np.asarray(gallery)[gi], same)
