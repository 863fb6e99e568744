"""Hierarchical bootstrap over training seeds, then over the items of each seed (numpy only).

A study's number (AC, a cell's margin, the update gain Γ) is a mean over seeds of a statistic of each seed's
per-item outcomes. Both levels vary: another seed trains other models, another sample of queries (or of images, for
verification pairs) scores them differently. One replicate draws the seeds with replacement and, for every seed
drawn (each occurrence on its own), resamples that seed's items; the statistic of each drawn seed's resampled column
means is averaged over the drawn seeds. The interval is the percentile interval of the replicates.

Items:

* queries (``SeedItems.images`` None): resampled with replacement (multinomial counts per query);
* verification pairs (``images``: the two image indices of each pair): pairs reuse images, so they are **not**
  independent (resampling pairs as if they were gives intervals 1.7-2.5x too narrow, issue 30). The images are
  resampled instead, with replacement, and each pair counts ``c_a * c_b`` times, ``c`` the draw counts of its two
  images: a pair is kept when both of its images were drawn, once per combination of their copies (the bootstrap of
  a dyadic, U-statistic-like mean). A pair of an image with itself counts ``c_a ** 2`` times.

Statistics receive the per-draw column means, shape ``(draws, columns)`` (NaN where no item of a column is defined),
and return one value per draw (NaN = undefined for that draw); :func:`matrix_columns` lays a T x T matrix's cells
out as columns and :func:`margin_statistic`, :func:`ac_statistic`, :func:`gain_statistic` read AC, a cell's margin
and Γ (only over cells where ECC holds, as paper 002 reports it) from them.

Coverage (tests/test_metrics_hierarchical.py, synthetic populations with a known mean): the percentile interval
covers at the nominal rate once there are ~10 seeds; with 3 seeds no bootstrap over seeds can (it sees 3 values);
the study table then uses Student's t over the per-seed estimates (:func:`engine.metrics.uncertainty.seed_interval`),
whose per-seed values already carry each seed's item noise.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.core.kinds import STRICT, beats

_CHUNK_ELEMENTS = 1 << 22  # draw counts held at once (draws x items)
Statistic = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class SeedItems:
    """One seed's per-item outcomes ``(items, columns)`` (NaN = undefined) and, for pairs, each pair's two images."""

    outcomes: np.ndarray
    images: np.ndarray | None = None  # (items, 2) int: the images a verification pair compares

    def __post_init__(self) -> None:
        x = np.asarray(self.outcomes)
        if x.ndim != 2 or not len(x):
            raise ValueError(f"a seed's outcomes are an (items, columns) array with at least one item, got {x.shape}")
        if self.images is not None:
            im = np.asarray(self.images)
            if im.shape != (len(x), 2) or not np.issubdtype(im.dtype, np.integer) or (im < 0).any():
                raise ValueError(f"pair images must be ({len(x)}, 2) non-negative integers, got {im.shape} {im.dtype}")


@dataclass(frozen=True)
class HierarchicalInterval:
    """Mean over seeds of a statistic, its percentile interval, the seeds, and the share of undefined replicates."""

    value: float
    lo: float
    hi: float
    n_seeds: int
    undefined: float  # share of replicates where the statistic was undefined on every drawn seed


def _weights(rng: np.random.Generator, draws: int, item: SeedItems, n: int) -> np.ndarray:
    """(draws, items) resampling weights of one seed's items: query counts, or pair weights from image counts."""
    if item.images is None:
        return rng.multinomial(n, np.full(n, 1 / n), size=draws).astype(np.float64)
    images = np.asarray(item.images)
    n_img = int(images.max()) + 1
    used = np.unique(images)
    c = np.zeros((draws, n_img))
    c[:, used] = rng.multinomial(len(used), np.full(len(used), 1 / len(used)), size=draws)
    return c[:, images[:, 0]] * c[:, images[:, 1]]


