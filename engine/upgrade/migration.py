"""The migration plan of two models' features in memory: adapters fitted and judged, roll-out rows, the threshold.

:func:`plan_inputs` gathers what :func:`engine.upgrade.plan.migration_plan` decides from, for ``check-upgrade --plan``
and the stored ``upgrade`` analysis (the Upgrade check page shows its plan):

* **adapters**: each kind (default Procrustes and ridge affine, :mod:`engine.adapters.posthoc`) is fitted on a seeded
  share of the gallery's paired old/new embeddings; the adapted new queries are searched against the old gallery and
  judged against old/old by :func:`engine.upgrade.verdict.check_upgrade` itself, with the report's metric, rule,
  interval, resamples, level and seed (one verdict function for the report and the adapters). The fitted items never
  score: open-set queries are other images anyway; when the queries are the gallery (same set) the fitted items are
  left out of both queries and gallery, so old/old is recomputed on the other items. An exported adapter folder
  (``--adapter DIR``) is judged the same way on every query (where it was fitted is its own business);
* **roll-outs**: the report's item-replacement backfill rows and, when the report has them (``--rollout``), its
  rank-merge rows; candidate re-scoring is kept as information only (its fraction is K / N per query, not items);
* **corpus transforms and the cascade** (:func:`remedy_inputs`, :mod:`engine.upgrade.remedies`): each adapter kind also
  fitted old -> new on the same pairs and the stored old gallery transformed, and the Procrustes adapter's queries
  fetching the old gallery's top N for the new model to re-score, both judged by the same rule and interval;
* **threshold**: each model's top-``k`` (query, gallery item) candidates of its own cell, relevant when the labels
  agree; the old threshold is given or, by default, the lowest old score whose candidates have precision 0.9, and
  :func:`engine.metrics.threshold.matched_threshold` gives the new score with the same precision.

A check read from sources gets the same rows from :mod:`engine.upgrade.source_remedies` (with the new gallery) or a
plan from the verdicts alone (:func:`plan_from_verdicts`, without it).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.norms import unit_rows_np
from engine.adapters.artifact import load_adapter
from engine.adapters.posthoc import PosthocMap, fit_map, kind_of
from engine.metrics.cell_interval import cell_seed
from engine.metrics.compatibility import CellFeatures
from engine.metrics.selection import simultaneous_level
from engine.sources.text import first_line
from engine.metrics.relevance import neighbour_recall
from engine.metrics.threshold import matched_threshold, threshold_at_precision
from engine.metrics.topk import array_blocks, stream_topk
from engine.upgrade import forecast as fc
from engine.upgrade import remedies
from engine.upgrade.plan import (DEFAULT_ADAPTERS, DEFAULT_FIT_SHARE, DEFAULT_PRECISION, THRESHOLD_K, Plan, backfill_metric,
                                 migration_plan)
from engine.upgrade.verdict import UpgradeReport, backfill_needs, check_upgrade, per_query_scores, rollout_needs
from storage import json_ready

RANK_MERGE = "rank_merge:"
LABEL_FREE_K = 10  # the depth of the label-free reading beside each adapter (the sources' default k)
RANK_MERGE_NOTE = ("a rank merge serves both models at query time (old queries on the old index, new queries on the "
                   "re-embedded part, merged by score); its fraction is the first measured one that scores above the "
                   "old self-test (at 0 % it is the old system itself)")


@dataclass(frozen=True)
class PlanInputs:
    """The plan and what it was decided from (JSON-ready rows)."""

    plan: Plan
    adapters: list[dict[str, Any]]
    rollouts: list[dict[str, Any]]
    rescoring: dict[str, Any] | None
    transforms: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # corpus transforms (remedies)
    cascade: dict[str, Any] | None = None  # the cascade's curve over N and its pick (remedies)
    adapted_lists: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)  # sources: adapter name -> the
    # adapted queries' top-k lists on the old gallery (engine.metrics.topk.TopK), for --export trec; not in the JSON

    def to_json(self, report: dict[str, Any] | None = None) -> dict[str, Any]:
        """The plan's fields, then its inputs (the report too when given)."""
        out = {**self.plan.to_json(), "headline": self.plan.headline(), "markdown": self.plan.to_markdown(),
               "adapters": self.adapters,
               "rollouts": self.rollouts, "rescoring": self.rescoring, "transforms": self.transforms,
               "cascade": self.cascade}
        return json_ready({**out, "report": report} if report is not None else out)


