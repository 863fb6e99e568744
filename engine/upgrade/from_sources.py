"""The upgrade check on embeddings where a team keeps them: ``check-upgrade --old-gallery SRC ...`` and the page's job.

Reads the old gallery (and, optionally, the new one) in blocks through :func:`engine.sources.open_source`, never whole:
each gallery item gets a row number once (its position in the old gallery's reading order; the new gallery's items
are mapped to the same numbers by id), and every top-k list, label, qrels judgement and neighbour match uses those
numbers, so string ids and two galleries in different orders cost nothing more. The queries (small) are joined by id
(:func:`engine.sources.join_by_id`). One streamed pass (:func:`engine.metrics.topk.stream_topk`) ranks the old and the
new queries against the old gallery (old/old, new/old); a second ranks the new queries against the new gallery when it
is given (new/new). Per-query outcomes come from :mod:`engine.metrics.relevance` under the chosen relevance:

* ``labels``: the same class label (labels from the old gallery and the queries);
* ``qrels``: judgements query id -> item id -> grade (:func:`engine.sources.qrels.read_qrels`);
* ``none``: each query's new/new top-k is the reference; neighbour recall@k of new/old and old/old against it
  (needs the new gallery; new/new is the reference itself, so "better on its own" is not judged).

The verdict is :func:`engine.upgrade.verdict.compare` under the same :class:`~engine.upgrade.rule.Rule`, with the
interval of :func:`engine.metrics.cell_interval.paired_intervals` seeded as check-upgrade's cell (1, 0). For Recall@k
with labels it is the **two-way** interval (queries and gallery items): the search keeps each query's top-D lists
(D = 16 + 4k, as in memory) and every replicate walks them with the gallery items' resampled counts and the labels'
per-class counts (:func:`engine.metrics.twoway.ranked_lists`), so no vector is needed again and memory holds
n_q x D ids; a query whose list runs out undecided (fewer than k negative copies among D items, P < 1e-8) counts as
a miss. The other metrics (mAP@k, nDCG@k, neighbour recall@k: graded or list-overlap outcomes, which the walk does
not recompute) resample the queries, with a note. ``query_groups`` (a column of the old query source) resamples
whole groups of related queries on every interval; ``interval="sequential"`` gives the anytime-valid one. On the same
vectors in the same order, with labels and Recall@1, the numbers equal ``check-upgrade --features`` (two-way to a
float tolerance, ``--interval queries`` to the last digit; tests/test_upgrade_sources.py).
When the new gallery is given and the pair is not compatible, backfill curves follow, one more streamed pass each
gallery (:mod:`engine.upgrade.backfill_sources`): every point merges the new queries' top-D lists on the two galleries
by score, under the same relevance (label-free, the reference is new/new, so every curve ends at 1 by definition).
The check keeps its lists and its relevance (:class:`CheckLists`, not in the JSON) for the migration plan's adapters,
rank merge and threshold (:mod:`engine.upgrade.source_remedies`), which read the galleries again.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np

from engine.core.kinds import (DEFAULT_RANK_TIES, LIST_RANK_TIES, MAX_K, STRICT, TREC_RANK_TIES, check_rank_ties,
                               metric_parts)
from engine.core.cluster import ClusterSpec
from engine.core.contract import sources_check_payload
from engine.core.fan_out import FanOut
from engine.core.conventions import relevance_phrase
from engine.core.vocab import RELEVANCE, RELEVANCE_K, decision_metric
from engine.evaluate.dask_search import dashboard_link, dask_client, sharded_topk
from engine.metrics.cell_interval import cell_seed, paired_intervals
from engine.metrics.list_merge import rows_of
from engine.metrics.paired import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, DEFAULT_SEED
from engine.metrics.relevance import Outcomes, label_outcomes, neighbour_recall, qrels_outcomes
from engine.metrics.ties import list_tie_outcomes, pair_ties
from engine.metrics.topk import TopK, stream_topk
from engine.metrics.twoway import TopLists, ranked_lists, two_way_depth
from engine.sources import Joined, Source, SourceError, join_by_id, open_source
from engine.sources.text import first_line
from engine.sources.base import check_unique_ids, join_ids
from engine.sources.join import IdSlots, check_same_ids
from engine.sources.qrels import QrelsTable, read_qrels
from engine.upgrade.backfill_sources import SourceBackfill, default_depth, source_backfill
from engine.upgrade.rule import DEFAULT_INTERVAL, Rule
from engine.upgrade.verdict import (BETTER, SEQUENTIAL_NOTE, PairedVerdict, UpgradeReport, best_ordering, check_settings,
                                    compare, query_group_index, unchanged_note)
from engine.upgrade.words import NOT_JUDGED

DEFAULT_K = RELEVANCE_K
DEFAULT_BLOCK_ROWS = 65536
_PRINT_ROWS = 4096  # rows per chunk of the per-item fingerprint

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class SourceSpecs:
    """The source texts of one check (``engine/sources/text.py``); the new gallery and the qrels are optional."""

    old_gallery: str
    old_queries: str
    new_queries: str
    new_gallery: str | None = None
    qrels: str | None = None


@dataclass(frozen=True)
class SourceRelevance:
    """What counts as relevant in one check, and the per-query outcomes of top-k lists whose ids are gallery rows."""

    kind: str  # labels, qrels or none (engine.core.vocab.RELEVANCE)
    gallery_rows: np.ndarray  # 0 .. n_gallery - 1
    query_labels: np.ndarray | None = None  # labels: per query row
    gallery_labels: np.ndarray | None = None  # labels: per gallery row
    judged: dict[int, dict[int, float]] = field(default_factory=dict)  # qrels: query row -> gallery row -> grade
    judged_rows: np.ndarray | None = None  # qrels: the gallery rows some query judges
    reference: TopK | None = None  # none: each query's new/new top-k
    rank_ties: str = "pessimistic"  # equal scores in a list: non-relevant first, or trec_eval's order (item id desc.)
    names: np.ndarray | None = None  # trec: each gallery row's id as text

    def outcomes(self, top: TopK, rows: np.ndarray | None = None, *, ks: Sequence[int]) -> Outcomes:
        """Outcomes of the lists ``top`` of the query rows ``rows`` (None: every query, in order)."""
        rows = np.arange(len(top.ids)) if rows is None else np.asarray(rows)
        ties = {"rank_ties": self.rank_ties, "names": None if self.names is None else self.names[top.ids]}
        if self.kind == "labels":
            return label_outcomes(top, self.query_labels[rows], self.gallery_rows, self.gallery_labels, ks=ks, **ties)
        if self.kind == "qrels":
            return qrels_outcomes(top, rows.tolist(), self.judged, self.judged_rows, ks=ks, **ties)
        return neighbour_recall(top, rows_of(self.reference, rows), ks=ks)

    def relevant(self, ids: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Whether each gallery row of ``ids`` (n, k) is relevant to its query (the query rows ``rows``; None: 0 .. n - 1):
        the same label, or a qrels grade above 0. Label-free relevance marks nothing relevant: ``ValueError``."""
        ids = np.asarray(ids)
        rows = np.arange(len(ids)) if rows is None else np.asarray(rows)
        if self.kind == "labels":
            return self.gallery_labels[ids] == self.query_labels[rows][:, None]
        if self.kind == "qrels":
            return np.array([[self.judged.get(q, {}).get(i, 0.0) > 0 for i in items] for q, items in
                             zip(rows.tolist(), ids.tolist())], bool).reshape(ids.shape)
        raise ValueError("label-free relevance (none) marks no item relevant")


