"""How much retrieval a post-hoc map gives back, as a function of the number of pairs it was fitted on.

The items (old and new embeddings joined by id) are split once, seeded: the *queries* are held out (``held_out``
items drawn at random, or a separate query set) and never fitted on; the *gallery* is every other item, in the
old space for the cross-test, and the map is fitted on the first N items of a seeded order of the gallery, so the
pairs of a smaller N are a subset of a larger one's. Three cells are scored on the held-out queries, each from one
streamed top-k pass (:mod:`engine.metrics.topk`) and the relevance kinds of :mod:`engine.metrics.relevance`:

* old/old: old queries on the old gallery; new/new: new queries on the new gallery (the full re-embedding);
* adapted/old: the map's image of the new queries on the old gallery (and new/old, the raw new queries, when the
  widths agree: what happens without an adapter).

``labels`` relevance scores Recall@k (a same-label item in the first k); ``qrels`` (judgements query -> item -> grade,
keyed by query and gallery row, as ``check-upgrade --old-gallery ... --qrels`` judges) scores nDCG@k, the check's
default under qrels; ``none`` (no labels) scores each query's neighbour recall@k against its new/new top-k, so new/new
is 1 by construction. The recovery is adapted/old as a
share of old/old and of new/new; each share's difference in points comes with the paired bootstrap interval over
queries of :func:`engine.metrics.paired.paired_bootstrap` (the gallery taken as fixed). Fit time is wall time; apply
time is the map over all queries (float32 numpy, blocks of rows) divided by their number.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from engine.adapters.posthoc import DIRECTIONS, NEW_TO_OLD, OLD_TO_NEW, PosthocMap, fit_map, kind_of, options_for
from engine.metrics.paired import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, paired_bootstrap
from engine.metrics.relevance import label_outcomes, neighbour_recall, qrels_outcomes
from engine.metrics.topk import TopK, array_blocks, stream_topk
from engine.sources import Joined

DEFAULT_GRID = (250, 500, 1000, 2000, 5000, 10000, 20000)
DEFAULT_HELD_OUT = 1000
RELEVANCE_KINDS = ("labels", "qrels", "none")


@dataclass(frozen=True)
class Split:
    """The gallery items (fitted on, in ``fit_order``) and the held-out queries."""

    gallery: Joined
    queries: Joined
    fit_order: np.ndarray  # gallery rows in the seeded order the pairs are taken in


def _take(items: Joined, rows: np.ndarray) -> Joined:
    return Joined(items.ids[rows], items.old[rows], items.new[rows], None if items.labels is None else items.labels[rows])


def split_items(items: Joined, *, queries: Joined | None = None, held_out: int = DEFAULT_HELD_OUT,
                seed: int = 0) -> Split:
    """Hold out ``held_out`` random items as queries (or use ``queries``, a separate set); the rest is the gallery."""
    n = len(items.ids)
    rng = np.random.default_rng(seed)
    if queries is None:
        if not 1 <= held_out < n:
            raise ValueError(f"--held-out must be between 1 and {n - 1} (the items less one for the gallery), got {held_out}")
        perm = rng.permutation(n)
        q_rows, g_rows = np.sort(perm[:held_out]), np.sort(perm[held_out:])
        gallery, queries = _take(items, g_rows), _take(items, q_rows)
    else:
        if len(queries.ids) < 1:
            raise ValueError("the query set is empty")
        if queries.old.shape[1] != items.old.shape[1] or queries.new.shape[1] != items.new.shape[1]:
            raise ValueError(f"the queries are {queries.old.shape[1]}-d old / {queries.new.shape[1]}-d new but the "
                             f"gallery {items.old.shape[1]}-d / {items.new.shape[1]}-d")
        gallery = items
    return Split(gallery, queries, rng.permutation(len(gallery.ids)))


def pair_counts(grid: Sequence[int], pool: int) -> list[int]:
    """The grid's pair counts that the gallery can supply; a larger count is capped at the gallery's size (once)."""
    if any(int(n) < 2 for n in grid):
        raise ValueError(f"every pair count must be at least 2, got {list(grid)}")
    return sorted({min(int(n), pool) for n in grid})


class Scorer:
    """The held-out queries' outcomes under one relevance kind; the old/old and new/new baselines computed once."""

    def __init__(self, split: Split, *, relevance: str | None = None, k: int | None = None,
                 resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE, seed: int = 0,
                 qrels: Mapping[int, Mapping[int, float]] | None = None) -> None:
        """``qrels``: judgements keyed by query row and gallery row (relevance ``qrels``, the default when given)."""
        g, q = split.gallery, split.queries
        if relevance is None:
            relevance = ("qrels" if qrels is not None else
                         "labels" if g.labels is not None and q.labels is not None else "none")
        if relevance not in RELEVANCE_KINDS:
            raise ValueError(f"relevance must be one of {', '.join(RELEVANCE_KINDS)}, got {relevance!r}")
        if relevance == "labels" and (g.labels is None or q.labels is None):
            raise ValueError("relevance 'labels' needs labels on the gallery and the query items; use relevance none")
        if (relevance == "qrels") != (qrels is not None):
            raise ValueError("relevance 'qrels' needs the qrels, and the qrels go with relevance 'qrels'")
        self.relevance, self.k = relevance, int(k if k is not None else (1 if relevance == "labels" else 10))
        if not 1 <= self.k <= len(g.ids):
            raise ValueError(f"k must be between 1 and the gallery's {len(g.ids)} items, got {self.k}")
        self.metric = {"labels": "recall", "qrels": "ndcg", "none": "neighbour_recall"}[relevance] + f"@{self.k}"
        self.qrels = qrels or {}
        self.judged_rows = np.unique(np.fromiter((i for items in self.qrels.values() for i in items), np.int64))
        self.split, self.resamples, self.confidence, self.seed = split, resamples, confidence, seed
        self.gallery_ids = np.arange(len(g.ids), dtype=np.int64)
        self.reference = self._top(q.new, g.new)
        self.old_old = self._values(self._top(q.old, g.old))
        self.new_new = self._values(self.reference)
        same = q.new.shape[1] == g.old.shape[1]
        self.new_old = self._values(self._top(q.new, g.old)) if same else None

    def _top(self, queries: np.ndarray, gallery: np.ndarray) -> TopK:
        return stream_topk(queries, array_blocks(self.gallery_ids, gallery), k=self.k)

    def _values(self, top: TopK) -> np.ndarray:
        if self.relevance == "labels":
            out = label_outcomes(top, self.split.queries.labels, self.gallery_ids, self.split.gallery.labels, ks=(self.k,))
        elif self.relevance == "qrels":
            out = qrels_outcomes(top, range(len(top.ids)), self.qrels, self.judged_rows, ks=(self.k,))
        else:
            out = neighbour_recall(top, self.reference, ks=(self.k,))
        return out.values[self.metric]

    def baselines(self) -> dict[str, Any]:
        """The cells that do not depend on the map, with the query counts."""
        q = self.split.queries
        return {"old/old": _mean(self.old_old), "new/new": _mean(self.new_new),
                "new/old": None if self.new_old is None else _mean(self.new_old),
                "n_queries": len(q.ids), "n_no_relevant": int(np.isnan(self.old_old).sum()),
                "n_gallery": len(self.split.gallery.ids)}

    def score(self, adapted: np.ndarray) -> dict[str, Any]:
        """adapted/old and its shares of old/old and new/new, with paired intervals of the differences (points)."""
        return self._against_baselines(self._values(self._top(adapted, self.split.gallery.old)), "adapted/old")

    def score_transformed(self, gallery: np.ndarray) -> dict[str, Any]:
        """A corpus transform's reading: the new queries on the transformed old gallery (``new/transformed``) and its
        shares of old/old and new/new, with the same paired intervals as :meth:`score`."""
        return self._against_baselines(self._values(self._top(self.split.queries.new, gallery)), "new/transformed")

    def _against_baselines(self, values: np.ndarray, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {name: _mean(values)}
        for i, (cell, base) in enumerate((("old/old", self.old_old), ("new/new", self.new_new))):
            diff, lo, hi = paired_bootstrap(values, base, resamples=self.resamples, seed=(self.seed, i),
                                            confidence=self.confidence)
            b = _mean(base)
            out[f"share of {cell}"] = None if not b else _mean(values) / b
            out[f"vs {cell}"] = {"diff": diff, "lo": lo, "hi": hi}
        return out


def _mean(values: np.ndarray) -> float:
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def fit_on_pairs(split: Split, kind: str, pairs: int, *, normalise: str = "l2", options: Any = None,
                 fitted_on: dict[str, Any] | None = None, direction: str = NEW_TO_OLD) -> tuple[PosthocMap, float]:
    """The map fitted on the first ``pairs`` gallery items of the split's order, and the fit's wall seconds;
    ``direction`` :data:`OLD_TO_NEW` fits a corpus transform (old vectors in, new out; recorded in ``fitted_on``)."""
    g = split.gallery
    if not 2 <= pairs <= len(g.ids):
        raise ValueError(f"--pairs must be between 2 and the gallery's {len(g.ids)} items, got {pairs}")
    if direction not in DIRECTIONS:
        raise ValueError(f"the direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    rows = np.sort(split.fit_order[:pairs])
    start = time.perf_counter()
    into, out = (g.old, g.new) if direction == OLD_TO_NEW else (g.new, g.old)
    m = fit_map(kind, into[rows], out[rows], normalise=normalise, options=options,
                fitted_on={**(fitted_on or {}), "pairs": int(pairs),
                           **({"direction": OLD_TO_NEW} if direction == OLD_TO_NEW else {})})
    return m, time.perf_counter() - start


def apply_timed(m: PosthocMap, queries: np.ndarray) -> tuple[np.ndarray, float]:
    """The map's image of ``queries`` and the wall microseconds per query."""
    start = time.perf_counter()
    out = m.apply(queries)
    return out, (time.perf_counter() - start) * 1e6 / max(len(queries), 1)


def recovery_curve(split: Split, scorer: Scorer, kinds: Sequence[tuple[str, Any]], *, grid: Sequence[int] = DEFAULT_GRID,
                   normalise: str = "l2", progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Each ``(kind, options)`` fitted at each pair count of ``grid`` (capped by the gallery) and scored."""
    counts = pair_counts(grid, len(split.gallery.ids))
    kinds = [(kind, options_for(kind, opts) if not isinstance(opts, kind_of(kind).options) else opts)
             for kind, opts in kinds]
    rows = []
    for kind, opts in kinds:
        for pairs in counts:
            m, fit_s = fit_on_pairs(split, kind, pairs, normalise=normalise, options=opts)
            adapted, apply_us = apply_timed(m, split.queries.new)
            row = {"kind": kind, "options": asdict(opts), "pairs": pairs, "fit_seconds": fit_s,
                   "apply_us_per_query": apply_us, **scorer.score(adapted)}
            rows.append(row)
            if progress is not None:
                progress(_line(row))
    return {"relevance": scorer.relevance, "metric": scorer.metric, "k": scorer.k, "normalise": normalise,
            "pair_counts": counts, "baselines": scorer.baselines(), "rows": rows,
            "interval": f"paired percentile bootstrap over queries ({scorer.resamples} resamples, level "
                        f"{scorer.confidence:g}, seed {scorer.seed}); the gallery taken as fixed"}


def _pct(x: float | None) -> str:
    return "   n/a" if x is None or x != x else f"{100 * x:5.1f}%"


def _line(row: dict[str, Any]) -> str:
    v = row["vs new/new"]
    return (f"{row['kind']:<10} {row['pairs']:>6} pairs  adapted/old {row['adapted/old']:.4f}  "
            f"{_pct(row['share of old/old'])} of old/old  {_pct(row['share of new/new'])} of new/new "
            f"(diff {v['diff']:+.4f} [{v['lo']:+.4f}, {v['hi']:+.4f}])  fit {row['fit_seconds']:.3f} s  "
            f"apply {row['apply_us_per_query']:.2f} us/query")


def format_curve(curve: dict[str, Any]) -> str:
    """The curve as printed lines: the baselines, then one line per (kind, pair count)."""
    b = curve["baselines"]
    new_old = "n/a (widths differ)" if b["new/old"] is None else f"{b['new/old']:.4f}"
    head = [f"{curve['metric']} on {b['n_queries']} held-out queries ({b['n_no_relevant']} without a relevant item), "
            f"gallery {b['n_gallery']} items, relevance {curve['relevance']}",
            f"  old/old {b['old/old']:.4f}  new/new {b['new/new']:.4f}  new/old (no adapter) {new_old}",
            f"  intervals: {curve['interval']}"]
    return "\n".join(head + ["  " + _line(r) for r in curve["rows"]])


__all__ = ["DEFAULT_GRID", "DEFAULT_HELD_OUT", "RELEVANCE_KINDS", "Scorer", "Split", "apply_timed", "fit_on_pairs",
           "format_curve", "pair_counts", "recovery_curve", "split_items"]