def check_plan_options(kinds: Sequence[str], share: float, precision: float = DEFAULT_PRECISION) -> None:
    """Refuse an unknown adapter kind, a share outside (0, 1) or a precision outside (0, 1], in one line."""
    for kind in kinds:
        kind_of(kind)
    if not 0 < share < 1:
        raise ValueError(f"--fit-share must lie strictly between 0 and 1, got {share!r}")
    if not 0 < precision <= 1:
        raise ValueError(f"the precision of the default old threshold must lie in (0, 1], got {precision!r}")


def fit_rows(n: int, share: float, seed: int, *, cap: int | None = None) -> np.ndarray:
    """The gallery rows the adapters are fitted on: a seeded ``share`` of ``n`` (at least 2, at least 1 left), at most
    ``cap`` of them (the first of the same seeded order), sorted."""
    m = int(round(share * n))
    if m < 2 or m > n - 1:
        raise ValueError(f"a fit share of {share:g} of {n} gallery items gives {m} pairs; an adapter needs at least 2 and "
                         "at least one item must be left to score")
    if cap is not None and cap < 2:
        raise ValueError(f"an adapter needs at least 2 pairs; the cap on them is {cap}")
    return np.sort(np.random.default_rng(seed).permutation(n)[: m if cap is None else min(m, cap)])


def _rows(cell: CellFeatures, keep: np.ndarray) -> CellFeatures:
    return CellFeatures(cell.query[keep], np.asarray(cell.query_labels)[keep], cell.gallery[keep],
                        np.asarray(cell.gallery_labels)[keep])


def _check_dims(m: PosthocMap, old: CellFeatures, new: CellFeatures) -> None:
    if m.new_dim != new.query.shape[1] or m.old_dim != old.gallery.shape[1]:
        raise ValueError(f"the adapter maps {m.new_dim}-d new vectors to {m.old_dim}-d old ones, but the new model's "
                         f"features are {new.query.shape[1]}-d and the old model's {old.gallery.shape[1]}-d")


def judge_map(m: PosthocMap, old: CellFeatures, new: CellFeatures, report: UpgradeReport,
              keep: np.ndarray | None = None, *, level: float | None = None,
              groups: np.ndarray | None = None) -> UpgradeReport:
    """Adapted new queries on the old gallery vs old/old under the report's settings (``keep``: the same-set items
    that score; None: all); ``level`` (default the report's): the simultaneous level of :func:`adapter_rows`;
    ``groups``: the check's query groups (one per query of ``old``)."""
    _check_dims(m, old, new)
    if keep is not None:
        old, new = _rows(old, keep), _rows(new, keep)
        groups = None if groups is None else np.asarray(groups)[keep]
    adapted = CellFeatures(m.apply(new.query), new.query_labels, old.gallery, old.gallery_labels)
    return check_upgrade(old, adapted, names=("old", "adapted"), metric=report.metric, resamples=report.resamples,
                         level=report.level if level is None else level, seed=report.seed, same_set=report.same_set,
                         orderings=(), margin=report.margin, ties=report.ties, interval=report.interval,
                         query_groups=groups)


def adapted_diffs(m: PosthocMap, old: CellFeatures, new: CellFeatures, report: UpgradeReport,
                  keep: np.ndarray | None = None) -> np.ndarray:
    """Per query of ``old`` (NaN where not scored: outside ``keep``, or no positive): adapted/old - old/old under the
    report's metric, the differences :func:`judge_map` judges."""
    _check_dims(m, old, new)
    rows = np.arange(len(old.query_labels)) if keep is None else np.asarray(keep)
    o, n = (old, new) if keep is None else (_rows(old, keep), _rows(new, keep))

    def score(q: np.ndarray) -> np.ndarray:
        return per_query_scores(q, o.query_labels, o.gallery, o.gallery_labels, metric=report.metric,
                                same_set=report.same_set)

    out = np.full(len(old.query_labels), np.nan)
    out[rows] = score(m.apply(n.query)) - score(o.query)
    return out


