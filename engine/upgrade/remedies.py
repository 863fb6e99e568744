"""Two remedies beside the query-side adapter, judged by the upgrade check's own rule and interval (issue 42).

* **Corpus transform** (:func:`fit_transform`, :func:`transform_rows`): a post-hoc map fitted the other way, old ->
  new (the same kinds and export, :mod:`engine.adapters.posthoc`; its ``fitted_on["direction"]`` says
  :data:`engine.adapters.posthoc.OLD_TO_NEW`), applied once to the stored old gallery (streamed: :func:`engine.adapters.batch_apply.apply_to_file`
  writes a new file, the store is never touched), so the new model serves at once. Judged: the new queries on the
  transformed gallery against old/old under the report's rule (the guardrail) and against new/new (what it keeps of a
  full re-embedding), each with the report's interval. Cost: one pass over the stored vectors, no model.
* **Cascade** (:func:`cascade_outcomes`, :func:`cascade_row`): the new queries, through the query-side adapter (or as
  they are when the two widths agree), fetch the old gallery's top N (ties at the N-th place by the lower gallery row);
  the new model re-scores those N (from the new gallery's vectors, standing in for embedding the N candidates with the
  new model at query time) and ranks them first; the others follow in the old order. Recall@k only (k <= N). The curve
  over a grid of N, each point judged against old/old at the simultaneous level of the grid (the plan picks the
  smallest passing N), and its serving cost: N re-scorings per query.

The plan reads both beside the adapters, the backfill and the full re-embedding (:func:`engine.upgrade.plan.remedy_options`);
from sources the same rows come from :func:`engine.upgrade.source_remedies.source_transform_rows` and
:func:`engine.upgrade.source_remedies.source_cascade` (any of the check's metrics there). This module imports no torch
itself.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from engine.core.norms import unit_rows_np
from engine.adapters.posthoc import NEW_TO_OLD, OLD_TO_NEW, PosthocMap, fit_map, map_direction
from engine.core.vocab import parse_metric
from engine.metrics.cell_interval import cell_seed, paired_intervals
from engine.metrics.compatibility import CellFeatures
from engine.metrics.selection import simultaneous_level
from engine.metrics.twoway import TopLists, ranked_lists, top_lists, two_way_depth
from engine.upgrade.verdict import BETTER, PairedVerdict, UpgradeReport, cell_scores, compare
from storage import json_ready

DEFAULT_TRANSFORMS = ("procrustes", "affine")
CASCADE_NS = (10, 20, 50, 100, 200, 500, 1000)  # candidates re-scored per query, capped by the gallery
_BLOCK_ELEMENTS = 1 << 22  # query rows x gallery items held at once by the cascade's first stage


def fit_transform(kind: str, old: np.ndarray, new: np.ndarray, *, normalise: str = "l2", options: Any = None,
                  fitted_on: dict[str, Any] | None = None) -> PosthocMap:
    """A ``kind`` map from the old space into the new one, fitted on paired rows (``old[i]``, ``new[i]`` embed one
    item); its ``new_dim`` is the old model's width (the map's input) and ``fitted_on["direction"]`` is
    :data:`OLD_TO_NEW`."""
    return fit_map(kind, old, new, normalise=normalise, options=options,
                   fitted_on={**(fitted_on or {}), "direction": OLD_TO_NEW})


def _lists(report: UpgradeReport, query: np.ndarray, labels: np.ndarray, gallery: np.ndarray,
           gallery_labels: np.ndarray) -> TopLists | None:
    if report.interval != "two-way":
        return None
    return top_lists(query, labels, gallery, gallery_labels, depth=two_way_depth(parse_metric(report.metric)[1] or 1),
                     same_set=report.same_set)


def judge(base: np.ndarray, other: np.ndarray, report: UpgradeReport, *, level: float | None = None,
          base_lists: TopLists | None = None, other_lists: TopLists | None = None, rule: bool = True,
          groups: np.ndarray | None = None) -> PairedVerdict:
    """``other`` (per-query outcomes) against ``base`` with the check's interval (seeded as its cell (1, 0): two-way when
    both lists are given, else over the queries or query groups, or sequential as the check's) and, with ``rule``, the
    report's rule (the guardrail's words); without it the strict paired verdict in the "better" words."""
    level = report.level if level is None else level
    at = parse_metric(report.metric)[1] or 1
    got = paired_intervals(base, [other], seed=cell_seed(report.seed, 1, 0), resamples=report.resamples,
                           confidence=level, k=at, base_lists=base_lists, other_lists=None if base_lists is None
                           else [other_lists], groups=groups, sequential=report.interval == "sequential")[0]
    words = {} if rule else {"names": BETTER}
    return compare(other, base, resamples=report.resamples, level=level, seed=report.seed,
                   rule=report.rule if rule else None, bounds=(got.lo, got.hi), groups=groups, **words)


def _scores(report: UpgradeReport, query: np.ndarray, labels: np.ndarray, gallery: np.ndarray,
            gallery_labels: np.ndarray) -> np.ndarray:
    return cell_scores(query, labels, gallery, gallery_labels, metric=report.metric, same_set=report.same_set)[0]


def _mean(x: np.ndarray) -> float:
    return float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")


def transform_rows(old: CellFeatures, new: CellFeatures, report: UpgradeReport, *, fitted: np.ndarray,
                   kinds: Sequence[str] = DEFAULT_TRANSFORMS, groups: np.ndarray | None = None) -> list[dict[str, Any]]:
    """One row per kind: the map old -> new fitted on the gallery pairs ``fitted`` (sorted rows: the adapters' own,
    :func:`engine.upgrade.migration.fit_rows`), the old gallery transformed, the new queries judged on it against
    old/old (the rule, at the simultaneous level of the kinds: the plan picks one) and against new/new. Under same-set
    the fitted items leave the queries and the gallery, as for the adapters."""
    fitted = np.asarray(fitted, np.int64)
    keep = np.setdiff1d(np.arange(len(old.gallery)), fitted) if report.same_set else np.arange(len(old.gallery_labels))
    ql, gl = np.asarray(old.query_labels)[keep if report.same_set else slice(None)], np.asarray(old.gallery_labels)[keep]
    q_old = old.query[keep] if report.same_set else old.query
    q_new = new.query[keep] if report.same_set else new.query
    g_old, g_new = old.gallery[keep], new.gallery[keep]
    grp = None if groups is None else np.asarray(groups)[keep] if report.same_set else groups
    oo, nn = _scores(report, q_old, ql, g_old, gl), _scores(report, q_new, ql, g_new, gl)
    oo_l, nn_l = _lists(report, q_old, ql, g_old, gl), _lists(report, q_new, ql, g_new, gl)
    made = []
    for kind in kinds:
        start = time.perf_counter()
        m = fit_transform(kind, old.gallery[fitted], new.gallery[fitted],
                          fitted_on={"pairs": len(fitted), "seed": report.seed})
        fit_s = time.perf_counter() - start
        start = time.perf_counter()
        transformed = m.apply(g_old)
        apply_s = time.perf_counter() - start
        made.append((kind, m, fit_s, apply_s, _scores(report, q_new, ql, transformed, gl),
                     _lists(report, q_new, ql, transformed, gl)))
    level = report.level if len(made) < 2 else simultaneous_level(
        [t - oo for *_, t, _ in made], level=report.level, resamples=report.resamples,
        seed=cell_seed(report.seed, 1, 0), groups=grp)
    return [transform_row(m, report, t, judge(oo, t, report, level=level, base_lists=oo_l, other_lists=t_l, groups=grp),
                          judge(nn, t, report, base_lists=nn_l, other_lists=t_l, rule=False, groups=grp), level=level,
                          pairs=len(fitted), vectors=len(g_old), fit_seconds=fit_s, apply_seconds=apply_s,
                          old_old=_mean(oo), new_new=_mean(nn))
            for _, m, fit_s, apply_s, t, t_l in made]


def transform_row(m: PosthocMap, report: UpgradeReport, values: np.ndarray, guard: PairedVerdict, kept: PairedVerdict, *,
                  level: float, **extra: Any) -> dict[str, Any]:
    """The plan's row of one corpus transform (in memory and from sources): the new queries' mean outcome on the
    transformed gallery (``values``), its verdict against old/old (``guard``, at ``level``) and against new/new
    (``kept``, at the report's level), and ``extra`` (pairs, vectors, seconds; old/old and new/new when they were
    scored on other items than the report's)."""
    return json_ready({"name": m.kind, "kind": m.kind, "direction": map_direction(m), "transformed": _mean(values),
                       "old_old": report.old_old, "new_new": report.new_new, **extra, "compatibility": asdict(guard),
                       "vs_new_new": {**asdict(kept), "level": report.level}, "interval": report.interval,
                       "level": level, "report_level": report.level})


def _top_rows(scores: np.ndarray, width: int) -> np.ndarray:
    """Each row's ``width`` highest columns, best first, ties by the lower column (a partition, then a sort of the
    ``width`` kept: the whole row is never sorted)."""
    n = scores.shape[1]
    if width >= n:
        return np.argsort(-scores, axis=1, kind="stable")
    cut = -np.partition(-scores, width - 1, axis=1)[:, width - 1:width]  # the width-th highest score of each row
    above = scores > cut
    tied = scores == cut
    keep = above | (tied & (np.cumsum(tied, axis=1) <= width - above.sum(axis=1, keepdims=True)))
    cols = np.nonzero(keep)[1].reshape(len(scores), width)  # ascending columns within each row
    kept = np.take_along_axis(scores, cols, 1)
    return np.take_along_axis(cols, np.argsort(-kept, axis=1, kind="stable"), 1)


def cascade_outcomes(first: np.ndarray, query: np.ndarray, query_labels: np.ndarray, old_gallery: np.ndarray,
                     new_gallery: np.ndarray, gallery_labels: np.ndarray, *, ns: Sequence[int], k: int = 1,
                     same_set: bool = False, depth: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per N of ``ns``: each query's cascade hit@``k`` (1.0 / 0.0, NaN without a positive in the gallery; a negative
    tied with the best positive ranks first), and its first ``max(N, depth)`` gallery rows with their ranking keys
    (re-scored head first: key 3 + new cosine; then the old order: key = old cosine), for a two-way interval.

    ``first``: the first stage's queries in the old space (adapted new queries, or the new ones when the widths agree);
    ``query``: the new queries, re-scoring the old gallery's top N against ``new_gallery`` (cosine)."""
    n_g = len(old_gallery)
    limit = n_g - 1 if same_set else n_g
    ns = [int(n) for n in ns]
    if not ns or min(ns) < max(1, int(k)) or max(ns) > limit:
        raise ValueError(f"a cascade re-scores from k = {k} to {limit} candidates per query, got {ns}")
    q1, q2 = unit_rows_np(first, np.float64), unit_rows_np(query, np.float64)
    g_old, g_new = unit_rows_np(old_gallery, np.float64), unit_rows_np(new_gallery, np.float64)
    g_lab, q_lab = np.asarray(gallery_labels), np.asarray(query_labels)
    width = min(limit, max(max(ns), int(depth)))
    out = {n: (np.full(len(q1), np.nan), np.zeros((len(q1), max(n, min(width, depth))), np.int64),
               np.zeros((len(q1), max(n, min(width, depth))))) for n in ns}
    step = max(1, _BLOCK_ELEMENTS // max(n_g, 1))
    for lo in range(0, len(q1), step):
        rows = np.arange(lo, min(len(q1), lo + step))
        s_old = q1[rows] @ g_old.T
        if same_set:
            s_old[np.arange(len(rows)), rows] = -np.inf
        order = _top_rows(s_old, width)
        positive = g_lab[order] == q_lab[rows, None]
        has = (g_lab[None, :] == q_lab[rows, None])
        if same_set:
            has[np.arange(len(rows)), rows] = False
        any_pos = has.any(axis=1)
        s_new = np.take_along_axis(q2[rows] @ g_new.T, order, 1)
        for n in ns:
            head_s, head_p = s_new[:, :n], positive[:, :n]
            best = np.where(head_p, head_s, -np.inf).max(axis=1)
            before = ((head_s >= best[:, None]) & ~head_p).sum(axis=1)
            hit = np.isfinite(best) & (before < k)
            values, ids, keys = out[n]
            values[rows] = np.where(any_pos, hit.astype(np.float64), np.nan)
            d = ids.shape[1]
            key = np.concatenate([3.0 + head_s, np.take_along_axis(s_old, order, 1)[:, n:]], axis=1)[:, :d]
            ids[rows], keys[rows] = order[:, :d], key
    return out


def cascade_row(old: CellFeatures, new: CellFeatures, report: UpgradeReport, *, first: np.ndarray, first_name: str,
                ns: Sequence[int] = CASCADE_NS, groups: np.ndarray | None = None) -> dict[str, Any]:
    """The cascade's curve over N (:data:`CASCADE_NS` capped by the gallery, and the metric's k at least), each point
    judged against old/old under the report's rule at the simultaneous level of the grid, and the smallest N that
    passes (None: none does). ``ValueError`` for a metric other than Recall@k."""
    kind, at = parse_metric(report.metric)
    if kind != "recall":
        raise ValueError(f"the cascade is judged on Recall@k; this check's metric is {report.metric}")
    limit = len(old.gallery) - (1 if report.same_set else 0)
    grid = sorted({min(max(int(n), at), limit) for n in ns})
    two_way = report.interval == "two-way"
    depth = two_way_depth(at) if two_way else 0
    got = cascade_outcomes(first, new.query, new.query_labels, old.gallery, new.gallery, old.gallery_labels, ns=grid,
                           k=at, same_set=report.same_set, depth=depth)
    oo = _scores(report, old.query, old.query_labels, old.gallery, old.gallery_labels)
    oo_l = _lists(report, old.query, old.query_labels, old.gallery, old.gallery_labels)
    level = report.level if len(grid) < 2 else simultaneous_level(
        [got[n][0] - oo for n in grid], level=report.level, resamples=report.resamples,
        seed=cell_seed(report.seed, 1, 0), groups=groups)
    curve = []
    for n in grid:
        values, ids, keys = got[n]
        lists = ranked_lists(ids, keys, old.query_labels, old.gallery_labels) if two_way else None
        v = judge(oo, values, report, level=level, base_lists=oo_l, other_lists=lists, groups=groups)
        curve.append({"n": n, "value": _mean(values), "compatibility": asdict(v)})
    return cascade_result(curve, report, first_name=first_name, old_old=_mean(oo), level=level)


def cascade_result(curve: Sequence[dict[str, Any]], report: UpgradeReport, *, first_name: str, old_old: float,
                   level: float) -> dict[str, Any]:
    """The cascade's row from its judged curve (points ``n``, ``value``, ``compatibility``, N ascending): the smallest
    N that passes, else the largest, with its serving cost (in memory and from sources)."""
    passing = next((p for p in curve if p["compatibility"]["verdict"] == "compatible"), None)
    pick = passing or curve[-1]
    return json_ready({"name": f"at N = {pick['n']}", "first_stage": first_name, "n": pick["n"],
                       "smallest_passing": None if passing is None else passing["n"], "value": pick["value"],
                       "old_old": old_old, "compatibility": pick["compatibility"], "curve": list(curve),
                       "per_query_rescorings": pick["n"], "interval": report.interval, "level": level,
                       "report_level": report.level})


__all__ = ["CASCADE_NS", "DEFAULT_TRANSFORMS", "NEW_TO_OLD", "OLD_TO_NEW", "cascade_outcomes", "cascade_row",
           "cascade_result", "fit_transform", "judge", "transform_row", "transform_rows"]
