"""Compatibility matrices: C[t, k] = metric(queries embedded by model t, gallery embedded by model k), k <= t.

Each cell's neighbours are computed once and every requested metric is read from them. Cells whose
query and gallery features have different dimensions are *not comparable*: they are NaN and flagged
in ``MatrixResult.comparable`` (never shown as zero).

With ``paired=PairedOptions(...)``, every cross-test C[t, k] is also compared with the self-test
C[k, k] item by item (:mod:`engine.metrics.paired`): the per-query outcomes (hit@k, AP) or per-pair
outcomes (verification) come from the same single pass that gives the cell's value. Both cells use
gallery model k; their queries are paired by ``CellFeatures.query_ids`` when given, by position
otherwise. Only the diagonal's outcome vectors are kept (memory T x queries per metric). Each cross-test's interval
is the one ``check-upgrade`` computes for the same pair (:mod:`engine.metrics.cell_interval`: two-way over queries and
gallery items for Recall@k when the cells' features are here, the diagonal's top lists kept for it: T x queries x
(16 + 4k) indices), judged by its rule (:mod:`engine.metrics.decision`). With ``on_its_own``, each cross-test
also gets check-upgrade's "on its own" comparison, self-test C[t, t] against C[k, k] (``paired[metric]["alone"]``).

Every Recall@k cell also carries its ties (:mod:`engine.metrics.ties`): the queries whose best positive ties a
negative within ``RANK_TIE_TOLERANCE`` and the Recall@k under the pessimistic, expected and optimistic readings, from
the same pass (``MatrixResult.ties``); with a paired test, each cross-test where a query is tied also gets its
interval under the pessimistic and the optimistic reading (``paired[metric]["readings"]``), so its verdict can say
whether ties decide it.

A cell may also arrive as :class:`CellStats`: its per-query statistics computed elsewhere (e.g. by many workers,
:mod:`engine.evaluate.matrix`); everything after the neighbour pass is then the same code.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.core.kinds import STRICT
from engine.metrics.ranking import QueryStats
from engine.metrics.cell_interval import cell_seed, pair_images, pair_interval, paired_intervals, two_way_applies
from engine.metrics.decision import Rule, decide
from engine.metrics.paired import PairedOptions, count_verdicts, shared_items
from engine.metrics.paired import verdict as paired_verdict
from engine.metrics.retrieval import VERIFICATION, GalleryKind, RankTies, cell_stats, parse_metric, per_query_from_stats
from engine.metrics.gain import MIN_GAIN, gain_cells
from engine.metrics.summary import summarize
from engine.metrics.ties import RANK_TIE_READINGS, RANK_TIE_TOLERANCE, TieOutcomes, reading_intervals, \
    reading_verdicts, tie_outcomes, ties_decide
from engine.metrics.twoway import top_lists
from engine.metrics.verification import pair_verification


@dataclass(frozen=True)
class CellFeatures:
    """The four arrays of one model's evaluation (or of one cell)."""

    query: np.ndarray
    query_labels: np.ndarray
    gallery: np.ndarray
    gallery_labels: np.ndarray
    query_ids: np.ndarray | None = None  # identity of each query (pairs a cross-test with its self-test)

    @staticmethod
    def of(x: "CellFeatures | Mapping[str, np.ndarray]") -> "CellFeatures":
        """Accept a CellFeatures or a mapping with keys query_features/query_labels/gallery_features/gallery_labels."""
        if isinstance(x, CellFeatures):
            return x
        return CellFeatures(x["query_features"], x["query_labels"], x["gallery_features"], x["gallery_labels"])


@dataclass(frozen=True)
class CellStats:
    """A cell whose neighbour pass ran elsewhere: per-query statistics in query order (None: not comparable), and
    the cell's features when a metric needs them (pair verification)."""

    stats: QueryStats | None
    query_ids: np.ndarray | None = None
    features: CellFeatures | None = None


