"""One big cell evaluated by many workers: fan-out into tasks (:func:`fan_out_cell`) and the task loop (:func:`run_tasks`).

The graph follows :mod:`engine.metrics.sharded`'s two counting passes, per (query block x gallery shard):

1. ``search`` pass 1: the block's positive similarities found in the shard (offsets, values).
2. ``search`` pass 2 (waits for its block's pass-1 tasks): the block's positives merged, then the shard's
   negatives counted against them (cnt, >= / > best positive).
3. ``reduce`` (waits for every search task): counts summed over shards, AP from the merged positives, metrics.

Counts add up across shards, so the result equals :func:`engine.metrics.retrieval.retrieval_metrics` on the whole
gallery (ties as in sharded.py). Query and gallery are stored feature sets; a task reads its rows through
:func:`feature_rows` (the one place that knows where features live). Instance galleries only.

``python -m engine worker --tasks`` runs :func:`run_tasks` on any machine pointed at the same database.
"""
from __future__ import annotations

import os
import socket
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Protocol, get_args

import numpy as np
from sqlalchemy import Engine, select

from engine.jobs.extract_tasks import commit_task, extract_task
from engine.metrics.ranking import QueryStats
from engine.metrics.retrieval import Ties, metrics_from_stats, unit_rows
from engine.metrics.search import DEFAULT_BLOCK
from engine.metrics.sharded import (CPU, Shard, ap_kernel, checked_shard, count_kernel, gather_positives, group_by_query,
                                    label_codes, shard_blocks)
from storage import FeatureSet, Job, Task, feature_set_rows, init_db, session_scope
from storage.tasks import (
    NewTask,
    claim_task,
    complete_task,
    create_task_job,
    extend_lease,
    fail_task,
    task_arrays,
    unfinished_tasks,
)

LEASE_S = 60.0


class Stop(Protocol):
    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def worker_name() -> str:
    """``host:pid``: who holds a task, as the task board shows it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _ranges(n: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(n, lo + size)) for lo in range(0, n, size)]


def feature_rows(session, feature_set_id: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``lo:hi`` of a stored feature set as (features, labels): the shard source of every task."""
    return feature_set_rows(session, feature_set_id, lo, hi)


def fan_out_cell(db: Engine, *, query: int, gallery: int, same_set: bool = False, ks: tuple[int, ...] = (1, 5),
                 map_at: int | None = None, ties: str = "pessimistic", compute_map: bool = True,
                 block_rows: int = 10_000, shard_rows: int = 100_000, needs_gpu: bool = False,
                 max_attempts: int = 3) -> int:
    """Queue one cell (query feature set x gallery feature set, by id) as search and reduce tasks; return the job id.

    ``same_set``: the queries are the gallery's items (row i of both), each left out of its own ranking.
    Every refusal is a ``ValueError`` before anything is written.
    """
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 for k in ks) or (map_at is not None and map_at < 1):
        raise ValueError(f"every k must be >= 1, got ks={ks}, map_at={map_at}")
    if ties not in get_args(Ties):
        raise ValueError(f"unknown tie rule {ties!r}; use one of {', '.join(get_args(Ties))}")
    if block_rows < 1 or shard_rows < 1:
        raise ValueError(f"block_rows and shard_rows must be >= 1, got {block_rows} and {shard_rows}")
    with session_scope(db) as s:
        sizes = {fid: s.execute(select(FeatureSet.count, FeatureSet.dim).where(FeatureSet.id == fid)).first()
                 for fid in (query, gallery)}
        for fid, size in sizes.items():
            if size is None or size.count == 0:
                raise ValueError(f"feature set {fid} is missing or empty")
        (nq, dq), (ng, dg) = sizes[query], sizes[gallery]
        if dq != dg:
            raise ValueError(f"query features are {dq}-d but gallery features are {dg}-d")
        if same_set and nq != ng:
            raise ValueError(f"same_set needs the queries to be the gallery's items, but they have {nq} and {ng} rows")
        blocks, shards = _ranges(nq, block_rows), _ranges(ng, shard_rows)
        tasks = [NewTask("search", {"pass": 1, "block": b, "shard": g}, needs_gpu=needs_gpu) for b in blocks for g in shards]
        first = {b: [i for i, t in enumerate(tasks) if t.payload["block"] == b] for b in blocks}
        tasks += [NewTask("search", {"pass": 2, "block": b, "shard": g}, after=tuple(first[b]), needs_gpu=needs_gpu)
                  for b in blocks for g in shards]
        tasks.append(NewTask("reduce", {}, after=tuple(range(len(tasks)))))
        spec = {"query": query, "gallery": gallery, "same_set": same_set, "ks": list(ks), "map_at": map_at,
                "ties": ties, "compute_map": compute_map}
        return create_task_job(s, spec, tasks, max_attempts=max_attempts,
                               message=f"{len(blocks)} query blocks x {len(shards)} gallery shards queued")


