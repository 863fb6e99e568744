"""The migration plan of a check read from sources (``check-upgrade --old-gallery ... --new-gallery ... --plan``, the
page's sources check): adapters, rank-merge roll-outs and the threshold, the galleries streamed as the check streams them.

:func:`plan_from_sources` gathers what :func:`engine.upgrade.plan.migration_plan` decides from, as
:func:`engine.upgrade.migration.plan_inputs` does for features in memory, from the check's own lists
(:class:`engine.upgrade.from_sources.CheckLists`) and under the check's relevance, metric, interval and rule:

* **adapters**: a seeded sample of the gallery's rows (a ``share`` of it, at most ``max_pairs``, default
  :data:`MAX_FIT_PAIRS`: :func:`engine.upgrade.migration.fit_rows`, in the check's row numbering) is read block by block
  from both galleries, only the sampled pairs kept; each post-hoc kind (:func:`engine.adapters.posthoc.fit_map`) is
  fitted on them, each exported folder loaded. The adapted new queries of every map are ranked against the streamed
  old gallery in one pass and judged against old/old with the check's paired interval (seeded as its cell (1, 0)) and
  rule, as the check judges new/old, at the simultaneous level of all the candidates (the plan picks one of them:
  :func:`engine.upgrade.migration.selection_level`). The queries are never fitted on (held out by construction);
  the fitted gallery items stay in the searched gallery, as in the in-memory open-set check. Each row also carries the
  check's new/new and ``label_free``: the adapted queries' neighbour recall@k on the old gallery against their new/new top-k;
* **rank-merge roll-outs** (when the check kept the old queries' top-D lists: ``check_sources(..., rollout=True)``):
  per ordering of the check's backfill, the old index (the items not yet re-embedded) searched with the old queries
  and the re-embedded part with the new queries, merged by score from the two top-D lists
  (:func:`engine.metrics.list_merge.list_curves`: exact for the queries the lists decide, the others left out of a
  point and counted); the first fraction scoring above old/old is :func:`engine.upgrade.migration.rollout_rows`'s;
* **corpus transforms**: each kind is also fitted old -> new on the same sampled pairs
  (:func:`engine.upgrade.remedies.fit_transform`); the old gallery is read again, each block mapped through it (nothing
  written), and the new queries ranked against it in one streamed pass per kind, judged against old/old as the adapters
  are (the check's interval and rule, at the simultaneous level of the kinds) and against new/new over the queries;
* **threshold**: each model's top-10 candidates of its own cell (the check's old/old and new/new lists), relevant under
  the check's relevance (the same label; a qrels grade above 0), re-mapped to the same precision as in memory
  (:func:`engine.upgrade.migration.remapped_threshold`); label-free relevance marks nothing relevant, so no threshold.

This module imports no torch itself (the streamed search and the fits come from the floors below).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.adapters.artifact import load_adapter
from engine.adapters.posthoc import PosthocMap, fit_map
from engine.metrics.cell_interval import cell_seed, paired_intervals
from engine.metrics.list_merge import list_curves, rows_of
from engine.metrics.relevance import neighbour_recall
from engine.metrics.topk import TopK, stream_topk
from engine.metrics.twoway import TopLists, ranked_lists
from engine.upgrade.backfill_sources import curve_need, decided_note
from engine.upgrade.from_sources import CheckLists, Opened, SourcesCheck, SourceSpecs, by_id, cut_lists, in_order
from engine.sources.text import first_line
from engine.upgrade import forecast as fc
from engine.upgrade.migration import (FORECAST_PAIRS, RANK_MERGE, RANK_MERGE_NOTE, PlanInputs, check_plan_options, fit_rows,
                                      remapped_threshold, rollout_rows, selection_level, selection_note)
from engine.upgrade.plan import DEFAULT_ADAPTERS, DEFAULT_FIT_SHARE, DEFAULT_PRECISION, THRESHOLD_K, migration_plan
from engine.upgrade.remedies import CASCADE_NS, cascade_result, fit_transform, transform_row
from engine.upgrade.verdict import BETTER, BackfillNeed, PairedVerdict, UpgradeReport, compare
from storage import json_ready

MAX_FIT_PAIRS = 50_000  # pairs read from the galleries to fit an adapter on, at most
NEEDS_NEW_GALLERY = ("adapters, roll-outs and the threshold from sources need the new gallery (--new-gallery): the "
                     "adapters are fitted on its items paired with the old ones, the roll-outs and the threshold rank it")

Blocks = Iterable[tuple[np.ndarray, np.ndarray]]  # (gallery rows, vectors) blocks, as the check reads them
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Adapted:
    """One map's adapted new queries on the old gallery: per-query outcomes under the check's metric (NaN: undefined),
    per-query neighbour recall@k against new/new, and whether the adapted queries are the old queries themselves."""

    values: np.ndarray
    label_free: np.ndarray
    same_as_old: bool
    ranked: TopLists | None = None  # the check's interval is two-way: the adapted queries' top-D lists, re-ordered
    top: TopK | None = None  # the adapted queries' top-k lists on the old gallery, as scored (for --export trec)


def _gather(blocks: Blocks, rows: np.ndarray, what: str) -> np.ndarray:
    """The vectors of the sorted gallery ``rows`` from a stream of blocks (float32; nothing else kept)."""
    out, seen = None, np.zeros(len(rows), bool)
    for b_rows, vectors in blocks:
        at = np.minimum(np.searchsorted(rows, b_rows), len(rows) - 1)
        hit = rows[at] == b_rows
        if hit.any():
            if out is None:
                out = np.empty((len(rows), vectors.shape[1]), np.float32)
            out[at[hit]] = vectors[hit]
            seen[at[hit]] = True
    if out is None or not seen.all():
        raise ValueError(f"the {what} gallery gave {int(seen.sum())} of the {len(rows)} sampled items; it changed while "
                         "it was read")
    return out


def read_pairs(old_blocks: Blocks, new_blocks: Blocks, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The old and the new vectors of the sorted, distinct gallery ``rows``, each gallery read once block by block:
    memory holds the sample and one block, never a whole gallery."""
    rows = np.asarray(rows, np.int64)
    return _gather(old_blocks, rows, "old"), _gather(new_blocks, rows, "new")


