"""Retrieval cells evaluated by many workers: fan-out into search and reduce tasks, and their handlers.

The graph follows :mod:`engine.metrics.sharded`'s two counting passes, per cell and (query block x gallery shard):

1. ``search`` pass 1: the block's positive similarities found in the shard (offsets, values).
2. ``search`` pass 2 (waits for its block's pass-1 tasks): the block's positives merged, then the shard's
   negatives counted against them (cnt, >= / > best positive).
3. ``reduce`` (waits for the cell's search tasks): counts summed over shards, AP from the merged positives; its
   result holds the cell's metrics and its arrays the per-query statistics (``QueryStats`` fields plus ``ids``,
   the kept query rows), which :mod:`engine.evaluate.matrix` turns into a stored compatibility matrix.

Counts add up across shards, so a cell equals :func:`engine.metrics.retrieval.cell_stats` on the whole gallery
(ties as in sharded.py). A cell (:class:`CellSpec`) names a stored query and gallery feature set; a task reads its
rows through :func:`storage.feature_set_rows` and applies the cell's recipe to them
(:meth:`engine.core.cell.CellRecipe.side`: the rows of the classes the cell evaluates, the view derived row by
row), as the in-process paths do for a whole set. Instance galleries only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, get_args

import numpy as np
from sqlalchemy import Engine

from engine.core.cell import CellRecipe
from engine.core.vocab import RANK_TIE_TOLERANCE
from engine.metrics.device import one_blas_thread
from engine.metrics.ranking import QueryStats
from engine.metrics.retrieval import RankTies, metrics_from_stats, unit_rows
from engine.metrics.search import DEFAULT_BLOCK
from engine.metrics.sharded import Shard, ap_kernel, checked_shard, count_kernel, gather_positives, group_by_query, \
    label_codes, shard_blocks, tied_positives
from storage import Task, feature_set_rows, session_scope
from storage.feature_sets import feature_set_size
from storage.tasks import NewTask, create_task_job, job_payload, task_arrays, task_payloads

STATS_FIELDS = tuple(QueryStats.__dataclass_fields__)


@dataclass(frozen=True)
class CellSpec:
    """One cell: query feature set x gallery feature set (stored ids of the same raw view), and how to read them.

    The fields after ``gallery`` are the cell's :class:`engine.core.cell.CellRecipe` (``view``, each side's
    ``columns``, ``topk``, ``below`` for ``eval_classes = "seen"``, ``same_set``), kept flat so a task job's stored
    payload reads as before; build one with :meth:`of`, read it with :attr:`recipe`.
    """

    query: int
    gallery: int
    view: str = "encoder"
    query_columns: int | list[int] | None = None
    gallery_columns: int | list[int] | None = None
    topk: int | None = None
    below: int | None = None
    same_set: bool = False

    @classmethod
    def of(cls, query: int, gallery: int, recipe: CellRecipe) -> "CellSpec":
        """The cell of stored feature sets ``query`` x ``gallery`` read by ``recipe``."""
        def plain(columns: int | tuple[int, ...] | None) -> int | list[int] | None:
            return list(columns) if isinstance(columns, tuple) else columns

        return cls(query, gallery, view=recipe.view, query_columns=plain(recipe.query_columns),
                   gallery_columns=plain(recipe.gallery_columns), topk=recipe.topk, below=recipe.below,
                   same_set=recipe.same_set)

    @property
    def recipe(self) -> CellRecipe:
        """How the cell's rows are kept and its view derived."""
        def frozen(columns: int | list[int] | None) -> int | tuple[int, ...] | None:
            return tuple(columns) if isinstance(columns, list) else columns

        return CellRecipe(self.view, frozen(self.query_columns), frozen(self.gallery_columns), topk=self.topk,
                          below=self.below, same_set=self.same_set)


def _ranges(n: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(n, lo + size)) for lo in range(0, n, size)]


def _width(columns: int | list[int] | None, dim: int) -> int:
    return dim if columns is None else columns if isinstance(columns, int) else len(columns)


def _check_cell(s, cell: CellSpec) -> tuple[int, int]:
    """The cell's (query rows, gallery rows) before class selection; ``ValueError`` for a cell that cannot be searched."""
    sizes = {fid: feature_set_size(s, fid) for fid in (cell.query, cell.gallery)}
    for fid, size in sizes.items():
        if size is None or size[0] == 0:
            raise ValueError(f"feature set {fid} is missing or empty")
    (nq, dq), (ng, dg) = sizes[cell.query], sizes[cell.gallery]
    derived = cell.recipe.derived
    wq = _width(cell.query_columns if derived else None, dq)
    wg = _width(cell.gallery_columns if derived else None, dg)
    if wq != wg:
        raise ValueError(f"query features are {wq}-d but gallery features are {wg}-d")
    if cell.same_set and nq != ng:
        raise ValueError(f"same_set needs the queries to be the gallery's items, but they have {nq} and {ng} rows")
    return nq, ng