def selection_level(diffs: Sequence[np.ndarray], report: UpgradeReport, groups: np.ndarray | None = None) -> float:
    """The level each of several candidates is judged at so that the plan's pick keeps the report's level
    (:func:`engine.metrics.selection.simultaneous_level`, seeded as the check's cell (1, 0)); one candidate: the
    report's level."""
    return simultaneous_level(diffs, level=report.level, resamples=report.resamples, seed=cell_seed(report.seed, 1, 0),
                              groups=groups)


def selection_note(rows: Sequence[dict[str, Any]]) -> str | None:
    """The plan's note on how its adapters' intervals were made honest for the choice among them (None: one or none)."""
    if len(rows) < 2:
        return None
    return (f"the {len(rows)} adapters are judged with simultaneous intervals (max-T over the candidates' percentile "
            f"ranks, Mandel & Betensky 2008): each at level {100 * rows[0]['level']:.1f} % so that all cover together "
            f"at {100 * rows[0]['report_level']:g} %; the one the plan picks (highest lower end) keeps that level")


def _adapter_row(name: str, m: PosthocMap, got: UpgradeReport, report_level: float, **extra: Any) -> dict[str, Any]:
    return json_ready({"name": name, "kind": m.kind, **extra, "adapted_old": got.new_old, "old_old": got.old_old,
                       "n_queries": got.n_queries, "n_gallery": got.n_gallery, "compatibility": asdict(got.compatibility),
                       "interval": got.interval, "level": got.level, "report_level": report_level})


def fitted_maps(old: CellFeatures, new: CellFeatures, kinds: Sequence[str], *, share: float,
                seed: int) -> Iterator[tuple[str, PosthocMap, np.ndarray, float]]:
    """Each kind's map new -> old fitted on the seeded ``share`` of the gallery's old/new pairs (:func:`fit_rows`):
    ``(kind, map, the fitted gallery rows, fit seconds)``."""
    fitted = fit_rows(len(old.gallery), share, seed)
    for kind in kinds:
        start = time.perf_counter()
        m = fit_map(kind, new.gallery[fitted], old.gallery[fitted], fitted_on={"pairs": len(fitted), "share": share,
                                                                               "seed": seed})
        yield kind, m, fitted, time.perf_counter() - start


def label_free(m: PosthocMap, old: CellFeatures, new: CellFeatures, *, k: int = LABEL_FREE_K) -> float | None:
    """The adapted new queries' neighbour recall@k on the old gallery against each query's new/new top-k: agreement
    with the new model's own neighbours, the reading the adapter literature quotes (None under same-set, whose own
    item would have to be excluded from both lists, or a gallery of fewer than k items)."""
    n_g = len(new.gallery)
    if n_g < k:
        return None
    rows = np.arange(n_g, dtype=np.int64)
    ref = stream_topk(new.query, array_blocks(rows, new.gallery), k=k)
    got = stream_topk(m.apply(new.query), array_blocks(rows, old.gallery), k=k)
    return float(np.mean(neighbour_recall(got, ref, ks=(k,)).values[f"neighbour_recall@{k}"]))


