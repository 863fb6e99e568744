"""The one paired interval of a cross-test against its self-test, for check-upgrade and for every stored matrix cell.

``check-upgrade`` and the matrices the engine stores (the Compatibility page, Overview, the CSV and the exports read
them) call :func:`paired_intervals` with the same arguments for the same pair, and judge the result with the same
:class:`engine.metrics.decision.Rule` (:func:`engine.metrics.decision.decide`), so one pair gets one verdict:

* Recall@k on an instance gallery, with the cells' features at hand: the two-way bootstrap over queries **and**
  gallery items (:mod:`engine.metrics.twoway`, rescaled; the gallery is a sample too);
* pair verification: the images resampled, a pair counted once per combination of its two images' copies
  (:func:`pair_interval`; pairs reuse images, so resampling them as independent is too narrow);
* otherwise (mAP, a class-template gallery, optimistic rank ties, or cells whose neighbour pass ran elsewhere
  without their features): the paired bootstrap over queries (:func:`engine.metrics.paired.paired_bootstrap`);
* when no item's score changes although the features differ (a float16 export), the exact binomial bound on the
  share of items that could change (:func:`unchanged_bound`) instead of the bootstrap's point ``[0, 0]``.

With ``groups`` (one group per query: paraphrases, one user's reformulations) every bootstrap above resamples whole
groups instead of single queries (the cluster bootstrap; :mod:`engine.metrics.paired`, :mod:`engine.metrics.twoway`).
With ``sequential`` the interval is the anytime-valid confidence sequence of :mod:`engine.metrics.sequential` over the
queries in the order given (for a team that adds queries and reruns; it takes the gallery as fixed, and refuses
groups: it needs one observation per independent query).

Every cell draws from a generator seeded by :func:`cell_seed` ``(seed, t, k)``: check-upgrade is the cell (1, 0)
of a two-model matrix (old = model 0, new = model 1), so its interval and the stored cell's are the same numbers.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.metrics.decision import unchanged_bound
from engine.metrics.hierarchical import SeedItems, hierarchical_bootstrap
from engine.metrics.paired import paired_bootstrap
from engine.metrics.sequential import confidence_sequence
from engine.metrics.twoway import TopLists, twoway_bootstraps
from engine.metrics.verification import sample_pairs

TWO_WAY, QUERIES, IMAGES, SEQUENTIAL = "two-way", "queries", "images", "sequential"


@dataclass(frozen=True)
class PairedInterval:
    """Mean paired difference (other - base) with its interval, the items paired and what the interval resampled."""

    diff: float
    lo: float
    hi: float
    n: int
    interval: str  # "two-way" | "queries" | "images" (verification pairs) | "sequential" (a confidence sequence) |
    # "unchanged" (no item changed: exact bound)


def cell_seed(seed: int, t: int, k: int) -> tuple[int, int, int]:
    """The bootstrap seed of cross-test (t, k): its interval does not depend on which other cells were computed."""
    return (int(seed), int(t), int(k))


def two_way_applies(kind: str, *, gallery_kind: str = "instance", rank_ties: str = "pessimistic") -> bool:
    """Whether the gallery resample is defined for this metric: Recall@k on an instance gallery, pessimistic ties."""
    return kind == "recall" and gallery_kind == "instance" and rank_ties == "pessimistic"


def paired_intervals(base: np.ndarray, others: Sequence[np.ndarray], *, seed: int | tuple[int, ...], resamples: int,
                     confidence: float, k: int = 1, base_lists: TopLists | None = None,
                     other_lists: Sequence[TopLists] | None = None,
                     bound_unchanged: Sequence[bool] | None = None, groups: np.ndarray | None = None,
                     sequential: bool = False) -> list[PairedInterval]:
    """Each of ``others`` minus ``base`` (per-item outcomes, NaN = undefined, paired by position), all from one
    seeded draw: two-way when ``base_lists`` and ``other_lists`` are given (Recall@``k``), over items otherwise;
    ``groups`` (one per item) resamples whole groups; ``sequential`` gives the confidence sequence instead.

    ``bound_unchanged[i]`` (default True): when no item's outcome differs, give other ``i`` the exact bound
    ``+/- unchanged_bound`` instead of the bootstrap's point ``[0, 0]``; pass False where the features are the same
    (an unchanged model: the population gap is 0 and ``[0, 0]`` is the truth, not a sample artefact).
    """
    base = np.asarray(base, np.float64)
    if sequential and groups is not None:
        raise ValueError("the sequential interval takes queries one by one; it cannot resample query groups")
    two_way = base_lists is not None and other_lists is not None and not sequential
    bounds = (twoway_bootstraps(base_lists, list(other_lists), k=k, resamples=resamples, seed=seed, confidence=confidence,
                                groups=groups)
              if two_way else [None] * len(others))
    out = []
    for i, (other, b) in enumerate(zip(others, bounds)):
        other = np.asarray(other, np.float64)
        d = other - base
        d = d[~np.isnan(d)]
        if not len(d):
            out.append(PairedInterval(float("nan"), float("nan"), float("nan"), 0, QUERIES))
            continue
        bound = bound_unchanged is None or bound_unchanged[i]
        if not np.any(d) and bound and not sequential:
            r = unchanged_bound(len(d), confidence)
            out.append(PairedInterval(0.0, -r, r, len(d), "unchanged"))
            continue
        if sequential:
            lo, hi = (0.0, 0.0) if not np.any(d) and not bound else confidence_sequence(other - base, confidence=confidence)
            out.append(PairedInterval(float(d.mean()), lo, hi, len(d), SEQUENTIAL))
        elif b is None:
            diff, lo, hi = paired_bootstrap(other, base, resamples=resamples, seed=seed, confidence=confidence,
                                            groups=groups)
            out.append(PairedInterval(diff, lo, hi, len(d), QUERIES))
        else:
            out.append(PairedInterval(float(d.mean()), b[0], b[1], len(d), TWO_WAY))
    return out


def pair_images(query_labels: np.ndarray, gallery_labels: np.ndarray, *, same_set: bool) -> np.ndarray:
    """(pairs, 2) image ids of a cell's verification pairs, in :func:`engine.metrics.verification.pair_verification`'s
    order: the query image and the gallery image (one id space under ``same_set``, where the gallery is the queries)."""
    qi, gi, _ = sample_pairs(query_labels, gallery_labels, same_set=same_set)
    return np.stack([qi, gi if same_set else len(np.asarray(query_labels)) + gi], axis=1).astype(np.int64)


def pair_interval(base: np.ndarray, other: np.ndarray, images: np.ndarray, *, seed: int | tuple[int, ...], resamples: int,
                  confidence: float, bound_unchanged: bool = True) -> PairedInterval:
    """``other - base`` over verification pairs that reuse images: the images are resampled, each pair counted
    ``c_a * c_b`` times (:mod:`engine.metrics.hierarchical`, one seed), not the pairs as if independent."""
    d = np.asarray(other, np.float64) - np.asarray(base, np.float64)
    keep = ~np.isnan(d)
    if not keep.any():
        return PairedInterval(float("nan"), float("nan"), float("nan"), 0, IMAGES)
    n = int(keep.sum())
    if not np.any(d[keep]) and bound_unchanged:
        r = unchanged_bound(n, confidence)
        return PairedInterval(0.0, -r, r, n, "unchanged")
    got = hierarchical_bootstrap([SeedItems(d[keep][:, None], np.asarray(images)[keep])], lambda m: m[:, 0],
                                 resamples=max(2, resamples), seed=seed, confidence=confidence)
    return PairedInterval(got.value, got.lo, got.hi, n, IMAGES)