@dataclass(frozen=True)
class MatrixResult:
    """Matrices of several metrics over the same cells; NaN above the diagonal and where undefined."""

    values: dict[str, np.ndarray]
    valid_queries: np.ndarray  # int per cell (-1 where not computed)
    no_positive: np.ndarray  # int per cell (-1 where not computed)
    comparable: np.ndarray  # bool per cell (False above the diagonal and for dimension mismatches)
    paired: dict[str, dict] | None = None  # per metric: paired_matrices() of every cross-test (see engine.metrics.paired)
    rank_ties: str = "pessimistic"  # Recall@k's rule for a negative tying the best positive (stored with the summary)
    ties: dict[str, dict[str, np.ndarray]] | None = None  # per Recall@k metric: "tied" (queries, -1 where not counted)
    # and each reading's T x T matrix (engine.metrics.ties)


def _empty_paired(T: int, options: PairedOptions) -> dict:
    nan = lambda: np.full((T, T), np.nan)  # noqa: E731
    return {"diff": nan(), "lo": nan(), "hi": nan(), "n": np.full((T, T), -1, np.int64),
            "verdict": [[None] * T for _ in range(T)], "interval": [[None] * T for _ in range(T)],
            "resamples": options.resamples, "seed": options.seed, "confidence": options.confidence}


def _cell_outcomes(c: CellFeatures | CellStats, metrics: Sequence[str], parsed: list, *, gallery_kind: GalleryKind, same_set: bool,
                   rank_ties: RankTies, backend
                   ) -> tuple[dict[str, float], dict[str, np.ndarray], int, int, dict[str, TieOutcomes]]:
    """One cell: each metric's value and per-item outcome vector (NaN = undefined), valid and no-positive counts, and
    each Recall@k's tie readings (where the pass counted near ties)."""
    ks = tuple(sorted({k for kind, k in parsed if kind == "recall"}))
    map_k = next((k for kind, k in parsed if kind == "map" and k), 0)
    want_map = any(kind == "map" for kind, _ in parsed)
    values: dict[str, float] = {}
    vectors: dict[str, np.ndarray] = {}
    readings: dict[str, TieOutcomes] = {}
    n_valid = n_no_pos = 0
    if any(kind in ("recall", "map") for kind, _ in parsed):
        stats = c.stats if isinstance(c, CellStats) else cell_stats(
            c.query, c.query_labels, c.gallery, c.gallery_labels, gallery_kind=gallery_kind, same_set=same_set, map_k=map_k,
            want_ap=want_map, backend=backend, top_k=max(ks, default=1))
        valid, per_query = per_query_from_stats(stats, ks=ks, map_at=map_k or None, want_map=("map", None) in parsed, rank_ties=rank_ties)
        n_valid, n_no_pos = int(valid.sum()), int((~valid).sum())
        for name, (kind, at) in zip(metrics, parsed):
            if kind != VERIFICATION:
                vec = np.where(valid, per_query[f"{kind}@{at}" if at else kind], np.nan)
                vectors[name], values[name] = vec, float(np.nanmean(vec)) if n_valid else float("nan")
            if kind == "recall" and (got := tie_outcomes(stats, at)) is not None:
                readings[name] = got
    for name, (kind, _) in zip(metrics, parsed):
        if kind == VERIFICATION:
            f = c.features if isinstance(c, CellStats) else c
            if f is None:
                raise ValueError("pair verification needs the cell's features, not only its retrieval statistics")
            values[name], correct = pair_verification(f.query, f.query_labels, f.gallery, f.gallery_labels, same_set=same_set)
            vectors[name] = correct.astype(np.float64)
    return values, vectors, n_valid, n_no_pos, readings

def cell_outcomes(c: CellFeatures | CellStats, metric: str, *, gallery_kind: GalleryKind = "instance",
                  same_set: bool = False, rank_ties: RankTies = "pessimistic", backend=None) -> tuple[float, np.ndarray]:
    """One cell's value of ``metric`` and its per-item outcomes (per query, or per verification pair in
    :func:`engine.metrics.cell_interval.pair_images`'s order; NaN = undefined), from the pass that gives its value."""
    values, vectors, _, _, _ = _cell_outcomes(c, (metric,), [parse_metric(metric)], gallery_kind=gallery_kind,
                                              same_set=same_set, rank_ties=rank_ties, backend=backend)
    return values[metric], vectors[metric]