def adapter_rows(old: CellFeatures, new: CellFeatures, report: UpgradeReport, *, kinds: Sequence[str] = DEFAULT_ADAPTERS,
                 files: Sequence[str | Path] = (), share: float = DEFAULT_FIT_SHARE,
                 groups: np.ndarray | None = None) -> list[dict[str, Any]]:
    """One row per adapter kind fitted here (see the module docstring) and per exported adapter folder, each judged at
    the simultaneous level of all of them (:func:`selection_level`: the plan picks one, and its interval keeps the
    report's level); ``groups``: the check's query groups. Each row has the report's new/new (its recovery's ceiling,
    :func:`engine.upgrade.plan.recovery_rows`) and :func:`label_free`."""
    candidates: list[tuple[str, PosthocMap, np.ndarray | None, dict[str, Any]]] = []
    for kind, m, fitted, seconds in fitted_maps(old, new, kinds, share=share, seed=report.seed):
        keep = np.setdiff1d(np.arange(len(old.gallery)), fitted) if report.same_set else None
        candidates.append((kind, m, keep, {"source": "fitted here", "pairs": len(fitted), "fit_seconds": seconds}))
    for folder in files:
        m = load_adapter(folder)
        candidates.append((f"{m.kind} ({Path(folder).name})", m, None, {"source": str(folder),
                                                                        "pairs": m.fitted_on.get("pairs")}))
    level = report.level if len(candidates) < 2 else selection_level(
        [adapted_diffs(m, old, new, report, keep) for _, m, keep, _ in candidates], report, groups)
    beside = lambda m: {"new_new": report.new_new,  # noqa: E731
                        "label_free": None if report.same_set else label_free(m, old, new)}
    return [_adapter_row(name, m, judge_map(m, old, new, report, keep, level=level, groups=groups), report.level, **extra,
                         **beside(m)) for name, m, keep, extra in candidates]


FORECAST_PAIRS = 1000  # gallery pairs the forecast's Procrustes is fitted on (at most half the gallery), as calibrated


