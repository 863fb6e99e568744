"""Compiled and torch kernels of the backfilling curves (:mod:`engine.metrics.backfill`).

Evaluation is incremental: per block of query rows, the similarities to the old and to the new
gallery are computed once (two matrix products). On CPU, one compiled pass per query then gives every
fraction's statistics, AP included (:func:`all_fraction_stats`). On CUDA, for each beta the columns backfilled
since the previous beta are copied from the new block into the old one (the backfilled sets are nested), and
the ranking kernel runs on that mixed block (:func:`mixed_stats`). A request for Recall@1 alone skips the ranking kernel: one
pass over both blocks collects, per query, the best positive and the best negative of each segment of
the order (the items first backfilled at one fraction); the best positive and negative at every beta
are then prefix/suffix maxima over those segments (:func:`recall1_stats`). Exact, and its cost does
not grow with the grid size.
"""
from __future__ import annotations

from typing import Any

import numba
import numpy as np

from engine.metrics.device import host, on_cpu, torch_threads_kept
from engine.metrics.ranking import QueryStats, _ap_from_counts, _bucket, _bucket_table, stats_numba, stats_torch


def _stats(sims: Any, starts: np.ndarray, ends: np.ndarray, *, map_k: int, want_ap: bool) -> QueryStats:
    """The ranking statistics of one block (a numpy array or a tensor), with the kernel the search backends use there."""
    if on_cpu(sims):
        return stats_numba(host(sims), starts, ends, map_k=map_k, want_ap=want_ap)
    import torch

    return stats_torch(sims, torch.as_tensor(starts), torch.as_tensor(ends), map_k=map_k, want_ap=want_ap)


@numba.njit(parallel=True, cache=True, nogil=True)
def _copy_columns_kernel(dst, src, cols):  # pragma: no cover - compiled
    for r in numba.prange(dst.shape[0]):
        for c in cols:
            dst[r, c] = src[r, c]


def copy_columns(dst: Any, src: Any, cols: np.ndarray) -> None:
    """``dst[:, cols] = src[:, cols]`` in place (compiled on CPU, where torch's column indexing is slow)."""
    cols = np.sort(cols)  # ascending columns walk each row forwards
    if on_cpu(dst):
        _copy_columns_kernel(host(dst), host(src), cols)
    else:
        import torch

        idx = torch.as_tensor(cols, device=dst.device)
        dst.index_copy_(1, idx, src.index_select(1, idx))


def mixed_stats(s_old: Any, s_new: Any, starts: np.ndarray, ends: np.ndarray,
                cols: np.ndarray, counts: np.ndarray, *, map_k: int, want_ap: bool) -> list[QueryStats]:
    """Statistics at every fraction; ``s_old`` becomes the mixed block (new columns copied in, in place)."""
    out, done = [], 0
    for k in counts:
        if k > done:
            copy_columns(s_old, s_new, cols[done:k])
            done = k
        out.append(_stats(s_old, starts, ends, map_k=map_k, want_ap=want_ap))
    return out