CellSource = Sequence["CellFeatures | Mapping[str, np.ndarray]"] | Callable[[int, int], "CellFeatures | CellStats"]


def compatibility_matrices(
    source: CellSource,
    *,
    metrics: Sequence[str] = ("recall@1", "map"),
    num_models: int | None = None,
    gallery_kind: GalleryKind = "instance",
    same_set: bool = False,
    rank_ties: RankTies = "pessimistic",
    backend=None,
    progress: Callable[[int, int], None] | None = None,
    paired: PairedOptions | None = None,
) -> MatrixResult:
    """All lower-triangle cells for every metric in ``metrics`` (one neighbour pass per cell).

    ``source`` is either one feature set per model (row t's queries meet column k's gallery) or a
    callable ``cell(t, k) -> CellFeatures`` (0-based) for views whose query side depends on the
    gallery model, such as PSP/LSP, or ``-> CellStats`` for cells searched elsewhere.
    """
    if callable(source):
        if num_models is None:
            raise ValueError("num_models is required when cells come from a callable")
        cell = source
        T = num_models
    else:
        sets = [CellFeatures.of(s) for s in source]
        T = len(sets)
        cell = lambda t, k: CellFeatures(sets[t].query, sets[t].query_labels, sets[k].gallery, sets[k].gallery_labels)  # noqa: E731
    if T < 1:
        raise ValueError("a compatibility matrix needs at least one model")
    parsed = [parse_metric(m) for m in metrics]
    if len({k for kind, k in parsed if kind == "map" and k}) > 1:
        raise ValueError(f"one mAP@k at a time, got {sorted({k for kind, k in parsed if kind == 'map' and k})}")
    values = {m: np.full((T, T), np.nan) for m in metrics}
    valid = np.full((T, T), -1, dtype=np.int64)
    no_pos = np.full((T, T), -1, dtype=np.int64)
    comparable = np.zeros((T, T), dtype=bool)
    tests = {m: {**_empty_paired(T, paired), "items": "pairs" if kind == VERIFICATION else "queries"}
             for m, (kind, _) in zip(metrics, parsed)} if paired else None
    tie_cells = {m: {"tied": np.full((T, T), -1, np.int64), **{r: np.full((T, T), np.nan) for r in RANK_TIE_READINGS}}
                 for m, (kind, _) in zip(metrics, parsed) if kind == "recall"}
    diagonal: dict[int, tuple] = {}  # self-test of each gallery model: (query ids, outcomes, top lists, query features,
    # pair images, tie readings)
    recall_ks = [at for kind, at in parsed if kind == "recall"]
    two_way = paired is not None and bool(recall_ks) and two_way_applies("recall", gallery_kind=gallery_kind, rank_ties=rank_ties)
    cells = [(t, k) for t in range(T) for k in range(t + 1)]
    for i, (t, k) in enumerate(cells):
        c = cell(t, k)
        if _comparable(c):  # otherwise left NaN
            out, vectors, valid[t, k], no_pos[t, k], readings = _cell_outcomes(
                c, metrics, parsed, gallery_kind=gallery_kind, same_set=same_set, rank_ties=rank_ties, backend=backend)
            for name in metrics:
                values[name][t, k] = out[name]
            for name, got in readings.items():
                summary = got.summary()
                tie_cells[name]["tied"][t, k] = summary["tied"]
                for r in RANK_TIE_READINGS:
                    tie_cells[name][r][t, k] = summary[r]
            comparable[t, k] = True
            f = c.features if isinstance(c, CellStats) else c  # a cell searched elsewhere may bring its features
            lists = (top_lists(f.query, f.query_labels, f.gallery, f.gallery_labels, depth=16 + 4 * max(recall_ks),
                               same_set=same_set) if two_way and f is not None else None)
            query = f.query if f is not None else None
            if tests is not None and t == k:
                images = (pair_images(f.query_labels, f.gallery_labels, same_set=same_set)
                          if f is not None and any(kind == VERIFICATION for kind, _ in parsed) else None)
                diagonal[k] = (c.query_ids, vectors, lists, query, images, readings)
            elif tests is not None and k in diagonal:
                _pair_cell(tests, t, k, (c.query_ids, vectors, lists, query, readings), diagonal[k],
                           dict(zip(metrics, parsed)), paired)
        if progress:
            progress(i + 1, len(cells))
    if tests is not None and paired.on_its_own:
        for t, k in [(t, k) for t in range(T) for k in range(t) if t in diagonal and k in diagonal]:
            _alone_cell(tests, t, k, diagonal[t], diagonal[k], dict(zip(metrics, parsed)), paired)
    return MatrixResult(values, valid, no_pos, comparable, tests, rank_ties=rank_ties, ties=tie_cells or None)