def adapted_outcomes(lists: CheckLists, maps: Sequence[PosthocMap], old_blocks: Blocks) -> list[Adapted]:
    """Every map's image of the new queries ranked against the old gallery in one streamed pass (the check's depth and
    backend), each list scored under the check's relevance and metric, and against each query's new/new top-k."""
    q = lists.queries
    adapted = []
    for m in maps:
        if m.new_dim != q.new.shape[1] or m.old_dim != q.old.shape[1]:
            raise ValueError(f"the {m.kind} adapter maps {m.new_dim}-d new vectors to {m.old_dim}-d old ones, but the new "
                             f"queries are {q.new.shape[1]}-d and the old gallery {q.old.shape[1]}-d")
        adapted.append(m.apply(q.new))
    if not adapted:
        return []
    n_q = len(q.ids)
    top = stream_topk(np.concatenate(adapted), old_blocks, k=max(lists.old_old.k, lists.ranked_depth), backend=lists.backend)
    rel = lists.relevance
    out = []
    for i, a in enumerate(adapted):
        deep = rows_of(top, np.arange(i * n_q, (i + 1) * n_q))
        ranked = (ranked_lists(deep.ids, deep.scores, rel.query_labels, rel.gallery_labels) if lists.ranked is not None
                  else None)
        mine = cut_lists(deep, lists.old_old.k)
        values = rel.outcomes(mine, ks=(lists.at,)).values[lists.key]
        free = neighbour_recall(mine, lists.new_new, ks=(lists.new_new.k,)).values[f"neighbour_recall@{lists.new_new.k}"]
        out.append(Adapted(values, free, bool(np.array_equal(a, q.old)), ranked, mine))
    return out


def transformed_outcomes(lists: CheckLists, m: PosthocMap, old_blocks: Blocks) -> Adapted:
    """The new queries ranked against the old gallery mapped through the corpus transform ``m`` block by block (one
    streamed pass, the check's depth and backend; nothing written), scored as :func:`adapted_outcomes` scores."""
    q = lists.queries
    if m.new_dim != q.old.shape[1] or m.old_dim != q.new.shape[1]:
        raise ValueError(f"the {m.kind} transform maps {m.new_dim}-d old vectors to {m.old_dim}-d new ones, but the old "
                         f"gallery is {q.old.shape[1]}-d and the new queries {q.new.shape[1]}-d")
    mapped = ((rows, m.apply(vectors)) for rows, vectors in old_blocks)
    deep = stream_topk(q.new, mapped, k=max(lists.old_old.k, lists.ranked_depth), backend=lists.backend)
    rel = lists.relevance
    ranked = ranked_lists(deep.ids, deep.scores, rel.query_labels, rel.gallery_labels) if lists.ranked is not None else None
    mine = cut_lists(deep, lists.old_old.k)
    free = neighbour_recall(mine, lists.new_new, ks=(lists.new_new.k,)).values[f"neighbour_recall@{lists.new_new.k}"]
    return Adapted(rel.outcomes(mine, ks=(lists.at,)).values[lists.key], free, False, ranked)


