"""Backfill curves of ``check-upgrade --old-gallery ... --new-gallery ...``, the galleries streamed.

One extra streamed pass (:func:`engine.metrics.topk.stream_topk`) keeps each new query's top-D list on the old
gallery and on the new one; every point of every curve is then a merge of the two lists
(:mod:`engine.metrics.list_merge`), exact for the queries the lists decide and flagged for the others. Orderings:

* ``random``: the seeded permutation of :func:`engine.metrics.backfill_orders.backfill_order`;
* ``distance_mse`` / ``distance_cosine`` (when the old gallery has labels): farthest from its class mean in the old
  space first, as :func:`engine.metrics.backfill_orders.class_mean_distance`, from two passes over the old gallery
  (the class sums, then each item's distance);
* ``adapter_residual`` (identity map, the two models share one space here): largest ``||new_i - old_i||`` of the
  unit vectors first, from one lock-step pass over both galleries matched by id
  (:func:`engine.metrics.backfill_orders.adapter_residual` on each pair of blocks). When the two galleries list their
  items in orders too different to pair within a bounded buffer, the ordering is left out with a note.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np

from engine.metrics.backfill import curve_area, fraction_to_reach
from engine.metrics.backfill_orders import adapter_residual, backfill_order, mean_distances
from engine.metrics.list_merge import ListCurve, list_curves
from engine.metrics.topk import TopK, stream_topk
from engine.upgrade.verdict import BackfillNeed

SOURCE_ORDERINGS = ("random", "distance_mse", "distance_cosine", "adapter_residual")
MAX_PENDING_BLOCKS = 4  # the residual pass buffers at most this many blocks of unmatched rows per side

Blocks = Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]  # a fresh pass: (gallery rows, vectors) blocks


def default_depth(k: int) -> int:
    """The lists' default depth D: max(10 k, 100)."""
    return max(10 * int(k), 100)


def residual_order(old_blocks: Iterable[tuple[np.ndarray, np.ndarray]],
                   new_blocks: Iterable[tuple[np.ndarray, np.ndarray]], n: int, *,
                   max_pending: int) -> np.ndarray | None:
    """Gallery rows by largest identity residual first (ties by lower row), or None when the two streams' orders
    differ by more than ``max_pending`` rows (the pairing buffer's bound)."""
    res = np.full(n, np.nan)
    pending: list[dict[int, np.ndarray]] = [{}, {}]
    streams = [iter(old_blocks), iter(new_blocks)]
    live = [True, True]
    while any(live):
        for side in (0, 1):
            if not live[side]:
                continue
            got = next(streams[side], None)
            if got is None:
                live[side] = False
                continue
            rows, vectors = got
            pending[side].update(zip(np.asarray(rows).tolist(), np.asarray(vectors)))
        both = sorted(pending[0].keys() & pending[1].keys())
        if both:
            old_rows = np.stack([pending[0].pop(r) for r in both])
            new_rows = np.stack([pending[1].pop(r) for r in both])
            res[both] = adapter_residual(new_rows, old_rows)
        if len(pending[0]) + len(pending[1]) > max_pending:
            return None
    if np.isnan(res).any():
        raise ValueError(f"the residual pass paired {int((~np.isnan(res)).sum())} of {n} gallery items")
    return np.argsort(-res, kind="stable").astype(np.int64)


def class_mean_orders(blocks: Blocks, labels: np.ndarray) -> dict[str, np.ndarray]:
    """``distance_mse`` and ``distance_cosine`` orders (farthest from the class mean first, ties by lower row) from two
    passes over the old gallery; ``labels`` are the gallery rows' labels."""
    _, inverse = np.unique(np.asarray(labels), return_inverse=True)
    index = inverse.reshape(-1)
    sums = None
    for rows, vectors in blocks():
        x = np.asarray(vectors, dtype=np.float64)
        if sums is None:
            sums = np.zeros((int(inverse.max()) + 1, x.shape[1]))
        np.add.at(sums, index[rows], x)
    means = sums / np.bincount(index)[:, None]
    dist = {"mse": np.empty(len(inverse)), "cosine": np.empty(len(inverse))}
    for rows, vectors in blocks():
        for kind, d in mean_distances(vectors, means[index[rows]]).items():
            dist[kind][rows] = d
    return {f"distance_{kind}": np.argsort(-d, kind="stable").astype(np.int64) for kind, d in dist.items()}


def source_backfill(new_queries: np.ndarray, old_blocks: Blocks, new_blocks: Blocks, *, n_gallery: int, k: int,
                    depth: int, outcome: Callable[[TopK, np.ndarray], np.ndarray], old_self: float, seed: int,
                    block_rows: int, backend: str = "numpy", gallery_labels: np.ndarray | None = None,
                    say: Callable[[float, str], None] = lambda f, m: None) -> tuple[tuple[BackfillNeed, ...],
                                                                                 dict[str, list[float]], tuple[str, ...]]:
    """The backfill needs (one :class:`BackfillNeed` per ordering), each curve's share of decided queries per
    fraction, and the notes; ``outcome(top, rows)`` is the check's per-query metric of merged top-``k`` lists.
    With ``gallery_labels`` (per old-gallery row) the distance-to-class-mean orders are added."""
    d = min(int(depth), n_gallery)
    say(0.91, f"backfill: the new queries' top-{d} on the old gallery")
    on_old = stream_topk(new_queries, old_blocks(), k=d, backend=backend)
    say(0.94, f"backfill: the new queries' top-{d} on the new gallery")
    on_new = stream_topk(new_queries, new_blocks(), k=d, backend=backend)
    orders = {"random": backfill_order("random", gallery_labels=np.zeros(n_gallery, np.int8), seed=seed)}
    notes = []
    if gallery_labels is not None:
        say(0.95, "backfill: the distance-to-class-mean orders (two passes over the old gallery)")
        orders.update(class_mean_orders(old_blocks, gallery_labels))
    say(0.96, "backfill: the residual order (one pass over both galleries)")
    residual = residual_order(old_blocks(), new_blocks(), n_gallery, max_pending=MAX_PENDING_BLOCKS * block_rows)
    if residual is None:
        notes.append("backfill ordering adapter_residual left out: the two galleries list their items in orders too "
                     "different to pair them block by block")
    else:
        orders["adapter_residual"] = residual
    curves = list_curves(on_old, on_new, orders, outcome, k=k)
    needs = tuple(_need(name, c, old_self) for name, c in curves.items())
    decided = {name: c.decided.tolist() for name, c in curves.items()}
    worst = min(min(c.decided) for c in curves.values())
    exact = ("every query decided at every point (D covers the gallery)" if d >= n_gallery else
             f"queries decided: {100 * worst:.1f}% at the worst point (the others are left out of that point's mean; "
             "raise --backfill-depth to decide more)" if worst < 1 else "every query decided at every point")
    notes.append(f"backfill curves from sources: each point merges the new queries' top-{d} lists on the old and the "
                 f"new gallery by score (item-by-item backfilling searched with the new queries); {exact}")
    return needs, decided, tuple(notes)


def _need(name: str, curve: ListCurve, old_self: float) -> BackfillNeed:
    f, v = curve.fractions, curve.values
    area = curve_area(f, v) if np.isfinite(v).all() else float("nan")
    return BackfillNeed(name, area, fraction_to_reach(f, v, old_self), fraction_to_reach(f, v, float(v[-1])),
                        [float(x) for x in f], [float(x) for x in v])


__all__ = ["SOURCE_ORDERINGS", "class_mean_orders", "default_depth", "residual_order", "source_backfill"]