@dataclass(frozen=True)
class CheckLists:
    """What a check computed that its remedies reuse (:mod:`engine.upgrade.source_remedies`); never in the JSON."""

    queries: Joined  # ids, old and new vectors, labels of the queries
    gallery_ids: np.ndarray  # the old gallery's ids in reading order: row i is gallery row i
    slots: IdSlots  # new-gallery ids -> gallery rows
    relevance: SourceRelevance
    key: str  # the metric's outcome key, e.g. recall@1
    at: int  # the metric's K
    old_old: TopK
    new_new: TopK | None  # None: no new gallery
    oo: np.ndarray  # per-query old/old outcome under the metric
    block_rows: int
    backend: str
    backfill: SourceBackfill | None = None  # when the backfill was computed
    interval: str = "queries"  # what the check's interval resampled (two-way, queries, sequential)
    groups: np.ndarray | None = None  # each query's group index (None: queries on their own)
    ranked: TopLists | None = None  # two-way: old/old's pessimistically ordered top-D lists
    ranked_depth: int = 0  # two-way: D of the lists the gallery resample walks
    new_old: TopK | None = None  # the cross-test's lists (new queries on the old gallery)


@dataclass(frozen=True)
class SourcesCheck:
    """The report and what it was computed under: relevance, list depth, convention line, masked sources, means."""

    report: UpgradeReport
    relevance: str
    k: int
    convention: str
    sources: dict[str, str]
    means: dict[str, dict[str, float]] = field(default_factory=dict)  # cell -> metric -> mean over defined queries
    backfill_depth: int | None = None  # D of the backfill's top-D lists (None: no backfill computed)
    backfill_decided: dict[str, list[float]] = field(default_factory=dict)  # ordering -> share of queries decided per point
    lists: CheckLists | None = field(default=None, repr=False, compare=False)  # for the remedies, not in the JSON
    rank_ties: str = DEFAULT_RANK_TIES  # how equal scores in a list ranked (engine.core.kinds.LIST_RANK_TIES)

    def to_json(self) -> dict:
        """The report's JSON with the relevance, the depth, the convention line, the sources and every cell's means."""
        from storage import json_ready

        return {**self.report.to_json(), "relevance": self.relevance, "k": self.k, "rank_ties": self.rank_ties,
                "convention": self.convention,
                "sources": dict(self.sources), "means": json_ready(self.means), "backfill_depth": self.backfill_depth,
                "backfill_decided": json_ready(self.backfill_decided)}


