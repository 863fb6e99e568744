"""A compatibility matrix evaluated on a Dask cluster: query blocks x gallery partitions of the stored feature sets.

:func:`matrix_on_dask` follows :mod:`engine.metrics.sharded`'s two counting passes for every comparable cell
(:class:`CellSpec`: a stored query and gallery feature set and the cell's recipe), as a Dask graph per query block:

1. :func:`positives_part` per (block x partition): the block's positive similarities found in the partition.
2. :func:`merged_positives` (the block's pass-1 parts): each query's positives, sorted.
3. :func:`counts_part` per (block x partition): the partition's negatives counted against the merged positives.
4. :func:`block_stats`: the counts summed over partitions and AP from the merged positives, as
   :class:`~engine.metrics.ranking.QueryStats` of the block's kept queries.

Counts add up across partitions, so a cell equals :func:`engine.metrics.retrieval.cell_stats` on the whole gallery
(ties as in sharded.py); the blocks' statistics are concatenated and the
:class:`~engine.metrics.compatibility.MatrixResult` is built with the same code as an in-process evaluation (paired
tests included). Each task opens the database by its URL and reads only its rows (:func:`storage.feature_set_rows`),
so the workers must reach the database and the feature store; only per-query statistics come back. A failed task
fails the matrix (Dask recomputes the tasks of a lost worker), a cancelled job cancels the futures; nothing is written
here. Instance galleries only (:func:`engine.core.fan_out.check_fan_out_gallery`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine

from engine.core.cell import CellRecipe
from engine.core.fan_out import FanOut
from engine.core.vocab import RANK_TIE_TOLERANCE
from engine.evaluate.dask_search import dashboard_link, wait_for
from engine.metrics.compatibility import CellFeatures, CellStats, MatrixResult, compatibility_matrices
from engine.metrics.device import one_pass_at_a_time
from engine.metrics.paired import PairedOptions
from engine.metrics.ranking import QueryStats
from engine.metrics.retrieval import VERIFICATION, parse_metric, unit_rows
from engine.metrics.search import DEFAULT_BLOCK
from engine.metrics.sharded import Shard, ap_kernel, checked_shard, count_kernel, gather_positives, group_by_query, \
    label_codes, shard_blocks, tied_positives
from storage import feature_set_rows, get_engine, session_scope
from storage.feature_sets import feature_set_size

Positives = tuple[np.ndarray, np.ndarray, np.ndarray]  # (offsets, values sorted per query, kept query row ids)


@dataclass(frozen=True)
class CellSpec:
    """One cell: query feature set x gallery feature set (stored ids of the same raw view) and its
    :class:`engine.core.cell.CellRecipe` (the view, each side's columns, ``topk``, ``below`` for ``eval_classes =
    "seen"``, ``same_set``), the one recipe every path reads a cell by."""

    query: int
    gallery: int
    recipe: CellRecipe = CellRecipe("encoder")


def _ranges(n: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(n, lo + size)) for lo in range(0, n, size)]


def _width(columns: int | tuple[int, ...] | None, dim: int) -> int:
    return dim if columns is None else columns if isinstance(columns, int) else len(columns)


def check_cell(db: Engine, cell: CellSpec) -> tuple[int, int]:
    """The cell's (query rows, gallery rows) before class selection; ``ValueError`` for a cell that cannot be searched."""
    with session_scope(db) as s:
        sizes = {fid: feature_set_size(s, fid) for fid in (cell.query, cell.gallery)}
    for fid, size in sizes.items():
        if size is None or size[0] == 0:
            raise ValueError(f"feature set {fid} is missing or empty")
    (nq, dq), (ng, dg) = sizes[cell.query], sizes[cell.gallery]
    derived = cell.recipe.derived
    wq = _width(cell.recipe.query_columns if derived else None, dq)
    wg = _width(cell.recipe.gallery_columns if derived else None, dg)
    if wq != wg:
        raise ValueError(f"query features are {wq}-d but gallery features are {wg}-d")
    if cell.recipe.same_set and nq != ng:
        raise ValueError(f"same_set needs the queries to be the gallery's items, but they have {nq} and {ng} rows")
    return nq, ng