def fan_out_cells(db: Engine, cells: list[CellSpec], *, ks: tuple[int, ...] = (1, 5), map_at: int | None = None,
                  ties: str = "pessimistic", compute_map: bool = True, block_rows: int = 10_000,
                  shard_rows: int = 100_000, needs_gpu: bool = False, max_attempts: int = 3,
                  label: str = "", experiment_id: int | None = None, owner_lease_s: float | None = None) -> int:
    """Queue every cell as search and reduce tasks of one job; return the job id.

    The reduce of ``cells[i]`` is the job's i-th reduce task. Every refusal is a ``ValueError`` before anything is
    written. ``label``: how the dashboard names the job (e.g. "experiment 3, view psp"). ``experiment_id`` and
    ``owner_lease_s``: as :func:`storage.tasks.create_task_job` (this process owns the job).
    """
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 for k in ks) or (map_at is not None and map_at < 1):
        raise ValueError(f"every k must be >= 1, got ks={ks}, map_at={map_at}")
    if ties not in get_args(RankTies):
        raise ValueError(f"unknown tie rule {ties!r}; use one of {', '.join(get_args(RankTies))}")
    if block_rows < 1 or shard_rows < 1:
        raise ValueError(f"block_rows and shard_rows must be >= 1, got {block_rows} and {shard_rows}")
    if not cells:
        raise ValueError("no cell to evaluate")
    tasks: list[NewTask] = []
    with session_scope(db) as s:
        for index, cell in enumerate(cells):
            nq, ng = _check_cell(s, cell)
            blocks, shards = _ranges(nq, block_rows), _ranges(ng, shard_rows)
            first = len(tasks)
            tasks += [NewTask("search", {"cell": index, "pass": 1, "block": b, "shard": g}, needs_gpu=needs_gpu)
                      for b in blocks for g in shards]
            by_block = {b: tuple(first + i * len(shards) + j for j in range(len(shards))) for i, b in enumerate(blocks)}
            tasks += [NewTask("search", {"cell": index, "pass": 2, "block": b, "shard": g}, after=by_block[b],
                              needs_gpu=needs_gpu) for b in blocks for g in shards]
            tasks.append(NewTask("reduce", {"cell": index}, after=tuple(range(first, len(tasks)))))
        spec = {"cells": [asdict(c) for c in cells], "ks": list(ks), "map_at": map_at, "ties": ties,
                "compute_map": compute_map, "label": label}
        return create_task_job(s, spec, tasks, max_attempts=max_attempts, experiment_id=experiment_id,
                               owner_lease_s=owner_lease_s, message=f"{len(cells)} cell(s), {len(tasks)} tasks queued")


def fan_out_cell(db: Engine, *, query: int, gallery: int, same_set: bool = False, **options: Any) -> int:
    """Queue one cell (query feature set x gallery feature set, by id) as tasks; see :func:`fan_out_cells`."""
    return fan_out_cells(db, [CellSpec(query, gallery, same_set=same_set)], **options)


def _job_spec(db: Engine, task: Task) -> tuple[dict[str, Any], CellSpec]:
    with session_scope(db) as s:
        spec = job_payload(s, task.job_id)
    return spec, CellSpec(**spec["cells"][task.payload["cell"]])


