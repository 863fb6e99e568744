"""Per-query retrieval outcomes under the three ways to say what is relevant, all from one top-k list per cell.

``relevance`` (``engine.core.vocab.RELEVANCE``):

* ``labels``: an item is relevant when it shares the query's class label (the engine's convention so far);
  Recall@k is the hit rate (a relevant item in the first k; trec_eval's ``success_k``), the others as for qrels
  with gain 1 (R: the class's items in the gallery).
* ``qrels``: a mapping query id -> {item id: grade} (BEIR / MS MARCO judgements; grade > 0 is relevant, binary
  judgements are grade 1). Per query: Recall@k = relevant items in the first k / R, the relevant items in the
  gallery; P@k = relevant items in the first k / k; AP@k = sum of precision at each relevant rank <= k / R (mAP@k,
  trec_eval's ``map_cut_k``; ``map_capped@k`` divides by min(R, k) instead); MRR@k = 1 / the rank of the first
  relevant item within k (0 when none is); nDCG@k with linear gains (DCG = sum grade_i / log2(i + 1), over the ideal
  DCG of the query's judged items in the gallery). On the list as ranked, these equal pytrec_eval's and ranx's
  (``tests/test_ir_equal.py``).
* ``none`` (label-free): the reference of query ``i`` is its top-k under the new model on the new gallery; a cell's
  outcome is the neighbour recall |top-k of the cell & reference| / k, items matched by id (old and new galleries
  hold the same items, joined by id).

Every outcome is per query, NaN where undefined, so the paired intervals of :mod:`engine.metrics.cell_interval`
apply unchanged (over queries). A query with no relevant item in the gallery is undefined, counted and reported
(:attr:`Outcomes.n_no_relevant`), never dropped silently.

Ties (``rank_ties``) follow the engine's pessimistic rule by default: inside the list, items with equal scores are
ranked non-relevant first; at the cut, the ``tied_beyond`` items outside the list that equal its last score
(:class:`engine.metrics.topk.TopK`) are counted as non-relevant and ranked before the relevant items of that score.
The rule needs ``k`` at least the largest cut asked for; the list's depth bounds the metrics (Recall@k for k <= depth).
``rank_ties="trec"`` is trec_eval's order instead: equal scores by item id descending (string compare; ``names``
gives each listed item's id), the list as it is, so the numbers are trec_eval's on the written run file
(:mod:`engine.results.trec`; the list itself was cut by gallery position among items tied at its last score).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.core.kinds import LIST_RANK_TIES, TREC_RANK_TIES, check_rank_ties
from engine.core.vocab import RELEVANCE
from engine.metrics.topk import TopK

Qrels = Mapping[object, Mapping[object, float]]


@dataclass(frozen=True)
class Outcomes:
    """Per-query outcomes of one cell: ``values[metric]`` (n_q,) float64 (NaN = undefined), queries without relevance counted."""

    values: dict[str, np.ndarray]
    n_queries: int
    n_no_relevant: int
    relevance: str
    no_relevant: np.ndarray = field(repr=False)  # (n_q,) bool

    def means(self) -> dict[str, float]:
        """Each metric's mean over the queries it is defined for (NaN when none is)."""
        return {m: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for m, v in self.values.items()}




def ranked_gains(top: TopK, gains: np.ndarray, *, rank_ties: str = "pessimistic",
                 names: np.ndarray | None = None) -> np.ndarray:
    """(n_q, k) gains in rank order: pessimistic (equal scores non-relevant first, ``tied_beyond`` zero gains at the
    cut) or trec (equal scores by ``names``, the listed items' ids, descending)."""
    gains = np.asarray(gains, np.float64)
    if gains.shape != top.ids.shape:
        raise ValueError(f"gains must have the top-k list's shape {top.ids.shape}, got {gains.shape}")
    check_rank_ties(rank_ties, LIST_RANK_TIES)
    if rank_ties == TREC_RANK_TIES:
        if names is None or np.shape(names) != top.ids.shape:
            raise ValueError("the trec tie order needs each listed item's id (names, the list's shape)")
        text = np.asarray(names).astype(str)
        _, code = np.unique(text, return_inverse=True)  # code order = string order (code points, as strcmp on UTF-8)
        order = np.lexsort((-code.reshape(text.shape), -top.scores), axis=1)
        return np.take_along_axis(gains, order, 1)
    order = np.lexsort((gains, -top.scores), axis=1)  # stable: score desc, then smaller gain first
    out = np.take_along_axis(gains, order, 1)
    scores = np.take_along_axis(top.scores, order, 1)
    for r in np.flatnonzero(top.tied_beyond > 0):
        last = scores[r, -1]
        tied = np.flatnonzero(scores[r] == last)
        group = np.concatenate([np.zeros(int(min(top.tied_beyond[r], len(tied)))), np.sort(out[r, tied])])
        out[r, tied] = group[: len(tied)]  # the outside ties take the first places of the group; the list is cut at k
    return out


