"""The upgrade check: can a new model's queries be searched against the gallery the old model embedded?

Paper 002's empirical compatibility criterion (ECC, strict): the new model is compatible with the old one
when ``M(new queries, old gallery) > M(old queries, old gallery)``. On a gallery of a few hundred items two
or three points decide that, so the check is paired over the queries (query i is the same image in both
cells) and carries a confidence interval:

* per-query scores of three cells, old/old, new/old and new/new, each from one neighbour pass of the
  evaluation core (hit@k, or AP, with NaN for a query without a positive in the gallery);
* the mean difference new/old - old/old with a seeded **percentile** paired bootstrap: by default over the
  queries *and* the gallery items (:mod:`engine.metrics.twoway`, Recall@k; the gallery is a sample too, and
  resampling queries alone covers the population gap ~90 % of the time for a 95 % interval,
  ``bench/calibrate_verdict.py``), else over the queries (``interval="queries"``, and always for mAP:
  :func:`engine.metrics.paired.paired_bootstrap`); with ``query_groups`` (paraphrases of one topic) every bootstrap
  resamples whole groups instead of single queries; ``interval="sequential"`` is the anytime-valid confidence
  sequence (:mod:`engine.metrics.sequential`) for teams that add queries and rerun;
* the verdict under a rule (:mod:`engine.upgrade.rule`): strict ECC by default (``compatible`` when the
  interval lies above 0 and the point passes, ``not compatible`` when it lies below 0, ``too close to call``
  otherwise, with the queries that would decide it at 80 % power, a one-look estimate; an exact tie, the point
  [0, 0], is too close to call and flagged), ties passing (>=), or a non-inferiority ``margin`` in points;
* the same test of new/new against old/old: is the new model better on its own (the matrices' strict rule)?
* when not compatible, the partial-backfill curves (new queries, gallery re-embedded item by item) of
  each ordering, the fraction of the gallery each needs to reach the old and the new self-test, and the
  best ordering: the one with the **largest** area under its curve (M-tilde, trapezoid over 0..1);
  with ``rollout`` also the roll-out curves (:mod:`engine.metrics.backfill_rollout`): the rank merge of the old
  index (old queries) and the new one (new queries) in each ordering, and candidate re-scoring over K.

Why the percentile bootstrap: the statistic is a mean of bounded per-query differences (hits: -1, 0, 1;
APs: in [-1, 1]) over hundreds of queries; the percentile interval needs no variance formula, stays inside
the statistic's range (the "basic" interval need not), and with ``interval="queries"`` it is the interval the
compatibility matrices' per-cell verdicts use (they resample queries only). BCa would correct
bias and skew, but needs a jackknife (one mean per left-out query) and, for a mean of bounded
differences at these sizes, moves the ends by less than the Monte-Carlo noise of 1,000 resamples.

This module imports no torch itself; the engine functions it reuses are imported in one place below.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

# ---- the engine pieces this check reuses
from engine.core.kinds import STRICT
from engine.metrics.backfill import backfill_curve, curve_area, fraction_to_reach
from engine.metrics.backfill_orders import backfill_order
from engine.metrics.backfill_rollout import rank_merge_curves, rescoring_curves, rescoring_ks
from engine.core.contract import DEFAULT_ORDERINGS
from engine.metrics.compatibility import CellFeatures
from engine.metrics.paired import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, DEFAULT_SEED, group_index, paired_bootstrap
from engine.metrics.paired import verdict as paired_verdict
from engine.metrics.retrieval import cell_stats, per_query_from_stats
from engine.metrics.cell_interval import PairedInterval, cell_seed, paired_intervals
from engine.metrics.same_set import resolve_same_set
from engine.metrics.ties import TieOutcomes, pair_ties, tie_outcomes
from engine.metrics.twoway import top_lists, two_way_depth
from engine.upgrade.rule import DEFAULT_INTERVAL, INTERVALS, Rule, decide, queries_needed
from engine.upgrade.orders import best_by_area
from engine.upgrade.words import sentence
from engine.results.verdict_words import ALONE_WORDS
from engine.core.vocab import check_resamples, parse_metric
from storage import json_ready

COMPATIBILITY = {"pass": "compatible", "fail": "not compatible", "unresolved": "too close to call"}
SEQUENTIAL_NOTE = ("sequential: the interval is a confidence sequence (Waudby-Smith & Ramdas 2024, predictable plug-in "
                   "empirical Bernstein), valid at every number of queries at once, so adding queries and rerunning "
                   "until it decides keeps its level; it reads the queries in the order given (append new ones, do not "
                   "reorder) and takes the gallery as fixed; it is wider than the one-look interval")
BETTER = ALONE_WORDS  # the matrices print the same words for the same pair (evaluate, compare-checkpoints)
BOOTSTRAP = "percentile"
SEQUENTIAL_METHOD = "confidence sequence (predictable plug-in empirical Bernstein, Waudby-Smith & Ramdas 2024)"
MAX_NAME = 40


@dataclass(frozen=True)
class PairedVerdict:
    """Paired comparison of two cells over the same queries: mean difference, its interval and the verdict."""

    diff: float
    lo: float
    hi: float
    n: int  # queries scored in both cells
    verdict: str
    tie: bool = False  # every paired difference sits on the rule's threshold (an unchanged model under strict ECC)
    needed: int | None = None  # too close to call: queries that would decide it (None: no number would)


@dataclass(frozen=True)
class BackfillNeed:
    """One ordering's backfill curve, its area and the fractions of the gallery needed to reach each self-test."""

    ordering: str
    area: float
    to_old_self: float | None  # None: the curve never reaches it
    to_new_self: float | None
    fractions: list[float]
    values: list[float]