def _rows(db: Engine, cell: CellSpec, side: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``lo:hi`` of the cell's ``side`` set, its classes only, in the cell's view: (features, labels, row ids)."""
    with session_scope(db) as s:
        feats, labels = feature_set_rows(s, getattr(cell, side), lo, hi)
    return cell.recipe.side(side, feats, labels, np.arange(lo, hi, dtype=np.int64))


def _query_block(db: Engine, cell: CellSpec, block: list[int]):
    """Unit query rows, their labels, codes among the block's classes, row ids and exclusion ids of one query block."""
    feats, labels, ids = _rows(db, cell, "query", *block)
    classes = np.unique(labels)
    return unit_rows(feats), labels, classes, label_codes(classes, labels), ids, ids if cell.same_set else None


def _merged_positives(db: Engine, pass1_ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A query block's positives from each shard's pass-1 result, as (offsets, values sorted per query, query row ids)."""
    with session_scope(db) as s:
        parts = task_arrays(s, pass1_ids)
    ids = parts[0]["ids"]
    who = [np.repeat(np.arange(len(ids), dtype=np.int64), np.diff(p["offsets"])) for p in parts]
    return (*group_by_query(who, [p["pos"] for p in parts], len(ids)), ids)


def _wants_counts(spec: dict[str, Any]) -> bool:
    return bool(spec["compute_map"] or spec["map_at"])


def search_task(db: Engine, task: Task) -> tuple[dict[str, Any] | None, dict[str, np.ndarray]]:
    """One pass over one (query block x gallery shard); see the module docstring."""
    spec, cell = _job_spec(db, task)
    q, _, classes, qcode, qids, exclude = _query_block(db, cell, task.payload["block"])
    feats, labels, ids = _rows(db, cell, "gallery", *task.payload["shard"])
    shard = checked_shard(task.payload["shard"][0], Shard(feats, labels, ids), q.shape[1])
    if task.payload["pass"] == 1:
        if shard is None or not len(q):  # nothing of the cell's classes in this block or shard
            return None, {"offsets": np.zeros(len(q) + 1, np.int64), "pos": np.zeros(0, np.float32), "ids": qids}
        with one_blas_thread():
            offsets, pos = gather_positives(q, qcode, classes, lambda: enumerate([shard]), exclude, DEFAULT_BLOCK, [])
        return None, {"offsets": offsets, "pos": pos, "ids": qids}
    offsets, pos, _ = _merged_positives(db, task.upstream)
    want_cnt = _wants_counts(spec)
    cnt = np.zeros(offsets[-1] + len(q) if want_cnt else 0, np.int64)
    neg_ge, neg_gt, above, tied = (np.zeros(len(q), np.int64) for _ in range(4))
    if shard is not None and len(q):
        gcode = label_codes(classes, shard.labels)
        with one_blas_thread():
            for rows, sims in shard_blocks(q, shard, exclude, DEFAULT_BLOCK, None):
                count_kernel(sims, rows.start, qcode, gcode, offsets, pos, cnt, neg_ge, neg_gt, want_cnt, above, tied,
                             RANK_TIE_TOLERANCE)
    return None, {"cnt": cnt, "neg_ge": neg_ge, "neg_gt": neg_gt, "neg_above": above, "neg_tied": tied}


def reduce_task(db: Engine, task: Task) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Sum each block's counts over its shards, then the cell's metrics (memory: one block's counts at a time)."""
    spec, _ = _job_spec(db, task)
    with session_scope(db) as s:
        searches = task_payloads(s, task.upstream)
    by_block: dict[tuple[int, int], dict[int, list[int]]] = {}
    for task_id, payload in searches:
        by_block.setdefault(tuple(payload["block"]), {1: [], 2: []})[payload["pass"]].append(task_id)
    want_cnt, map_k = _wants_counts(spec), int(spec["map_at"] or 0)
    parts, kept = [], []
    for _, tasks in sorted(by_block.items()):
        offsets, pos, rows = _merged_positives(db, tasks[1])  # rows: the block's kept queries, in its counts' order
        n = len(rows)
        with session_scope(db) as s:
            counts = task_arrays(s, tasks[2])
        total = {key: sum(c[key] for c in counts) for key in ("cnt", "neg_ge", "neg_gt")}
        near = ((sum(c["neg_above"] for c in counts), sum(c["neg_tied"] for c in counts), tied_positives(offsets, pos))
                if all("neg_above" in c for c in counts) else ())  # a search task stored before near ties: none
        ap, ap_k = (ap_kernel(offsets, pos, total["cnt"], map_k) if want_cnt and n
                    else (np.full(n, np.nan), np.full(n, np.nan)))
        parts.append(QueryStats(np.diff(offsets), total["neg_ge"], total["neg_gt"], ap, ap_k, *near))
        kept.append(rows)
    stats = QueryStats.concat(parts)
    metrics = metrics_from_stats(stats, ks=tuple(spec["ks"]), map_at=spec["map_at"], want_map=spec["compute_map"],
                                 ties=spec["ties"])
    shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
    arrays = ({name: getattr(stats, name) for name in STATS_FIELDS if getattr(stats, name) is not None}
              | {"ids": np.concatenate(kept)})
    index, count = task.payload["cell"], len(spec["cells"])
    which = f"cell {index + 1} of {count}" if count > 1 else "cell"
    return {"cell": index, "metrics": metrics, "message": f"{which} done: {shown}"}, arrays


SEARCH_HANDLERS = {"search": search_task, "reduce": reduce_task}  # what the owner of a cells job runs (engine.evaluate.matrix)

__all__ = ["SEARCH_HANDLERS", "STATS_FIELDS", "CellSpec", "fan_out_cell", "fan_out_cells", "reduce_task", "search_task"]