def rescored(first: TopK, query: np.ndarray, new_blocks: Blocks) -> np.ndarray:
    """The new model's cosine of each query (``query``, new vectors) with each candidate of ``first`` (ids = gallery
    rows), read from the new gallery block by block: memory holds the candidates' scores and one block."""
    q = query / np.maximum(np.linalg.norm(query, axis=1, keepdims=True), 1e-12)
    out = np.full(first.ids.shape, np.nan)
    for rows, vectors in new_blocks:
        rows = np.asarray(rows)
        at = np.argsort(rows)
        pos = np.minimum(np.searchsorted(rows[at], first.ids), len(rows) - 1)
        hit = rows[at][pos] == first.ids
        if hit.any():
            v = np.asarray(vectors, np.float64)[at[pos[hit]]]
            v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
            out[hit] = np.einsum("ij,ij->i", q[np.nonzero(hit)[0]], v)
    if np.isnan(out[first.ids >= 0]).any():
        raise ValueError("the new gallery lacks some of the old gallery's candidates; it changed while it was read")
    return out


def source_cascade(lists: CheckLists, report: UpgradeReport, first: np.ndarray, first_name: str, old_blocks: Blocks,
                   new_blocks: Blocks, ns: Sequence[int] = CASCADE_NS) -> dict[str, Any]:
    """The cascade from sources (:func:`engine.upgrade.remedies.cascade_row`'s row): ``first`` (the adapted new queries)
    fetch the streamed old gallery's top N, the new gallery's vectors of those N re-score them (one pass over each
    gallery, at the largest N), each N's re-ranked list scored under the check's relevance and metric and judged
    against old/old with the check's interval and rule at the simultaneous level of the grid."""
    n_g = lists.old_old.n_gallery
    grid = sorted({min(max(int(n), lists.at), n_g) for n in ns})
    deep = stream_topk(first, old_blocks, k=max(grid), backend=lists.backend)
    s_new = rescored(deep, lists.queries.new, new_blocks)
    rel, points = lists.relevance, []
    for n in grid:
        order = np.argsort(-s_new[:, :n], axis=1, kind="stable")  # the re-scored head, ties in the old order
        ids, scores = np.take_along_axis(deep.ids[:, :n], order, 1), np.take_along_axis(s_new[:, :n], order, 1)
        top = TopK(ids, scores.astype(np.float32), np.zeros(len(ids), np.int64), n_g)
        ranked = None
        if lists.ranked is not None:  # two-way: the head, then the old order to the lists' depth
            tail = deep.ids[:, n:max(n, lists.ranked_depth)]
            keys = np.concatenate([3.0 + scores, deep.scores[:, n:max(n, lists.ranked_depth)]], axis=1)
            ranked = ranked_lists(np.concatenate([ids, tail], axis=1), keys, rel.query_labels, rel.gallery_labels)
        values = rel.outcomes(top, ks=(lists.at,)).values[lists.key]
        points.append((n, Adapted(values, np.full(len(values), np.nan), False, ranked)))
    level = report.level if len(points) < 2 else selection_level([a.values - lists.oo for _, a in points], report,
                                                                   lists.groups)
    curve = [{"n": n, "value": _mean(a.values), "compatibility": asdict(judge_adapted(lists, report, a, level=level))}
             for n, a in points]
    return cascade_result(curve, report, first_name=first_name, old_old=report.old_old, level=level)


def judge_adapted(lists: CheckLists, report: UpgradeReport, got: Adapted, *, level: float | None = None) -> PairedVerdict:
    """adapted/old vs old/old with the check's paired interval (seeded as its cell (1, 0): two-way, over queries or
    query groups, or sequential, as the check's) and rule; ``level`` (default the report's): the simultaneous level of
    the plan's candidates (:func:`engine.upgrade.migration.selection_level`)."""
    level = report.level if level is None else level
    two_way = lists.ranked is not None and got.ranked is not None
    interval = paired_intervals(lists.oo, [got.values], seed=cell_seed(report.seed, 1, 0), resamples=report.resamples,
                                confidence=level, k=lists.at, base_lists=lists.ranked if two_way else None,
                                other_lists=[got.ranked] if two_way else None, bound_unchanged=[not got.same_as_old],
                                groups=lists.groups, sequential=lists.interval == "sequential")[0]
    return compare(got.values, lists.oo, resamples=report.resamples, level=level, seed=report.seed,
                   rule=report.rule, bounds=(interval.lo, interval.hi), groups=lists.groups)


