"""Ties in Recall@k: each cell's tie share and its Recall@k under three readings, from the cell's one neighbour pass.

A query is **tied** at ``k`` when a negative scores within ``RANK_TIE_TOLERANCE`` (``engine.core.vocab``: 1e-6 on
cosine similarities, whose scale is 1) of its best positive and fewer than ``k`` negatives score above the tie: the
queries whose hit depends on how ties are broken (a tie behind k clear negatives cannot change Recall@k); the cell's
**tie share** is their share of the queries with a positive. The pass that gives the cell's value counts, per query, the
negatives above the best positive by more than the tolerance (``neg_above``), the negatives within it
(``neg_tied``) and the positives within it below the best one, itself included (``pos_tied``;
:class:`engine.metrics.ranking.QueryStats`, every search backend and the sharded passes), so nothing here searches
again and nothing holds a similarity matrix. A query's hit at ``k`` under each reading
(``engine.core.vocab.RANK_TIE_READINGS``):

* **pessimistic**: every tied negative ranks before the positives, a hit when ``neg_above + neg_tied < k``;
* **expected**: the tied items in random order, the chance that one of the ``p`` tied positives takes one of the
  ``m = k - neg_above`` places left among the ``t`` tied negatives: ``1 - C(t, m) / C(t + p, m)`` (0 when
  ``m <= 0``, 1 when ``m > t``);
* **optimistic**: every tied negative ranks after them, a hit when ``neg_above < k``.

The cell's stored value is the engine's rule, pessimistic on *exact* ties (``rank_ties``), so it lies between the
pessimistic and the optimistic readings; without a tied query the three readings and the value agree query by query.

**Why pessimistic stays the default.** The papers' released code ranks with faiss (iamcl2r
``performance_metrics.calculate_rank``: ``IndexFlatIP`` top-1 on class templates; CoReS scores pair verification,
without a ranking), whose flat search keeps, among equal scores, the item it met first (the lowest gallery position
on the CPU; unspecified on a GPU). That order carries no relevance, so on tied queries the papers' numbers are one draw whose mean is the *expected*
reading, and a default that followed it would change when the same gallery is stored in another order. The
pessimistic reading is order-free and a lower bound on every tie-break faiss can make: a pass under it holds
whatever the order, and the two-way interval is defined for it (:mod:`engine.metrics.twoway`). The expected reading
is the one to hold against a paper's number; both are printed beside the value.

**Ties decide a verdict** when the cross-test's paired verdict under the pessimistic reading (both cells read that
way) differs from the one under the optimistic reading: both intervals over queries, from the cell's seed, judged by
the verdict's own rule (:func:`engine.metrics.decision.decide`). They are computed only where a query of either cell
is tied (elsewhere the readings agree).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engine.core.vocab import RANK_TIE_READINGS, RANK_TIE_TOLERANCE
from engine.metrics.cell_interval import PairedInterval, paired_intervals
from engine.metrics.decision import Rule, decide
from engine.metrics.ranking import QueryStats

JUDGED = RANK_TIE_READINGS[::2]  # pessimistic, optimistic: the readings whose verdicts say whether ties decide one
_LGAMMA = np.frompyfunc(math.lgamma, 1, 1)


@dataclass(frozen=True)
class TieOutcomes:
    """One cell's per-query Recall@``k`` under each reading (expected: the chance of a hit) and which queries are tied;
    NaN and not tied where a query has no positive."""

    k: int
    tied: np.ndarray  # (n,) bool: a negative ties the best positive within the first k places
    readings: dict[str, np.ndarray]  # reading -> (n,) float64

    def summary(self) -> dict[str, float | int]:
        """``tied`` (queries), ``share`` (of the queries with a positive, NaN without one) and each reading's mean."""
        valid = ~np.isnan(self.readings["pessimistic"])
        n = int(valid.sum())
        tied = int(self.tied.sum())
        means = {r: float(v[valid].mean()) if n else float("nan") for r, v in self.readings.items()}
        return {"tied": tied, "share": tied / n if n else float("nan"), **means}


def expected_hits(above: np.ndarray, tied: np.ndarray, positives: np.ndarray, k: int) -> np.ndarray:
    """The chance of a hit at ``k`` when ``above`` negatives rank first and ``tied`` negatives and ``positives``
    positives (at least one) follow in random order: ``1 - C(tied, m) / C(tied + positives, m)``, ``m = k - above``."""
    above, tied, positives = (np.asarray(a, np.int64) for a in (above, tied, positives))
    m = k - above
    out = np.where(m > tied, 1.0, 0.0)
    mixed = (m > 0) & (m <= tied) & (positives > 0)
    if mixed.any():
        t, p, mm = (a[mixed].astype(np.float64) for a in (tied, positives, m))
        lg = lambda x: _LGAMMA(x).astype(np.float64)  # noqa: E731
        miss = np.exp(lg(t + 1) - lg(t - mm + 1) + lg(t + p - mm + 1) - lg(t + p + 1))
        out[mixed] = 1.0 - miss
    return out


def tie_outcomes(stats: QueryStats, k: int) -> TieOutcomes | None:
    """The readings of Recall@``k`` from a cell's statistics; None when the pass did not count near ties."""
    if stats.neg_tied is None or stats.neg_above is None or stats.pos_tied is None:
        return None
    return _outcomes(stats.n_positives > 0, stats.neg_above, stats.neg_tied, stats.pos_tied, k)