def _comparable(c: CellFeatures | CellStats) -> bool:
    if isinstance(c, CellStats):
        return c.stats is not None
    return np.asarray(c.query).shape[1] == np.asarray(c.gallery).shape[1]


def _pair_cell(tests: dict, t: int, k: int, cross_cell: tuple, self_cell: tuple, parsed: dict[str, tuple],
               options: PairedOptions) -> None:
    """Fill the paired test of cross-test (t, k) for every metric: the interval check-upgrade computes for the same
    pair (:func:`engine.metrics.cell_interval.paired_intervals`, two-way for Recall@k when both cells' top lists
    are at hand), judged by strict ECC (:func:`engine.metrics.decision.decide`; ``stored_summary`` re-judges under
    the stored tie rule)."""
    ids, vectors, lists, query, readings = cross_cell
    self_ids, self_vectors, self_lists, self_query, images, self_readings = self_cell
    same_queries = ids is None or self_ids is None or np.array_equal(ids, self_ids)
    for name, vec in vectors.items():
        kind, at = parsed[name]
        if tests[name]["items"] == "pairs":  # pairs are drawn from the cell's images: the same only on the same queries
            if not same_queries or len(vec) != len(self_vectors[name]):
                continue
            a = b = np.arange(len(vec))
        else:
            a, b = shared_items(ids, self_ids, len(vec), len(self_vectors[name]))
        aligned = same_queries and len(vec) == len(self_vectors[name])
        two_way = kind == "recall" and aligned and lists is not None and self_lists is not None
        same = aligned and query is not None and self_query is not None and np.array_equal(query, self_query)
        if tests[name]["items"] == "pairs" and images is not None and len(images) == len(vec):
            got = pair_interval(self_vectors[name], vec, images, seed=cell_seed(options.seed, t, k),
                                resamples=options.resamples, confidence=options.confidence, bound_unchanged=not same)
        else:
            got = paired_intervals(self_vectors[name][b], [vec[a]], seed=cell_seed(options.seed, t, k),
                                   resamples=options.resamples, confidence=options.confidence, k=at or 1,
                                   base_lists=self_lists if two_way else None, other_lists=[lists] if two_way else None,
                                   bound_unchanged=[not same])[0]
        entry = tests[name]
        entry["diff"][t, k], entry["lo"][t, k], entry["hi"][t, k] = got.diff, got.lo, got.hi
        entry["n"][t, k] = got.n
        entry["interval"][t][k] = got.interval
        entry["verdict"][t][k] = None if np.isnan(got.lo) else decide(got.diff, got.lo, got.hi, Rule())[0]
        if name in readings and name in self_readings:
            by_reading = reading_intervals(self_readings[name], readings[name], a, b, seed=cell_seed(options.seed, t, k),
                                           resamples=options.resamples, confidence=options.confidence,
                                           bound_unchanged=not same)
            for r, iv in (by_reading or {}).items():
                cell = entry.setdefault("readings", {}).setdefault(r, {
                    **{key: np.full(entry["diff"].shape, np.nan) for key in ("diff", "lo", "hi")},
                    "interval": [[None] * len(entry["verdict"]) for _ in entry["verdict"]]})
                cell["diff"][t, k], cell["lo"][t, k], cell["hi"][t, k] = iv.diff, iv.lo, iv.hi
                cell["interval"][t][k] = iv.interval