def _cell(db: Engine, task: Task) -> dict[str, Any]:
    with session_scope(db) as s:
        return dict(s.get(Job, task.job_id).payload)


def _query_block(db: Engine, spec: dict[str, Any], block: list[int]):
    """Unit query rows, their labels, codes among the block's classes, and exclusion ids of one query block."""
    lo, hi = block
    with session_scope(db) as s:
        feats, labels = feature_rows(s, spec["query"], lo, hi)
    classes = np.unique(labels)
    exclude = np.arange(lo, hi, dtype=np.int64) if spec["same_set"] else None
    return unit_rows(feats, CPU), labels, classes, label_codes(classes, labels), exclude


def _gallery_shard(db: Engine, spec: dict[str, Any], shard: list[int], d: int) -> Shard:
    lo, hi = shard
    with session_scope(db) as s:
        feats, labels = feature_rows(s, spec["gallery"], lo, hi)
    return checked_shard(lo, Shard(feats, labels, np.arange(lo, hi, dtype=np.int64)), d)


def _merged_positives(db: Engine, pass1_ids: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """A query block's positives from each shard's pass-1 result, as (offsets, values sorted per query)."""
    with session_scope(db) as s:
        parts = task_arrays(s, pass1_ids)
    who = [np.repeat(np.arange(n, dtype=np.int64), np.diff(p["offsets"])) for p in parts]
    return group_by_query(who, [p["pos"] for p in parts], n)


def _wants_counts(spec: dict[str, Any]) -> bool:
    return bool(spec["compute_map"] or spec["map_at"])


def _search(db: Engine, task: Task) -> tuple[dict[str, Any] | None, dict[str, np.ndarray]]:
    """One pass over one (query block x gallery shard); see the module docstring."""
    spec = _cell(db, task)
    q, _, classes, qcode, exclude = _query_block(db, spec, task.payload["block"])
    shard = _gallery_shard(db, spec, task.payload["shard"], q.shape[1])
    if task.payload["pass"] == 1:
        offsets, pos = gather_positives(q, qcode, classes, lambda: enumerate([shard]), exclude, DEFAULT_BLOCK, [])
        return None, {"offsets": offsets, "pos": pos}
    offsets, pos = _merged_positives(db, task.upstream, len(q))
    want_cnt = _wants_counts(spec)
    cnt = np.zeros(offsets[-1] + len(q) if want_cnt else 0, np.int64)
    neg_ge, neg_gt = np.zeros(len(q), np.int64), np.zeros(len(q), np.int64)
    gcode = label_codes(classes, shard.labels)
    for rows, sims in shard_blocks(q, shard, exclude, DEFAULT_BLOCK, None):
        count_kernel(sims, rows.start, qcode, gcode, offsets, pos, cnt, neg_ge, neg_gt, want_cnt)
    return None, {"cnt": cnt, "neg_ge": neg_ge, "neg_gt": neg_gt}


def _reduce(db: Engine, task: Task) -> tuple[dict[str, Any], None]:
    """Sum each block's counts over its shards, then the cell's metrics (memory: one block's counts at a time)."""
    spec = _cell(db, task)
    with session_scope(db) as s:
        searches = s.execute(select(Task.id, Task.payload).where(Task.id.in_(task.upstream)).order_by(Task.id)).all()
    by_block: dict[tuple[int, int], dict[int, list[int]]] = {}
    for task_id, payload in searches:
        by_block.setdefault(tuple(payload["block"]), {1: [], 2: []})[payload["pass"]].append(task_id)
    want_cnt, map_k = _wants_counts(spec), int(spec["map_at"] or 0)
    parts = []
    for (lo, hi), ids in sorted(by_block.items()):
        offsets, pos = _merged_positives(db, ids[1], hi - lo)
        with session_scope(db) as s:
            counts = task_arrays(s, ids[2])
        total = {key: sum(c[key] for c in counts) for key in ("cnt", "neg_ge", "neg_gt")}
        ap, ap_k = (ap_kernel(offsets, pos, total["cnt"], map_k) if want_cnt
                    else (np.full(hi - lo, np.nan), np.full(hi - lo, np.nan)))
        parts.append(QueryStats(np.diff(offsets), total["neg_ge"], total["neg_gt"], ap, ap_k))
    metrics = metrics_from_stats(QueryStats.concat(parts), ks=tuple(spec["ks"]), map_at=spec["map_at"],
                                 want_map=spec["compute_map"], ties=spec["ties"])
    shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
    return {"metrics": metrics, "message": f"cell done: {shown}"}, None


Handler = Callable[[Engine, Task], tuple[dict[str, Any] | None, dict[str, np.ndarray] | None]]
TASK_HANDLERS: dict[str, Handler] = {"search": _search, "reduce": _reduce, "extract": extract_task, "commit": commit_task}


class _LeaseBeat(threading.Thread):
    """Extends a task's lease every third of it while its handler runs; stops when the lease is lost or the task's
    job was asked to stop (the renewal cancels the task: the handler's result is then written nowhere)."""

    def __init__(self, db: Engine, task: Task, lease_s: float):
        super().__init__(daemon=True)
        self.db, self.task, self.lease_s, self.done = db, task, lease_s, threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.lease_s / 3):
            with session_scope(self.db) as s:
                if not extend_lease(s, self.task.id, self.task.lease, self.lease_s):
                    return