def _mean(values: np.ndarray) -> float:
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def adapter_row(name: str, m: PosthocMap, report: UpgradeReport, got: Adapted, verdict: PairedVerdict,
                level: float | None = None, **extra: Any) -> dict[str, Any]:
    """The plan's row of one adapter (the form of :func:`engine.upgrade.migration.adapter_rows`' rows)."""
    return json_ready({"name": name, "kind": m.kind, **extra, "adapted_old": _mean(got.values), "old_old": report.old_old,
                       "new_new": report.new_new, "n_queries": report.n_queries, "n_gallery": report.n_gallery,
                       "compatibility": asdict(verdict), "interval": report.interval, "label_free": _mean(got.label_free),
                       "level": report.level if level is None else level, "report_level": report.level})


def rank_merge_needs(lists: CheckLists, old_self: float) -> tuple[tuple[BackfillNeed, ...], str]:
    """Per ordering of the check's backfill, the rank merge's need (named ``rank_merge:<ordering>``) and a note on how
    many queries the lists decide; needs the old queries' top-D lists (``check_sources(..., rollout=True)``)."""
    b = lists.backfill
    if b is None or b.old_on_old is None:
        raise ValueError("the check kept no old-query lists for the rank merge; run it with rollout=True")
    curves = list_curves(b.old_on_old, b.new_on_new, b.orders,
                         lambda top, rows: lists.relevance.outcomes(top, rows, ks=(lists.at,)).values[lists.key],
                         k=lists.at)
    needs = tuple(curve_need(f"{RANK_MERGE}{name}", c, old_self) for name, c in curves.items())
    return needs, (f"rank-merge roll-outs from sources: each point merges the old queries' top-{b.depth} lists on the "
                   f"old gallery and the new queries' on the new gallery by score; "
                   f"{decided_note(curves, b.depth, lists.old_old.n_gallery)}")


def source_threshold(lists: CheckLists, *, t_old: float | None = None, precision: float = DEFAULT_PRECISION,
                     k: int = THRESHOLD_K) -> tuple[dict[str, Any] | None, str]:
    """The re-mapped threshold from each model's top-``k`` candidates of its own cell (the check's old/old and new/new
    lists) and a note on where it came from; label-free, None (nothing is marked relevant)."""
    rel = lists.relevance
    if rel.kind == "none":
        return None, ("label-free (relevance none) marks no candidate relevant, so no precision can be held: no "
                      "threshold re-mapped (use labels or qrels)")
    if lists.new_new is None:
        raise ValueError(NEEDS_NEW_GALLERY)
    kk = min(int(k), lists.old_old.k)
    pairs = [(top.scores[:, :kk].astype(np.float64).ravel(), rel.relevant(top.ids[:, :kk]).ravel())
             for top in (lists.old_old, lists.new_new)]
    how = (f"each model's top-{kk} candidates per query (the check's own lists"
           + (f"; they hold {kk}, --k {k} gives the usual {k}" if kk < k else "") + "), relevant when "
           + ("the labels agree" if rel.kind == "labels" else "the qrels grade them above 0"))
    return remapped_threshold(*pairs[0], *pairs[1], how=how, t_old=t_old, precision=precision)


def source_forecast(lists: CheckLists, m: PosthocMap, got: Adapted) -> tuple[fc.Forecast | None, str | None]:
    """The recovery forecast (:func:`engine.upgrade.migration.forecast_of`'s, from sources): the check's per-query
    old/old and new/new outcomes, the queries through the small Procrustes fit ``m`` on the old gallery (``got``) and
    its residual on the queries; ``(None, why not)`` when it cannot be read."""
    try:
        nn = lists.relevance.outcomes(lists.new_new, ks=(lists.at,)).values[lists.key]
        residual = fc.procrustes_residual(lists.queries.new, lists.queries.old, m.tensors["weight"].astype(np.float64))
        return fc.forecast_recovery(lists.oo, nn, got.values, residual), None
    except ValueError as exc:
        return None, f"no recovery forecast: {first_line(exc)}"