def _alone_cell(tests: dict, t: int, k: int, new_cell: tuple, old_cell: tuple, parsed: dict[str, tuple],
                options: PairedOptions) -> None:
    """Is model t better on its own than model k: its self-test against model k's, item by item, with the interval
    and words check-upgrade gives its "on its own" line for the same pair (seeded as cross-test (t, k); an exact
    tie stays ``[0, 0]``), stored as ``tests[metric]["alone"]``."""
    ids, vectors, lists, _, images, _ = new_cell
    old_ids, old_vectors, old_lists, _, old_images, _ = old_cell
    same_queries = ids is None or old_ids is None or np.array_equal(ids, old_ids)
    for name, vec in vectors.items():
        kind, at = parsed[name]
        entry = tests[name].setdefault("alone", {**{key: np.full(tests[name]["diff"].shape, np.nan) for key in ("diff", "lo", "hi")},
                                                 "n": np.full(tests[name]["diff"].shape, -1, np.int64),
                                                 "verdict": [[None] * len(tests[name]["verdict"]) for _ in tests[name]["verdict"]]})
        aligned = same_queries and len(vec) == len(old_vectors[name])
        seed = cell_seed(options.seed, t, k)
        if tests[name]["items"] == "pairs":
            if not aligned or images is None or old_images is None or not np.array_equal(images, old_images):
                continue
            got = pair_interval(old_vectors[name], vec, images, seed=seed, resamples=options.resamples,
                                confidence=options.confidence, bound_unchanged=False)
        else:
            try:
                a, b = shared_items(ids, old_ids, len(vec), len(old_vectors[name]))
            except ValueError:  # the two self-tests' queries cannot be paired: no comparison
                continue
            two_way = (kind == "recall" and aligned and lists is not None and old_lists is not None
                       and _same_gallery(lists, old_lists))  # the gallery resample needs the same gallery items
            got = paired_intervals(old_vectors[name][b], [vec[a]], seed=seed, resamples=options.resamples,
                                   confidence=options.confidence, k=at or 1, base_lists=old_lists if two_way else None,
                                   other_lists=[lists] if two_way else None, bound_unchanged=[False])[0]
        entry["diff"][t, k], entry["lo"][t, k], entry["hi"][t, k], entry["n"][t, k] = got.diff, got.lo, got.hi, got.n
        entry["verdict"][t][k] = paired_verdict(got.lo, got.hi, bool(got.diff > 0))


def _same_gallery(a, b) -> bool:
    """Whether two cells' top lists rank the same gallery items (sizes and classes), as a two-way bootstrap needs."""
    return (a.gallery.shape[0] == b.gallery.shape[0] and a.n_classes == b.n_classes
            and np.array_equal(a.gallery_class, b.gallery_class))


def compatibility_matrix(source: CellSource, *, metric: str = "recall@1", gallery_kind: GalleryKind = "instance",
                         same_set: bool = False, **kwargs) -> np.ndarray:
    """One metric's T x T matrix (NaN above the diagonal and for non-comparable cells)."""
    return compatibility_matrices(source, metrics=(metric,), gallery_kind=gallery_kind, same_set=same_set, **kwargs).values[metric]


def _json_matrix(a: np.ndarray) -> list[list[float | None]]:
    return [[None if np.isnan(v) else float(v) for v in row] for row in np.asarray(a, dtype=np.float64)]


def _verdicts_under(paired: dict, ties: str) -> list[list[str | None]]:
    """The per-cell paired verdicts under the ECC tie rule ``ties`` (the bootstrap itself does not depend on it): the
    rule check-upgrade judges with (:func:`engine.metrics.decision.decide`)."""
    rule = Rule(0.0, ties)
    kinds = paired.get("interval") or [[None] * len(row) for row in paired["verdict"]]  # a matrix stored before: none
    return [[decide(paired["diff"][t, k], paired["lo"][t, k], paired["hi"][t, k], rule,
                    unchanged=kinds[t][k] == "unchanged")[0]
             if paired["verdict"][t][k] is not None else None for k in range(len(row))]
            for t, row in enumerate(paired["verdict"])]