@dataclass(frozen=True)
class UpgradeReport:
    """Everything the upgrade check found; :meth:`sentence` says it in words, :meth:`to_json` as data."""

    old_name: str
    new_name: str
    metric: str
    old_old: float
    new_old: float
    new_new: float
    n_queries: int
    n_no_positive: int
    n_gallery: int
    compatibility: PairedVerdict
    better: PairedVerdict
    resamples: int
    level: float
    seed: int
    same_set: bool
    backfill: tuple[BackfillNeed, ...] = ()
    best_ordering: str | None = None
    margin: float = 0.0  # points; > 0: non-inferiority
    ties: str = STRICT
    interval: str = "queries"  # what the bootstrap resampled (a key of INTERVALS)
    notes: tuple[str, ...] = ()
    relevance: str = "labels"  # what counts as relevant (engine.core.vocab.RELEVANCE)
    rollout: tuple[BackfillNeed, ...] = ()  # with rollout=True: "rank_merge:<ordering>" curves and "rescoring" (over K / N)
    query_groups: int = 0  # groups the queries were resampled in (0: none, each query on its own)
    tie_readings: dict | None = None  # Recall@k: each cell's ties and the verdict under each tie reading
    # (engine.metrics.ties.pair_ties; None for other metrics)

    @property
    def rule(self) -> Rule:
        return Rule(self.margin, self.ties)

    @property
    def paired_over(self) -> str:
        """What the interval resampled, in words (``queries and gallery items``; ``12 query groups ...``)."""
        return paired_over(self.interval, self.query_groups)

    @property
    def verdict(self) -> str:
        return self.compatibility.verdict

    def sentence(self) -> str:
        """The verdict in one sentence, then one sentence on the new model alone and, if needed, on backfilling."""
        return sentence({**asdict(self), "compatibility": asdict(self.compatibility), "better": asdict(self.better)})

    def to_json(self) -> dict:
        """JSON-ready dict (NaN as null), with the sentence and the bootstrap's settings."""
        data = json_ready(asdict(self))
        data["verdict"] = self.verdict
        data["sentence"] = self.sentence()
        data["bootstrap"] = {"method": SEQUENTIAL_METHOD if self.interval == "sequential" else BOOTSTRAP,
                             "paired_over": self.paired_over, "resamples": self.resamples, "level": self.level,
                             "seed": self.seed}
        data["rule"] = self.rule.name
        return data


