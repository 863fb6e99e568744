"""Paired test of one ECC cell: is the cross-test C[t, k] really above the self-test C[k, k]?

Both cells are evaluated on the same items (queries, or verification pairs) against the same gallery
model k, so the question is about the mean of the per-item differences ``d_i = cross_i - self_i``
(hit@k: -1, 0 or 1; AP: a difference of two APs; pair verification: of two correct/incorrect bits).
A seeded paired bootstrap resamples the items with replacement (``resamples`` times; each cell
draws from its own generator seeded by ``(seed, t, k)``, so a cell's interval does not depend on
which other cells were computed) and takes the percentile interval of the resampled mean.

The bootstrap draws multinomial counts over the *distinct* values of ``d`` - the same
distribution as resampling indices, in memory bounded by ``chunk x distinct values``.

**Query groups** (paraphrases of one topic, one user's reformulations, one template's fillings): related queries are
not independent, and resampling them one by one gives an interval as narrow as if each group were ten topics. With
``groups`` whole groups are the units: the interval inverts the wild cluster bootstrap's test with Rademacher weights
(Cameron, Gelbach & Miller, Rev. Econ. Stat. 90(3), 2008), which for one mean is a sign-flip randomization test,
exact when each group's residual ``S_g - mu N_g`` (``S_g``, ``N_g`` the group's sum of differences and its number of
defined items) is symmetric about 0, however unequal the groups' spreads (Canay, Romano & Shaikh, Econometrica 85(3),
2017; Hartigan, JASA 64, 1969), and however few the groups (from 6 at 95 %). Flipping the signs of a set F of groups
moves the statistic past the observed one exactly when ``mu`` passes ``sum_F S_g / sum_F N_g``, so the ends are
order statistics of the means of random halves of the groups (:func:`sign_flip_interval`): no root search.
Before, the percentile ends of a cluster bootstrap widened to Student's t(G - 1) (Cameron & Miller, J. Human
Resources 50(2), 2015; :func:`few_groups_factor`, which the two-way interval keeps) passed a null upgrade too often
(``bench/calibrate_verdict.py --grouped``, 20 groups, mAP; docs/decision.md), with 20,000 resamples as with 1,000: a
percentile interval follows each sample's skew (one outlying topic skews the resampled means its way and moves the
opposite end in), which the interval of a mean should not. :func:`cluster_variance` is the cluster-robust variance of
the mean (the two-way interval and the queries needed use it).

The stored matrices' per-cell verdicts are no longer :func:`verdict`'s: each cross-test's interval comes from
:mod:`engine.metrics.cell_interval` (two-way for Recall@k, this bootstrap otherwise) and is judged by
:func:`engine.metrics.decision.decide`, the rule check-upgrade uses (an exact tie under strict ECC is too close to
call there, a fail here). :func:`verdict` remains for "is the new model better on its own": ``pass`` when ECC
passes and ``lo > 0`` (``lo >= 0`` under ties ``pass``), ``fail`` when ``hi < 0`` or ECC fails and ``hi <= 0``,
``unresolved`` otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from engine.core.kinds import STRICT, beats

VERDICTS = ("pass", "fail", "unresolved")
SYMBOLS = {"pass": "✓", "fail": "✗", "unresolved": "?"}
DEFAULT_RESAMPLES = 1000
DEFAULT_SEED = 0
DEFAULT_CONFIDENCE = 0.95
_CHUNK_ELEMENTS = 1 << 20  # multinomial counts drawn per chunk (bounded memory)


@dataclass(frozen=True)
class PairedOptions:
    """How the paired bootstrap of every ECC cell is run."""

    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED
    confidence: float = DEFAULT_CONFIDENCE
    on_its_own: bool = False  # also new self-test vs old self-test per cross-test (check-upgrade's "on its own")

    def __post_init__(self) -> None:
        if not isinstance(self.resamples, int) or self.resamples < 1:
            raise ValueError(f"paired bootstrap resamples must be a positive integer, got {self.resamples!r}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"paired bootstrap confidence must be in (0, 1), got {self.confidence!r}")


def group_index(groups: np.ndarray, n: int) -> np.ndarray:
    """Each item's group as an index 0 .. G - 1 (groups of any kind: numbers or text); ``ValueError`` when the
    length is not ``n``."""
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"query groups must give one group per query ({n}), got {groups.shape[0] if groups.ndim else 0}")
    return np.unique(groups, return_inverse=True)[1].reshape(n).astype(np.int64)


def cluster_variance(d: np.ndarray, groups: np.ndarray | None = None) -> float:
    """Variance of the mean of ``d`` (no NaN): the sample variance / n, or with ``groups`` (an index per item) the
    cluster-robust ``G / (G - 1) * sum_g (S_g - mean N_g)^2 / n^2`` (equal to the former for singleton groups)."""
    d = np.asarray(d, np.float64)
    n = len(d)
    if groups is None:
        return float(d.var(ddof=1)) / n if n > 1 else 0.0
    g = group_index(groups, n)
    sums, sizes = np.bincount(g, weights=d), np.bincount(g)
    keep = sizes > 0
    n_groups = int(keep.sum())
    if n_groups < 2:
        return 0.0
    resid = sums[keep] - d.mean() * sizes[keep]
    return float(n_groups / (n_groups - 1) * np.sum(resid ** 2) / n ** 2)


def student_quantile(p: float, df: float) -> float:
    """Student's t quantile (``scipy.stats.t.ppf``; a hand-written Cornish-Fisher series stood here, 1 % low at df =
    2 and within 3e-4 from df = 10: the two-way interval's few-groups ends are now exact)."""
    from scipy.stats import t  # loaded when groups are given: the module stays light

    return float(t.ppf(p, df))


