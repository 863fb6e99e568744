"""Compiled CPU kernels of the roll-out curves (:mod:`engine.metrics.backfill_rollout`).

Each grid point of a rank merge by rank or of candidate re-scoring is a ranking built from parts of the gallery
(an index, the candidates, the rest), each part in the order of one similarity. The rows are sorted once per block
(:func:`sorted_columns`, by old and by new similarity); at each grid point the ranking is walked from the top,
tie group by tie group, and the statistics the ranking kernel would give are accumulated on the way (the walk
stops at the last positive): AP with scikit-learn's ties (a positive's precision counts every item of its tie
group), AP@k, and the negatives at or above / above the best positive. The same arithmetic, in the same order, as
:func:`engine.metrics.ranking._ap_from_counts`.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(parallel=True, cache=True, nogil=True)
def _sorted_columns_kernel(sims, col_of_row):  # pragma: no cover - compiled
    n, width = sims.shape
    out = np.empty((n, width), np.int64)
    for r in numba.prange(n):
        negated = np.empty(width, np.float32)
        for i in range(width):
            v = sims[r, col_of_row[i]]
            negated[i] = np.float32(0.0) if v == 0 else -v  # 0.0 and -0.0 are one value
        bits = negated.view(np.uint32)
        keys = np.empty(width, np.uint64)
        for i in range(width):  # (value from the highest down, gallery row) packed in one integer: one plain sort
            b = np.uint64(bits[i])
            ordered = (~b & np.uint64(0xFFFFFFFF)) if b & np.uint64(0x80000000) else (b | np.uint64(0x80000000))
            keys[i] = (ordered << np.uint64(32)) | np.uint64(i)
        keys.sort()
        for i in range(width):
            out[r, i] = col_of_row[np.int64(keys[i] & np.uint64(0xFFFFFFFF))]
    return out


def sorted_columns(sims: np.ndarray, col_of_row: np.ndarray) -> np.ndarray:
    """Per row, the block's columns by similarity, highest first, ties by lower gallery row (``col_of_row[row]`` = column)."""
    return _sorted_columns_kernel(np.ascontiguousarray(sims, dtype=np.float32), col_of_row.astype(np.int64))


@numba.njit(inline="always")
def _next_group(sims, r, cols, ptr, segment, point, want_new, head, a, b):  # pragma: no cover - compiled
    """The next tie group of one part from ``ptr``: (next ptr, items of the part before it, items, positives).

    Membership: with ``head`` given (size > 0), the candidates (``want_new``) or the others; else an index of the
    rank merge, the new one (``segment <= point``, ``want_new``) or the old one. ``items = 0`` when the part is done.
    """
    width = len(cols)
    g = 0
    gp = 0
    value = np.float32(0.0)
    while ptr < width:
        j = cols[ptr]
        member = head[j] if len(head) else segment[j] <= point
        if member != want_new:
            ptr += 1
            continue
        v = sims[r, j]
        if v == -np.inf:  # excluded items sort last: the part is done
            ptr = width
            break
        if g and v != value:
            break
        value = v
        g += 1
        gp += a <= j < b
        ptr += 1
    return ptr, g, gp


@numba.njit(inline="always")
def _take(g, gp, state, map_k):  # pragma: no cover - compiled
    """Add one tie group (g items, gp positives) below the ones taken; state = [C, P, found, neg_gt, neg_ge, total, total_k]."""
    state[0] += g
    state[1] += gp
    if gp:
        if not state[2]:
            state[2] = 1
            state[3] = (state[0] - g) - (state[1] - gp)  # negatives ranked above the best positive's group
            state[4] = state[0] - state[1]  # ... and in it
        precision = state[1] / state[0]
        state[5] += gp * precision
        if map_k > 0 and state[0] <= map_k:
            state[6] += gp * precision


@numba.njit(inline="always")
def _store(state, p, map_k, i, r, n_pos, neg_ge, neg_gt, ap, ap_k):  # pragma: no cover - compiled
    n_pos[i, r] = p
    if p:
        neg_gt[i, r] = np.int64(state[3])
        neg_ge[i, r] = np.int64(state[4])
        ap[i, r] = state[5] / p
        if map_k > 0:
            ap_k[i, r] = state[6] / p  # over every positive, as trec_eval's map_cut