def per_query_scores(query: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray, *,
                     metric: str = "recall@1", same_set: bool = False) -> np.ndarray:
    """One cell's per-query outcome of ``metric`` (hit@k as 0/1, or AP), NaN for a query without a positive."""
    return cell_scores(query, query_labels, gallery, gallery_labels, metric=metric, same_set=same_set)[0]


def cell_scores(query: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray, *,
                metric: str = "recall@1", same_set: bool = False) -> tuple[np.ndarray, TieOutcomes | None]:
    """:func:`per_query_scores` and, for Recall@k, the cell's tie readings from the same pass (None otherwise)."""
    kind, at = parse_metric(metric, pairs=False)
    stats = cell_stats(query, query_labels, gallery, gallery_labels, same_set=same_set,
                       map_k=at if kind == "map" and at else 0, want_ap=kind == "map",
                       top_k=at if kind == "recall" else 1)
    valid, vectors = per_query_from_stats(stats, ks=(at,) if kind == "recall" else (), want_map=kind == "map" and not at,
                                          map_at=at if kind == "map" else None)
    scores = np.where(valid, vectors[f"{kind}@{at}" if at else kind].astype(np.float64), np.nan)
    return scores, tie_outcomes(stats, at) if kind == "recall" else None


def paired_over(interval: str, groups: int = 0) -> str:
    """What an interval resampled, in words: :data:`INTERVALS`' phrase, with ``N query groups`` for the queries when
    they were resampled in groups."""
    words = INTERVALS[interval]
    return words.replace("queries", f"{groups:,} query groups", 1) if groups else words


def query_group_index(groups: np.ndarray | None, n: int) -> np.ndarray | None:
    """The query groups as an index per query (None stays None); ``ValueError`` in one line when there is not one
    group per query or a group is missing (NaN, None, empty)."""
    if groups is None:
        return None
    g = np.asarray(groups)
    if g.ndim != 1 or len(g) != n:
        raise ValueError(f"query groups must give one group per query: {n} queries, {g.size} groups given")
    missing = (np.isnan(g) if g.dtype.kind == "f" else np.array([x is None or str(x).strip() == "" for x in g.tolist()],
                                                                bool) if g.dtype.kind in "OUS" else np.zeros(n, bool))
    if missing.any():
        raise ValueError(f"{int(missing.sum())} of {n} queries have no query group (missing or empty)")
    return group_index(g, n)


def compare(a: np.ndarray, b: np.ndarray, *, resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_CONFIDENCE,
            seed: int = DEFAULT_SEED, names: dict[str, str] = COMPATIBILITY, rule: Rule | None = None,
            bounds: tuple[float, float] | None = None, groups: np.ndarray | None = None) -> PairedVerdict:
    """Is the mean of ``a`` above the mean of ``b`` (paired by position)? Percentile paired bootstrap.

    ``names`` maps the paired test's pass / fail / unresolved to the words of the verdict. ``rule`` (the upgrade
    gate, :mod:`engine.upgrade.rule`) also sizes a too-close call; without it the matrices' strict verdict
    applies. ``bounds`` is an interval computed elsewhere (the two-way bootstrap); else queries are resampled
    (with ``groups``, the signs of whole groups are flipped instead; the queries needed are then sized with the
    groups' variance too).
    """
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    n = int(np.sum(~np.isnan(d)))
    if n == 0:
        raise ValueError("no query has a positive in the gallery: nothing to compare")
    if bounds is None:
        diff, lo, hi = paired_bootstrap(a, b, resamples=resamples, seed=seed, confidence=level, groups=groups)
    else:
        diff, (lo, hi) = float(np.nanmean(d)), bounds
    if rule is None:  # the matrices' strict verdict; a too-close call is sized against 0
        word = paired_verdict(lo, hi, bool(np.nanmean(a) > np.nanmean(b)))
        needed = queries_needed(d, level=level, groups=groups) if word == "unresolved" else None
        return PairedVerdict(diff, lo, hi, n, names[word], needed=needed)
    verdict, tie = decide(diff, lo, hi, rule, unchanged=not np.any(d[~np.isnan(d)]))
    needed = queries_needed(d, level=level, rule=rule, groups=groups) if verdict == "unresolved" else None
    return PairedVerdict(diff, lo, hi, n, names[verdict], tie, needed)