def _dcg(gains: np.ndarray) -> np.ndarray:
    return (gains / np.log2(np.arange(2, gains.shape[1] + 2))).sum(1)


def graded_outcomes(top: TopK, gains: np.ndarray, n_relevant: np.ndarray, ideal: np.ndarray, *, ks: Sequence[int],
                    relevance: str, rank_ties: str = "pessimistic", names: np.ndarray | None = None) -> Outcomes:
    """Recall@k, P@k, AP@k, MRR@k and nDCG@k of each query from its list's ``gains`` (n_q, k), its relevant count and
    ideal gains, ranked under ``rank_ties`` (:func:`ranked_gains`).

    ``ideal`` (n_q, k): the query's largest gains in the gallery, descending, zero-padded (for the ideal DCG).
    """
    ks = _check_ks(ks, top.k)
    ranked = ranked_gains(top, gains, rank_ties=rank_ties, names=names)
    hit = ranked > 0
    n_relevant = np.asarray(n_relevant, np.int64)
    none = n_relevant == 0
    values: dict[str, np.ndarray] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for k in ks:
            found = hit[:, :k].sum(1)
            values[f"recall@{k}"] = np.where(none, np.nan, found / np.maximum(n_relevant, 1))
            if relevance == "labels":  # a class has many members: the hit rate is the engine's Recall@k
                values[f"recall@{k}"] = np.where(none, np.nan, (found > 0).astype(np.float64))
            precision = np.cumsum(hit[:, :k], 1) / np.arange(1, k + 1)
            summed = (precision * hit[:, :k]).sum(1)
            values[f"map@{k}"] = np.where(none, np.nan, summed / np.maximum(n_relevant, 1))
            values[f"map_capped@{k}"] = np.where(none, np.nan, summed / np.minimum(np.maximum(n_relevant, 1), k))
            values[f"precision@{k}"] = np.where(none, np.nan, found / k)
            first = np.where(hit[:, :k].any(1), hit[:, :k].argmax(1) + 1, 0)
            values[f"mrr@{k}"] = np.where(none, np.nan, np.where(first > 0, 1.0 / np.maximum(first, 1), 0.0))
            ideal_dcg = _dcg(np.asarray(ideal, np.float64)[:, :k])
            values[f"ndcg@{k}"] = np.where(none | (ideal_dcg <= 0), np.nan, _dcg(ranked[:, :k]) / ideal_dcg)
    return Outcomes(values, len(ranked), int(none.sum()), relevance, none)


def label_outcomes(top: TopK, query_labels: np.ndarray, gallery_ids: np.ndarray, gallery_labels: np.ndarray, *,
                   ks: Sequence[int] = (1,), rank_ties: str = "pessimistic", names: np.ndarray | None = None) -> Outcomes:
    """``labels`` relevance: an item is relevant when its label is the query's (``gallery_ids`` -> ``gallery_labels``)."""
    query_labels = np.asarray(query_labels)
    if len(query_labels) != len(top.ids):
        raise ValueError(f"{len(query_labels)} query labels for {len(top.ids)} queries")
    item_labels = _lookup(np.asarray(gallery_ids), np.asarray(gallery_labels), top.ids)
    gains = (item_labels == query_labels[:, None]).astype(np.float64)
    classes, counts = np.unique(np.asarray(gallery_labels), return_counts=True)
    at = np.clip(np.searchsorted(classes, query_labels), 0, len(classes) - 1)
    n_rel = np.where(classes[at] == query_labels, counts[at], 0)
    ideal = (np.arange(top.k)[None, :] < n_rel[:, None]).astype(np.float64)
    return graded_outcomes(top, gains, n_rel, ideal, ks=ks, relevance="labels", rank_ties=rank_ties, names=names)