def segment_of_columns(cols: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Segment of each gallery column: the index of the first fraction at which it is backfilled.

    ``cols`` lists the columns in backfilling order. Segment i holds the columns first backfilled at
    fraction i; segment ``len(counts)`` those the grid never backfills (when it stops before 1).
    """
    position = np.empty(len(cols), np.int64)
    position[cols] = np.arange(len(cols))
    return np.searchsorted(counts, position, side="right").astype(np.int64)


@numba.njit(parallel=True, cache=True, nogil=True)
def _segment_maxima_kernel(s_old, s_new, segment, starts, ends, n_seg):  # pragma: no cover - compiled
    n, width = s_old.shape
    out = np.full((4, n, n_seg), -np.inf, np.float32)  # old positives, old negatives, new positives, new negatives
    for r in numba.prange(n):
        a = starts[r]
        b = ends[r]
        for j in range(width):
            s = segment[j]
            k = 0 if a <= j < b else 1
            v = s_old[r, j]
            if v > out[k, r, s]:
                out[k, r, s] = v
            v = s_new[r, j]
            if v > out[2 + k, r, s]:
                out[2 + k, r, s] = v
    return out


def segment_maxima(s_old: Any, s_new: Any, segment: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   n_seg: int, *, engine: str = "auto") -> np.ndarray:
    """Per query and segment, the best positive and the best negative similarity, old and new (-inf if none).

    Returns float32 (4, n, n_seg): old positives, old negatives, new positives, new negatives. One pass
    over both blocks: the compiled kernel on CPU (``engine="auto"``/``"numba"``), torch scatter otherwise.
    """
    if engine not in ("auto", "numba", "torch"):
        raise ValueError(f"unknown engine {engine!r}; use 'auto', 'numba' or 'torch'")
    if engine == "numba" or (engine == "auto" and on_cpu(s_old)):
        return _segment_maxima_kernel(host(s_old), host(s_new), segment, starts.astype(np.int64), ends.astype(np.int64), n_seg)
    import torch

    s_old, s_new = torch.as_tensor(s_old), torch.as_tensor(s_new)
    n, width = s_old.shape
    dev = s_old.device
    cols = torch.arange(width, device=dev)
    is_pos = (cols >= torch.as_tensor(starts, device=dev)[:, None]) & (cols < torch.as_tensor(ends, device=dev)[:, None])
    index = torch.as_tensor(segment, device=dev).expand(n, width)
    out = [torch.full((n, n_seg), -torch.inf, device=dev).scatter_reduce(1, index, sims.masked_fill(drop, -torch.inf), "amax")
           for sims in (s_old, s_new) for drop in (~is_pos, is_pos)]
    return torch.stack(out).cpu().numpy()


def recall1_stats(s_old: Any, s_new: Any, starts: np.ndarray, ends: np.ndarray,
                  segment: np.ndarray, n_fractions: int, n_pos: np.ndarray) -> list[QueryStats]:
    """Recall@1 statistics at every fraction without the ranking kernel (exact).

    At fraction i, segments 0..i carry new similarities and the others old ones (see
    :func:`segment_of_columns`), so the best positive and the best negative are a prefix maximum of the
    new segment maxima joined with a suffix maximum of the old ones. The negative counts are capped at 1
    (``best negative >= / > best positive``), which is all Recall@1 reads under either tie rule; AP is
    not computed (NaN).
    """
    maxima = segment_maxima(s_old, s_new, segment, starts, ends, n_fractions + 1)

    def at_fractions(old: np.ndarray, new: np.ndarray) -> np.ndarray:
        backfilled = np.maximum.accumulate(new, axis=1)[:, :n_fractions]  # segments 0..i
        stale = np.maximum.accumulate(old[:, ::-1], axis=1)[:, ::-1][:, 1:]  # segments i+1..last
        return np.maximum(backfilled, stale)

    best, neg = at_fractions(maxima[0], maxima[2]), at_fractions(maxima[1], maxima[3])
    nan = np.full(len(n_pos), np.nan)
    return [QueryStats(n_pos, (neg[:, i] >= best[:, i]).astype(np.int64), (neg[:, i] > best[:, i]).astype(np.int64), nan, nan)
            for i in range(n_fractions)]


# Every fraction in one pass (any metric, AP included) --------------------------------------------------------


@numba.njit(inline="always")
def _thresholds_at_or_below(v, thr, scale, nb, in_bucket, below):  # pragma: no cover - compiled
    """How many of the ascending thresholds ``thr`` are <= v (bucketed like the ranking kernel, then exact)."""
    if v < thr[0]:
        return 0
    k = _bucket(v, thr[0], scale, nb)
    m = below[k]
    if in_bucket[k] == 0:
        return m
    while m < len(thr) and thr[m] <= v:
        m += 1
    return m


@numba.njit(parallel=True, cache=True, nogil=True)
def _all_fractions_kernel(s_old, s_new, starts, ends, segment, n_fr, map_k):  # pragma: no cover - compiled
    """Ranking statistics of every row at every fraction; arrays are (n_fr, n), plus the NaN/+inf count per row."""
    n, width = s_old.shape
    n_pos = np.zeros((n_fr, n), np.int64)
    neg_ge = np.zeros((n_fr, n), np.int64)
    neg_gt = np.zeros((n_fr, n), np.int64)
    ap = np.full((n_fr, n), np.nan)
    ap_k = np.full((n_fr, n), np.nan)
    bad = np.zeros(n, np.int64)
    for r in numba.prange(n):
        a = starts[r]
        b = ends[r]
        nonfinite = 0
        for j in range(width):
            nonfinite += (not s_old[r, j] < np.inf) + (not s_new[r, j] < np.inf)
        bad[r] = nonfinite
        if nonfinite or b == a:
            continue
        # thresholds: every value a positive takes at some fraction (its old and its new similarity)
        raw = np.empty(2 * (b - a), np.float32)
        u = 0
        for j in range(a, b):
            for v in (s_old[r, j], s_new[r, j]):
                if v != -np.inf:
                    raw[u] = v
                    u += 1
        if u == 0:
            continue
        raw = np.sort(raw[:u])
        thr = np.empty(u, np.float32)
        t = 0
        for i in range(u):
            if i == 0 or raw[i] != raw[i - 1]:
                thr[t] = raw[i]
                t += 1
        thr = thr[:t]
        nb, scale, in_bucket, below = _bucket_table(thr, width)
        # negatives per threshold slot m (thr[m - 1] <= v < thr[m]) before the first fraction (``cur``), and what
        # changes at each fraction (``delta``): a new value counts from its item's segment on, an old one before
        # it; ``eq0`` / ``eq_delta`` the same for negatives exactly equal to thr[m - 1] (read only at the best positive)
        cur = np.zeros(t + 1, np.int64)
        delta = np.zeros((n_fr + 1, t + 1), np.int32)
        eq0 = np.zeros(t + 1, np.int64)
        eq_delta = np.zeros((n_fr + 1, t + 1), np.int32)
        for part in range(2):
            lo = 0 if part == 0 else b
            hi = a if part == 0 else width
            for j in range(lo, hi):
                s = segment[j]
                if s < n_fr:
                    v = s_new[r, j]
                    m = _thresholds_at_or_below(v, thr, scale, nb, in_bucket, below)
                    if m:
                        delta[s, m] += 1
                        if thr[m - 1] == v:
                            eq_delta[s, m] += 1
                if s > 0:
                    v = s_old[r, j]
                    m = _thresholds_at_or_below(v, thr, scale, nb, in_bucket, below)
                    if m:
                        cur[m] += 1
                        delta[s, m] -= 1
                        if thr[m - 1] == v:
                            eq0[m] += 1
                            eq_delta[s, m] -= 1
        # positives per threshold (``at``), kept up to date as their items switch to the new similarity
        k_old = np.full(b - a, -1, np.int64)
        k_new = np.full(b - a, -1, np.int64)
        at = np.zeros(t, np.int64)
        p = 0
        for j in range(a, b):
            if s_old[r, j] != -np.inf:
                k_old[j - a] = np.searchsorted(thr, s_old[r, j])
            if s_new[r, j] != -np.inf:
                k_new[j - a] = np.searchsorted(thr, s_new[r, j])
            if segment[j] > 0 and k_old[j - a] >= 0:
                at[k_old[j - a]] += 1
                p += 1
        pos = np.empty(b - a, np.float32)
        cnt = np.zeros(b - a + 1, np.int64)
        for i in range(n_fr):
            for m in range(t + 1):
                cur[m] += delta[i, m]
            for j in range(a, b):
                if segment[j] == i:
                    if i > 0 and k_old[j - a] >= 0:
                        at[k_old[j - a]] -= 1
                        p -= 1
                    if k_new[j - a] >= 0:
                        at[k_new[j - a]] += 1
                        p += 1
            n_pos[i, r] = p
            if p == 0:
                continue
            cnt[: p + 1] = 0
            q = 0
            top = 0
            for m in range(1, t + 1):  # slot m holds the negatives with thr[m - 1] <= v < thr[m]
                q += at[m - 1]
                cnt[q] += cur[m]
                if at[m - 1]:
                    top = m  # slot of the best positive's value
                    for c in range(at[m - 1]):
                        pos[q - at[m - 1] + c] = thr[m - 1]  # ascending positives, as the ranking kernel sorts them
            ties_best = eq0[top]
            for s in range(i + 1):
                ties_best += eq_delta[s, top]
            neg_ge[i, r] = cnt[p]
            neg_gt[i, r] = cnt[p] - ties_best
            ap[i, r], ap_k[i, r] = _ap_from_counts(pos[:p], cnt[: p + 1], map_k)
    return n_pos, neg_ge, neg_gt, ap, ap_k, bad


def all_fraction_stats(s_old: Any, s_new: Any, starts: np.ndarray, ends: np.ndarray,
                       segment: np.ndarray, n_fractions: int, *, map_k: int) -> list[QueryStats]:
    """Ranking statistics (counts, AP, AP@k) at every fraction from one pass over both CPU blocks (exact).

    Every value a positive can take is one of its two similarities, so per query the negatives are counted
    once into slots between those thresholds, with a difference table over the fractions (a negative counts
    with its new similarity from its segment on, with its old one before). At each fraction the slots are
    mapped onto that fraction's sorted positives: the same ``cnt`` the ranking kernel builds, hence the same
    AP bit for bit (:func:`engine.metrics.ranking._ap_from_counts`). Cost: one pass over the block plus
    O(fractions x positives) per query, instead of one ranking pass per fraction.
    """
    with torch_threads_kept():
        *out, bad = _all_fractions_kernel(np.ascontiguousarray(host(s_old)), np.ascontiguousarray(host(s_new)),
                                          starts.astype(np.int64), ends.astype(np.int64), segment, n_fractions, int(map_k))
    rows = np.flatnonzero(bad)
    if len(rows):
        raise ValueError(f"similarities have NaN/inf values in {len(rows)} query row(s) (first: row {rows[0]}); "
                         f"the features are not finite after the float32 cast")
    n_pos, neg_ge, neg_gt, ap, ap_k = out
    return [QueryStats(n_pos[i], neg_ge[i], neg_gt[i], ap[i], ap_k[i]) for i in range(n_fractions)]
