"""Per-query ranking statistics from one similarity block: the single pass every metric derives from.

Conventions (documented once, used by every metric):

* The gallery columns are sorted by label, so the positives of a query of class ``c`` are the
  contiguous columns ``[start, end)``. A similarity of ``-inf`` marks an excluded gallery item
  (the query's own image under ``same_set``, an empty class template): it is neither a positive
  nor a negative.
* Ties follow scikit-learn's ``average_precision_score``: items with equal similarity share one
  threshold, so the precision at a positive with similarity ``s`` is
  ``#positives >= s / #items >= s``.
* For Recall@k the tie rule is explicit: ``pessimistic`` (default) counts a negative that ties the
  best positive as ranked before it, ``optimistic`` as ranked after it. A query is a hit at ``k``
  when fewer than ``k`` negatives rank before its best positive.
* Near ties (:mod:`engine.metrics.ties`): the negatives above the best positive by more than ``tol``
  (``RANK_TIE_TOLERANCE``), the negatives within ``tol`` of it and the positives within ``tol`` below it, counted
  in the same pass, give every Recall@k cell its tie share and its three readings.
* mAP@k (not used by the papers) is ``sum of precisions at positives ranked <= k / P`` (over every positive, as
  trec_eval's ``map_cut_k``, ranx and ir-measures), where a positive's rank is ``#items >= s``.

Two implementations compute the same numbers: compiled CPU kernels (numba) and a torch version
that runs on CUDA. On CPU, a request without AP takes the counting kernel (best positive, then two
branch-free counts over the row, which the compiler vectorises); with AP, the ranking kernel makes one
pass per query that places every negative between that query's sorted positives through buckets
(counted per bucket where a bucket holds no positive, placed exactly where it does). Tests check the
implementations against each other and against scikit-learn.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numba
import numpy as np

from engine.core.vocab import RANK_TIE_TOLERANCE
from engine.metrics.device import torch_threads_kept

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class QueryStats:
    """Ranking statistics of each query in a block; every retrieval metric derives from these."""

    n_positives: np.ndarray  # int64 (n,): valid positives in the gallery (0 = no positive)
    neg_ge_best: np.ndarray  # int64 (n,): negatives scoring >= the best positive
    neg_gt_best: np.ndarray  # int64 (n,): negatives scoring > the best positive
    ap: np.ndarray  # float64 (n,): average precision over the full ranking (NaN without positives)
    ap_at_k: np.ndarray  # float64 (n,): AP@k for the requested k (NaN when not requested)
    # near ties (module docstring; None where a pass did not count them, e.g. a backfill curve's points)
    neg_above: np.ndarray | None = None  # int64 (n,): negatives scoring above the best positive + tol
    neg_tied: np.ndarray | None = None  # int64 (n,): negatives within tol of the best positive
    pos_tied: np.ndarray | None = None  # int64 (n,): positives within tol below the best one, itself included

    @staticmethod
    def concat(parts: list["QueryStats"]) -> "QueryStats":
        """Stack the statistics of consecutive blocks (a field missing from any block is missing from the result)."""
        return QueryStats(*(None if any(getattr(p, f) is None for p in parts)
                            else np.concatenate([getattr(p, f) for p in parts]) for f in QueryStats.__dataclass_fields__))

    def take(self, order: np.ndarray) -> "QueryStats":
        """Reorder the queries (e.g. back to the caller's order)."""
        return QueryStats(*(None if getattr(self, f) is None else getattr(self, f)[order]
                            for f in QueryStats.__dataclass_fields__))


@numba.njit(inline="always")
def _bucket(x, lowest, scale, nb):  # pragma: no cover - compiled
    """min(int((x - lowest) * scale), nb), clamped to [0, nb] for any x (NaN included): never out of bounds."""
    f = (x - lowest) * scale
    if not f >= 0:
        return 0
    if f >= nb:
        return nb
    return np.intp(f)


@numba.njit(parallel=True, cache=True, nogil=True)
def _counts_kernel(sims, starts, ends, tol):  # pragma: no cover - compiled
    """Positives, negatives >= / > the best positive and the near-tie counts of each row (no AP); and NaN/+inf values
    of rows with a positive."""
    n, width = sims.shape
    n_pos = np.zeros(n, np.int64)
    neg_ge = np.zeros(n, np.int64)
    neg_gt = np.zeros(n, np.int64)
    above = np.zeros(n, np.int64)
    tied = np.zeros(n, np.int64)
    pos_tied = np.zeros(n, np.int64)
    bad = np.zeros(n, np.int64)
    for r in numba.prange(n):
        row = sims[r]
        best = -np.inf
        p = 0
        for j in range(starts[r], ends[r]):
            v = row[j]
            if v != -np.inf:
                p += 1
                best = max(best, v)
        n_pos[r] = p
        if p == 0:
            continue
        top = np.float64(best) + tol
        bottom = np.float64(best) - tol
        ge = 0
        gt = 0
        ab = 0
        near = 0
        nonfinite = 0
        for j in range(width):  # whole row, then take the positives back out: no branch in the long loop
            ge += row[j] >= best
            gt += row[j] > best
            ab += row[j] > top
            near += row[j] >= bottom
            nonfinite += not row[j] < np.inf  # NaN or +inf (-inf marks an excluded item)
        bad[r] = nonfinite
        pt = 0
        for j in range(starts[r], ends[r]):
            ge -= row[j] >= best
            gt -= row[j] > best
            ab -= row[j] > top
            near -= row[j] >= bottom
            pt += row[j] >= bottom
        neg_ge[r] = ge
        neg_gt[r] = gt
        above[r] = ab
        tied[r] = near - ab
        pos_tied[r] = pt
    return n_pos, neg_ge, neg_gt, above, tied, pos_tied, bad


@numba.njit(parallel=True, cache=True, nogil=True)
def _stats_kernel(sims, starts, ends, map_k, tol):  # pragma: no cover - compiled
    """Positives, negatives >= / > the best positive, AP and AP@k and the near-tie counts of each row; and NaN/+inf
    values of rows with a positive."""
    n, width = sims.shape
    n_pos = np.zeros(n, np.int64)
    neg_ge = np.zeros(n, np.int64)
    neg_gt = np.zeros(n, np.int64)
    above = np.zeros(n, np.int64)
    tied = np.zeros(n, np.int64)
    pos_tied = np.zeros(n, np.int64)
    ap = np.full(n, np.nan)
    ap_k = np.full(n, np.nan)
    bad = np.zeros(n, np.int64)
    for r in numba.prange(n):
        row = sims[r]
        a = starts[r]
        b = ends[r]
        nonfinite = 0  # NaN or +inf (-inf marks an excluded item): counted in the passes below, then refused
        pos = np.empty(b - a, np.float32)
        p = 0
        for j in range(a, b):
            nonfinite += not row[j] < np.inf
            if row[j] != -np.inf:
                pos[p] = row[j]
                p += 1
        n_pos[r] = p
        bad[r] = nonfinite
        if p == 0 or nonfinite:
            continue
        pos = np.sort(pos[:p])  # ascending
        best = pos[p - 1]
        lowest = pos[0]
        top = np.float64(best) + tol
        bottom = np.float64(best) - tol
        pt = 0
        for i in range(p):
            pt += pos[i] >= bottom
        pos_tied[r] = pt
        ab = 0
        near = 0
        # cnt[m] = negatives v with exactly m positives <= v. A negative in [lowest, best) is placed
        # through buckets: bucket(x) = min(int((x - lowest) * scale), nb) is monotone in x, so every
        # positive in a lower bucket is below v and every one in a higher bucket above it. A bucket
        # that holds no positive therefore gives all its negatives the same m (positives in lower
        # buckets) and only needs a count; in a bucket with positives each negative is placed exactly.
        nb, scale, in_bucket, below = _bucket_table(pos, width)
        hist = np.zeros(nb + 1, np.int32)
        cnt = np.zeros(p + 1, np.int64)
        ge = 0
        gt = 0
        for part in range(2):  # the negatives: the columns left and right of the positives' slice
            lo = 0 if part == 0 else b
            hi = a if part == 0 else width
            for j in range(lo, hi):
                v = row[j]
                nonfinite += not v < np.inf
                ab += v > top
                near += v >= bottom
                if v < lowest:
                    continue
                if v >= best:
                    ge += 1
                    gt += v > best
                    continue
                _place(v, pos, scale, nb, in_bucket, below, hist, cnt)
        for i in range(nb + 1):
            cnt[below[i]] += hist[i]
        cnt[p] = ge
        neg_gt[r] = gt
        neg_ge[r] = ge
        above[r] = ab
        tied[r] = near - ab
        bad[r] = nonfinite
        if nonfinite:
            continue
        ap[r], ap_k[r] = _ap_from_counts(pos, cnt, map_k)
    return n_pos, neg_ge, neg_gt, ap, ap_k, above, tied, pos_tied, bad


def stats_numba(sims: np.ndarray, starts: np.ndarray, ends: np.ndarray, *, map_k: int = 0, want_ap: bool = True) -> QueryStats:
    """Compiled CPU statistics for a float32 block ``sims`` (n, width); see the module docstring.

    Raises ValueError for column ranges outside the block or NaN/+inf similarities (the kernels flag them
    in the pass they make anyway), so a bad number gives an error, never a wrong metric or a crash.
    """
    sims = np.ascontiguousarray(sims, dtype=np.float32)
    starts, ends = starts.astype(np.int64), ends.astype(np.int64)
    if sims.ndim != 2 or starts.shape != ends.shape or starts.shape != (len(sims),):
        raise ValueError(f"ranking needs a 2-D block and one column range per row, got {sims.shape}, {starts.shape}, {ends.shape}")
    if len(sims) and (starts.min() < 0 or (ends < starts).any() or ends.max() > sims.shape[1]):
        raise ValueError(f"positive column ranges must lie within the block's {sims.shape[1]} columns")
    with torch_threads_kept():
        if want_ap or map_k:
            *out, bad = _stats_kernel(sims, starts, ends, int(map_k), RANK_TIE_TOLERANCE)
        else:
            nan = np.full(len(sims), np.nan)
            n_pos, neg_ge, neg_gt, *near, bad = _counts_kernel(sims, starts, ends, RANK_TIE_TOLERANCE)
            out = (n_pos, neg_ge, neg_gt, nan, nan.copy(), *near)
    rows = np.flatnonzero(bad)
    if len(rows):
        raise ValueError(f"similarities have NaN/inf values in {len(rows)} query row(s) (first: row {rows[0]}); "
                         f"the features are not finite after the float32 cast")
    return QueryStats(*out)


def stats_torch(sims: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, *, map_k: int = 0, want_ap: bool = True) -> QueryStats:
    """The same statistics with torch sorting (used on CUDA, and as the cross-check on CPU).

    Without AP (``want_ap=False`` and no ``map_k``) the sort is skipped and AP fields are NaN.
    """
    import torch

    n, width = sims.shape
    dev = sims.device
    cols = torch.arange(width, device=dev)
    in_slice = (cols[None, :] >= starts[:, None].to(dev)) & (cols[None, :] < ends[:, None].to(dev))
    valid = sims != -torch.inf
    is_pos = in_slice & valid
    is_neg = ~in_slice & valid
    n_pos = is_pos.sum(1)
    best = torch.where(is_pos, sims, torch.full_like(sims, -torch.inf)).amax(1)
    has = n_pos > 0
    neg_ge = torch.where(has, (is_neg & (sims >= best[:, None])).sum(1), 0)
    neg_gt = torch.where(has, (is_neg & (sims > best[:, None])).sum(1), 0)
    top, bottom = best.double()[:, None] + RANK_TIE_TOLERANCE, best.double()[:, None] - RANK_TIE_TOLERANCE
    wide = sims.double()
    to_np = lambda t: t.cpu().numpy().astype(np.int64)  # noqa: E731
    near = tuple(to_np(torch.where(has, counted.sum(1), 0)) for counted in
                 (is_neg & (wide > top), is_neg & (wide >= bottom) & (wide <= top), is_pos & (wide >= bottom)))
    if not want_ap and not map_k:
        nan = np.full(n, np.nan)
        return QueryStats(to_np(n_pos), to_np(neg_ge), to_np(neg_gt), nan, nan.copy(), *near)
    # threshold counts: for each item, items (and positives) with similarity >= its own
    vals = torch.where(valid, sims, torch.full_like(sims, -torch.inf))
    sorted_vals, order = torch.sort(vals, dim=1)  # ascending
    pos_sorted = is_pos.gather(1, order)
    first = torch.searchsorted(sorted_vals, vals, right=False)  # first sorted index with value >= own
    ge_all = width - first
    pos_from_top = torch.flip(torch.cumsum(torch.flip(pos_sorted.long(), [1]), 1), [1])
    ge_pos = pos_from_top.gather(1, first.clamp(max=width - 1))
    precision = torch.where(is_pos, ge_pos.double() / ge_all.double().clamp(min=1), torch.zeros((), dtype=torch.float64, device=dev))
    ap = torch.where(has, precision.sum(1) / n_pos.clamp(min=1), torch.full((n,), float("nan"), dtype=torch.float64, device=dev))
    if map_k > 0:
        in_top = is_pos & (ge_all <= map_k)
        ap_k_vals = torch.where(in_top, precision, torch.zeros_like(precision)).sum(1) / n_pos.clamp(min=1)
        ap_k = torch.where(has, ap_k_vals, torch.full_like(ap_k_vals, float("nan")))
    else:
        ap_k = torch.full((n,), float("nan"), dtype=torch.float64, device=dev)
    return QueryStats(to_np(n_pos), to_np(neg_ge), to_np(neg_gt), ap.cpu().numpy(), ap_k.cpu().numpy(), *near)


# Pieces of the ranking kernel, shared with the sharded search (engine.metrics.sharded) ------------------------


@numba.njit(inline="always")
def _bucket_table(pos, width):  # pragma: no cover - compiled
    """Buckets over [lowest, best] of the ascending positives ``pos``: (nb, scale, positives per bucket, positives below)."""
    p = len(pos)
    best = pos[p - 1]
    lowest = pos[0]
    nb = min(16 * p, 4 * width) + 16
    scale = np.float32(nb / (np.float64(best) - np.float64(lowest))) if best > lowest else np.float32(0.0)
    if not np.isfinite(scale):  # positives a few subnormals apart: one bucket, every negative placed exactly
        scale = np.float32(0.0)
    in_bucket = np.zeros(nb + 1, np.int32)
    for i in range(p):
        in_bucket[_bucket(pos[i], lowest, scale, nb)] += 1
    below = np.empty(nb + 1, np.int32)  # positives in lower buckets
    acc = 0
    for i in range(nb + 1):
        below[i] = acc
        acc += in_bucket[i]
    return nb, scale, in_bucket, below


@numba.njit(inline="always")
def _place(v, pos, scale, nb, in_bucket, below, hist, cnt):  # pragma: no cover - compiled
    """Count a negative ``lowest <= v < best``: in its bucket's histogram, or exactly in ``cnt`` where the bucket has positives."""
    k = _bucket(v, pos[0], scale, nb)
    if in_bucket[k] == 0:
        hist[k] += 1
    else:
        m = below[k]
        while m < len(pos) and pos[m] <= v:  # ends before len(pos) because v < best
            m += 1
        cnt[m] += 1


@numba.njit(inline="always")
def _ap_from_counts(pos, cnt, map_k):  # pragma: no cover - compiled
    """AP and AP@k (NaN when map_k is 0) from the ascending positives and cnt[m] = negatives with exactly m positives <= them."""
    p = len(pos)
    # walk tie groups of positives from the highest down; suffix = negatives >= group value
    total = 0.0
    total_k = 0.0
    suffix = 0
    m = p  # upper bound of the current group value
    i = p - 1
    while i >= 0:
        g0 = i
        while g0 > 0 and pos[g0 - 1] == pos[i]:
            g0 -= 1
        # group occupies [g0, i]; its upper bound is i + 1; negatives >= value: cnt[i+1..p]
        while m > i:
            suffix += cnt[m]
            m -= 1
        pos_ge = p - g0
        precision = pos_ge / (pos_ge + suffix)
        size = i - g0 + 1
        total += size * precision
        if map_k > 0 and pos_ge + suffix <= map_k:
            total_k += size * precision
        i = g0 - 1
    return total / p, (total_k / p if map_k > 0 else np.nan)