def run_one_task(db: Engine, worker: str, *, has_gpu: bool, lease_s: float = LEASE_S,
                 handlers: Mapping[str, Handler] = TASK_HANDLERS) -> int | None:
    """Claim one task, run it and write its result under the lease; return its id (None when none is claimable)."""
    task = claim_task(db, worker, has_gpu=has_gpu, lease_s=lease_s)
    if task is None:
        return None
    beat = _LeaseBeat(db, task, lease_s)
    beat.start()
    try:
        handler = handlers.get(task.kind)
        if handler is None:
            raise ValueError(f"unknown task kind {task.kind!r}; known kinds: {', '.join(handlers)}")
        result, arrays = handler(db, task)
        beat.done.set()
        with session_scope(db) as s:
            complete_task(s, task.id, task.lease, result=result, arrays=arrays)
    except Exception as exc:  # the attempt fails, the worker lives on
        beat.done.set()
        with session_scope(db) as s:
            fail_task(s, task.id, task.lease, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
    return task.id


def run_tasks(db: Engine, worker_id: str, has_gpu: bool, stop: Stop, *, lease_s: float = LEASE_S,
              poll_s: float = 1.0, until_idle: bool = False, handlers: Mapping[str, Handler] = TASK_HANDLERS) -> int:
    """Run tasks until ``stop`` is set (``until_idle``: also once no task is queued or running); return how many ran."""
    ran = 0
    while not stop.is_set():
        if run_one_task(db, worker_id, has_gpu=has_gpu, lease_s=lease_s, handlers=handlers) is not None:
            ran += 1
            continue
        if until_idle:
            with session_scope(db) as s:
                if unfinished_tasks(s) == 0:
                    return ran
        stop.wait(poll_s)
    return ran


def serve_tasks(db: Engine, *, once: bool = False) -> int:
    """``python -m engine worker --tasks``: run tasks as ``host:pid`` (``once``: until none is left); return how many."""
    import torch

    init_db(db)
    return run_tasks(db, worker_name(), torch.cuda.is_available(), threading.Event(), until_idle=once)


__all__ = ["LEASE_S", "TASK_HANDLERS", "fan_out_cell", "feature_rows", "run_one_task", "run_tasks", "serve_tasks",
           "worker_name"]
