"""Backfilling orders: which gallery items the new model re-embeds first (:func:`backfill_order`)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.metrics.validate import check_features, check_labels


def _gallery_size(**arrays: np.ndarray | None) -> int:
    sizes = {name: len(np.asarray(a)) for name, a in arrays.items() if a is not None}
    if not sizes:
        raise ValueError("an ordering needs the gallery: pass old_gallery, new_gallery, gallery_labels or new_logits")
    if len(set(sizes.values())) > 1:
        raise ValueError("the inputs disagree on the gallery size: " + ", ".join(f"{k} has {v} rows" for k, v in sizes.items()))
    return next(iter(sizes.values()))


def _need(ordering: str, what: str, value: np.ndarray | None, meaning: str) -> np.ndarray:
    if value is None:
        raise ValueError(f"ordering {ordering!r} needs {what} ({meaning})")
    return np.asarray(value)


def _random_order(*, old_gallery, new_gallery, gallery_labels, new_logits, seed) -> np.ndarray:
    """FCT's baseline: a seeded uniform permutation."""
    n = _gallery_size(old_gallery=old_gallery, new_gallery=new_gallery, gallery_labels=gallery_labels, new_logits=new_logits)
    return np.random.default_rng(seed).permutation(n).astype(np.int64)


def class_mean_distance(old_gallery: np.ndarray, gallery_labels: np.ndarray, *, kind: str = "mse") -> np.ndarray:
    """Distance of each gallery item to the mean of its class, both in the given (old / F-adapted) space.

    The class mean is the plain mean of the features as given (not L2-normalised), over the gallery
    items of that class. ``kind="mse"``: the Euclidean distance ``||x - mu||_2`` (Paper B calls it MSE;
    ``||x - mu||^2 / d`` gives the same order). ``kind="cosine"``: ``1 - cos(x, mu)``, a zero vector having
    cosine 0 as under ``F.normalize``. An item alone in its class is its own mean: distance 0.
    """
    check_features("old gallery features", old_gallery)
    check_labels("gallery labels", gallery_labels, np.shape(old_gallery)[0])
    x = torch.as_tensor(np.asarray(old_gallery), dtype=torch.float64)
    _, inverse = np.unique(np.asarray(gallery_labels), return_inverse=True)
    idx = torch.as_tensor(inverse)
    sums = torch.zeros(int(inverse.max()) + 1, x.shape[1], dtype=torch.float64).index_add_(0, idx, x)
    means = (sums / torch.bincount(idx)[:, None])[idx]
    if kind == "mse":
        return torch.linalg.vector_norm(x - means, dim=1).numpy()
    if kind == "cosine":
        return (1.0 - torch.nn.functional.cosine_similarity(x, means, dim=1, eps=1e-12)).numpy()
    raise ValueError(f"unknown distance {kind!r}; use 'mse' or 'cosine'")


def _distance_ordering(kind: str, *, farthest_first: bool) -> Callable[..., np.ndarray]:
    name = f"distance_{kind}" + ("" if farthest_first else "_reverse")

    def ordering(*, old_gallery, new_gallery, gallery_labels, new_logits, seed) -> np.ndarray:
        feats = _need(name, "old_gallery", old_gallery, "the (forward-adapted) old gallery features")
        labels = _need(name, "gallery_labels", gallery_labels, "the class of each gallery item")
        _gallery_size(old_gallery=feats, new_gallery=new_gallery, gallery_labels=labels, new_logits=new_logits)
        far_first = np.argsort(-class_mean_distance(feats, labels, kind=kind), kind="stable").astype(np.int64)
        return far_first if farthest_first else far_first[::-1].copy()

    ordering.__doc__ = (f"{'Largest' if farthest_first else 'Smallest'} {kind} distance to the class mean first "
                        f"({'ties by lower row' if farthest_first else 'exactly the reverse of distance_' + kind}).")
    return ordering


def _confidence_order(*, old_gallery, new_gallery, gallery_labels, new_logits, seed) -> np.ndarray:
    """Lowest new-model confidence (max softmax) first; ties by lower row."""
    logits = _need("confidence", "new_logits", new_logits, "the new classifier's logits for each gallery item")
    check_features("new_logits", logits)
    if logits.shape[1] < 2:
        raise ValueError(f"new_logits needs at least 2 classes to measure confidence, got {logits.shape[1]}")
    _gallery_size(old_gallery=old_gallery, new_gallery=new_gallery, gallery_labels=gallery_labels, new_logits=logits)
    confidence = torch.softmax(torch.as_tensor(logits, dtype=torch.float64), dim=1).amax(1).numpy()
    return np.argsort(confidence, kind="stable").astype(np.int64)


ORDERINGS: dict[str, Callable[..., np.ndarray]] = {
    "random": _random_order,
    "distance_mse": _distance_ordering("mse", farthest_first=True),
    "distance_cosine": _distance_ordering("cosine", farthest_first=True),
    "distance_mse_reverse": _distance_ordering("mse", farthest_first=False),
    "distance_cosine_reverse": _distance_ordering("cosine", farthest_first=False),
    "confidence": _confidence_order,
}


def backfill_order(
    name: str,
    *,
    old_gallery: np.ndarray | None = None,
    new_gallery: np.ndarray | None = None,
    gallery_labels: np.ndarray | None = None,
    new_logits: np.ndarray | None = None,
    seed: int = 0,
) -> np.ndarray:
    """A backfilling order (a permutation of the gallery rows, first = backfilled first).

    * ``random``: seeded uniform permutation (FCT's baseline).
    * ``distance_mse`` / ``distance_cosine``: farthest from the class mean first (Paper B, Sec. 3.6 and
      App. G). Pass as ``old_gallery`` the gallery as stored before backfilling, i.e. the
      forward-adapted F(old) features when F exists; the class means are the means of those features
      over the gallery items of each class (gallery labels). See :func:`class_mean_distance`.
    * ``distance_mse_reverse`` / ``distance_cosine_reverse``: the same orders reversed (nearest first).
    * ``confidence``: lowest max-softmax of the new model's classifier first. Low confidence marks an
      item the new model places near a class boundary, where its stale embedding is most likely to be
      retrieved wrongly or to displace a positive: the same "least reliable first" idea as FastFill's
      uncertainty order and Paper B's outliers first. It is oracle-free only when ``new_logits`` come
      without re-processing the images, e.g. the new classifier applied to F(old); logits from new-model
      forward passes cost as much as the backfilling itself.
    """
    if name not in ORDERINGS:
        raise ValueError(f"unknown backfilling order {name!r}; known: {', '.join(ORDERINGS)}")
    return ORDERINGS[name](old_gallery=old_gallery, new_gallery=new_gallery, gallery_labels=gallery_labels,
                           new_logits=new_logits, seed=seed)