@dataclass(frozen=True)
class GalleryScan:
    """One read of a gallery: ids in reading order, labels (or None), a 64-bit fingerprint of each item's vector."""

    ids: np.ndarray
    labels: np.ndarray | None
    prints: np.ndarray
    dim: int


def default_relevance(qrels: str | None) -> str:
    """``qrels`` when a qrels source is given, else ``labels``."""
    return "qrels" if qrels else "labels"


def default_metric(relevance: str, k: int) -> str:
    """The decision's metric on streamed top-k lists (:func:`engine.core.vocab.decision_metric`): mAP@k with labels,
    nDCG@k with qrels (BEIR's), neighbour recall@k label-free."""
    return decision_metric(relevance, k, streamed=True)


SOURCE_KINDS = ("recall", "precision", "map", "map_capped", "mrr", "ndcg")  # on top-k lists, labels or qrels


def parse_source_metric(metric: str, relevance: str, k: int | None = None) -> tuple[str, int]:
    """``(kind, K)`` of ``recall@K``, ``precision@K``, ``map@K``, ``map_capped@K``, ``mrr@K``, ``ndcg@K`` (labels,
    qrels) or ``neighbour_recall@K`` (none), in any spelling :func:`engine.core.kinds.metric_parts` reads
    (``ndcg_cut_10``, ``P_10``, ``recip_rank``: MRR over the lists' depth ``k``)."""
    parts = metric_parts(metric)
    if parts is not None and parts == ("mrr", None) and k is not None:
        parts = ("mrr", int(k))
    label_free = relevance == "none"
    allowed = "neighbour_recall@K" if label_free else "recall@K, precision@K, map@K, map_capped@K, mrr@K or ndcg@K"
    if (parts is None or parts[1] is None or parts[0] not in (*SOURCE_KINDS, "neighbour_recall")
            or (parts[0] == "neighbour_recall") != label_free):
        raise ValueError(f"metric {metric!r} does not go with relevance {relevance}; use {allowed} (1 <= K <= "
                         f"{MAX_K:,}; the lists are top-k, so a full-ranking mAP is not available)")
    return parts[0], parts[1]


def trec_texts(check: SourcesCheck, adapted: Mapping[str, TopK] | None = None) -> tuple[dict[str, str], str, int]:
    """The check's TREC files as text (:mod:`engine.results.trec`): a run per cell (old->old, new->old, new->new when
    the new gallery was given, and adapted->old per ``adapted`` list: adapter name -> its adapted queries' lists on the
    old gallery), keyed by file name; the qrels it judged with (labels: every gallery item of the query's label;
    label-free: the new/new top-k, so neighbour recall@k is a tool's P@k); how many lists hold tied scores."""
    import re

    from engine.results.trec import CELL_FILES, RUN_SUFFIX, qrels_text, run_text, tied_queries

    lists = check.lists
    if lists is None:
        raise ValueError("this check kept no lists to write")
    qids, gids = lists.queries.ids, lists.gallery_ids
    cells = {f"{CELL_FILES[c]}{RUN_SUFFIX}": (c, top) for c, top in
             (("old->old", lists.old_old), ("new->old", lists.new_old), ("new->new", lists.new_new)) if top is not None}
    for name, top in (adapted or {}).items():
        plain = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.")
        cells[f"adapted_{plain}_old{RUN_SUFFIX}"] = (f"adapted({plain})->old", top)
    runs = {file: run_text(qids, gids[top.ids], top.scores, tag) for file, (tag, top) in cells.items()}
    judge, rows = lists.relevance, np.arange(len(qids))
    if judge.kind == "qrels":
        judged = {qids[q]: {gids[i]: g for i, g in items.items()} for q, items in judge.judged.items()}
    elif judge.kind == "labels":
        by_label: dict = {}
        for row, label in enumerate(judge.gallery_labels.tolist()):
            by_label.setdefault(label, []).append(gids[row])
        judged = {qids[q]: dict.fromkeys(by_label.get(label, ()), 1.0)
                  for q, label in zip(rows.tolist(), judge.query_labels.tolist())}
    else:
        judged = {qids[q]: dict.fromkeys(gids[ids].tolist(), 1.0) for q, ids in zip(rows.tolist(), judge.reference.ids)}
    tied = sum(tied_queries(top.scores) for _, top in cells.values())
    return runs, qrels_text(judged), tied