def unchanged_note(got: PairedInterval) -> tuple[str, ...]:
    """The note of an interval that is the exact zero-change bound (no query's score changed), else nothing."""
    if got.interval != "unchanged":
        return ()
    return (f"no query's score changes but the features differ: the interval is +/-{100 * got.hi:.1f} points, the exact "
            f"bound on the share of queries that could change when none of {got.n} did",)


def check_names(names: Sequence[str]) -> tuple[str, str]:
    """The old and new model's names: two distinct, non-empty, printable names of at most 40 characters."""
    if len(names) != 2:
        raise ValueError(f"give two model names (old, then new), got {len(names)}")
    out = tuple(str(n).strip() for n in names)
    for n in out:
        if not n or len(n) > MAX_NAME or not n.isprintable():
            raise ValueError(f"model name {n!r} must be 1..{MAX_NAME} printable characters")
    if out[0] == out[1]:
        raise ValueError(f"the old and new model need different names, both are {out[0]!r}")
    return out  # type: ignore[return-value]


def _check_pair(old: CellFeatures, new: CellFeatures, names: tuple[str, str]) -> None:
    """Old and new must embed the same images in the same order, in feature spaces of one dimension."""
    for side in ("query", "gallery"):
        a, b = np.asarray(getattr(old, f"{side}_labels")), np.asarray(getattr(new, f"{side}_labels"))
        if a.shape != b.shape or not np.array_equal(a, b):
            raise ValueError(f"{names[0]} and {names[1]} must embed the same {side} images in the same order, but their "
                             f"{side} labels differ ({len(a)} vs {len(b)} items)")
    dims = {np.shape(x)[1] for x in (old.query, old.gallery, new.query, new.gallery)}
    if len(dims) > 1:
        raise ValueError(f"{names[0]} and {names[1]} features have different dimensions {sorted(dims)}; "
                         "a new-query / old-gallery search needs one feature space")


def _same_features(old: CellFeatures, new: CellFeatures) -> bool:
    """The new model embeds every image exactly as the old one: the population gap is 0, whatever was sampled."""
    return bool(np.array_equal(old.query, new.query) and np.array_equal(old.gallery, new.gallery))


def backfill_needs(old: CellFeatures, new: CellFeatures, *, metric: str, old_self: float,
                   orderings: Sequence[str] = DEFAULT_ORDERINGS, seed: int = DEFAULT_SEED,
                   same_set: bool = False) -> tuple[BackfillNeed, ...]:
    """For each ordering: new queries against a gallery re-embedded in that order, and what it takes.

    The new self-test target is the curve's own end (beta = 1 is the new model's self-test); the old
    self-test target is ``old_self``. Both are reached when the curve is >= the target, read piecewise
    linearly between grid points (:func:`engine.metrics.backfill.fraction_to_reach`).
    """
    out = []
    for name in orderings:
        order = backfill_order(name, old_gallery=old.gallery, new_gallery=new.gallery, gallery_labels=old.gallery_labels,
                               seed=seed)
        f, v = backfill_curve(new.query, new.query_labels, old.gallery, new.gallery, old.gallery_labels, order=order,
                              metric=metric, same_set=same_set)
        out.append(BackfillNeed(name, curve_area(f, v), fraction_to_reach(f, v, old_self), fraction_to_reach(f, v, float(v[-1])),
                                [float(x) for x in f], [float(x) for x in v]))
    return tuple(out)