def plan_from_sources(check: SourcesCheck, specs: SourceSpecs, *, kinds: Sequence[str] = DEFAULT_ADAPTERS,
                      files: Sequence[str | Path] = (), share: float = DEFAULT_FIT_SHARE, t_old: float | None = None,
                      precision: float = DEFAULT_PRECISION, max_pairs: int = MAX_FIT_PAIRS,
                      progress: Progress | None = None, queries: int | None = None) -> PlanInputs:
    """The migration plan of a check from sources (``specs`` are the check's own; the galleries are read again) with
    its adapters, rank-merge roll-outs and threshold (see the module docstring); ``ValueError`` in one line when the
    check had no new gallery or an option is bad."""
    lists, report = check.lists, check.report
    if lists is None or lists.new_new is None or specs.new_gallery is None:
        raise ValueError(NEEDS_NEW_GALLERY)
    check_plan_options(kinds, share, precision)
    say = progress or (lambda f, m: None)
    n_g = report.n_gallery
    maps: list[tuple[str, PosthocMap, dict[str, Any]]] = []
    transform_maps: list[tuple[PosthocMap, float]] = []  # each kind fitted old -> new too: the corpus transforms
    forecast_map: PosthocMap | None = None  # the forecast's own small fit, judged in the same pass as the adapters
    opened = Opened()
    try:
        old_g = opened.open(specs.old_gallery, "old gallery")
        rows = None
        if kinds:
            rows = fit_rows(n_g, share, report.seed, cap=max_pairs)
            say(0.1, f"reading {len(rows):,} paired gallery items to fit the adapters on")
            new_g = opened.open(specs.new_gallery, "new gallery")
            old_s, new_s = read_pairs(in_order(old_g, lists.gallery_ids, lists.block_rows),
                                      by_id(new_g, lists.slots, lists.block_rows), rows)
            take = np.sort(np.random.default_rng(report.seed).permutation(len(rows))[:min(FORECAST_PAIRS, n_g // 2)])
            if len(take) >= 2 and lists.relevance.kind != "none":  # label-free: new/new is the reference, no ceiling
                forecast_map = fit_map("procrustes", new_s[take], old_s[take], fitted_on={"pairs": len(take)})
            for kind in kinds:
                say(0.3, f"fitting the {kind} adapter and corpus transform")
                start = time.perf_counter()
                m = fit_map(kind, new_s, old_s, fitted_on={"pairs": len(rows), "share": share, "seed": report.seed,
                                                           "cap": max_pairs})
                maps.append((kind, m, {"source": "fitted here", "pairs": len(rows),
                                       "fit_seconds": time.perf_counter() - start}))
                start = time.perf_counter()
                t = fit_transform(kind, old_s, new_s, fitted_on={"pairs": len(rows), "share": share,
                                                                 "seed": report.seed, "cap": max_pairs})
                transform_maps.append((t, time.perf_counter() - start))
            del old_s, new_s
        for folder in files:
            m = load_adapter(folder)
            maps.append((f"{m.kind} ({Path(folder).name})", m, {"source": str(folder), "pairs": m.fitted_on.get("pairs"),
                                                                 "fit_seconds": None}))
        say(0.5, "searching the old gallery with the adapted queries")
        judged = adapted_outcomes(lists, [m for _, m, _ in maps] + ([forecast_map] if forecast_map else []),
                                  in_order(old_g, lists.gallery_ids, lists.block_rows))
        cascade, no_cascade = None, "no cascade: no procrustes adapter fitted here to take its first stage"
        first = next((m for kind, m, _ in maps if kind == "procrustes"), None)
        if first is not None:
            say(0.55, "the cascade: the old gallery's top N for the adapted queries, re-scored from the new gallery")
            cascade = source_cascade(lists, report, first.apply(lists.queries.new), "the procrustes adapter's queries",
                                     in_order(old_g, lists.gallery_ids, lists.block_rows),
                                     by_id(new_g, lists.slots, lists.block_rows))
        transformed = []
        for t, _ in transform_maps:
            say(0.6, f"searching the old gallery transformed by {t.kind} with the new queries")
            start = time.perf_counter()
            transformed.append((transformed_outcomes(lists, t, in_order(old_g, lists.gallery_ids, lists.block_rows)),
                                time.perf_counter() - start))
    finally:
        opened.close()
    forecast, no_forecast = source_forecast(lists, forecast_map, judged.pop()) if forecast_map else (None, None)
    say(0.9, "rank merge and threshold")
    level = report.level if len(judged) < 2 else selection_level([got.values - lists.oo for got in judged], report,
                                                                   lists.groups)
    adapters = [adapter_row(name, m, report, got, judge_adapted(lists, report, got, level=level), level, **extra)
                for (name, m, extra), got in zip(maps, judged)]
    transforms = source_transform_rows(lists, report, transform_maps, transformed, n_g)
    data = report.to_json()
    notes = [no_forecast] if no_forecast else []
    if transforms:
        notes.append(f"corpus transforms {', '.join(kinds)} fitted old -> new on the adapters' pairs; the new queries "
                     f"searched the {n_g:,} stored old vectors mapped block by block (one pass each, nothing written); "
                     "against new/new the interval resamples the queries")
    if cascade is not None:
        notes.append(f"cascade: the procrustes adapter's queries fetch the old gallery's top N (the streamed search's "
                     f"order) and the new gallery's vectors re-score them; N over "
                     f"{', '.join(str(p['n']) for p in cascade['curve'])}, judged at the simultaneous level "
                     f"{100 * cascade['level']:.1f} % of the grid; smallest passing N: "
                     + ("none" if cascade["smallest_passing"] is None else f"{cascade['smallest_passing']:,}"))
    elif kinds:
        notes.append(no_cascade)
    if rows is not None:
        capped = f", capped at {max_pairs:,} pairs" if int(round(share * n_g)) > max_pairs else ""
        notes.append(f"adapters {', '.join(kinds)} fitted on {len(rows):,} paired gallery items (a share of {share:g} of "
                     f"{n_g:,}{capped}, seed {report.seed}, read from both galleries block by block) and scored on every "
                     "query: the queries are never fitted on (held out by construction); the fitted items stay in the "
                     "searched gallery, as in the in-memory open-set check")
    if maps:
        notes.append(f"adapters' label_free: the adapted queries' neighbour recall@{lists.new_new.k} on the old gallery "
                     f"against each query's own new/new top-{lists.new_new.k}")
    picked = selection_note(adapters)
    notes += [picked] if picked else []
    rank_merge: list[dict[str, Any]] = []
    if lists.backfill is not None and lists.backfill.old_on_old is not None:
        needs, how = rank_merge_needs(lists, report.old_old)
        rank_merge = json_ready([asdict(n) for n in needs])
        notes += [how, RANK_MERGE_NOTE]
    rollouts, rescoring = rollout_rows({**data, "rollout": rank_merge})
    threshold, how = source_threshold(lists, t_old=t_old, precision=precision)
    notes.append(f"similarity threshold: {how}")
    plan = migration_plan(data, adapters=adapters, rollouts=rollouts, threshold=threshold,
                          forecast=forecast and forecast.to_json(), transforms=transforms, cascade=cascade,
                          queries=queries)
    say(1.0, "plan ready")
    return PlanInputs(dataclasses.replace(plan, notes=(*plan.notes, *notes)), adapters, rollouts, rescoring, transforms,
                      cascade, adapted_lists={name: got.top for (name, _, _), got in zip(maps, judged)})


def source_transform_rows(lists: CheckLists, report: UpgradeReport, maps: Sequence[tuple[PosthocMap, float]],
                          got: Sequence[tuple[Adapted, float]], n_gallery: int) -> list[dict[str, Any]]:
    """The corpus transforms' rows (:func:`engine.upgrade.remedies.transform_row`): against old/old with the check's
    interval and rule at the simultaneous level of the kinds; against new/new over the queries (or query groups)."""
    if not maps:
        return []
    level = report.level if len(got) < 2 else selection_level([a.values - lists.oo for a, _ in got], report,
                                                                lists.groups)
    nn = lists.relevance.outcomes(lists.new_new, ks=(lists.at,)).values[lists.key]
    return [transform_row(m, report, a.values, judge_adapted(lists, report, a, level=level),
                          compare(a.values, nn, resamples=report.resamples, level=report.level, seed=report.seed,
                                  names=BETTER, groups=lists.groups),
                          level=level, pairs=m.fitted_on.get("pairs"), vectors=n_gallery, fit_seconds=fit_s,
                          pass_seconds=search_s)
            for (m, fit_s), (a, search_s) in zip(maps, got)]


__all__ = ["MAX_FIT_PAIRS", "NEEDS_NEW_GALLERY", "Adapted", "adapted_outcomes", "adapter_row", "judge_adapted",
           "plan_from_sources", "rank_merge_needs", "read_pairs", "rescored", "source_cascade", "source_threshold",
           "source_transform_rows", "transformed_outcomes"]