def list_tie_outcomes(scores: np.ndarray, relevant: np.ndarray, tied_beyond: np.ndarray, valid: np.ndarray,
                      k: int) -> tuple[TieOutcomes | None, int]:
    """The readings of Recall@``k`` from each query's top list where the gallery was streamed (:mod:`engine.metrics.topk`:
    ``scores`` (n, depth) descending, ``relevant`` (n, depth) bool, ``tied_beyond`` the items past the list equal to its
    last score; ``valid``: the query has a relevant item), and how many queries' ties run past their list (items past
    it that tie within the first ``k`` places, whose relevance the list does not hold). Those make the readings unknown:
    ``(None, count)``; a deeper list reads them. A near (not exact) tie past the list's end is not seen."""
    scores = np.asarray(scores, np.float64)
    relevant = np.asarray(relevant, bool)
    valid = np.asarray(valid, bool)
    n = len(scores)
    listed = relevant.any(1)
    best = np.where(listed, scores[np.arange(n), relevant.argmax(1)], scores[:, -1])[:, None]  # unlisted: at most last
    top, bottom = best + RANK_TIE_TOLERANCE, best - RANK_TIE_TOLERANCE
    above = (~relevant & (scores > top)).sum(1)
    past = valid & (tied_beyond > 0) & (scores[:, -1] >= bottom[:, 0]) & (above < k)
    if past.any():
        return None, int(past.sum())
    tied = (~relevant & (scores >= bottom) & (scores <= top)).sum(1)
    positives = (relevant & (scores >= bottom)).sum(1)
    above = np.where(listed, above, k)  # no positive in the list nor tied at its end: a miss, whatever the order
    return _outcomes(valid, above, np.where(listed, tied, 0), np.maximum(positives, 1), k), 0


def _outcomes(valid: np.ndarray, above: np.ndarray, tied: np.ndarray, positives: np.ndarray, k: int) -> TieOutcomes:
    hits = {"pessimistic": (above + tied < k).astype(np.float64), "expected": expected_hits(above, tied, positives, k),
            "optimistic": (above < k).astype(np.float64)}
    return TieOutcomes(int(k), valid & (tied > 0) & (above < k),
                       {r: np.where(valid, hits[r], np.nan) for r in RANK_TIE_READINGS})


def reading_intervals(base: TieOutcomes, other: TieOutcomes, a: np.ndarray, b: np.ndarray, *,
                      seed: int | tuple[int, ...], resamples: int, confidence: float, bound_unchanged: bool = True,
                      groups: np.ndarray | None = None) -> dict[str, PairedInterval] | None:
    """``other - base`` under the pessimistic and the optimistic reading (``other``'s queries ``a`` paired with
    ``base``'s ``b``), each over queries from one seed; None when no paired query of either cell is tied."""
    if not (base.tied[b].any() or other.tied[a].any()):
        return None
    return {r: paired_intervals(base.readings[r][b], [other.readings[r][a]], seed=seed, resamples=resamples,
                                confidence=confidence, k=base.k, bound_unchanged=[bound_unchanged], groups=groups)[0]
            for r in JUDGED}


def reading_verdicts(intervals: Mapping[str, Mapping[str, float | str | None]] | None, rule: Rule = Rule()
                     ) -> dict[str, str] | None:
    """Each judged reading's verdict (``pass`` / ``fail`` / ``unresolved``) under ``rule``, from its ``diff``, ``lo``,
    ``hi`` and ``interval``; None without intervals or when one is undefined (NaN)."""
    if not intervals or any(intervals[r]["lo"] is None or math.isnan(intervals[r]["lo"]) for r in JUDGED):
        return None
    return {r: decide(intervals[r]["diff"], intervals[r]["lo"], intervals[r]["hi"], rule,
                      unchanged=intervals[r].get("interval") == "unchanged")[0] for r in JUDGED}


def ties_decide(verdicts: Mapping[str, str] | None) -> bool:
    """Whether the verdict turns on how ties are broken: the pessimistic and the optimistic readings' verdicts differ."""
    return bool(verdicts) and verdicts["pessimistic"] != verdicts["optimistic"]


def pair_ties(cells: Mapping[str, TieOutcomes | None], *, base: str, other: str, rule: Rule, seed: int | tuple[int, ...],
              resamples: int, confidence: float, bound_unchanged: bool = True, groups: np.ndarray | None = None
              ) -> dict | None:
    """JSON-ready ties of a two-model check (queries paired by position): each cell's tie share and readings
    (``cells``, keyed as given), then ``other - base`` under the pessimistic and the optimistic reading judged by
    ``rule`` (``intervals``, ``verdicts``: None when no query is tied) and whether ties decide it (``decide``). None when
    a cell has no tie counts."""
    if any(c is None for c in cells.values()):
        return None
    index = np.arange(len(cells[base].tied))
    got = reading_intervals(cells[base], cells[other], index, index, seed=seed, resamples=resamples,
                            confidence=confidence, bound_unchanged=bound_unchanged, groups=groups)
    intervals = {r: {"diff": iv.diff, "lo": iv.lo, "hi": iv.hi, "interval": iv.interval} for r, iv in (got or {}).items()}
    verdicts = reading_verdicts(intervals, rule)
    return {"tolerance": RANK_TIE_TOLERANCE, "readings": list(RANK_TIE_READINGS), "k": cells[base].k,
            "cells": {name: c.summary() for name, c in cells.items()}, "intervals": intervals or None,
            "verdicts": verdicts, "decide": ties_decide(verdicts)}


__all__ = ["JUDGED", "RANK_TIE_READINGS", "RANK_TIE_TOLERANCE", "TieOutcomes", "expected_hits", "list_tie_outcomes", "pair_ties",
           "reading_intervals", "reading_verdicts", "tie_outcomes", "ties_decide"]