def rollout_needs(old: CellFeatures, new: CellFeatures, *, metric: str, old_self: float, new_self: float,
                  orderings: Sequence[str] = DEFAULT_ORDERINGS, seed: int = DEFAULT_SEED,
                  same_set: bool = False) -> tuple[BackfillNeed, ...]:
    """Roll-out curves and what they take: per ordering the rank merge of the old index (searched with the old
    model's queries) and the new one (new queries, merged by score), named ``rank_merge:<ordering>``; then
    ``rescoring``, the old index's top K re-ranked by the new model, over K / N."""
    out = []
    for name in orderings:
        order = backfill_order(name, old_gallery=old.gallery, new_gallery=new.gallery, gallery_labels=old.gallery_labels,
                               seed=seed)
        got = rank_merge_curves(old.query, new.query, new.query_labels, old.gallery, new.gallery, old.gallery_labels,
                                order=order, metrics=(metric,), same_set=same_set)
        out.append((f"rank_merge:{name}", got["fractions"], got[metric]))
    got = rescoring_curves(old.query, new.query, new.query_labels, old.gallery, new.gallery, old.gallery_labels,
                           ks=rescoring_ks(len(old.gallery_labels)), metrics=(metric,), same_set=same_set)
    out.append(("rescoring", got["fractions"], got[metric]))
    return tuple(BackfillNeed(name, curve_area(f, v), fraction_to_reach(f, v, old_self), fraction_to_reach(f, v, new_self),
                              [float(x) for x in f], [float(x) for x in v]) for name, f, v in out)


def best_ordering(needs: Sequence[BackfillNeed]) -> str | None:
    """The ordering with the largest area under its curve (the first listed among equal areas)."""
    return best_by_area({n.ordering: n.area for n in needs})


def check_settings(names: Sequence[str], *, metric: str, resamples: int, level: float, margin: float = 0.0,
                   ties: str = STRICT, interval: str = DEFAULT_INTERVAL) -> tuple[tuple[str, str], str]:
    """The checked names and the normalised metric of :func:`check_upgrade`; ``ValueError`` with one sentence otherwise.

    Callers that must embed images first (``check-upgrade --model``) call it before that work.
    """
    checked = check_names(names)
    metric = str(metric).strip().lower()
    parse_metric(metric, pairs=False)
    check_resamples(resamples)
    if not 0 < level < 1:
        raise ValueError(f"the confidence level must lie strictly between 0 and 1, got {level!r}")
    Rule(margin, ties)
    if interval not in INTERVALS:
        raise ValueError(f"unknown interval {interval!r}; use one of {', '.join(INTERVALS)}")
    return checked, metric