def qrels_outcomes(top: TopK, query_ids: Sequence, qrels: Qrels, gallery_ids: np.ndarray, *,
                   ks: Sequence[int] = (10,), rank_ties: str = "pessimistic", names: np.ndarray | None = None) -> Outcomes:
    """``qrels`` relevance: graded or binary judgements ``qrels[query id][item id] = grade`` (grade > 0 relevant).

    Only judged items present in the gallery count (a judgement on an item the gallery lacks cannot be retrieved).
    """
    query_ids = list(query_ids)
    if len(query_ids) != len(top.ids):
        raise ValueError(f"{len(query_ids)} query ids for {len(top.ids)} queries")
    in_gallery = set(np.asarray(gallery_ids).tolist())
    gains = np.zeros(top.ids.shape)
    n_rel = np.zeros(len(query_ids), np.int64)
    ideal = np.zeros(top.ids.shape)
    for i, qid in enumerate(query_ids):
        judged = {item: float(g) for item, g in (qrels.get(qid) or {}).items() if float(g) > 0 and item in in_gallery}
        if not judged:
            continue
        n_rel[i] = len(judged)
        best = sorted(judged.values(), reverse=True)[: top.k]
        ideal[i, : len(best)] = best
        gains[i] = [judged.get(item, 0.0) for item in top.ids[i].tolist()]
    return graded_outcomes(top, gains, n_rel, ideal, ks=ks, relevance="qrels", rank_ties=rank_ties, names=names)


def neighbour_recall(top: TopK, reference: TopK, *, ks: Sequence[int] = (10,)) -> Outcomes:
    """``none`` relevance: |first k of ``top`` & first k of ``reference``| / k per query, items matched by id.

    Ties in either list are cut by stream position (:mod:`engine.metrics.topk`); the reference always has k items.
    """
    if top.ids.shape[0] != reference.ids.shape[0]:
        raise ValueError(f"the cell has {top.ids.shape[0]} queries but the reference {reference.ids.shape[0]}")
    ks = _check_ks(ks, min(top.k, reference.k))
    values = {}
    for k in ks:
        a, b = np.sort(top.ids[:, :k], 1), np.sort(reference.ids[:, :k], 1)
        both = np.concatenate([a, b], 1)
        both.sort(1)
        shared = (both[:, 1:] == both[:, :-1]).sum(1)  # ids are distinct within a list: a repeat is one shared item
        values[f"neighbour_recall@{k}"] = shared / k
    n = len(top.ids)
    return Outcomes(values, n, 0, "none", np.zeros(n, bool))


def _lookup(keys: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``values`` of the ids ``wanted`` (any shape), ValueError naming an id the gallery lacks."""
    order = np.argsort(keys, kind="stable")
    at = np.clip(np.searchsorted(keys[order], wanted), 0, len(keys) - 1)
    found = keys[order][at] == wanted
    if not found.all():
        raise ValueError(f"gallery id {wanted[~found].flat[0]} of a top-k list has no label")
    return values[order][at]


def _check_ks(ks: Sequence[int], depth: int) -> tuple[int, ...]:
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 or k > depth for k in ks):
        raise ValueError(f"every k must be in [1, {depth}] (the top-k list's depth), got {ks}")
    return ks


def outcomes(kind: str, top: TopK, **inputs) -> Outcomes:
    """Dispatch on the relevance kind: ``labels`` (query_labels, gallery_ids, gallery_labels), ``qrels`` (query_ids,
    qrels, gallery_ids), ``none`` (reference)."""
    if kind not in RELEVANCE:
        raise ValueError(f"unknown relevance {kind!r}; use one of {', '.join(RELEVANCE)}")
    if kind == "labels":
        return label_outcomes(top, **inputs)
    if kind == "qrels":
        return qrels_outcomes(top, **inputs)
    return neighbour_recall(top, **inputs)


__all__ = ["Outcomes", "Qrels", "graded_outcomes", "label_outcomes", "neighbour_recall", "outcomes", "qrels_outcomes",
           "ranked_gains"]