def column_means(outcomes: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(draws, columns) weighted means of each column over its defined items (NaN where none has weight)."""
    x = np.asarray(outcomes, np.float64)
    defined = ~np.isnan(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights @ np.where(defined, x, 0.0)) / (weights @ defined)


def hierarchical_bootstrap(seeds: Sequence[SeedItems], statistic: Statistic, *, resamples: int = 1000,
                           seed: int | tuple[int, ...] = 0, confidence: float = 0.95) -> HierarchicalInterval:
    """The statistic averaged over ``seeds`` with its percentile interval over seeds, then items (module docstring)."""
    if not len(seeds):
        raise ValueError("a hierarchical bootstrap needs at least one seed")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 2:
        raise ValueError(f"resamples must be an integer of at least 2, got {resamples!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
    S = len(seeds)
    point = np.array([statistic(column_means(s.outcomes, np.ones((1, len(s.outcomes)))))[0] for s in seeds], np.float64)
    value = float(np.nanmean(point)) if (~np.isnan(point)).any() else float("nan")
    rng = np.random.default_rng(seed)
    picks = rng.multinomial(S, np.full(S, 1 / S), size=resamples)  # (replicates, seeds): how often each seed is drawn
    sums, counts = np.zeros(resamples), np.zeros(resamples)
    for s, item in enumerate(seeds):
        owner = np.repeat(np.arange(resamples), picks[:, s])  # the replicate of each of this seed's draws
        n = len(item.outcomes)
        chunk = max(1, _CHUNK_ELEMENTS // n)
        for lo in range(0, len(owner), chunk):
            rows = owner[lo:lo + chunk]
            v = np.asarray(statistic(column_means(item.outcomes, _weights(rng, len(rows), item, n))), np.float64)
            ok = ~np.isnan(v)
            np.add.at(sums, rows[ok], v[ok])
            np.add.at(counts, rows[ok], 1)
    reps = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    keep = reps[~np.isnan(reps)]
    undefined = 1 - len(keep) / resamples
    if not len(keep):
        return HierarchicalInterval(value, float("nan"), float("nan"), S, undefined)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(keep, [alpha, 1 - alpha])
    return HierarchicalInterval(value, float(lo), float(hi), S, float(undefined))


def matrix_columns(T: int) -> dict[tuple[int, int], int]:
    """The column of each lower-triangle cell (t, k), k <= t, of a T x T matrix, row by row."""
    cells = [(t, k) for t in range(T) for k in range(t + 1)]
    return {c: i for i, c in enumerate(cells)}


def margin_statistic(T: int, t: int, k: int) -> Statistic:
    """Cross-test (t, k) minus its self-test (k, k), per draw."""
    col = matrix_columns(T)
    return lambda m: m[:, col[(t, k)]] - m[:, col[(k, k)]]


def ac_statistic(T: int, *, ties: str = STRICT) -> Statistic:
    """AC per draw: the share of cross-tests whose value is above (``ties="pass"``: at least) its self-test."""
    col = matrix_columns(T)
    cross = [(col[(t, k)], col[(k, k)]) for t in range(T) for k in range(t)]
    if not cross:
        raise ValueError("AC needs at least two models")

    def stat(m: np.ndarray) -> np.ndarray:
        a, b = m[:, [c for c, _ in cross]], m[:, [s for _, s in cross]]
        ok = beats(a, b, ties)
        defined = ~(np.isnan(a) | np.isnan(b))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(defined.any(1), (ok & defined).sum(1) / defined.sum(1), np.nan)
    return stat


def gain_statistic(T: int, *, min_gain: float = 0.01, ties: str = STRICT) -> Statistic:
    """Mean update gain Γ per draw over the cross-tests where ECC holds and the new model beats the old one on its own
    by ``min_gain`` (paper 002 reports Γ only where ECC holds); NaN when no cell qualifies."""
    col = matrix_columns(T)
    cells = [(col[(t, k)], col[(k, k)], col[(t, t)]) for t in range(T) for k in range(t)]

    def stat(m: np.ndarray) -> np.ndarray:
        cross, old, new = (m[:, [c[i] for c in cells]] for i in range(3))
        denom = new - old
        ecc = beats(cross, old, ties)
        use = ecc & (denom >= min_gain)
        with np.errstate(invalid="ignore", divide="ignore"):
            g = np.where(use, (cross - old) / np.where(use, denom, 1.0), 0.0)
            return np.where(use.any(1), g.sum(1) / use.sum(1), np.nan)
    return stat
