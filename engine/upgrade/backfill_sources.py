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

Given the old queries too, the same pass over the old gallery keeps their top-D lists, and :class:`SourceBackfill` holds
them with the new queries' lists on the new gallery and the orders: the rank-merge roll-outs of the migration plan
(:mod:`engine.upgrade.source_remedies`) merge those two without reading a gallery again.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from engine.metrics.backfill import curve_area, fraction_to_reach
from engine.metrics.backfill_orders import adapter_residual, backfill_order, mean_distances
from engine.metrics.list_merge import ListCurve, list_curves, rows_of
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


@dataclass(frozen=True)
class SourceBackfill:
    """The backfill of one check from sources: needs, decided shares and notes, and the lists and orders behind them."""

    needs: tuple[BackfillNeed, ...]
    decided: dict[str, list[float]]  # ordering -> share of queries decided per point
    notes: tuple[str, ...]
    orders: dict[str, np.ndarray]  # ordering -> gallery rows, first backfilled first
    depth: int  # D of the lists
    new_on_new: TopK  # the new queries' top-D on the new gallery
    old_on_old: TopK | None = None  # the old queries' top-D on the old gallery (when they were given)


def source_orders(old_blocks: Blocks, new_blocks: Blocks, *, n_gallery: int, seed: int, block_rows: int,
                  gallery_labels: np.ndarray | None = None,
                  say: Callable[[float, str], None] = lambda f, m: None) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """The orderings of :data:`SOURCE_ORDERINGS` the sources allow (distance orders need labels) and a note per one left out."""
    orders = {"random": backfill_order("random", gallery_labels=np.zeros(n_gallery, np.int8), seed=seed)}
    if gallery_labels is not None:
        say(0.95, "backfill: the distance-to-class-mean orders (two passes over the old gallery)")
        orders.update(class_mean_orders(old_blocks, gallery_labels))
    say(0.96, "backfill: the residual order (one pass over both galleries)")
    residual = residual_order(old_blocks(), new_blocks(), n_gallery, max_pending=MAX_PENDING_BLOCKS * block_rows)
    if residual is None:
        return orders, ("backfill ordering adapter_residual left out: the two galleries list their items in orders too "
                        "different to pair them block by block",)
    return {**orders, "adapter_residual": residual}, ()


def decided_note(curves: dict[str, ListCurve], depth: int, n_gallery: int) -> str:
    """How many queries the merged lists decide, in words (the worst point of every curve)."""
    worst = min(min(c.decided) for c in curves.values())
    return ("every query decided at every point (D covers the gallery)" if depth >= n_gallery else
            f"queries decided: {100 * worst:.1f}% at the worst point (the others are left out of that point's mean; "
            "raise --backfill-depth to decide more)" if worst < 1 else "every query decided at every point")


def source_backfill(new_queries: np.ndarray, old_blocks: Blocks, new_blocks: Blocks, *, n_gallery: int, k: int,
                    depth: int, outcome: Callable[[TopK, np.ndarray], np.ndarray], old_self: float, seed: int,
                    block_rows: int, backend: str = "numpy", gallery_labels: np.ndarray | None = None,
                    old_queries: np.ndarray | None = None,
                    say: Callable[[float, str], None] = lambda f, m: None) -> SourceBackfill:
    """The backfill needs (one :class:`BackfillNeed` per ordering), each curve's share of decided queries per
    fraction, the notes, the orders and the lists; ``outcome(top, rows)`` is the check's per-query metric of merged
    top-``k`` lists. With ``gallery_labels`` (per old-gallery row) the distance-to-class-mean orders are added; with
    ``old_queries`` their top-D lists on the old gallery are kept from the same pass (for the rank merge)."""
    d = min(int(depth), n_gallery)
    n_q = len(new_queries)
    say(0.91, f"backfill: the new queries' top-{d} on the old gallery")
    stacked = new_queries if old_queries is None else np.concatenate([new_queries, old_queries])
    on_old = stream_topk(stacked, old_blocks(), k=d, backend=backend)
    old_on_old = None if old_queries is None else rows_of(on_old, np.arange(n_q, len(stacked)))
    on_old = on_old if old_queries is None else rows_of(on_old, np.arange(n_q))
    say(0.94, f"backfill: the new queries' top-{d} on the new gallery")
    on_new = stream_topk(new_queries, new_blocks(), k=d, backend=backend)
    orders, notes = source_orders(old_blocks, new_blocks, n_gallery=n_gallery, seed=seed, block_rows=block_rows,
                                  gallery_labels=gallery_labels, say=say)
    curves = list_curves(on_old, on_new, orders, outcome, k=k)
    needs = tuple(curve_need(name, c, old_self) for name, c in curves.items())
    decided = {name: c.decided.tolist() for name, c in curves.items()}
    notes += (f"backfill curves from sources: each point merges the new queries' top-{d} lists on the old and the "
              f"new gallery by score (item-by-item backfilling searched with the new queries); "
              f"{decided_note(curves, d, n_gallery)}",)
    return SourceBackfill(needs, decided, notes, orders, d, on_new, old_on_old)


def curve_need(name: str, curve: ListCurve, old_self: float) -> BackfillNeed:
    """One curve's need: its area (NaN when a point has no decided query), the fractions reaching the old self-test
    and the curve's own end (the new self-test)."""
    f, v = curve.fractions, curve.values
    area = curve_area(f, v) if np.isfinite(v).all() else float("nan")
    return BackfillNeed(name, area, fraction_to_reach(f, v, old_self), fraction_to_reach(f, v, float(v[-1])),
                        [float(x) for x in f], [float(x) for x in v])


__all__ = ["SOURCE_ORDERINGS", "SourceBackfill", "class_mean_orders", "curve_need", "decided_note", "default_depth",
           "residual_order", "source_backfill", "source_orders"]