def forecast_inputs(old: CellFeatures, new: CellFeatures, metric: str, seed: int, *, same_set: bool = False,
                    self_tests: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """What :func:`engine.upgrade.forecast.forecast_recovery` reads: both self-tests per query (``self_tests``: already
    computed) and, for the queries through an orthogonal map fitted on at most :data:`FORECAST_PAIRS` seeded gallery
    pairs, their score on the old gallery and the map's residual (the procedure the forecast was calibrated on by
    ``bench/bench_evidence.py``). ``ValueError`` when the two models' widths differ (no orthogonal map)."""
    if old.gallery.shape[1] != new.gallery.shape[1]:
        raise ValueError(f"the forecast's orthogonal map needs one width, the models give {old.gallery.shape[1]} and "
                         f"{new.gallery.shape[1]}")
    oo, nn = self_tests or tuple(per_query_scores(c.query, c.query_labels, c.gallery, c.gallery_labels, metric=metric,
                                                  same_set=same_set) for c in (old, new))
    m = min(FORECAST_PAIRS, len(old.gallery) // 2)
    rows = np.random.default_rng(seed).permutation(len(old.gallery))[:m]
    w = fc.procrustes_map(new.gallery[rows], old.gallery[rows])
    residual = fc.procrustes_residual(new.query, old.query, w)
    adapted = per_query_scores(unit_rows_np(new.query, np.float64) @ w, old.query_labels, old.gallery, old.gallery_labels, metric=metric,
                               same_set=same_set)
    raw = float(np.mean(np.sum(unit_rows_np(new.query, np.float64) * unit_rows_np(old.query, np.float64), axis=1))) if new.query.shape == old.query.shape else None
    return {"oo": oo, "nn": nn, "adapted": adapted, "residual": residual, "pairs": int(m), "raw_cosine": raw}


def forecast_of(old: CellFeatures, new: CellFeatures, report: UpgradeReport) -> tuple[fc.Forecast | None, str | None]:
    """The plan's recovery forecast on the check's own queries, read before any adapter is fitted, or ``(None, why
    not)``."""
    try:
        f = forecast_inputs(old, new, report.metric, report.seed, same_set=report.same_set)
        return fc.forecast_recovery(f["oo"], f["nn"], f["adapted"], f["residual"]), None
    except ValueError as exc:
        return None, f"no recovery forecast: {first_line(exc)}"


def above(fractions: Sequence[float], values: Sequence[float], target: float) -> float | None:
    """The first measured fraction whose value lies strictly above ``target`` (None: none does)."""
    return next((float(f) for f, v in zip(fractions, values) if v is not None and v > target), None)


def rollout_rows(report: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The roll-outs a plan may choose (backfill and rank-merge rows) and the candidate re-scoring row (information).

    A rank merge at 0 % is the old system itself (old queries on the old index), so its curve "reaches" the old
    self-test at once; its row's ``to_old_self`` is replaced by the first measured fraction that scores strictly above
    the old self-test (``reaches_at`` keeps the curve's own reading)."""
    rows = [dict(r) for r in report.get("backfill") or ()]
    rows += [{**r, "reaches_at": r["to_old_self"], "to_old_self": above(r["fractions"], r["values"], report["old_old"])}
             for r in report.get("rollout") or () if str(r["ordering"]).startswith(RANK_MERGE)]
    rescoring = next((dict(r) for r in report.get("rollout") or () if r["ordering"] == "rescoring"), None)
    return rows, rescoring


def plan_rollouts(old: CellFeatures, new: CellFeatures, report: UpgradeReport) -> tuple[list[dict[str, Any]],
                                                                                     dict[str, Any] | None]:
    """The roll-out rows the plan chooses from, read on :func:`engine.upgrade.plan.backfill_metric`'s curves: the
    report's own when its metric does not flatter backfilling, else the same orderings recomputed under mAP (the old
    self-test target too), each row naming its ``metric``."""
    data = report.to_json()
    metric = backfill_metric(report.metric, report.relevance)
    if metric == report.metric or not (report.backfill or report.rollout):
        rows, rescoring = rollout_rows(data)
        return [{**r, "metric": report.metric, "old_self": report.old_old} for r in rows], rescoring

    def mean(q: CellFeatures, g: CellFeatures) -> float:
        return float(np.nanmean(per_query_scores(q.query, q.query_labels, g.gallery, g.gallery_labels, metric=metric,
                                                 same_set=report.same_set)))

    old_self = mean(old, old)
    orderings = tuple(b.ordering for b in report.backfill)
    needs = backfill_needs(old, new, metric=metric, old_self=old_self, orderings=orderings, seed=report.seed,
                           same_set=report.same_set)
    rolled = rollout_needs(old, new, metric=metric, old_self=old_self, new_self=mean(new, new), orderings=orderings,
                           seed=report.seed, same_set=report.same_set) if report.rollout else ()
    rows, rescoring = rollout_rows({**data, "old_old": old_self, "backfill": [asdict(n) for n in needs],
                                    "rollout": [asdict(r) for r in rolled]})
    return [{**r, "metric": metric, "old_self": old_self} for r in rows], rescoring


def candidate_pairs(cell: CellFeatures, *, k: int = THRESHOLD_K, same_set: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Scores of each query's top-``k`` gallery items in its own model's cell (own item excluded under ``same_set``)
    and whether each pair is relevant (same label)."""
    n_g = len(cell.gallery)
    depth = min(k + (1 if same_set else 0), n_g)
    top = stream_topk(cell.query, array_blocks(np.arange(n_g, dtype=np.int64), cell.gallery), k=depth)
    ids, scores = np.asarray(top.ids), np.asarray(top.scores, np.float64)
    keep = ids >= 0
    if same_set:
        keep &= ids != np.arange(len(ids))[:, None]
    keep &= np.cumsum(keep, axis=1) <= k  # the first k that are kept
    relevant = np.asarray(cell.gallery_labels)[np.where(ids >= 0, ids, 0)] == np.asarray(cell.query_labels)[:, None]
    return scores[keep], relevant[keep]


def threshold_row(old: CellFeatures, new: CellFeatures, *, same_set: bool, t_old: float | None = None,
                  precision: float = DEFAULT_PRECISION, k: int = THRESHOLD_K) -> tuple[dict[str, Any] | None, str]:
    """The re-mapped threshold (None when the old candidates never reach ``precision``) and a note on where it came from."""
    so, ro = candidate_pairs(old, k=k, same_set=same_set)
    sn, rn = candidate_pairs(new, k=k, same_set=same_set)
    return remapped_threshold(so, ro, sn, rn, how=f"each model's top-{k} candidates per query, relevant when the labels "
                              "agree", t_old=t_old, precision=precision)


def remapped_threshold(so: np.ndarray, ro: np.ndarray, sn: np.ndarray, rn: np.ndarray, *, how: str,
                       t_old: float | None = None,
                       precision: float = DEFAULT_PRECISION) -> tuple[dict[str, Any] | None, str]:
    """:func:`threshold_row` from the scored candidates (``so``, ``sn``) and their relevance (``ro``, ``rn``) of the old
    and the new model; ``how`` says what the candidates are."""
    if t_old is None:
        t_old = threshold_at_precision(so, ro, precision)
        if t_old is None:
            return None, f"no old score has precision {precision:g} on {how}: no threshold to re-map (give --threshold T)"
        how = f"the old threshold is the lowest old score with precision {precision:g} (the default) on {how}"
    else:
        how = f"the old threshold {t_old:g} was given; precision measured on {how}"
    return asdict(matched_threshold(so, ro, sn, rn, float(t_old))), how


def plan_inputs(old: CellFeatures, new: CellFeatures, report: UpgradeReport, *, kinds: Sequence[str] = DEFAULT_ADAPTERS,
                files: Sequence[str | Path] = (), share: float = DEFAULT_FIT_SHARE, t_old: float | None = None,
                precision: float = DEFAULT_PRECISION, groups: np.ndarray | None = None,
                queries: int | None = None) -> PlanInputs:
    """The migration plan of ``report`` (computed on ``old`` and ``new``, with the query ``groups`` when it had them)
    with its adapters, roll-outs and threshold; ``queries``: the plan's horizon (:func:`engine.upgrade.plan.horizon`)."""
    data = report.to_json()
    forecast, no_forecast = forecast_of(old, new, report) if kinds else (None, None)  # before any adapter is fitted
    adapters = adapter_rows(old, new, report, kinds=kinds, files=files, share=share, groups=groups)
    rollouts, rescoring = plan_rollouts(old, new, report)
    threshold, how = threshold_row(old, new, same_set=report.same_set, t_old=t_old, precision=precision)
    transforms, cascade, remedy_notes = remedy_inputs(old, new, report, kinds=kinds, share=share, groups=groups)
    plan = migration_plan(data, adapters=adapters, rollouts=rollouts, threshold=threshold,
                          forecast=forecast and forecast.to_json(), transforms=transforms, cascade=cascade,
                          queries=queries)
    notes = list(plan.notes) + ([no_forecast] if no_forecast else []) + remedy_notes
    if kinds:
        scored = ("the other items (the fitted ones left out of queries and gallery)" if report.same_set
                  else "every query (none of them fitted on)")
        notes.append(f"adapters {', '.join(kinds)} fitted on {adapters[0]['pairs']:,} paired gallery items (a share of "
                     f"{share:g}, seed {report.seed}) and scored on {scored}")
    picked = selection_note(adapters)
    notes += [picked] if picked else []
    notes.append(f"similarity threshold: {how}")
    if any(str(r["ordering"]).startswith(RANK_MERGE) for r in rollouts):
        notes.append(RANK_MERGE_NOTE)
    if rescoring is not None:
        reach = rescoring.get("to_old_self")
        notes.append("candidate re-scoring (the old index's top K re-ranked by the new model) reaches the old self-test "
                     + ("never" if reach is None else f"at K = {100 * reach:.1f} % of the gallery per query")
                     + ": a query-time cost, not items to re-embed, so it is not a backfill choice")
    return PlanInputs(dataclasses.replace(plan, notes=tuple(notes)), adapters, rollouts, rescoring, transforms, cascade)


def remedy_inputs(old: CellFeatures, new: CellFeatures, report: UpgradeReport, *, kinds: Sequence[str], share: float,
                  groups: np.ndarray | None = None) -> tuple[list[dict[str, Any]], dict[str, Any] | None, list[str]]:
    """The corpus transforms (the adapter ``kinds`` fitted old -> new on the same seeded share) and the cascade (first
    stage: the Procrustes adapter when it is one of ``kinds``, else the new queries when the widths agree) of
    :mod:`engine.upgrade.remedies`, and a note on each, or on why it was left out."""
    transforms = remedies.transform_rows(old, new, report, fitted=fit_rows(len(old.gallery), share, report.seed),
                                         kinds=kinds, groups=groups) if kinds else []
    notes = [f"corpus transforms {', '.join(kinds)} fitted old -> new on the adapters' {transforms[0]['pairs']:,} gallery "
             f"pairs; the new queries searched the transformed {len(old.gallery):,} stored vectors (one pass, no model)"
             ] if transforms else []
    first, name = None, ""
    o, n, g = old, new, groups
    if "procrustes" in kinds:
        _, m, fitted, _ = next(fitted_maps(old, new, ("procrustes",), share=share, seed=report.seed))
        if report.same_set:  # the queries are the gallery: the fitted items leave both, as for the adapters
            keep = np.setdiff1d(np.arange(len(old.gallery)), fitted)
            o, n, g = _rows(old, keep), _rows(new, keep), None if groups is None else np.asarray(groups)[keep]
        first, name = m.apply(n.query), "the procrustes adapter's queries"
    elif old.gallery.shape[1] == new.gallery.shape[1]:
        first, name = new.query, "new queries"
    cascade = None
    try:
        if first is None:
            raise ValueError("no first stage: no procrustes adapter and the two widths differ")
        cascade = remedies.cascade_row(o, n, report, first=first, first_name=name, groups=g)
        notes.append(f"cascade: {name} fetch the old index's top N and the new model re-scores them (from its gallery "
                     f"vectors); N over {', '.join(str(p['n']) for p in cascade['curve'])}, judged at the simultaneous "
                     f"level {100 * cascade['level']:.1f} % of the grid; smallest passing N: "
                     + ("none" if cascade["smallest_passing"] is None else f"{cascade['smallest_passing']:,}"))
    except ValueError as exc:
        notes.append(f"no cascade: {first_line(exc)}")
    return transforms, cascade, notes


VERDICTS_ONLY = ("adapters, roll-outs and the threshold need the features in memory (--features, --experiment or --model) "
                 "or, from sources, the new gallery (--new-gallery); this plan is decided from the verdicts alone")


def plan_from_verdicts(report: UpgradeReport, *, why: str = VERDICTS_ONLY) -> PlanInputs:
    """The plan from the verdicts alone (no adapter, roll-out or threshold), with ``why`` as a note: a check read from
    sources without the new gallery (with it, :func:`engine.upgrade.source_remedies.plan_from_sources`), or one whose
    default adapters cannot be fitted."""
    plan = migration_plan(report.to_json())
    return PlanInputs(dataclasses.replace(plan, notes=(*plan.notes, why)), [], [], None)


def or_verdicts(build: Callable[[], PlanInputs], report: UpgradeReport, *, asked: bool) -> PlanInputs:
    """``build()``'s plan; when it cannot be built (a gallery too small for the default adapters) and no adapter or
    threshold was asked for by name, the plan from the verdicts alone, saying why."""
    try:
        return build()
    except ValueError as exc:
        if asked:
            raise
        return plan_from_verdicts(report, why=f"no adapter, roll-out or threshold: {first_line(exc)}")


def decide_in_memory(old: CellFeatures, new: CellFeatures, report: UpgradeReport, *,
                     kinds: Sequence[str] | None = None, files: Sequence[str | Path] = (), share: float = DEFAULT_FIT_SHARE,
                     t_old: float | None = None, precision: float = DEFAULT_PRECISION,
                     groups: np.ndarray | None = None, queries: int | None = None) -> PlanInputs:
    """The plan of a check whose features are in memory (``--features``, ``--experiment``, ``--model``, the stored
    ``upgrade`` analysis): :func:`plan_inputs`, or the verdicts alone (:func:`or_verdicts`) when the default adapters
    cannot be fitted and nothing was asked for by name (``kinds`` None, no ``files``, no ``t_old``)."""
    return or_verdicts(lambda: plan_inputs(old, new, report, kinds=DEFAULT_ADAPTERS if kinds is None else kinds,
                                           files=files, share=share, t_old=t_old, precision=precision, groups=groups,
                                           queries=queries),
                       report, asked=kinds is not None or bool(files) or t_old is not None)
