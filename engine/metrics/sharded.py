"""Exact retrieval statistics of one cell when the gallery arrives as shards (e.g. read from disk one at a time).

The result is the :class:`~engine.metrics.ranking.QueryStats` that :func:`engine.metrics.retrieval.cell_stats`
computes on the whole gallery, so Recall@k, mAP and mAP@k follow from :func:`metrics_from_stats` unchanged.
Memory holds one block of (query rows x shard items) similarities (at most ``max_block`` entries, or one
query row when a shard is wider), about two shards (the one being read while the last is released), the
queries, and per-query state of the size of each query's positives (values and counts); never the gallery.

Route: two counting passes over the shards (no top-k heaps). Every statistic is a count that adds up
across shards once each query's positives are known:

1. Gather each query's positive similarities (its class's items, its own item excluded), sorted.
2. For every negative ``v``: ``m = #positives <= v`` and ``cnt[m] += 1`` (bucketed as in the single-shot
   kernel), plus the counts ``>= best`` / ``> best`` positive. ``cnt`` is the same array that
   ``ranking._stats_kernel`` builds per row, so AP and AP@k come from the same walk over it.

Counts merge by addition, so the statistics are exact, including the negatives tied with the best positive
that both Recall@k tie rules need and that a top-k heap would only give below k. Tie rules are ranking.py's:
scikit-learn thresholds for AP, ``pessimistic``/``optimistic`` for Recall@k. RankTies are resolved the same way as
single-shot wherever the similarities are the same floats; the BLAS product of a (block x shard) may round the
last bit differently from that of a (block x gallery), so items within one float32 ulp may order differently.

Exclusion is by global id: ``exclude_ids[i]`` is the gallery id of query ``i``'s own item (``-1``: none),
what ``same_set=True`` means for a gallery whose ids are the query rows. Template galleries take one pass
instead: class sums are accumulated over the shards (memory: classes x d), then searched single-shot.
Instance galleries are read twice, so ``shards`` is a list or a function returning a fresh iterable.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numba
import numpy as np

from engine.metrics.device import one_blas_thread, torch_threads_kept
from engine.metrics.ranking import QueryStats, _ap_from_counts, _bucket_table, _place
from engine.metrics.retrieval import GalleryKind, RankTies, cell_stats, metrics_from_stats, unit_rows
from engine.metrics.search import DEFAULT_BLOCK
from engine.metrics.validate import check_features, check_labels
from engine.core.vocab import GALLERY_KINDS, RANK_TIE_TOLERANCE


@dataclass(frozen=True)
class Shard:
    """A slice of the gallery: features (m, d), labels (m,) and gallery ids (m,), unique across shards."""

    features: np.ndarray
    labels: np.ndarray
    ids: np.ndarray


ShardSource = Iterable[Shard] | Callable[[], Iterable[Shard]]


def _passes(shards: ShardSource) -> Callable[[], Iterator[tuple[int, Shard]]]:
    """A function that starts one pass over the shards; refuses a one-shot iterator."""
    if not callable(shards) and iter(shards) is shards:
        raise ValueError("shards must be re-iterable (a list, or a function returning a fresh iterator): "
                         "exact search reads the gallery twice")
    return lambda: enumerate(shards() if callable(shards) else shards)


def checked_shard(index: int, shard: Shard, d: int) -> Shard | None:
    """The shard with array fields (None when empty), or ValueError naming the shard."""
    if not isinstance(shard, Shard):
        shard = Shard(*shard)
    feats, labels, ids = np.asarray(shard.features), np.asarray(shard.labels), np.asarray(shard.ids)
    try:
        if feats.ndim == 2 and feats.shape[0] == 0:
            return None
        check_features("gallery features", feats)
        check_labels("gallery labels", labels, len(feats))
        check_labels("gallery ids", ids, len(feats))
    except ValueError as err:
        raise ValueError(f"shard {index}: {err}") from None
    if feats.shape[1] != d:
        raise ValueError(f"shard {index}: gallery features are {feats.shape[1]}-d but query features are {d}-d")
    if not np.issubdtype(ids.dtype, np.integer) or len(np.unique(ids)) != len(ids):
        raise ValueError(f"shard {index}: gallery ids must be distinct integers")
    return Shard(feats, labels, ids.astype(np.int64))


def _similarities(q: np.ndarray, g: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Cosine similarities of a block of unit query rows to a shard's unit rows, written into ``out``."""
    return np.matmul(q, g.T, out=out[: len(q), : len(g)])