@numba.njit(parallel=True, cache=True, nogil=True)
def _rank_merge_stats_kernel(s_old, s_new, by_old, by_new, segment, starts, ends, n_points, map_k):  # pragma: no cover
    n, width = s_old.shape
    n_pos = np.zeros((n_points, n), np.int64)
    neg_ge = np.zeros((n_points, n), np.int64)
    neg_gt = np.zeros((n_points, n), np.int64)
    ap = np.full((n_points, n), np.nan)
    ap_k = np.full((n_points, n), np.nan)
    no_head = np.zeros(0, np.bool_)
    for r in numba.prange(n):
        a = starts[r]
        b = ends[r]
        p = 0
        for j in range(a, b):
            p += s_old[r, j] != -np.inf
        for i in range(n_points):
            state = np.zeros(7)
            pn, gn, gpn = _next_group(s_new, r, by_new[r], 0, segment, i, True, no_head, a, b)
            po, go, gpo = _next_group(s_old, r, by_old[r], 0, segment, i, False, no_head, a, b)
            rn = 0  # items of the new index above its current group
            ro = 0
            while (gn or go) and state[1] < p:
                if gn and (not go or rn <= ro):  # the new index first at an equal place
                    _take(gn, gpn, state, map_k)
                    rn += gn
                    pn, gn, gpn = _next_group(s_new, r, by_new[r], pn, segment, i, True, no_head, a, b)
                else:
                    _take(go, gpo, state, map_k)
                    ro += go
                    po, go, gpo = _next_group(s_old, r, by_old[r], po, segment, i, False, no_head, a, b)
            _store(state, p, map_k, i, r, n_pos, neg_ge, neg_gt, ap, ap_k)
    return n_pos, neg_ge, neg_gt, ap, ap_k


@numba.njit(parallel=True, cache=True, nogil=True)
def _rescoring_stats_kernel(s_old, s_new, by_old, by_new, ks, starts, ends, map_k):  # pragma: no cover - compiled
    n, width = s_old.shape
    n_points = len(ks)
    n_pos = np.zeros((n_points, n), np.int64)
    neg_ge = np.zeros((n_points, n), np.int64)
    neg_gt = np.zeros((n_points, n), np.int64)
    ap = np.full((n_points, n), np.nan)
    ap_k = np.full((n_points, n), np.nan)
    dummy = np.zeros(0, np.int64)
    for r in numba.prange(n):
        a = starts[r]
        b = ends[r]
        p = 0
        for j in range(a, b):
            p += s_old[r, j] != -np.inf
        head = np.zeros(width, np.bool_)
        marked = 0
        taken = 0
        for i in range(n_points):
            while taken < ks[i] and marked < width:  # the old ranking's first k valid items (ties by lower row)
                j = by_old[r, marked]
                marked += 1
                if s_old[r, j] != -np.inf:
                    head[j] = True
                    taken += 1
            state = np.zeros(7)
            ptr = 0
            while state[1] < p:  # the candidates, by new similarity
                ptr, g, gp = _next_group(s_new, r, by_new[r], ptr, dummy, 0, True, head, a, b)
                if not g:
                    break
                _take(g, gp, state, map_k)
            ptr = 0
            while state[1] < p:  # then the others, in old order
                ptr, g, gp = _next_group(s_old, r, by_old[r], ptr, dummy, 0, False, head, a, b)
                if not g:
                    break
                _take(g, gp, state, map_k)
            _store(state, p, map_k, i, r, n_pos, neg_ge, neg_gt, ap, ap_k)
    return n_pos, neg_ge, neg_gt, ap, ap_k


def rank_merge_stats(s_old: np.ndarray, s_new: np.ndarray, by_old: np.ndarray, by_new: np.ndarray, segment: np.ndarray,
                     starts: np.ndarray, ends: np.ndarray, n_points: int, *, map_k: int) -> tuple[np.ndarray, ...]:
    """Statistics of the merge by rank at every fraction, (n_points, n) each: an item in the new index (``segment <=``
    the fraction) at place ``2r``, in the old one at ``2r + 1``, r = items of its index scoring strictly higher."""
    return _rank_merge_stats_kernel(s_old, s_new, by_old, by_new, segment.astype(np.int64), starts.astype(np.int64),
                                    ends.astype(np.int64), int(n_points), int(map_k))


def rescoring_stats(s_old: np.ndarray, s_new: np.ndarray, by_old: np.ndarray, by_new: np.ndarray, ks: np.ndarray,
                    starts: np.ndarray, ends: np.ndarray, *, map_k: int) -> tuple[np.ndarray, ...]:
    """Statistics of candidate re-scoring at every K in ``ks`` (ascending), (len(ks), n) each."""
    return _rescoring_stats_kernel(s_old, s_new, by_old, by_new, ks.astype(np.int64), starts.astype(np.int64),
                                   ends.astype(np.int64), int(map_k))