def few_groups_factor(n_groups: int, confidence: float) -> float:
    """How much wider a (1 - a) interval from G groups should be than a normal one: ``t_{G-1} / z`` (1 below 2
    groups)."""
    if n_groups < 2:
        return 1.0
    p = (1 + confidence) / 2
    return student_quantile(p, n_groups - 1) / NormalDist().inv_cdf(p)


def sign_flip_interval(sums: np.ndarray, sizes: np.ndarray, *, resamples: int, confidence: float,
                       rng: np.random.Generator) -> tuple[float, float]:
    """``(lo, hi)`` of the mean ``sum(sums) / sum(sizes)`` over G groups by inverting the sign-flip (wild cluster,
    Rademacher) test (module docstring): ``resamples`` random halves (each group in with probability 1/2,
    ``rng.integers(0, 2)`` per group, in chunks: the same stream as one call), each half's ``counts @ sums / counts @
    sizes``; ``lo`` the k-th smallest and ``hi`` the k-th largest, ``k = floor(a / 2 (resamples + 1))`` (the Monte
    Carlo test's exact rank). An empty half counts against both ends; ``(-inf, inf)`` when k is 0 or when empty
    halves reach k: the level needs more resamples or more groups (``2^-G <= a / 2``: 6 groups at 95 %)."""
    n_groups = len(sums)
    k = math.floor((1 - confidence) / 2 * (resamples + 1) + 1e-9)
    if k < 1:
        return -math.inf, math.inf
    chunk = max(1, _CHUNK_ELEMENTS // n_groups)
    low, high = np.empty(resamples), np.empty(resamples)
    for start in range(0, resamples, chunk):
        half = rng.integers(0, 2, size=(min(chunk, resamples - start), n_groups)).astype(np.float64)
        count = half @ sizes
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (half @ sums) / count
        low[start:start + len(half)] = np.where(count > 0, mean, -np.inf)
        high[start:start + len(half)] = np.where(count > 0, mean, np.inf)
    return float(np.partition(low, k - 1)[k - 1]), float(np.partition(high, resamples - k)[resamples - k])


def paired_bootstrap(cross: np.ndarray, self_test: np.ndarray, *, resamples: int = DEFAULT_RESAMPLES,
                     seed: int | tuple[int, ...] = DEFAULT_SEED, confidence: float = DEFAULT_CONFIDENCE,
                     groups: np.ndarray | None = None) -> tuple[float, float, float]:
    """``(mean difference, lo, hi)`` of ``cross - self_test`` over the paired items (NaN items left out); with
    ``groups`` (one group per item, any values) the interval inverts a sign-flip test over whole groups instead
    (:func:`sign_flip_interval`, module docstring).

    Returns NaNs when no item is defined on both sides.
    """
    cross, self_test = np.asarray(cross, dtype=np.float64), np.asarray(self_test, dtype=np.float64)
    if cross.shape != self_test.shape or cross.ndim != 1:
        raise ValueError(f"paired outcomes must be two vectors of the same length, got {cross.shape} and {self_test.shape}")
    d = cross - self_test
    keep = ~np.isnan(d)
    d = d[keep]
    if not len(d):
        return float("nan"), float("nan"), float("nan")
    if groups is not None:
        g = group_index(groups, len(keep))[keep]
        sums, sizes = np.bincount(g, weights=d), np.bincount(g)
        lo, hi = sign_flip_interval(sums[sizes > 0], sizes[sizes > 0].astype(np.float64), resamples=resamples,
                                    confidence=confidence, rng=np.random.default_rng(seed))
        return float(d.mean()), max(-1.0, lo), min(1.0, hi)
    alpha = (1 - confidence) / 2
    values, counts = np.unique(d, return_counts=True)
    n = len(d)
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // len(values))
    means = np.empty(resamples)
    for start in range(0, resamples, chunk):
        draws = rng.multinomial(n, counts / n, size=min(chunk, resamples - start))
        means[start:start + len(draws)] = draws @ values / n
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(d.mean()), float(lo), float(hi)


def verdict(lo: float, hi: float, ecc_passes: bool, *, ties: str = STRICT) -> str | None:
    """``pass`` / ``fail`` / ``unresolved`` from the interval and the ECC under the tie rule ``ties`` (None when
    undefined)."""
    if np.isnan(lo) or np.isnan(hi):
        return None
    if ecc_passes and beats(lo, 0.0, ties):
        return "pass"
    if hi < 0 or (not ecc_passes and hi <= 0):
        return "fail"
    return "unresolved"


def shared_items(cross_ids: np.ndarray | None, self_ids: np.ndarray | None, n_cross: int, n_self: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the items both cells evaluated, in each cell's order.

    With ids, pair on the ids the two cells share; without, the cells must list the same items in the
    same order (equal lengths), which the engine's cells do by construction.
    """
    if cross_ids is None or self_ids is None:
        if n_cross != n_self:
            raise ValueError(f"cannot pair a cross-test of {n_cross} items with a self-test of {n_self} items without item ids")
        return np.arange(n_cross), np.arange(n_self)
    _, a, b = np.intersect1d(np.asarray(cross_ids), np.asarray(self_ids), assume_unique=True, return_indices=True)
    return a, b


def count_verdicts(verdicts: list[list[str | None]]) -> dict[str, int]:
    """How many cells pass, fail and are unresolved."""
    flat = [v for row in verdicts for v in row if v]
    return {v: flat.count(v) for v in VERDICTS}