def _rows(url: str, cell: CellSpec, side: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``lo:hi`` of the cell's ``side`` set, its classes only, in the cell's view: (features, labels, row ids)."""
    with session_scope(get_engine(url)) as s:
        feats, labels = feature_set_rows(s, getattr(cell, side), lo, hi)
    return cell.recipe.side(side, feats, labels, np.arange(lo, hi, dtype=np.int64))


def _query_block(url: str, cell: CellSpec, block: tuple[int, int]):
    """Unit query rows, their classes, codes among the block's classes, row ids and exclusion ids of one query block."""
    feats, labels, ids = _rows(url, cell, "query", *block)
    classes = np.unique(labels)
    return unit_rows(feats), classes, label_codes(classes, labels), ids, ids if cell.recipe.same_set else None


def _partition(url: str, cell: CellSpec, part: tuple[int, int], d: int) -> Shard | None:
    feats, labels, ids = _rows(url, cell, "gallery", *part)
    return checked_shard(part[0], Shard(feats, labels, ids), d)


def positives_part(url: str, cell: CellSpec, block: tuple[int, int], part: tuple[int, int]) -> Positives:
    """Pass 1: the block's positive similarities in gallery rows ``part`` (offsets per kept query, values, query ids)."""
    q, classes, qcode, qids, exclude = _query_block(url, cell, block)
    shard = _partition(url, cell, part, q.shape[1])
    if shard is None or not len(q):  # nothing of the cell's classes in this block or partition
        return np.zeros(len(q) + 1, np.int64), np.zeros(0, np.float32), qids
    with one_pass_at_a_time():
        offsets, pos = gather_positives(q, qcode, classes, lambda: enumerate([shard]), exclude, DEFAULT_BLOCK, [])
    return offsets, pos, qids


def merged_positives(*parts: Positives) -> Positives:
    """A query block's positives from each partition's pass-1 part, sorted per query."""
    ids = parts[0][2]
    who = [np.repeat(np.arange(len(ids), dtype=np.int64), np.diff(offsets)) for offsets, _, _ in parts]
    return (*group_by_query(who, [pos for _, pos, _ in parts], len(ids)), ids)


def counts_part(url: str, cell: CellSpec, block: tuple[int, int], part: tuple[int, int], merged: Positives,
                want_cnt: bool) -> dict[str, np.ndarray]:
    """Pass 2: the partition's negatives counted against the block's merged positives (sharded.py's counts)."""
    q, classes, qcode, _, exclude = _query_block(url, cell, block)
    offsets, pos, _ = merged
    cnt = np.zeros(offsets[-1] + len(q) if want_cnt else 0, np.int64)
    neg_ge, neg_gt, above, tied = (np.zeros(len(q), np.int64) for _ in range(4))
    shard = _partition(url, cell, part, q.shape[1])
    if shard is not None and len(q):
        gcode = label_codes(classes, shard.labels)
        with one_pass_at_a_time():
            for rows, sims in shard_blocks(q, shard, exclude, DEFAULT_BLOCK, None):
                count_kernel(sims, rows.start, qcode, gcode, offsets, pos, cnt, neg_ge, neg_gt, want_cnt, above, tied,
                             RANK_TIE_TOLERANCE)
    return {"cnt": cnt, "neg_ge": neg_ge, "neg_gt": neg_gt, "neg_above": above, "neg_tied": tied}


def block_stats(merged: Positives, *counts: dict[str, np.ndarray], want_cnt: bool,
                map_k: int) -> tuple[QueryStats, np.ndarray]:
    """The block's per-query statistics from its positives and its partitions' counts, with its kept query row ids."""
    offsets, pos, rows = merged
    n = len(rows)
    total = {key: sum(c[key] for c in counts) for key in ("cnt", "neg_ge", "neg_gt", "neg_above", "neg_tied")}
    with one_pass_at_a_time(numpy_products=False):
        ap, ap_k = (ap_kernel(offsets, pos, total["cnt"], map_k) if want_cnt and n
                    else (np.full(n, np.nan), np.full(n, np.nan)))
    stats = QueryStats(np.diff(offsets), total["neg_ge"], total["neg_gt"], ap, ap_k, total["neg_above"],
                       total["neg_tied"], tied_positives(offsets, pos))
    return stats, rows


def _submit_cell(client: Any, url: str, cell: CellSpec, blocks: list[tuple[int, int]], parts: list[tuple[int, int]],
                 want_cnt: bool, map_k: int) -> tuple[list[Any], list[Any]]:
    """The cell's graph: (every future, the blocks' :func:`block_stats` futures in block order)."""
    every, stats = [], []
    for block in blocks:
        found = [client.submit(positives_part, url, cell, block, part, pure=False) for part in parts]
        merged = client.submit(merged_positives, *found, pure=False)
        counted = [client.submit(counts_part, url, cell, block, part, merged, want_cnt, pure=False) for part in parts]
        stats.append(client.submit(block_stats, merged, *counted, want_cnt=want_cnt, map_k=map_k, pure=False))
        every += [*found, merged, *counted, stats[-1]]
    return every, stats


def matrix_on_dask(db: Engine, client: Any, cells: Callable[[int, int], CellSpec | None], num_models: int, *,
                   metrics: Sequence[str], rank_ties: str = "pessimistic", paired: PairedOptions | None = None,
                   fan_out: FanOut = FanOut(), features: Callable[[int, int], CellFeatures] | None = None,
                   same_set: bool = False, should_stop: Callable[[], bool] | None = None,
                   progress: Callable[[int, int, str | None], None] | None = None) -> MatrixResult:
    """Every lower-triangle cell ``cells(t, k)`` (None: not comparable) on the client's cluster; see the module
    docstring. ``features(t, k)``: the cell's features, read here only when a metric needs them (pair verification,
    and the two-way interval of Recall@k). ``progress(done, total, dashboard)``: tasks finished of the graph's, and
    the Dask dashboard's address (None without one). A cancelled job (``should_stop`` or the job's cancel event)
    raises :class:`~engine.core.signals.Cancelled` and its futures are cancelled; every refusal is a one-line
    ``ValueError`` before any task runs.
    """
    parsed = [parse_metric(m) for m in metrics]
    verification = any(kind == VERIFICATION for kind, _ in parsed)
    if verification and features is None:
        raise ValueError("pair verification needs the cells' features: pass features=")
    if all(kind == VERIFICATION for kind, _ in parsed):  # nothing to search
        return compatibility_matrices(features, num_models=num_models, metrics=metrics, rank_ties=rank_ties, paired=paired,
                                      same_set=same_set)
    want_cnt = any(kind == "map" for kind, _ in parsed)
    map_k = next((k for kind, k in parsed if kind == "map" and k), None) or 0
    specs = {(t, k): cells(t, k) for t in range(num_models) for k in range(t + 1)}
    sizes = {tk: check_cell(db, spec) for tk, spec in specs.items() if spec is not None}
    url = db.url.render_as_string(hide_password=False)  # each task opens the database itself
    every, by_cell = [], {}
    for tk, (nq, ng) in sizes.items():
        futures, by_cell[tk] = _submit_cell(client, url, specs[tk], _ranges(nq, fan_out.block_rows),
                                            _ranges(ng, fan_out.shard_rows), want_cnt, map_k)
        every += futures
    link = dashboard_link(client)
    try:
        wait_for(every, what="the matrix's search", should_stop=should_stop,
                 progress=None if progress is None else lambda done, total: progress(done, total, link))
        results = {}
        for tk, futures in by_cell.items():
            parts = client.gather(futures)
            results[tk] = CellStats(QueryStats.concat([stats for stats, _ in parts]),
                                    np.concatenate([rows for _, rows in parts]))
    finally:
        client.cancel(every)

    # the paired test's two-way interval (Recall@k, check-upgrade's) ranks each cell's features again: read them here
    two_way = paired is not None and features is not None and any(kind == "recall" for kind, _ in parsed)

    def cell(t: int, k: int) -> CellStats:
        if (t, k) not in results:
            return CellStats(None)
        done = results[(t, k)]
        return CellStats(done.stats, done.query_ids, features(t, k) if verification or two_way else None)

    return compatibility_matrices(cell, num_models=num_models, metrics=metrics, rank_ties=rank_ties, paired=paired,
                                  same_set=same_set)


__all__ = ["CellSpec", "block_stats", "check_cell", "counts_part", "matrix_on_dask", "merged_positives",
           "positives_part"]
