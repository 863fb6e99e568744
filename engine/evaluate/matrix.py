"""A compatibility matrix evaluated through tasks: N workers share one matrix.

:func:`matrix_by_tasks` fans every comparable cell out as search and reduce tasks
(:func:`engine.evaluate.search_tasks.fan_out_cells`), takes part in the job itself (:func:`run_task_job`: the process
that asked runs the job's tasks too, so one machine alone finishes it; any ``python -m engine worker --tasks`` on
any machine pointed at the same database and feature store helps), then reads each cell's per-query statistics
and builds the :class:`~engine.metrics.compatibility.MatrixResult` with the same code as an in-process
evaluation (paired tests included). Cells are exact, so the matrices equal the in-process ones.

The process that fans the job out owns it (``storage.tasks``, "Owner"): while it waits, a thread renews its lease on
the job every third of ``$COMPATLAB_OWNER_LEASE_S`` (default 60 s); if it dies, the first worker that sees the lease
expired (by the database's clock) fails the job and its experiment and cancels its tasks.

The task graph searches instance galleries for Recall@k, mAP and mAP@k; pair verification (paper 002) is computed
in this process from the cells' features (``features``), as an in-process evaluation does.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

import torch
from sqlalchemy import Engine

from engine.core.fan_out import FanOut
from engine.evaluate.search_tasks import SEARCH_HANDLERS, STATS_FIELDS, CellSpec, fan_out_cells
from engine.tasks.loop import LEASE_S, Handler, TaskJobStopped, run_tasks, worker_name
from engine.metrics.compatibility import CellFeatures, CellStats, MatrixResult, compatibility_matrices
from engine.metrics.paired import PairedOptions
from engine.metrics.ranking import QueryStats
from engine.metrics.retrieval import VERIFICATION, parse_metric
from storage import session_scope
from storage.settings import OWNER_LEASE_S, read_setting
from storage.tasks import results_of_kind, task_job_state

OWNER_LEASE_ENV = OWNER_LEASE_S.name


def owner_lease_s() -> float:
    """Seconds a task job outlives its owner's last renewal: ``$COMPATLAB_OWNER_LEASE_S``, else the task lease."""
    value = read_setting(OWNER_LEASE_S)
    return LEASE_S if value is None else value


def run_task_job(db: Engine, job_id: int, *, should_stop: Callable[[], bool] | None = None, poll_s: float = 0.5,
                 owner_lease: str | None = None, handlers: Mapping[str, Handler] = SEARCH_HANDLERS) -> None:
    """Run ``job_id``'s tasks in this process until the job is done (other workers may take some meanwhile): the
    task loop (:func:`engine.tasks.loop.run_tasks`) with ``job_id``, as the job's owner when ``owner_lease`` is given
    (renewed every third of :func:`owner_lease_s`).

    ``should_stop`` asks the job to stop (:func:`storage.tasks.cancel_task_job`). Raises :class:`TaskJobStopped` when
    the job fails (with its error) or is cancelled; any other exception cancels the job before propagating.
    """
    run_tasks(db, worker_name(), torch.cuda.is_available(), threading.Event(), handlers=handlers, poll_s=poll_s,
              job_id=job_id, should_stop=should_stop, owner_lease=owner_lease,
              owner_lease_s=owner_lease_s() if owner_lease is not None else LEASE_S)


def cell_results(db: Engine, job_id: int) -> list[CellStats]:
    """Each cell's per-query statistics and query row ids, in the order the cells were fanned out."""
    with session_scope(db) as s:
        reduces = results_of_kind(s, job_id, "reduce")
    by_cell = {result["cell"]: arrays for result, arrays in reduces}
    return [CellStats(QueryStats(*(by_cell[i].get(f) for f in STATS_FIELDS)), by_cell[i]["ids"]) for i in sorted(by_cell)]


def matrix_by_tasks(db: Engine, cells: Callable[[int, int], CellSpec | None], num_models: int, *,
                    metrics: Sequence[str], ties: str = "pessimistic", paired: PairedOptions | None = None,
                    fan_out: FanOut = FanOut(), label: str = "", should_stop: Callable[[], bool] | None = None,
                    features: Callable[[int, int], CellFeatures] | None = None, same_set: bool = False,
                    experiment_id: int | None = None) -> MatrixResult:
    """Every lower-triangle cell ``cells(t, k)`` (None: not comparable) through tasks; see the module docstring.

    ``experiment_id``: the experiment the matrix is for, failed with the task job if this process dies.

    ``features(t, k)``: the cell's features, read only when a metric needs them (pair verification, which samples its
    pairs by ``same_set`` as the cells' ``CellSpec.same_set`` leaves each query's own item out).
    """
    parsed = [parse_metric(m) for m in metrics]
    verification = any(kind == VERIFICATION for kind, _ in parsed)
    if verification and features is None:
        raise ValueError("pair verification needs the cells' features: pass features=")
    if all(kind == VERIFICATION for kind, _ in parsed):  # nothing to search
        return compatibility_matrices(features, num_models=num_models, metrics=metrics, rank_ties=ties, paired=paired,
                                      same_set=same_set)
    ks = tuple(sorted({k for kind, k in parsed if kind == "recall"})) or (1,)
    map_k = next((k for kind, k in parsed if kind == "map" and k), None)
    specs = {(t, k): cells(t, k) for t in range(num_models) for k in range(t + 1)}
    positions = [tk for tk, spec in specs.items() if spec is not None]
    results: dict[tuple[int, int], CellStats] = {}
    if positions:
        job_id = fan_out_cells(db, [specs[tk] for tk in positions], ks=ks, map_at=map_k, ties=ties,
                               compute_map=any(kind == "map" for kind, _ in parsed), block_rows=fan_out.block_rows,
                               shard_rows=fan_out.shard_rows, label=label, experiment_id=experiment_id,
                               owner_lease_s=owner_lease_s())
        with session_scope(db) as s:
            lease = task_job_state(s, job_id).lease
        run_task_job(db, job_id, should_stop=should_stop, owner_lease=lease)
        results = dict(zip(positions, cell_results(db, job_id)))

    # the paired test's two-way interval (Recall@k, check-upgrade's) ranks each cell's features again: read them here
    two_way = paired is not None and features is not None and any(kind == "recall" for kind, _ in parsed)

    def cell(t: int, k: int) -> CellStats:
        if (t, k) not in results:
            return CellStats(None)
        done = results[(t, k)]
        return CellStats(done.stats, done.query_ids, features(t, k) if verification or two_way else None)

    return compatibility_matrices(cell, num_models=num_models, metrics=metrics, rank_ties=ties, paired=paired,
                                  same_set=same_set)


__all__ = ["OWNER_LEASE_ENV", "TaskJobStopped", "cell_results", "matrix_by_tasks", "owner_lease_s", "run_task_job"]