def shard_blocks(q: np.ndarray, shard: Shard, exclude_ids: np.ndarray | None, max_block: int,
                 hits: np.ndarray | None) -> Iterator[tuple[slice, np.ndarray]]:
    """``(rows, sims)`` of each query block (unit float32 rows, :func:`unit_rows`) against one shard, own items set to
    -inf (counted in ``hits``)."""
    g = unit_rows(shard.features)
    step = max(1, max_block // len(g))
    out = np.empty((min(step, len(q)), len(g)), np.float32)
    order = np.argsort(shard.ids)
    sorted_ids = shard.ids[order]
    for lo in range(0, len(q), step):
        rows = slice(lo, min(len(q), lo + step))
        sims = _similarities(q[rows], g, out)
        if exclude_ids is not None:
            at = np.clip(np.searchsorted(sorted_ids, exclude_ids[rows]), 0, len(g) - 1)
            found = np.flatnonzero(sorted_ids[at] == exclude_ids[rows])
            sims[found, order[at[found]]] = -np.inf
            if hits is not None:
                hits[lo + found] += 1
        yield rows, sims


def label_codes(classes: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each label's index among the sorted distinct query labels ``classes`` (-1 when no query has it)."""
    at = np.clip(np.searchsorted(classes, labels), 0, len(classes) - 1)
    return np.where(classes[at] == labels, at, -1).astype(np.int64)


@numba.njit(parallel=True, cache=True, nogil=True)
def count_kernel(sims, row0, qcode, gcode, offsets, pos, cnt, neg_ge, neg_gt, want_cnt, above, tied,
                 tol):  # pragma: no cover - compiled
    """Add one (block x shard) of negatives to each query's counts: >= / > best positive, cnt[m] (see docstring), and
    the negatives above the best positive + tol and within tol of it (engine.metrics.ranking's near ties)."""
    n, width = sims.shape
    for r in numba.prange(n):
        i = row0 + r
        a = offsets[i]
        p = offsets[i + 1] - a
        if p == 0:
            continue
        row = sims[r]
        c = qcode[i]
        mine = pos[a: a + p]
        best = mine[p - 1]
        top = np.float64(best) + tol
        bottom = np.float64(best) - tol
        ge = 0
        gt = 0
        ab = 0
        near = 0
        if not want_cnt:
            for j in range(width):
                if gcode[j] != c:
                    ge += row[j] >= best
                    gt += row[j] > best
                    ab += row[j] > top
                    near += row[j] >= bottom
            neg_ge[i] += ge
            neg_gt[i] += gt
            above[i] += ab
            tied[i] += near - ab
            continue
        nb, scale, in_bucket, below = _bucket_table(mine, width)
        hist = np.zeros(nb + 1, np.int64)
        counts = cnt[a + i: a + i + p + 1]  # this query's cnt[0..p]
        for j in range(width):
            v = row[j]
            if gcode[j] == c:  # a positive (or excluded: -inf)
                continue
            ab += v > top
            near += v >= bottom
            if v < mine[0]:  # below every positive
                continue
            if v >= best:
                ge += 1
                gt += v > best
            else:
                _place(v, mine, scale, nb, in_bucket, below, hist, counts)
        for k in range(nb + 1):
            counts[below[k]] += hist[k]
        counts[p] += ge
        neg_ge[i] += ge
        neg_gt[i] += gt
        above[i] += ab
        tied[i] += near - ab


def tied_positives(offsets: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Each query's positives within ``RANK_TIE_TOLERANCE`` below its best one (itself included), from its sorted
    positives ``pos[offsets[i]:offsets[i + 1]]``."""
    n = len(offsets) - 1
    counts = np.diff(offsets)
    has = counts > 0
    best = np.full(n, np.inf)
    best[has] = pos[offsets[1:][has] - 1]
    owner = np.repeat(np.arange(n), counts)
    near = pos.astype(np.float64) >= best[owner] - RANK_TIE_TOLERANCE
    return np.bincount(owner, weights=near, minlength=n).astype(np.int64)


@numba.njit(parallel=True, cache=True)
def ap_kernel(offsets, pos, cnt, map_k):  # pragma: no cover - compiled
    """AP and AP@k of each query from its sorted positives and its cnt."""
    n = len(offsets) - 1
    ap = np.full(n, np.nan)
    ap_k = np.full(n, np.nan)
    for q in numba.prange(n):
        a, b = offsets[q], offsets[q + 1]
        if b > a:
            ap[q], ap_k[q] = _ap_from_counts(pos[a:b], cnt[a + q: b + q + 1], map_k)
    return ap, ap_k


def _nonempty(each_pass, d: int) -> Iterator[Shard]:
    """The checked shards of one pass, empty ones skipped."""
    for index, raw in each_pass():
        shard = checked_shard(index, raw, d)
        if shard is not None:
            yield shard


def _pass(q, classes, each_pass, exclude_ids, max_block: int, hits, seen: list[int]):
    """One pass over the gallery: ``(gallery label codes, query rows, sims)`` per block; appends the items read to ``seen``."""
    seen.append(0)
    for shard in _nonempty(each_pass, q.shape[1]):
        seen[-1] += len(shard.ids)
        gcode = label_codes(classes, shard.labels)
        for rows, sims in shard_blocks(q, shard, exclude_ids, max_block, hits):
            yield gcode, rows, sims


def gather_positives(q: np.ndarray, qcode: np.ndarray, classes: np.ndarray, each_pass: Callable[[], Iterator[tuple[int, Shard]]],
                     exclude_ids: np.ndarray | None, max_block: int, seen: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Pass 1: each query's positive similarities, sorted ascending, as (offsets, values)."""
    who, vals = [], []
    hits = np.zeros(len(q), np.int64) if exclude_ids is not None else None
    for gcode, rows, sims in _pass(q, classes, each_pass, exclude_ids, max_block, hits, seen):
        r, c = np.nonzero((qcode[rows, None] == gcode[None, :]) & (sims != -np.inf))
        who.append((r + rows.start).astype(np.int64))
        vals.append(sims[r, c])
    if seen[0] == 0:
        raise ValueError("gallery features are empty: no shard has an item")
    if hits is not None and hits.max(initial=0) > 1:
        raise ValueError(f"gallery id {exclude_ids[np.argmax(hits)]} appears in more than one shard")
    return group_by_query(who, vals, len(q))


def group_by_query(who: list[np.ndarray], vals: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Positive similarities ``vals`` of queries ``who`` (lists of parts) as (offsets, values sorted per query)."""
    who_all = np.concatenate(who) if who else np.zeros(0, np.int64)
    vals_all = np.concatenate(vals) if vals else np.zeros(0, np.float32)
    order = np.lexsort((vals_all, who_all))
    offsets = np.concatenate([[0], np.cumsum(np.bincount(who_all, minlength=n))]).astype(np.int64)
    return offsets, np.ascontiguousarray(vals_all[order], dtype=np.float32)


def _class_sums(each_pass, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Template pass: the sum of each class's unit features over all shards, as (classes, sums)."""
    classes, sums = None, np.zeros((0, d), np.float32)
    for shard in _nonempty(each_pass, d):
        merged = np.unique(shard.labels) if classes is None else np.union1d(classes, shard.labels)
        total = np.zeros((len(merged), d), np.float32)
        if classes is not None:
            np.add.at(total, np.searchsorted(merged, classes), sums)
        np.add.at(total, np.searchsorted(merged, shard.labels), unit_rows(shard.features))
        classes, sums = merged, total
    if classes is None:
        raise ValueError("gallery features are empty: no shard has an item")
    return classes, sums


def sharded_cell_stats(
    query: np.ndarray,
    query_labels: np.ndarray,
    shards: ShardSource,
    *,
    gallery_kind: GalleryKind = "instance",
    exclude_ids: np.ndarray | None = None,
    map_k: int = 0,
    want_ap: bool = True,
    max_block: int = DEFAULT_BLOCK,
) -> QueryStats:
    """Per-query statistics of a cell whose gallery is a re-iterable of :class:`Shard` (see the module docstring).

    ``exclude_ids[i]`` is the gallery id of query ``i``'s own item, left out of its ranking (-1: none).
    """
    check_features("query features", query)
    query_labels = np.asarray(query_labels)
    check_labels("query labels", query_labels, len(query))
    if gallery_kind not in GALLERY_KINDS:
        raise ValueError(f"unknown gallery kind {gallery_kind!r}; use 'instance' or 'template'")
    if exclude_ids is not None:
        exclude_ids = np.asarray(exclude_ids)
        check_labels("exclude ids", exclude_ids, len(query))
        if not np.issubdtype(exclude_ids.dtype, np.integer):
            raise ValueError(f"exclude ids must be integer gallery ids (-1 for none), got dtype {exclude_ids.dtype}")
        exclude_ids = exclude_ids.astype(np.int64)
    each_pass = _passes(shards)
    if gallery_kind == "template":
        if exclude_ids is not None:
            raise ValueError("template galleries with same-set exclusion are not supported sharded; evaluate them with cell_stats")
        classes, sums = _class_sums(each_pass, np.asarray(query).shape[1])
        return cell_stats(query, query_labels, sums, classes, map_k=map_k, want_ap=want_ap, max_block=max_block)
    q = unit_rows(query)
    classes = np.unique(query_labels)
    qcode = label_codes(classes, query_labels)
    seen: list[int] = []
    want_cnt = bool(want_ap or map_k)
    with one_blas_thread():
        offsets, pos = gather_positives(q, qcode, classes, each_pass, exclude_ids, max_block, seen)
        cnt = np.zeros(offsets[-1] + len(q) if want_cnt else 0, np.int64)
        neg_ge, neg_gt, above, tied = (np.zeros(len(q), np.int64) for _ in range(4))
        for gcode, rows, sims in _pass(q, classes, each_pass, exclude_ids, max_block, None, seen):
            with torch_threads_kept():
                count_kernel(sims, rows.start, qcode, gcode, offsets, pos, cnt, neg_ge, neg_gt, want_cnt, above, tied,
                             RANK_TIE_TOLERANCE)
    if seen[1] != seen[0]:
        raise ValueError(f"the shards changed between the two passes ({seen[0]} then {seen[1]} items); "
                         "they must yield the same gallery each time")
    n_pos = np.diff(offsets)
    if want_cnt:
        ap, ap_k = ap_kernel(offsets, pos, cnt, int(map_k))
    else:
        ap, ap_k = np.full(len(q), np.nan), np.full(len(q), np.nan)
    return QueryStats(n_pos, neg_ge, neg_gt, ap, ap_k, above, tied, tied_positives(offsets, pos))


def sharded_retrieval_metrics(
    query: np.ndarray,
    query_labels: np.ndarray,
    shards: ShardSource,
    *,
    ks: tuple[int, ...] = (1, 5),
    map_at: int | None = None,
    gallery_kind: GalleryKind = "instance",
    exclude_ids: np.ndarray | None = None,
    rank_ties: RankTies = "pessimistic",
    compute_map: bool = True,
    max_block: int = DEFAULT_BLOCK,
) -> dict[str, float | int]:
    """:func:`engine.metrics.retrieval.retrieval_metrics` of a gallery given as shards (same keys, same values)."""
    ks = tuple(int(k) for k in ks)
    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be >= 1, got {ks}")
    stats = sharded_cell_stats(query, query_labels, shards, gallery_kind=gallery_kind, exclude_ids=exclude_ids,
                               map_k=map_at or 0, want_ap=compute_map or bool(map_at), max_block=max_block)
    return metrics_from_stats(stats, ks=ks, map_at=map_at, want_map=compute_map, rank_ties=rank_ties)


__all__ = ["Shard", "ShardSource", "ap_kernel", "checked_shard", "count_kernel", "gather_positives", "group_by_query",
           "label_codes", "shard_blocks", "sharded_cell_stats", "sharded_retrieval_metrics"]
