"""Backfilling orders: which gallery items the new model re-embeds first (:func:`backfill_order`)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.core.norms import EPS
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


def _random_order(*, old_gallery, new_gallery, gallery_labels, new_logits, seed, adapter=None) -> np.ndarray:
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
    if kind not in ("mse", "cosine"):
        raise ValueError(f"unknown distance {kind!r}; use 'mse' or 'cosine'")
    x = np.asarray(old_gallery, dtype=np.float64)
    _, inverse = np.unique(np.asarray(gallery_labels), return_inverse=True)
    sums = np.zeros((int(inverse.max()) + 1, x.shape[1]))
    np.add.at(sums, inverse, x)
    return mean_distances(x, (sums / np.bincount(inverse)[:, None])[inverse])[kind]


def mean_distances(x: np.ndarray, means: np.ndarray) -> dict[str, np.ndarray]:
    """Per row, ``mse`` = ``||x - mu||_2`` and ``cosine`` = ``1 - cos(x, mu)`` in float64, the cosine as torch's
    ``cosine_similarity`` takes it (each side divided by its norm floored at 1e-12, so a zero vector has cosine 0)."""
    x, means = np.asarray(x, dtype=np.float64), np.asarray(means, dtype=np.float64)
    unit = lambda a: a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), EPS)  # noqa: E731
    return {"mse": np.linalg.norm(x - means, axis=1), "cosine": 1.0 - (unit(x) * unit(means)).sum(1)}


def _distance_ordering(kind: str, *, farthest_first: bool) -> Callable[..., np.ndarray]:
    name = f"distance_{kind}" + ("" if farthest_first else "_reverse")

    def ordering(*, old_gallery, new_gallery, gallery_labels, new_logits, seed, adapter=None) -> np.ndarray:
        feats = _need(name, "old_gallery", old_gallery, "the (forward-adapted) old gallery features")
        labels = _need(name, "gallery_labels", gallery_labels, "the class of each gallery item")
        _gallery_size(old_gallery=feats, new_gallery=new_gallery, gallery_labels=labels, new_logits=new_logits)
        far_first = np.argsort(-class_mean_distance(feats, labels, kind=kind), kind="stable").astype(np.int64)
        return far_first if farthest_first else far_first[::-1].copy()

    ordering.__doc__ = (f"{'Largest' if farthest_first else 'Smallest'} {kind} distance to the class mean first "
                        f"({'ties by lower row' if farthest_first else 'exactly the reverse of distance_' + kind}).")
    return ordering


def _confidence_order(*, old_gallery, new_gallery, gallery_labels, new_logits, seed, adapter=None) -> np.ndarray:
    """Lowest new-model confidence (max softmax) first; ties by lower row."""
    logits = _need("confidence", "new_logits", new_logits, "the new classifier's logits for each gallery item")
    check_features("new_logits", logits)
    if logits.shape[1] < 2:
        raise ValueError(f"new_logits needs at least 2 classes to measure confidence, got {logits.shape[1]}")
    _gallery_size(old_gallery=old_gallery, new_gallery=new_gallery, gallery_labels=gallery_labels, new_logits=logits)
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max(1, keepdims=True))
    confidence = (e / e.sum(1, keepdims=True)).max(1)
    return np.argsort(confidence, kind="stable").astype(np.int64)


Adapter = Callable[[np.ndarray], np.ndarray] | np.ndarray | None
RESIDUAL_BLOCK = 4096  # gallery rows mapped and measured at a time


def adapter_residual(new_gallery: np.ndarray, old_gallery: np.ndarray, *, adapter: Adapter = None,
                     normalize: bool = True) -> np.ndarray:
    """Per gallery item, ``||A(new_i) - old_i||_2``: how far the adapted new embedding lands from the stored old one.

    ``adapter`` maps new-model rows into the old space: a callable applied to blocks of rows (float32 in, an
    array with one row per input row out), an array of the already adapted rows (same shape as
    ``old_gallery``), or ``None`` for the identity (same dimension needed). With ``normalize`` (default)
    both vectors are first scaled to unit length, as retrieval compares them by cosine: the residual is then
    ``sqrt(2 - 2 cos)``; without it, the raw Euclidean distance.
    """
    check_features("old gallery features", old_gallery)
    check_features("new gallery features", new_gallery)
    n, d_old = np.shape(old_gallery)
    if len(new_gallery) != n:
        raise ValueError(f"the new gallery has {len(new_gallery)} rows but the old gallery has {n}; "
                         "both must embed the same items in the same row order")
    if isinstance(adapter, np.ndarray) and adapter.shape != (n, d_old):
        raise ValueError(f"the adapted new gallery has shape {adapter.shape} but the old gallery {(n, d_old)}; "
                         "give one adapted row per gallery item, in the old space")
    if adapter is None and np.shape(new_gallery)[1] != d_old:
        raise ValueError(f"new gallery features are {np.shape(new_gallery)[1]}-d but old ones {d_old}-d; "
                         "without an adapter the residual needs one space: pass the map (or the adapted rows)")
    if not (adapter is None or callable(adapter) or isinstance(adapter, np.ndarray)):
        raise ValueError(f"adapter must be a callable, an array of adapted rows or None, got {type(adapter).__name__}")
    out = np.empty(n, np.float64)
    for lo in range(0, n, RESIDUAL_BLOCK):
        rows = slice(lo, min(n, lo + RESIDUAL_BLOCK))
        new = np.asarray(new_gallery[rows], dtype=np.float32)
        if isinstance(adapter, np.ndarray):
            mapped = adapter[rows]
        elif adapter is None:
            mapped = new
        else:
            mapped = np.asarray(adapter(new))
            if mapped.shape != (len(new), d_old):
                raise ValueError(f"the adapter returned shape {mapped.shape} for {len(new)} rows; "
                                 f"expected ({len(new)}, {d_old}), rows in the old space")
            if not np.isfinite(mapped).all():
                raise ValueError("the adapter returned NaN/inf values")
        a = np.asarray(mapped, dtype=np.float64)
        o = np.asarray(old_gallery[rows], dtype=np.float64)
        if normalize:
            a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
            o = o / np.maximum(np.linalg.norm(o, axis=1, keepdims=True), 1e-12)
        out[rows] = np.linalg.norm(a - o, axis=1)
    return out


def _residual_order(*, old_gallery, new_gallery, gallery_labels, new_logits, seed, adapter=None) -> np.ndarray:
    """Largest adapter residual ||A(new) - old|| first (no labels); ties by lower row."""
    old = _need("adapter_residual", "old_gallery", old_gallery, "the old gallery features as stored")
    new = _need("adapter_residual", "new_gallery", new_gallery, "the new model's gallery features")
    _gallery_size(old_gallery=old, new_gallery=new, gallery_labels=gallery_labels, new_logits=new_logits)
    return np.argsort(-adapter_residual(new, old, adapter=adapter), kind="stable").astype(np.int64)


ORDERINGS: dict[str, Callable[..., np.ndarray]] = {
    "random": _random_order,
    "distance_mse": _distance_ordering("mse", farthest_first=True),
    "distance_cosine": _distance_ordering("cosine", farthest_first=True),
    "distance_mse_reverse": _distance_ordering("mse", farthest_first=False),
    "distance_cosine_reverse": _distance_ordering("cosine", farthest_first=False),
    "confidence": _confidence_order,
    "adapter_residual": _residual_order,
}


def backfill_order(
    name: str,
    *,
    old_gallery: np.ndarray | None = None,
    new_gallery: np.ndarray | None = None,
    gallery_labels: np.ndarray | None = None,
    new_logits: np.ndarray | None = None,
    seed: int = 0,
    adapter: Adapter = None,
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
    * ``adapter_residual``: largest ``||A(new_i) - old_i||`` first (:func:`adapter_residual`; ``adapter`` is the
      new-to-old map, a callable or the adapted rows, identity when ``None``), needing no labels: the items whose
      stored old vector sits farthest from where the adapted queries look for them. It reads the new model's
      embedding of every item, so it fits a roll-out where the new embeddings are computed ahead and the index
      is swapped in steps; where re-embedding itself is the cost it is an oracle (an upper bound to compare with).
    """
    if name not in ORDERINGS:
        raise ValueError(f"unknown backfilling order {name!r}; known: {', '.join(ORDERINGS)}")
    return ORDERINGS[name](old_gallery=old_gallery, new_gallery=new_gallery, gallery_labels=gallery_labels,
                           new_logits=new_logits, seed=seed, adapter=adapter)