def check_upgrade(old: CellFeatures, new: CellFeatures, *, names: Sequence[str] = ("old", "new"), metric: str = "recall@1",
                  resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_CONFIDENCE, seed: int = DEFAULT_SEED,
                  same_set: bool = False, orderings: Sequence[str] = DEFAULT_ORDERINGS, margin: float = 0.0,
                  ties: str = STRICT, interval: str = DEFAULT_INTERVAL, rollout: bool = False,
                  query_groups: np.ndarray | None = None) -> UpgradeReport:
    """The upgrade verdict of ``new`` over ``old`` on one image set (see the module docstring).

    Both bootstraps draw from a generator seeded by ``seed``. ``margin`` (points) and ``ties`` pick the rule
    (:class:`engine.upgrade.rule.Rule`; strict ECC by default); ``interval`` what the bootstrap resamples
    (``two-way``: queries and gallery items, for Recall@k; mAP falls back to queries, with a note; ``sequential``:
    the anytime-valid confidence sequence over the queries in their order). ``query_groups`` (one group per query,
    any values): related queries are resampled as whole groups. Raises ``ValueError`` with one sentence for any
    input it cannot judge. ``rollout``: when not compatible, also the rank-merge and candidate re-scoring curves
    (:func:`rollout_needs`).
    """
    (old_name, new_name), metric = check_settings(names, metric=metric, resamples=resamples, level=level, margin=margin,
                                                  ties=ties, interval=interval)
    _check_pair(old, new, (old_name, new_name))
    groups = query_group_index(query_groups, len(old.query_labels))
    if groups is not None and interval == "sequential":
        raise ValueError("--sequential takes the queries one by one in their order; it does not go with query groups")
    rule = Rule(margin, ties)
    kind, at = parse_metric(metric, pairs=False)
    same_set, same_note = resolve_same_set([old, new], same_set)  # queries that are the gallery: own item excluded
    notes: tuple[str, ...] = (same_note,) if same_note else ()
    if interval == "two-way" and kind != "recall":
        interval, notes = "queries", notes + (f"the gallery resample covers recall@k; this {metric} interval resamples "
                                              f"{'query groups' if groups is not None else 'queries'} only",)
    if interval == "sequential":
        notes += (SEQUENTIAL_NOTE,)

    def cell(q: CellFeatures, g: CellFeatures) -> tuple[np.ndarray, TieOutcomes | None]:
        return cell_scores(q.query, q.query_labels, g.gallery, g.gallery_labels, metric=metric, same_set=same_set)

    (oo, oo_ties), (no, no_ties), (nn, nn_ties) = cell(old, old), cell(new, old), cell(new, new)
    settings = {"resamples": resamples, "level": level, "seed": seed}
    lists = None
    if interval == "two-way":
        lists = {name: top_lists(q.query, q.query_labels, g.gallery, g.gallery_labels, depth=two_way_depth(at),
                                 same_set=same_set)
                 for name, q, g in (("oo", old, old), ("no", new, old), ("nn", new, new))}
    unchanged = _same_features(old, new)
    # the stored matrices' function, seeded as their cell (1, 0): one pair, one interval, one verdict
    got = paired_intervals(oo, [no, nn], seed=cell_seed(seed, 1, 0), resamples=resamples, confidence=level, k=at,
                           base_lists=lists and lists["oo"], other_lists=lists and [lists["no"], lists["nn"]],
                           bound_unchanged=[not unchanged, False],  # "better": the matrices' rule, [0, 0] is a tie
                           groups=groups, sequential=interval == "sequential")
    bounds = {"compat": (got[0].lo, got[0].hi), "better": (got[1].lo, got[1].hi)}
    notes += unchanged_note(got[0])
    compat = compare(no, oo, **settings, rule=rule, bounds=bounds["compat"], groups=groups)
    better = compare(nn, oo, **settings, names=BETTER, bounds=bounds["better"], groups=groups)
    tie_readings = pair_ties({"old/old": oo_ties, "new/old": no_ties, "new/new": nn_ties}, base="old/old", other="new/old",
                     rule=rule, seed=cell_seed(seed, 1, 0), resamples=resamples, confidence=level,
                     bound_unchanged=not unchanged, groups=groups) if kind == "recall" else None
    old_self = float(np.nanmean(oo))
    needs = backfill_needs(old, new, metric=metric, old_self=old_self, orderings=orderings, seed=seed,
                           same_set=same_set) if compat.verdict == COMPATIBILITY["fail"] else ()
    rolled = rollout_needs(old, new, metric=metric, old_self=old_self, new_self=float(np.nanmean(nn)), orderings=orderings,
                           seed=seed, same_set=same_set) if rollout and compat.verdict == COMPATIBILITY["fail"] else ()
    n_no_pos = int(np.isnan(oo).sum())
    return UpgradeReport(old_name, new_name, metric, old_self, float(np.nanmean(no)), float(np.nanmean(nn)),
                         len(oo), n_no_pos, len(old.gallery_labels), compat, better, resamples, level, seed, same_set,
                         needs, best_ordering(needs), float(margin), ties, interval, notes, rollout=rolled,
                         query_groups=0 if groups is None else int(groups.max()) + 1, tie_readings=tie_readings)
