"""Backfill curves from two truncated top lists: item-by-item backfilling as a merge by score.

When the items of a set S carry their new embedding and the others their old one, searching that mixed gallery with
the new queries equals merging by score two lists (every item lives in exactly one index): the queries' top list on
the old gallery restricted to items outside S, and their top list on the new gallery restricted to S. This is the
rank merge by score of :mod:`engine.metrics.backfill_rollout` (``merge="score"``), done here on top-D lists that a
streamed pass (:func:`engine.metrics.topk.stream_topk`) kept, so a gallery of any size costs queries x D numbers.

Decided or not: an item beyond a truncated list scores at most that list's last kept score. The merged top-k is
therefore exact when its k-th score is strictly above the last kept score of every truncated list that may hide an
eligible item (one of its index's items at this point that the list does not hold); otherwise an item beyond depth D
could enter or tie, and the query is flagged undecided at that point (never guessed). A list that holds the whole
gallery (D >= gallery size) is complete: every query is decided; so is every query at beta = 0 and 1 when k <= D.

Order of the merged list: descending score; equal scores keep the order of their own list (stream position), and an
old-index item comes before a new-index item of the same score. At beta = 0 the merged list is the old list, at
beta = 1 the new list, item for item.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.metrics.backfill import DEFAULT_FRACTIONS, _check_fractions, _check_order, backfill_counts
from engine.metrics.topk import TopK


@dataclass(frozen=True)
class MergedLists:
    """The merged top-k of every query at one backfill point and which queries it decides exactly."""

    top: TopK
    decided: np.ndarray  # (n_q,) bool


def _complete(top: TopK) -> bool:
    return top.k >= top.n_gallery


def merge_backfilled(old: TopK, new: TopK, in_new: np.ndarray, k: int) -> MergedLists:
    """The top-``k`` of each query over the mixed gallery where row ``i`` is new-embedded iff ``in_new[i]``.

    ``old`` and ``new`` rank the same queries on the old and the new gallery (ids are gallery rows, ``in_new`` is
    indexed by them). Rows whose merged list cannot be decided from the truncated lists have ``decided`` False; their
    list is what the kept items give (padded with id -1 and score -inf when short).
    """
    in_new = np.asarray(in_new, bool)
    if old.ids.shape[0] != new.ids.shape[0]:
        raise ValueError(f"the old list has {old.ids.shape[0]} queries but the new list {new.ids.shape[0]}")
    if old.n_gallery != new.n_gallery or len(in_new) != old.n_gallery:
        raise ValueError(f"the lists rank galleries of {old.n_gallery} and {new.n_gallery} items and the mask has "
                         f"{len(in_new)}; all three must describe one gallery")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= old.n_gallery:
        raise ValueError(f"k must be in [1, {old.n_gallery}] (the gallery size), got {k!r}")
    keep_old = ~in_new[old.ids]
    keep_new = in_new[new.ids]
    scores = np.concatenate([np.where(keep_old, old.scores, -np.inf), np.where(keep_new, new.scores, -np.inf)], 1)
    ids = np.concatenate([np.where(keep_old, old.ids, -1), np.where(keep_new, new.ids, -1)], 1)
    order = np.argsort(-scores, axis=1, kind="stable")  # ties: old before new, each list in its own order
    width = min(k, scores.shape[1])
    s_sorted = np.take_along_axis(scores, order, 1)
    top_s = s_sorted[:, :width]
    top_i = np.take_along_axis(ids, order[:, :width], 1)
    if width < k:
        pad = k - width
        top_s = np.concatenate([top_s, np.full((len(top_s), pad), -np.inf)], 1)
        top_i = np.concatenate([top_i, np.full((len(top_i), pad), -1, np.int64)], 1)
    kth = top_s[:, -1]
    decided = np.isfinite(kth)
    n_new = int(in_new.sum())
    for lst, kept, eligible in ((old, keep_old, len(in_new) - n_new), (new, keep_new, n_new)):
        if not _complete(lst):  # an eligible item beyond the list scores <= its last kept score
            decided &= (kept.sum(1) == eligible) | (kth > lst.scores[:, -1])
    tied = (s_sorted[:, width:] == kth[:, None]).sum(1) if scores.shape[1] > width else np.zeros(len(kth), np.int64)
    tied = np.where(np.isfinite(kth), tied, 0).astype(np.int64)
    return MergedLists(TopK(top_i.astype(np.int64), top_s.astype(np.float32), tied, old.n_gallery), decided)


def rows_of(top: TopK, rows: np.ndarray) -> TopK:
    """The lists of the queries ``rows`` only."""
    return TopK(top.ids[rows], top.scores[rows], top.tied_beyond[rows], top.n_gallery)


@dataclass(frozen=True)
class ListCurve:
    """One ordering's curve from merged lists: the mean outcome over the decided queries at each fraction."""

    fractions: np.ndarray
    n_backfilled: np.ndarray
    values: np.ndarray  # NaN where no decided query has a defined outcome
    decided: np.ndarray  # share of the queries decided at each fraction


def list_curves(old: TopK, new: TopK, orders: Mapping[str, np.ndarray], outcome: Callable[[TopK, np.ndarray], np.ndarray],
                *, k: int, fractions: Sequence[float] | np.ndarray | None = None) -> dict[str, ListCurve]:
    """Per ordering (gallery rows, first backfilled first), the curve of ``outcome`` over the backfill ``fractions``.

    ``outcome(top, rows)`` gives the per-query values (NaN = undefined) of the queries ``rows`` from their merged
    top-``k`` lists ``top``; it is called on the decided queries only. Counts are ``round(beta * N)``
    (:func:`engine.metrics.backfill.backfill_counts`), as the in-memory curves.
    """
    f = _check_fractions(DEFAULT_FRACTIONS if fractions is None else fractions)
    n = old.n_gallery
    counts = backfill_counts(f, n)
    out = {}
    for name, order in orders.items():
        order = _check_order(order, n)
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n)
        values, decided = np.full(len(f), np.nan), np.zeros(len(f))
        for i, count in enumerate(counts):
            merged = merge_backfilled(old, new, rank < count, k)
            rows = np.flatnonzero(merged.decided)
            decided[i] = len(rows) / max(len(merged.decided), 1)
            if len(rows):
                got = np.asarray(outcome(rows_of(merged.top, rows), rows), np.float64)
                if np.isfinite(got).any():
                    values[i] = float(np.nanmean(got))
        out[name] = ListCurve(f, counts, values, decided)
    return out


__all__ = ["ListCurve", "MergedLists", "list_curves", "merge_backfilled", "rows_of"]