def trec_zip(check: SourcesCheck, adapted: Mapping[str, TopK] | None = None) -> tuple[dict, bytes | None]:
    """The files of :func:`trec_texts` (the runs and ``qrels.txt``, as ``check-upgrade --export trec`` writes them) in
    one zip (:func:`engine.results.trec.zip_files`; every text in memory at once, as the export), and what a reader is
    told of them: ``{"files": names, "note": the tied-scores note or None}``; or ``{"error": why}`` and no zip when
    they cannot be written (an id a TREC file cannot hold), which leaves the check as it is."""
    from engine.results.trec import QRELS_NAME, tied_note, zip_files

    try:
        runs, qrels, tied = trec_texts(check, adapted)
        files = {**runs, QRELS_NAME: qrels}
        return {"files": list(files), "note": tied_note(tied, check.rank_ties)}, zip_files(files)
    except ValueError as exc:
        return {"error": first_line(exc)}, None


def _fingerprints(vectors: np.ndarray, coeffs: np.ndarray) -> np.ndarray:
    """A 64-bit linear hash of each row's float32 bits (equal rows, equal prints; unequal rows collide ~2^-64)."""
    bits = np.ascontiguousarray(vectors, np.float32).view(np.uint32)
    out = np.empty(len(bits), np.uint64)
    for lo in range(0, len(bits), _PRINT_ROWS):
        out[lo: lo + _PRINT_ROWS] = (bits[lo: lo + _PRINT_ROWS].astype(np.uint64) * coeffs).sum(1, dtype=np.uint64)
    return out


def _coeffs(dim: int) -> np.ndarray:
    return np.random.default_rng(27).integers(1, 2 ** 63, dim, dtype=np.uint64) | np.uint64(1)


def scan_gallery(source: Source, *, block_rows: int = DEFAULT_BLOCK_ROWS) -> GalleryScan:
    """Ids, labels and fingerprints of a gallery, read block by block (vectors dropped after each block)."""
    ids, labels, prints = [], [], []
    coeffs = None
    for block in source.blocks(block_rows):
        if coeffs is None:
            coeffs = _coeffs(block.vectors.shape[1])
        ids.append(block.ids)
        prints.append(_fingerprints(block.vectors, coeffs))
        if block.labels is not None:
            labels.append(block.labels)
    if not ids:
        raise SourceError(f"{source.description} holds no item")
    all_ids = join_ids(ids, where=source.description)
    check_unique_ids(all_ids, where=source.description)  # a repeated id would be two gallery items of one
    all_labels = None
    if labels:
        if sum(len(x) for x in labels) != sum(len(x) for x in ids):
            raise SourceError(f"{source.description}: some items have labels and some do not")
        all_labels = np.concatenate([x.astype(str) if x.dtype.kind == "U" else x for x in labels])
    return GalleryScan(all_ids, all_labels, np.concatenate(prints), int(source.dim or 0))


def _writable(vectors: np.ndarray) -> np.ndarray:
    """A block torch can wrap without a warning (a reader may hand out a read-only view of its file)."""
    return vectors if vectors.flags.writeable else vectors.copy()