def stored_summary(result: MatrixResult, metric: str, *, ties: str = STRICT) -> dict:
    """JSON-ready summary stored with one metric's matrix: the ECC tie rule its verdicts used (``ties``: every
    reader marks cells with it, :func:`engine.core.conventions.stored_ties`), Recall@k's rank tie rule
    (``rank_ties``), AC/AA/ACA and curves, comparable
    cells, the update gain of every cross-test (``update_gain``; null where new self - old self is below
    ``update_gain_min``, :mod:`engine.metrics.gain`) and, when computed, the paired test (``paired``: diff/lo/hi/n
    matrices, per-cell verdicts, counts and the bootstrap's settings)."""
    C = result.values[metric]
    out = {"ties": ties, "rank_ties": result.rank_ties, **summarize(C, ties=ties), "comparable": result.comparable.tolist(),
           "update_gain": _json_matrix(gain_cells(C)[0]), "update_gain_min": MIN_GAIN}
    if result.paired and metric in result.paired:
        p = result.paired[metric]
        verdicts = _verdicts_under(p, ties)
        out["paired"] = {"diff": _json_matrix(p["diff"]), "lo": _json_matrix(p["lo"]), "hi": _json_matrix(p["hi"]),
                         "n": np.asarray(p["n"]).tolist(), "verdict": verdicts, "counts": count_verdicts(verdicts),
                         "interval": p.get("interval"), "rule": Rule(0.0, ties).name,
                         "items": p["items"], "resamples": p["resamples"], "seed": p["seed"], "confidence": p["confidence"]}
        if "alone" in p:  # model t's self-test against model k's: check-upgrade's "on its own"
            a = p["alone"]
            out["paired"]["alone"] = {"diff": _json_matrix(a["diff"]), "lo": _json_matrix(a["lo"]), "hi": _json_matrix(a["hi"]),
                                      "n": np.asarray(a["n"]).tolist(), "verdict": a["verdict"]}
    if result.ties and metric in result.ties:
        p = result.paired.get(metric) if result.paired else None
        out["tie_readings"] = tie_summary(result.ties[metric], result.valid_queries, p, ties=ties)
    return out


def tie_summary(cells: Mapping[str, np.ndarray], valid: np.ndarray, paired: Mapping | None, *,
                ties: str = STRICT) -> dict:
    """JSON-ready ties of one Recall@k matrix (:mod:`engine.metrics.ties`): the tolerance, per cell the tied queries
    (``tied``, null where not counted), their ``share`` of the queries with a positive and the Recall@k under each
    reading; with a paired test, each cross-test's interval under the pessimistic and the optimistic reading where a
    query is tied (``paired``), their verdicts under the ECC tie rule ``ties`` (``verdicts``: ``{reading: verdict}``)
    and whether ties decide it (``decide``: the two differ; false where no query is tied, null where not known)."""
    tied = np.asarray(cells["tied"])
    T = tied.shape[0]
    counted = (tied >= 0) & (valid > 0)
    out: dict = {"tolerance": RANK_TIE_TOLERANCE, "readings": list(RANK_TIE_READINGS),
                 "tied": [[int(v) if v >= 0 else None for v in row] for row in tied],
                 "share": _json_matrix(np.where(counted, tied / np.maximum(valid, 1), np.nan)),
                 **{r: _json_matrix(cells[r]) for r in RANK_TIE_READINGS}}
    if not paired:
        return out
    stored = paired.get("readings") or {}
    rule = Rule(0.0, ties)
    verdicts: list[list[dict | None]] = [[None] * T for _ in range(T)]
    decides: list[list[bool | None]] = [[None] * T for _ in range(T)]
    for t in range(T):
        for k in range(t):
            if paired["verdict"][t][k] is None or tied[t, k] < 0 or tied[k, k] < 0:
                continue
            cell = {r: {key: stored[r][key][t, k] for key in ("diff", "lo", "hi")} | {"interval": stored[r]["interval"][t][k]}
                    for r in stored}
            got = reading_verdicts(cell, rule) if stored else None
            verdicts[t][k], decides[t][k] = got, ties_decide(got)
    out["paired"] = {r: {"diff": _json_matrix(stored[r]["diff"]), "lo": _json_matrix(stored[r]["lo"]),
                         "hi": _json_matrix(stored[r]["hi"]), "interval": stored[r]["interval"]} for r in stored}
    out["verdicts"], out["decide"] = verdicts, decides
    return out
