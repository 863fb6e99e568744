"""Partial backfilling: retrieval metrics while gallery items are re-embedded one by one.

Setting (Paper B, Sec. 3.6; FastFill). The gallery starts embedded by the old model, raw or
forward-adapted (F(old)); queries come from the new model, raw or backward-adapted (B(new)). Gallery
items are re-embedded by the new model following an ordering ``order``, a permutation of the gallery
rows (first = re-embedded first). At a fraction beta the first ``round(beta * N)`` items of ``order``
carry their new embedding and the others their old one. Each such cell is scored with the evaluation
core's conventions (:mod:`engine.metrics.ranking`): cosine similarity, label-sorted gallery columns,
-inf for an excluded item, scikit-learn ties for AP, pessimistic ties for Recall@k by default, and
queries without a positive counted and left out of the means. The gallery kind is ``instance`` (class
templates would mix old and new items into one vector).

Choices:

* Rounding: ``round(beta * N)`` is the nearest integer with halves rounded up, ``floor(beta * N + 0.5)``
  (:func:`backfill_counts`). The paper writes ``floor(beta * N)``. The two agree whenever beta * N is an
  integer (the default grid with N a multiple of 20), and rounding keeps a product such as
  0.29 * 100 = 28.999999999999996 at 29 where flooring would drop it to 28.
* Area: M-tilde = E_{beta ~ U[0, 1]} M(beta) is the trapezoid rule over the grid, which must start at 0
  and end at 1 (:func:`curve_area`). Values are fractions in [0, 1], like every metric here.
* Endpoints: beta = 0 is the cross-test (new queries, old gallery) and beta = 1 the new model's
  self-test. Both equal ``retrieval_metrics`` on the pure galleries bit for bit, because the similarity
  blocks come from the search backends' own ``similarity_blocks`` on the same device
  (:func:`engine.metrics.device.auto_device`): same normalisation, same row blocks (``max_block``), same
  exclusion by index.

Evaluation is incremental (:mod:`engine.metrics.backfill_kernels`: on CPU every fraction from one pass per block, AP
included); the orderings live in
:mod:`engine.metrics.backfill_orders`.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.core.kinds import check_rank_ties
from engine.metrics.backfill_kernels import all_fraction_stats, mixed_stats, recall1_stats, segment_of_columns
from engine.metrics.device import auto_device, one_blas_thread
from engine.metrics.ranking import QueryStats
from engine.metrics.retrieval import RankTies, unit_rows, metrics_from_stats, parse_metric, prepare_gallery
from engine.metrics.search import DEFAULT_BLOCK, similarity_blocks
from engine.metrics.validate import check_cell, check_features

DEFAULT_FRACTIONS = np.linspace(0.0, 1.0, 21)


def backfill_counts(fractions: np.ndarray, n: int) -> np.ndarray:
    """Number of gallery items backfilled at each fraction: ``round(beta * n)``, halves rounded up."""
    return np.floor(np.asarray(fractions, dtype=np.float64) * n + 0.5).astype(np.int64)


def _check_fractions(fractions: Sequence[float] | np.ndarray | None) -> np.ndarray:
    f = DEFAULT_FRACTIONS.copy() if fractions is None else np.asarray(fractions, dtype=np.float64)
    if f.ndim != 1 or len(f) == 0:
        raise ValueError(f"fractions must be a non-empty 1-D grid of betas in [0, 1], got shape {f.shape}")
    if not np.isfinite(f).all() or f.min() < 0 or f.max() > 1:
        raise ValueError(f"fractions must lie in [0, 1], got values from {f.min()} to {f.max()}")
    steps = np.diff(f)
    if (steps <= 0).any():
        i = int(np.flatnonzero(steps <= 0)[0])
        raise ValueError(f"fractions must be strictly increasing; {f[i]} is followed by {f[i + 1]}")
    return f


def _check_order(order: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    order = np.asarray(order)
    if order.ndim != 1:
        raise ValueError(f"order must be a 1-D permutation of the gallery rows, got shape {order.shape}")
    if not np.issubdtype(order.dtype, np.integer):
        raise ValueError(f"order must hold integer gallery row indices, got dtype {order.dtype}")
    if len(order) != n:
        raise ValueError(f"order has {len(order)} entries but the gallery has {n} items; it must list every row once")
    outside = (order < 0) | (order >= n)
    if outside.any():
        raise ValueError(f"order has {int(outside.sum())} out-of-range indices (first: {order[outside][0]}); "
                         f"gallery rows are 0..{n - 1}")
    repeated = np.flatnonzero(np.bincount(order, minlength=n) > 1)
    if len(repeated):
        raise ValueError(f"order has duplicates: {len(repeated)} gallery rows appear more than once "
                         f"(first: {repeated[0]}); it must list every row once")
    return order.astype(np.int64)


def backfill_curves(
    query: np.ndarray,
    query_labels: np.ndarray,
    old_gallery: np.ndarray,
    new_gallery: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    order: Sequence[int] | np.ndarray,
    fractions: Sequence[float] | np.ndarray | None = None,
    metrics: Sequence[str] = ("recall@1", "map"),
    same_set: bool = False,
    rank_ties: RankTies = "pessimistic",
    max_block: int = DEFAULT_BLOCK,  # the search backends' default: same blocks, so the endpoints match it bit for bit
) -> dict[str, np.ndarray | int]:
    """Backfilling curves of several metrics from one pass over the queries.

    ``old_gallery`` and ``new_gallery`` embed the same items in the same row order (labels
    ``gallery_labels``); ``order`` lists the rows in backfilling order. Returns ``fractions``,
    ``n_backfilled`` (items backfilled at each fraction), one array per name in ``metrics`` (keyed by
    that name: ``recall@K``, ``map``, at most one ``map@K``), and ``n_queries``, ``n_valid`` and
    ``n_no_positive`` (the same at every fraction: exclusions are by index on both galleries).
    """
    return mixed_gallery_curves(query, query, query_labels, old_gallery, new_gallery, gallery_labels, order=order,
                                fractions=fractions, metrics=metrics, same_set=same_set, rank_ties=rank_ties, max_block=max_block)


def mixed_gallery_curves(
    query_old: np.ndarray,
    query_new: np.ndarray,
    query_labels: np.ndarray,
    old_gallery: np.ndarray,
    new_gallery: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    order: Sequence[int] | np.ndarray,
    fractions: Sequence[float] | np.ndarray | None = None,
    metrics: Sequence[str] = ("recall@1", "map"),
    same_set: bool = False,
    rank_ties: RankTies = "pessimistic",
    max_block: int = DEFAULT_BLOCK,
) -> dict[str, np.ndarray | int]:
    """:func:`backfill_curves` where an item not yet backfilled is scored against ``query_old`` and a backfilled
    one against ``query_new`` (the same query for item replacement; two indexes merged by score otherwise)."""
    n_old = check_two_spaces(query_old, query_new, query_labels, old_gallery, new_gallery, gallery_labels, same_set=same_set)
    order = _check_order(order, n_old)
    fractions = _check_fractions(fractions)
    metrics, parsed, ks, map_k, want_ap = parse_curve_metrics(metrics, rank_ties)

    device = auto_device()
    query_labels = np.asarray(query_labels)
    old_g = prepare_gallery(old_gallery, gallery_labels, device=device)
    new_g = prepare_gallery(new_gallery, gallery_labels, device=device)  # same labels -> same column order
    q_old = unit_rows(query_old, device)
    q_new = q_old if query_new is query_old else unit_rows(query_new, device)
    starts, ends = old_g.slices(query_labels)
    exclude = old_g.position if same_set else None
    counts = backfill_counts(fractions, n_old)
    cols = old_g.position[order]  # gallery column of each item, in backfilling order
    recall1_only = all(p == ("recall", 1) for p in parsed)
    segment = segment_of_columns(cols, counts) if recall1_only or device is None or device.type == "cpu" else None
    n_pos = ends - starts
    if exclude is not None:
        n_pos = n_pos - ((exclude >= starts) & (exclude < ends))

    parts: list[list[QueryStats]] = [[] for _ in fractions]
    blocks = zip(similarity_blocks(q_old, old_g, starts, ends, exclude, None, max_block),
                 similarity_blocks(q_new, new_g, starts, ends, exclude, None, max_block))
    with one_blas_thread(device is None):
        for (rows, s_old), (_, s_new) in blocks:
            if recall1_only:
                block = recall1_stats(s_old, s_new, starts[rows], ends[rows], segment, len(counts),
                                      n_pos[rows].astype(np.int64))
            elif segment is not None:  # CPU: every fraction from one pass (AP included)
                block = all_fraction_stats(s_old, s_new, starts[rows], ends[rows], segment, len(counts), map_k=map_k)
            else:
                block = mixed_stats(s_old, s_new, starts[rows], ends[rows], cols, counts, map_k=map_k, want_ap=want_ap)
            for acc, stats in zip(parts, block):
                acc.append(stats)

    return curve_output(parts, metrics, parsed, ks, map_k, rank_ties, fractions=fractions, n_backfilled=counts)


def check_two_spaces(query_old: np.ndarray, query_new: np.ndarray, query_labels: np.ndarray, old_gallery: np.ndarray,
                     new_gallery: np.ndarray, gallery_labels: np.ndarray, *, same_set: bool) -> int:
    """Validate an old index (searched with ``query_old``) and a new one (``query_new``) over the same items; the size."""
    check_features("query features", query_old)
    if query_new is not query_old:
        check_features("new-space query features", query_new)
        if np.shape(query_new)[0] != np.shape(query_old)[0]:
            raise ValueError(f"the old-space queries have {np.shape(query_old)[0]} rows but the new-space queries "
                             f"{np.shape(query_new)[0]}; both must embed the same queries in the same row order")
    check_features("old gallery features", old_gallery)
    check_features("new gallery features", new_gallery)
    (n_old, d_old), (n_new, d_new) = np.shape(old_gallery), np.shape(new_gallery)
    if n_old != n_new:
        raise ValueError(f"the old gallery has {n_old} rows but the new gallery has {n_new}; "
                         "both must embed the same items in the same row order")
    if query_new is query_old and d_old != d_new:
        raise ValueError(f"old gallery features are {d_old}-d but new gallery features are {d_new}-d; "
                         "adapt one side (F or B) so both live in the query's space")
    check_cell(query_old, query_labels, old_gallery, gallery_labels, same_set=same_set)
    if query_new is not query_old:
        check_cell(query_new, query_labels, new_gallery, gallery_labels, same_set=same_set)
    return n_old


def parse_curve_metrics(metrics: Sequence[str] | str, rank_ties: str) -> tuple[tuple[str, ...], list[tuple[str, int | None]], tuple[int, ...], int, bool]:
    """Validate curve metric names and the tie rule: (names, parsed, Recall@k ks, mAP@k's k or 0, whether AP is needed)."""
    metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    if not metrics or not all(isinstance(m, str) for m in metrics):
        raise ValueError(f"metrics must be a non-empty list of names such as 'recall@1' or 'map', got {metrics!r}")
    parsed = [parse_metric(m, pairs=False) for m in metrics]
    ks = tuple(sorted({k for kind, k in parsed if kind == "recall"}))
    map_ks = sorted({k for kind, k in parsed if kind == "map" and k})
    if len(map_ks) > 1:
        raise ValueError(f"one mAP@k at a time, got {map_ks}")
    check_rank_ties(rank_ties)
    return metrics, parsed, ks, (map_ks[0] if map_ks else 0), any(kind == "map" for kind, _ in parsed)


def curve_output(parts: list[list[QueryStats]], metrics: tuple[str, ...], parsed: list[tuple[str, int | None]],
                 recall_ks: tuple[int, ...], map_k: int, rank_ties: RankTies, **grid: np.ndarray) -> dict[str, np.ndarray | int]:
    """The curves' dict from the per-block statistics at each grid point: ``grid`` entries, one array per metric, counts."""
    per_point = [metrics_from_stats(QueryStats.concat(p), ks=recall_ks, map_at=map_k or None, want_map=("map", None) in parsed, rank_ties=rank_ties)
                 for p in parts]
    out: dict[str, np.ndarray | int] = dict(grid)
    for name, (kind, at) in zip(metrics, parsed):
        out[name] = np.array([m[f"{kind}@{at}" if at else kind] for m in per_point], dtype=np.float64)
    for key in ("n_queries", "n_valid", "n_no_positive"):
        out[key] = per_point[0][key]
    return out


def backfill_curve(
    query: np.ndarray,
    query_labels: np.ndarray,
    old_gallery: np.ndarray,
    new_gallery: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    order: Sequence[int] | np.ndarray,
    fractions: Sequence[float] | np.ndarray | None = None,
    metric: str = "recall@1",
    same_set: bool = False,
    rank_ties: RankTies = "pessimistic",
) -> tuple[np.ndarray, np.ndarray]:
    """One metric's backfilling curve: ``(fractions, values)`` (default grid 0, 0.05, ..., 1)."""
    if not isinstance(metric, str):
        raise ValueError(f"metric must be one name such as 'recall@1' or 'map', got {metric!r}")
    out = backfill_curves(query, query_labels, old_gallery, new_gallery, gallery_labels, order=order,
                          fractions=fractions, metrics=(metric,), same_set=same_set, rank_ties=rank_ties)
    return out["fractions"], out[metric]


def _check_curve(fractions: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    f = _check_fractions(fractions)
    v = np.asarray(values, dtype=np.float64)
    if v.shape != f.shape:
        raise ValueError(f"values has shape {v.shape} but fractions has shape {f.shape}; give one value per fraction")
    return f, v


def curve_area(fractions: np.ndarray, values: np.ndarray) -> float:
    """M-tilde: the area under a backfilling curve, trapezoid rule over a grid from 0 to 1.

    It approximates E_{beta ~ U[0, 1]} M(beta) (FastFill; Paper B), so a constant curve has that
    constant as its area.
    """
    f, v = _check_curve(fractions, values)
    if f[0] != 0.0 or f[-1] != 1.0:
        raise ValueError(f"the area M-tilde averages over beta in [0, 1]; the grid runs from {f[0]} to {f[-1]}")
    return float(np.trapezoid(v, f))


def fraction_to_reach(fractions: np.ndarray, values: np.ndarray, target: float) -> float | None:
    """The smallest beta at which the curve reaches ``target`` (e.g. the new model's self-test).

    The curve is read as piecewise linear between grid points: with i the first grid point whose value
    is >= ``target``, the answer is ``fractions[i]`` when i is the first point, otherwise the beta where
    the segment from point i - 1 to point i crosses ``target``. ``None`` when no point reaches it.
    """
    f, v = _check_curve(fractions, values)
    reached = np.flatnonzero(v >= target)
    if len(reached) == 0:
        return None
    i = int(reached[0])
    if i == 0:
        return float(f[0])
    return float(f[i - 1] + (target - v[i - 1]) * (f[i] - f[i - 1]) / (v[i] - v[i - 1]))