def in_order(source: Source, ids: np.ndarray, block_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(row numbers, vectors) blocks of the old gallery: row number = reading position, checked against the scan."""
    lo = 0
    for block in source.blocks(block_rows):
        n = len(block)
        if not np.array_equal(block.ids, ids[lo: lo + n]):
            raise SourceError(f"{source.description} changed while it was read (its items came in another order)")
        yield np.arange(lo, lo + n, dtype=np.int64), _writable(block.vectors)
        lo += n
    if lo != len(ids):
        raise SourceError(f"{source.description} changed while it was read: {len(ids)} items, then {lo}")


def by_id(source: Source, slots: IdSlots, block_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(row numbers, vectors) blocks of the new gallery, each item numbered as the same id in the old gallery."""
    for block in source.blocks(block_rows):
        yield slots(block.ids, source), _writable(block.vectors)


def _rows_of(wanted: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row numbers of the text ids ``wanted`` among ``ids`` (any kind, compared as text), and which were found."""
    text = ids.astype(str)
    order = np.argsort(text, kind="stable")
    at = np.clip(np.searchsorted(text[order], wanted), 0, max(len(text) - 1, 0))
    found = text[order][at] == wanted if len(text) else np.zeros(len(wanted), bool)
    return order[at], found


def qrels_rows(table: QrelsTable, query_ids: np.ndarray, gallery_ids: np.ndarray) -> dict[int, dict[int, float]]:
    """Judgements keyed by query row and gallery row; one line naming how many query / item ids are unknown."""
    q_rows, q_found = _rows_of(table.query, query_ids)
    i_rows, i_found = _rows_of(table.item, gallery_ids)
    if not (q_found.all() and i_found.all()):
        parts = []
        for side, ids, found, n in (("query", table.query, q_found, len(query_ids)),
                                    ("item", table.item, i_found, len(gallery_ids))):
            unknown = np.unique(ids[~found])
            if len(unknown):
                shown = ", ".join(unknown[:3].tolist()) + (", ..." if len(unknown) > 3 else "")
                parts.append(f"{len(unknown)} {side} ids not among the {n:,} {side if side == 'query' else 'gallery'} "
                             f"{'ids' if side == 'query' else 'items'} (e.g. {shown})")
        raise SourceError(f"{table.description} names unknown ids: " + "; ".join(parts))
    pairs = q_rows.astype(np.int64) * max(len(gallery_ids), 1) + i_rows
    if len(np.unique(pairs)) != len(pairs):
        raise SourceError(f"{table.description} judges {len(pairs) - len(np.unique(pairs))} (query, item) pairs twice")
    out: dict[int, dict[int, float]] = {}
    for q, i, g in zip(q_rows.tolist(), i_rows.tolist(), table.grade.tolist()):
        out.setdefault(q, {})[i] = g
    return out


def cut_lists(top: TopK, k: int) -> TopK:
    """The first ``k`` items of each list, ``tied_beyond`` counted again at the new cut (items beyond it, in the list or
    beyond the list, whose score equals its last)."""
    if k >= top.k:
        return top
    last = top.scores[:, k - 1: k]
    beyond = (top.scores[:, k:] == last).sum(1) + np.where(top.scores[:, -1] == last[:, 0], top.tied_beyond, 0)
    return TopK(top.ids[:, :k].copy(), top.scores[:, :k].copy(), beyond.astype(np.int64), top.n_gallery)


def read_query_groups(source: Source, ids: np.ndarray, column: str, block_rows: int) -> np.ndarray:
    """Each query's value of ``column`` in ``source`` (opened with that column as its label), in the order of ``ids``."""
    slots, out, filled = IdSlots(ids), None, np.zeros(len(ids), bool)
    for block in source.blocks(block_rows):
        if block.labels is None:
            raise SourceError(f"{source.description} has no column {column!r} to read the query groups from")
        at = slots(block.ids, source)
        if out is None:
            out = np.empty(len(ids), dtype=object)
        out[at] = block.labels
        filled[at] = True
    if out is None or not filled.all():
        raise SourceError(f"{source.description} gave {int(filled.sum())} of the {len(ids)} queries' groups")
    return np.array(out.tolist())


def _split(top: TopK, n: int) -> tuple[TopK, TopK]:
    """The first ``n`` queries' lists and the rest (one pass ranked old and new queries together)."""
    cut = lambda s: TopK(top.ids[s], top.scores[s], top.tied_beyond[s], top.n_gallery)  # noqa: E731
    return cut(slice(0, n)), cut(slice(n, None))


class Opened:
    """The sources one check opened, closed together when it ends (however it ends)."""

    def __init__(self) -> None:
        self.sources: list[Source] = []

    def open(self, text: str, what: str, *, label: str | None = None) -> Source:
        source = open_source(text, what=what, label=label)
        self.sources.append(source)
        return source

    def close(self) -> None:
        for source in self.sources:
            source.close()


def _labels_as(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Query and gallery labels of one kind (compared as text when one side is text)."""
    if (a.dtype.kind in "US") != (b.dtype.kind in "US"):
        return a.astype(str), b.astype(str)
    return a, b


def check_sources(specs: SourceSpecs, *, relevance: str | None = None, k: int = DEFAULT_K, metric: str | None = None,
                  names: Sequence[str] = ("old", "new"), resamples: int = DEFAULT_RESAMPLES,
                  level: float = DEFAULT_CONFIDENCE, seed: int = DEFAULT_SEED, margin: float = 0.0, ties: str = STRICT,
                  block_rows: int = DEFAULT_BLOCK_ROWS, backend: str = "numpy",
                  progress: Progress | None = None, backfill_depth: int | None = None,
                  rollout: bool = False, interval: str = DEFAULT_INTERVAL,
                  query_groups: str | None = None, cluster: ClusterSpec | None = None,
                  fan_out: FanOut | None = None, rank_ties: str = "pessimistic") -> SourcesCheck:
    """The upgrade verdict of the new model's queries on the old gallery, read from sources (module docstring).

    ``relevance`` defaults to ``qrels`` when ``specs.qrels`` is given, else ``labels``; ``k`` is the depth of the top-k
    lists (raised to the metric's K when that is larger); ``backfill_depth`` the backfill's list depth D (default
    :func:`engine.upgrade.backfill_sources.default_depth`); ``rollout``: the backfill's pass over the old gallery also
    keeps the old queries' top-D lists, for the rank-merge roll-outs of the plan (the report is the same);
    ``interval``: two-way (Recall@k with labels; every other metric resamples queries, with a note), queries or
    sequential; ``query_groups``: a column of the query sources whose value groups related queries (resampled
    together); ``cluster``: where the search over the old gallery runs (:mod:`engine.core.cluster`; default in this
    process), on a cluster as :attr:`fan_out`'s query blocks x gallery partitions
    (:func:`engine.evaluate.dask_search.sharded_topk`, the same lists). The result holds the lists its remedies reuse
    (:attr:`SourcesCheck.lists`, not in the JSON). Raises
    ``ValueError`` (a
    :class:`SourceError` for the sources) with one line, credentials masked, for anything it cannot judge; nothing is
    written anywhere.
    """
    opened = Opened()
    try:
        with dask_client(cluster or ClusterSpec()) as client:
            search = _OldSearch(specs.old_gallery, client, fan_out or FanOut(), backend, block_rows)
            return _check(specs, opened, relevance=relevance, k=k, metric=metric, names=names, resamples=resamples,
                          level=level, seed=seed, margin=margin, ties=ties, block_rows=block_rows, backend=backend,
                          say=progress or (lambda f, m: None), backfill_depth=backfill_depth, rollout=rollout,
                          interval=interval, query_groups=query_groups, search_old=search, rank_ties=rank_ties)
    finally:
        opened.close()


@dataclass(frozen=True)
class _OldSearch:
    """The search of the old gallery: streamed in this process, or sharded on the client's Dask cluster."""

    text: str
    client: object | None  # a distributed.Client, or None in-process
    fan_out: FanOut
    backend: str
    block_rows: int

    @cached_property
    def dashboard(self) -> str:
        """`` (Dask dashboard URL)`` when the cluster serves one, else nothing (asked once)."""
        link = dashboard_link(self.client)
        return f" (Dask dashboard {link})" if link else ""

    def __call__(self, queries: np.ndarray, source: Source, ids: np.ndarray, k: int, say: Progress) -> TopK:
        if self.client is None:
            return stream_topk(queries, in_order(source, ids, self.block_rows), k=k, backend=self.backend)
        return sharded_topk(self.client, self.text, "old gallery", ids, queries, k=k, backend=self.backend,
                            block_rows=self.block_rows, fan_out=self.fan_out,
                            progress=lambda done, total: say(0.2 + 0.4 * done / total,
                                                             f"searching the old gallery: {done} of {total} tasks"
                                                             + self.dashboard))


def _check(specs: SourceSpecs, opened: Opened, *, relevance: str | None, k: int, metric: str | None,
           names: Sequence[str], resamples: int, level: float, seed: int, margin: float, ties: str, block_rows: int,
           backend: str, say: Progress, backfill_depth: int | None = None, rollout: bool = False,
           interval: str = DEFAULT_INTERVAL, query_groups: str | None = None,
           search_old: Callable[..., TopK], rank_ties: str = "pessimistic") -> SourcesCheck:
    relevance = relevance or default_relevance(specs.qrels)
    check_rank_ties(rank_ties, LIST_RANK_TIES)
    if relevance not in RELEVANCE:
        raise ValueError(f"unknown relevance {relevance!r}; use one of {', '.join(RELEVANCE)}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    metric = str(metric or default_metric(relevance, k)).strip().lower()
    if backfill_depth is not None and (isinstance(backfill_depth, bool) or not isinstance(backfill_depth, (int, np.integer))
                                       or backfill_depth < 1):
        raise ValueError(f"the backfill depth must be a positive integer, got {backfill_depth!r}")
    kind, at = parse_source_metric(metric, relevance, int(k))
    metric = f"{kind}@{at}"  # one spelling in the report, whichever the caller used
    (old_name, new_name), _ = check_settings(names, metric="recall@1", resamples=resamples, level=level, margin=margin,
                                             ties=ties, interval=interval)
    if query_groups is not None and (not isinstance(query_groups, str) or not query_groups.strip()):
        raise ValueError(f"the query groups name a column of the query sources, got {query_groups!r}")
    if query_groups is not None and interval == "sequential":
        raise ValueError("--sequential takes the queries one by one in their order; it does not go with query groups")
    notes: tuple[str, ...] = ()
    two_way = interval == "two-way" and kind == "recall" and relevance == "labels" and rank_ties == "pessimistic"
    if interval == "two-way" and not two_way:
        interval = "queries"
        notes += (f"the gallery resample covers recall@k with labels (pessimistic ties); this {metric} interval "
                  f"resamples {'query groups' if query_groups else 'queries'} only",)
    if interval == "sequential":
        notes += (SEQUENTIAL_NOTE,)
    rule = Rule(margin, ties)
    sources_check_payload(asdict(specs), relevance=relevance, k=int(k), names=(old_name, new_name),
                          stored=False)  # what each needs; this check's own, never stored
    depth = max(int(k), at)
    ks = tuple(sorted({at, int(k)}))

    say(0.02, "reading the queries")
    old_q_src, new_q_src = opened.open(specs.old_queries, "old queries"), opened.open(specs.new_queries, "new queries")
    queries = join_by_id(old_q_src, new_q_src, block_rows=block_rows)
    if not len(queries.ids):
        raise SourceError(f"{old_q_src.description} holds no query")
    groups = None
    if query_groups is not None:
        say(0.05, "reading the query groups")
        groups = query_group_index(read_query_groups(opened.open(specs.old_queries, "query groups", label=query_groups),
                                                     queries.ids, query_groups, block_rows), len(queries.ids))
    say(0.08, "reading the old gallery's ids")
    old_g = opened.open(specs.old_gallery, "old gallery")
    new_g = opened.open(specs.new_gallery, "new gallery") if specs.new_gallery else None
    old_scan = scan_gallery(old_g, block_rows=block_rows)
    d_old_q, d_new_q = queries.old.shape[1], queries.new.shape[1]
    if d_old_q != old_scan.dim:
        raise SourceError(f"{old_q_src.description} holds {d_old_q}-d vectors but {old_g.description} {old_scan.dim}-d; "
                          "the old model's queries and gallery must share one space")
    if d_new_q != old_scan.dim:
        raise SourceError(f"{new_q_src.description} holds {d_new_q}-d vectors but {old_g.description} {old_scan.dim}-d; "
                          "the cross-test searches the old gallery with the new model's queries, so both need one "
                          "space (fit an adapter new -> old first)")
    new_scan = None
    if new_g is not None:
        say(0.14, "reading the new gallery's ids")
        new_scan = scan_gallery(new_g, block_rows=block_rows)
        check_same_ids(old_scan.ids, old_g, new_scan.ids, new_g)
        if new_scan.dim != d_new_q:
            raise SourceError(f"{new_g.description} holds {new_scan.dim}-d vectors but {new_q_src.description} "
                              f"{d_new_q}-d; the new model's queries and gallery must share one space")
    slots = IdSlots(old_scan.ids)
    if new_scan is not None and new_scan.labels is not None and old_scan.labels is not None:
        at_new = slots(new_scan.ids, new_g)
        differ = old_scan.labels[at_new] != new_scan.labels
        if np.any(differ):
            raise SourceError(f"{old_g.description} and {new_g.description} give {int(differ.sum())} items different labels")

    n_q, n_g = len(queries.ids), len(old_scan.ids)
    gallery_rows = np.arange(n_g, dtype=np.int64)
    q_labels = g_labels = judged_rows = None
    if at > n_g:
        raise ValueError(f"{metric} needs at least {at} gallery items; {old_g.description} holds {n_g}")
    judged: dict[int, dict[int, float]] = {}
    qrels_table = None
    if relevance == "labels":
        if queries.labels is None:
            raise SourceError(f"relevance labels needs labels on the queries ({old_q_src.description} and "
                              f"{new_q_src.description} have none); use --relevance qrels or none")
        if old_scan.labels is None:
            raise SourceError(f"relevance labels needs labels on {old_g.description} (a label column); use --relevance "
                              "qrels or none")
        q_labels, g_labels = _labels_as(queries.labels, old_scan.labels)
    elif relevance == "qrels":
        say(0.18, "reading the qrels")
        qrels_table = read_qrels(specs.qrels)
        judged = qrels_rows(qrels_table, queries.ids, old_scan.ids)
        judged_rows = np.unique(np.fromiter((i for q in judged.values() for i in q), np.int64))

    say(0.2, "searching the old gallery (old and new queries)")
    search = min(max(depth, two_way_depth(at)) if two_way else depth, n_g)  # two-way: deeper lists to walk
    stacked = np.concatenate([queries.old, queries.new])
    on_old = search_old(stacked, old_g, old_scan.ids, search, say)
    top_oo, top_no = _split(on_old, n_q)
    top_nn = None
    if new_g is not None:
        say(0.6, "searching the new gallery (new queries)")
        top_nn = stream_topk(queries.new, by_id(new_g, slots, block_rows), k=search, backend=backend)
    ranked = {}
    if two_way:
        ranked = {cell: ranked_lists(top.ids, top.scores, q_labels, g_labels)
                  for cell, top in (("oo", top_oo), ("no", top_no), ("nn", top_nn)) if top is not None}
        top_oo, top_no = cut_lists(top_oo, min(depth, n_g)), cut_lists(top_no, min(depth, n_g))
        top_nn = None if top_nn is None else cut_lists(top_nn, min(depth, n_g))
    ks = tuple(x for x in ks if x <= min(depth, n_g))

    say(0.9, "per-query outcomes and the paired interval")
    judge = SourceRelevance(relevance, gallery_rows, q_labels, g_labels, judged, judged_rows, top_nn, rank_ties,
                            old_scan.ids.astype(str) if rank_ties == TREC_RANK_TIES else None)
    cells = {f"{old_name}/{old_name}": judge.outcomes(top_oo, ks=ks), f"{new_name}/{old_name}": judge.outcomes(top_no, ks=ks)}
    if top_nn is not None and relevance != "none":
        cells[f"{new_name}/{new_name}"] = judge.outcomes(top_nn, ks=ks)
    key = f"{kind}@{at}"
    oo = cells[f"{old_name}/{old_name}"].values[key]
    no = cells[f"{new_name}/{old_name}"].values[key]
    nn = cells[f"{new_name}/{new_name}"].values[key] if f"{new_name}/{new_name}" in cells else None
    unchanged = bool(new_scan is not None and np.array_equal(queries.old, queries.new)
                     and np.array_equal(old_scan.prints[slots(new_scan.ids, new_g)], new_scan.prints))
    others = [no] if nn is None else [no, nn]
    got = paired_intervals(oo, others, seed=cell_seed(seed, 1, 0), resamples=resamples, confidence=level, k=at,
                           base_lists=ranked.get("oo"), other_lists=[ranked[c] for c in ("no", "nn")[: len(others)]]
                           if two_way else None, bound_unchanged=[not unchanged, False][: len(others)], groups=groups,
                           sequential=interval == "sequential")
    settings = {"resamples": resamples, "level": level, "seed": seed, "groups": groups}
    compat = compare(no, oo, **settings, rule=rule, bounds=(got[0].lo, got[0].hi))
    if nn is None:
        better = PairedVerdict(float("nan"), float("nan"), float("nan"), 0, NOT_JUDGED)
    else:
        better = compare(nn, oo, **settings, names=BETTER, bounds=(got[1].lo, got[1].hi))
    notes += unchanged_note(got[0])
    if two_way:
        notes += (f"two-way from the streamed gallery: each replicate walks the queries' top-{search} lists with the "
                  "gallery items' resampled counts (an item's vector is never needed again)",)
    needs, decided, b_depth, backfill = (), {}, None, None
    if compat.verdict == "not compatible" and new_g is not None:
        b_depth = min(backfill_depth or default_depth(max(int(k), at)), n_g)
        backfill = source_backfill(
            queries.new, lambda: in_order(old_g, old_scan.ids, block_rows), lambda: by_id(new_g, slots, block_rows),
            n_gallery=n_g, k=at, depth=b_depth, outcome=lambda top, rows: judge.outcomes(top, rows, ks=(at,)).values[key],
            old_self=float(np.nanmean(oo)), seed=seed, block_rows=block_rows, backend=backend, say=say,
            gallery_labels=old_scan.labels, old_queries=queries.old if rollout else None)
        needs, decided = backfill.needs, backfill.decided
        notes += backfill.notes + (("label-free, the backfill curves' reference is each query's new/new top-k: at beta = 1 "
                             "the merged list is new/new itself, so every curve ends at 1 by definition",)
                            if relevance == "none" else ())
    n_none = cells[f"{old_name}/{old_name}"].n_no_relevant
    tie_readings = None
    if relevance == "labels" and kind == "recall":  # the hit rate: the engine's Recall@k, its ties read off the lists
        who = {"old": old_name, "new": new_name}
        read = {f"{a}/{b}": list_tie_outcomes(top.scores, judge.relevant(top.ids), top.tied_beyond,
                                              ~cells[f"{who[a]}/{who[b]}"].no_relevant, at)
                for (a, b), top in ((("old", "old"), top_oo), (("new", "old"), top_no), (("new", "new"), top_nn))
                if top is not None}
        tie_readings = pair_ties({cell: got for cell, (got, _) in read.items()}, base="old/old", other="new/old",
                                 rule=rule, seed=cell_seed(seed, 1, 0), resamples=resamples, confidence=level,
                                 bound_unchanged=not unchanged, groups=groups)
        if past := {cell: n for cell, (_, n) in read.items() if n}:
            notes += ("ties not read: " + ", ".join(f"{n:,} {cell} queries" for cell, n in past.items())
                      + f" tie items past their top-{top_oo.k} lists, whose relevance the lists do not hold; a larger "
                        "--k reads them",)
    report = UpgradeReport(old_name, new_name, metric, float(np.nanmean(oo)), float(np.nanmean(no)),
                           float("nan") if nn is None else float(np.nanmean(nn)), n_q, n_none, n_g, compat, better,
                           resamples, level, seed, False, needs, best_ordering(needs), float(margin), ties, interval, notes,
                           relevance, query_groups=0 if groups is None else int(groups.max()) + 1,
                           tie_readings=tie_readings)
    sources = {"old_gallery": old_g.description, "old_queries": old_q_src.description,
               "new_queries": new_q_src.description}
    if new_g is not None:
        sources["new_gallery"] = new_g.description
    if qrels_table is not None:
        sources["qrels"] = qrels_table.description
    say(1.0, "done")
    lists = CheckLists(queries, old_scan.ids, slots, judge, key, at, top_oo, top_nn, oo, block_rows, backend, backfill,
                       interval, groups, ranked.get("oo"), search if two_way else 0, top_no)
    return SourcesCheck(report, relevance, depth, relevance_phrase(relevance, k=at, n_no_relevant=n_none, metric=key,
                                                                   rank_ties=rank_ties), sources,
                        {cell: o.means() for cell, o in cells.items()}, b_depth, decided, lists, rank_ties)


__all__ = ["DEFAULT_K", "CheckLists", "GalleryScan", "Opened", "SourceRelevance", "SourceSpecs", "SourcesCheck", "by_id",
           "check_sources", "default_metric", "trec_texts", "trec_zip", "default_relevance", "in_order", "parse_source_metric", "qrels_rows",
           "scan_gallery"]
