"""Tasks: one job's work split into pieces that any number of workers, on any machines, share through the database.

A task job is created "running" with its tasks (:func:`create_task_job`); no worker claims the job itself. It is
known by having tasks (:func:`is_task_job`), and its kind is that of its first task (``search`` for cells evaluated
as search and reduce tasks, ``extract`` for an image set embedded as extract and commit tasks; rows written before
have the kind ``"cell"``), so the job list shows what it does. The job row carries what every job has: progress,
cancel, the experiment it computes for, the owner's lease. A task is claimable when it is queued with no dependency left (``deps_left`` counts the unfinished
tasks it waits for), or running under a lease that has expired (its worker died or hangs). GPU tasks go only to
workers that say they have one. Claims (:func:`claim_task`) take the engine, as :func:`storage.jobs.claim_next_job`:
``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the conditional ``UPDATE`` on SQLite; either way one claim wins.

Every later write names the claim's lease. A task's result is written in the same transaction that marks it done
(:func:`complete_task`), so a worker that lost its lease writes nothing and a half-done task shows no result.
A failed attempt queues the task again until ``max_attempts`` attempts; then the task fails, its job fails with
its error, and the job's other unfinished tasks are cancelled. When the last task is done the job is done.

Cancel (:func:`cancel_task_job`, through :func:`storage.jobs.request_cancel`): the job's queued tasks are cancelled at
once and no task of it is claimed again; a running task is cancelled when its worker next renews its lease, completes
or fails it (nothing it computed is written), or when its lease expires; the job ends "cancelled" once none runs.

Owner. A job created with ``owner_lease_s`` belongs to the process that created it (``python -m engine run --tasks``,
which waits for its result): the claim records its (host, boot id, pid), and the owner renews the job's
``lease_until`` (:func:`renew_owner_lease`). When the owner dies its lease runs out, and the next worker that looks
(:func:`claim_task`, :func:`storage.jobs.fail_stale_jobs`) fails the job and its experiment and cancels its tasks
(:func:`fail_orphaned_task_jobs`), so nobody finishes work nobody waits for. A job without an owner (extract tasks
queued from the command line) runs until its tasks end.

Parts. A job whose tasks write files into the feature store names their folders in its payload (``store_uri`` and
``part_folders``, keys under it); when the job fails or is cancelled those folders are deleted once that commits
(:func:`storage.featurestore.sweep_parts`), so a cancelled or failed job leaves no orphaned parts.

Time. Every lease deadline and heartbeat is the database's time (:func:`storage.clock.db_now`), never a worker's
clock: a worker whose clock runs ahead does not see a fresh lease as expired. ``now`` arguments (tests) are
database times too.
"""
from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import ColumnElement, Engine, and_, exists, func, or_, select, update
from sqlalchemy.orm import Session

from storage.clock import db_now
from storage import featurestore
from storage.db import session_scope
from storage.identity import identity
from storage.models import TASK_KINDS, Experiment, Job, Task
from storage.rows import require_choice

_CLAIM_BATCH = 16
DEFAULT_MAX_ATTEMPTS = 3
UNFINISHED = ("queued", "running")
STALE_PREFIX = "worker stopped"  # a job failed because whoever ran it went silent (storage.jobs.crashed_worker)


@dataclass(frozen=True)
class NewTask:
    """A task to create: ``after`` holds the indexes (in the list given to :func:`create_task_job`) it waits for."""

    kind: str
    payload: dict[str, Any]
    after: tuple[int, ...] = ()
    needs_gpu: bool = False


@dataclass
class TaskLine:
    """One line of a job's task board: how many tasks of a kind are in a state, on a worker (None: no worker)."""

    state: str
    kind: str
    worker: str | None
    count: int
    task_ids: list[int] = field(default_factory=list)
    error: str | None = None  # the first error among these tasks (failed ones; retried ones keep their last)


def create_task_job(session: Session, payload: dict[str, Any], tasks: Sequence[NewTask], *,
                    max_attempts: int = DEFAULT_MAX_ATTEMPTS, message: str = "", experiment_id: int | None = None,
                    owner_lease_s: float | None = None) -> int:
    """Create a running task job and its tasks; return the job id. The job's kind is its first task's.

    ``experiment_id``: the experiment the job computes for (failed with it when its owner dies).
    ``owner_lease_s``: this process owns the job under a lease of that many seconds (see the module docstring);
    read the lease token from the job's ``lease`` and renew it with :func:`renew_owner_lease`.
    ``ValueError`` (nothing created) for an unknown kind, a dependency that is not an earlier task, or no task.
    """
    if not tasks:
        raise ValueError("a task job needs at least one task")
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    for index, task in enumerate(tasks):
        require_choice("task kind", task.kind, TASK_KINDS)
        if any(not 0 <= before < index for before in task.after) or len(set(task.after)) != len(task.after):
            raise ValueError(f"task {index} waits for {list(task.after)}: a task may wait only for distinct earlier tasks")
    if owner_lease_s is not None and not owner_lease_s > 0:
        raise ValueError(f"owner_lease_s must be a positive number of seconds, got {owner_lease_s!r}")
    now = db_now(session)
    job = Job(kind=tasks[0].kind, payload=dict(payload), status="running", progress=0.0, started_at=now,
              heartbeat_at=now, message=message or f"{len(tasks)} tasks queued", cancel_requested=False,
              experiment_id=experiment_id, created_at=now)
    if owner_lease_s is not None:
        owner = identity()
        job.worker_pid, job.worker_host, job.worker_boot_id = owner.pid, owner.host, owner.boot_id
        job.lease, job.lease_until = secrets.token_hex(16), now + timedelta(seconds=owner_lease_s)
    session.add(job)
    session.flush()
    rows = [Task(job_id=job.id, kind=t.kind, payload=dict(t.payload), state="queued", deps_left=len(t.after),
                 upstream=[], downstream=[], needs_gpu=t.needs_gpu, attempts=0, max_attempts=max_attempts) for t in tasks]
    session.add_all(rows)
    session.flush()
    for row, task in zip(rows, tasks):
        row.upstream = [rows[before].id for before in task.after]
        for before in task.after:
            rows[before].downstream = [*rows[before].downstream, row.id]
    session.flush()
    return job.id


def is_task_job() -> ColumnElement[bool]:
    """The condition on ``Job`` rows that holds for task jobs: those that have tasks (whatever their kind)."""
    return exists().where(Task.job_id == Job.id)


def _claimable(now: datetime, has_gpu: bool, job_id: int | None = None):
    """Queued with nothing left to wait for, or running under an expired lease; of a running job (``job_id``'s when
    given); GPU if needed."""
    ready = or_(and_(Task.state == "queued", Task.deps_left == 0),
                and_(Task.state == "running", Task.lease_until < now))
    live_jobs = select(Job.id).where(Job.status == "running", Job.cancel_requested.is_(False))
    if job_id is not None:
        live_jobs = live_jobs.where(Job.id == job_id)
    condition = and_(ready, Task.job_id.in_(live_jobs))
    return condition if has_gpu else and_(condition, Task.needs_gpu.is_(False))


def claim_task(engine: Engine, worker: str, *, has_gpu: bool, lease_s: float, now: datetime | None = None,
               job_id: int | None = None) -> Task | None:
    """Take the oldest claimable task (of job ``job_id`` when given) for ``worker`` (``host:pid``) under a fresh lease
    of ``lease_s`` seconds.

    None when nothing is claimable. Task jobs asked to stop are settled first (:func:`settle_cancelled_jobs`), and
    task jobs whose owner died are failed (:func:`fail_orphaned_task_jobs`). A task whose lease expired after its
    last allowed attempt is failed (with its job) instead of being claimed again. Commits on return.
    """
    if not lease_s > 0:
        raise ValueError(f"lease_s must be a positive number of seconds, got {lease_s!r}")
    with session_scope(engine) as session:
        now = now or db_now(session)
        candidates = select(Task.id).where(_claimable(now, has_gpu, job_id)).order_by(Task.id)
        if settle_cancelled_jobs(session, now) + fail_orphaned_task_jobs(session, now):
            session.commit()
        while True:
            if engine.dialect.name == "postgresql":
                ids = session.scalars(candidates.limit(1).with_for_update(skip_locked=True)).all()
            else:
                ids = session.scalars(candidates.limit(_CLAIM_BATCH)).all()
            if not ids:
                return None
            for task_id in ids:
                task = session.get(Task, task_id, populate_existing=True)
                if task.state == "running" and task.attempts >= task.max_attempts:
                    session.rollback()  # release the row: failing locks the job first, as every job-wide write does
                    _give_up(session, task_id, now)
                    session.commit()
                    break
                taken = _take(session, task_id, worker, has_gpu, lease_s, now)
                if taken is not None:
                    return taken


def _take(session: Session, task_id: int, worker: str, has_gpu: bool, lease_s: float, now: datetime) -> Task | None:
    """Claim ``task_id`` if it is still claimable (None when another worker got it first)."""
    claimed = session.execute(
        update(Task).where(Task.id == task_id, _claimable(now, has_gpu))
        .values(state="running", worker=worker, lease=secrets.token_hex(16), lease_until=now + timedelta(seconds=lease_s),
                heartbeat_at=now, started_at=now, attempts=Task.attempts + 1)
        .execution_options(synchronize_session=False))
    return session.get(Task, task_id, populate_existing=True) if claimed.rowcount == 1 else None


def _give_up(session: Session, task_id: int, now: datetime) -> None:
    """Fail a task whose lease expired on its last allowed attempt (if it still has), and its job."""
    task = session.get(Task, task_id, populate_existing=True)
    _lock_job(session, task.job_id, now)
    error = f"worker {task.worker} stopped answering (lease expired) on attempt {task.attempts} of {task.max_attempts}"
    _fail(session, task, task.lease, error, now, Task.lease_until < now)


def _leased(task_id: int, lease: str):
    return and_(Task.id == task_id, Task.lease == lease, Task.state == "running")


def extend_lease(session: Session, task_id: int, lease: str, lease_s: float) -> bool:
    """Heartbeat: the lease runs ``lease_s`` seconds from now; False when the task is no longer this lease's.

    A task whose job was asked to stop is cancelled instead (False): its worker stops and writes nothing.
    """
    now = db_now(session)
    live = select(Job.id).where(Job.cancel_requested.is_(False))
    result = session.execute(update(Task).where(_leased(task_id, lease), Task.job_id.in_(live))
                             .values(heartbeat_at=now, lease_until=now + timedelta(seconds=lease_s))
                             .execution_options(synchronize_session=False))
    if result.rowcount == 1:
        return True
    _cancelled_under(session, task_id, lease, now)
    return False


def _cancelled_under(session: Session, task_id: int, lease: str, now: datetime) -> bool:
    """If the task's job was asked to stop: cancel the task (while it runs under ``lease``), settle the job, True."""
    job_id = session.scalar(select(Task.job_id).where(Task.id == task_id))
    if job_id is None or not session.scalar(select(Job.cancel_requested).where(Job.id == job_id)):
        return False
    _lock_job(session, job_id, now)
    session.execute(update(Task).where(_leased(task_id, lease))
                    .values(state="cancelled", finished_at=now, lease_until=None)
                    .execution_options(synchronize_session=False))
    _settle_cancel(session, job_id, now)
    return True


def _settle_cancel(session: Session, job_id: int, now: datetime) -> str:
    """Cancel a stopping job's queued tasks and its running ones whose lease expired; end the job "cancelled" once
    none runs. The caller has locked the job row. Returns the job's status."""
    session.execute(update(Task).where(Task.job_id == job_id, or_(
                        Task.state == "queued", and_(Task.state == "running", Task.lease_until < now)))
                    .values(state="cancelled", finished_at=now, lease=None, lease_until=None)
                    .execution_options(synchronize_session=False))
    running = session.scalar(select(func.count()).select_from(Task)
                             .where(Task.job_id == job_id, Task.state == "running")) or 0
    if running == 0:
        ended = session.execute(update(Job).where(Job.id == job_id, Job.status == "running")
                                .values(status="cancelled", finished_at=now, message="cancelled")
                                .execution_options(synchronize_session=False))
        if ended.rowcount == 1:
            _discard_parts(session, job_id)
    else:
        session.execute(update(Job).where(Job.id == job_id, Job.status == "running")
                        .values(message=f"cancel requested: waiting for {running} running task(s) to stop")
                        .execution_options(synchronize_session=False))
    return session.scalar(select(Job.status).where(Job.id == job_id))


def cancel_task_job(session: Session, job_id: int) -> str:
    """Ask a running task job to stop (see the module docstring); returns the job's status afterwards."""
    now = db_now(session)
    _lock_job(session, job_id, now, cancel_requested=True)
    return _settle_cancel(session, job_id, now)


def settle_cancelled_jobs(session: Session, now: datetime | None = None) -> list[int]:
    """Settle every running task job asked to stop (its tasks' leases may have expired since); return their ids."""
    now = now or db_now(session)
    ids = session.scalars(select(Job.id).where(is_task_job(), Job.status == "running",
                                               Job.cancel_requested.is_(True))).all()
    for job_id in ids:
        _lock_job(session, job_id, now)
        _settle_cancel(session, job_id, now)
    return list(ids)


def renew_owner_lease(session: Session, job_id: int, lease: str, lease_s: float) -> bool:
    """The owner's heartbeat: its lease on the task job runs ``lease_s`` seconds from now (the database's time);
    False when the job no longer runs under ``lease`` (finished, failed, or failed as orphaned)."""
    now = db_now(session)
    renewed = session.execute(update(Job).where(Job.id == job_id, Job.lease == lease, Job.status == "running")
                              .values(lease_until=now + timedelta(seconds=lease_s))
                              .execution_options(synchronize_session=False))
    return renewed.rowcount == 1


def fail_orphaned_task_jobs(session: Session, now: datetime | None = None) -> list[int]:
    """Fail every running task job whose owner's lease expired (the owner died), with its experiment; cancel its
    unfinished tasks. Return the failed jobs' ids."""
    now = now or db_now(session)
    orphaned = select(Job.id).where(is_task_job(), Job.status == "running", Job.lease_until < now)
    failed = []
    for job_id in session.scalars(orphaned).all():
        _lock_job(session, job_id, now)
        job = session.get(Job, job_id, populate_existing=True)
        if job.status != "running" or job.lease_until is None or job.lease_until >= now:
            continue  # renewed or ended meanwhile
        silent = (now - job.lease_until).total_seconds()
        text = (f"{STALE_PREFIX} (the process that owns task job {job_id}, {job.worker_host}:{job.worker_pid}, let "
                f"its lease expire {silent:.0f} s ago); its unfinished tasks were cancelled")
        session.execute(update(Task).where(Task.job_id == job_id, Task.state.in_(UNFINISHED))
                        .values(state="cancelled", finished_at=now, lease=None, lease_until=None)
                        .execution_options(synchronize_session=False))
        session.execute(update(Job).where(Job.id == job_id)
                        .values(status="failed", error=text, message=text[:500], finished_at=now)
                        .execution_options(synchronize_session=False))
        _discard_parts(session, job_id)
        if job.experiment_id is not None:
            session.execute(update(Experiment).where(Experiment.id == job.experiment_id,
                                                     Experiment.status == "running")
                            .values(status="failed", error=text, finished_at=now)
                            .execution_options(synchronize_session=False))
        failed.append(job_id)
    return failed


def _discard_parts(session: Session, job_id: int) -> None:
    """Delete, once the session commits, the part folders a job that ended without a result names (module docstring)."""
    payload = session.scalar(select(Job.payload).where(Job.id == job_id)) or {}
    for key in payload.get("part_folders") or ():
        featurestore.sweep_parts(session, payload["store_uri"], key)


def _lock_job(session: Session, job_id: int, now: datetime, **values: Any) -> None:
    """Update (and so lock) the job row first: a job's completions and failures take turns, so the last one sees all."""
    session.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=now, **values)
                    .execution_options(synchronize_session=False))


def complete_task(session: Session, task_id: int, lease: str, *, result: dict[str, Any] | None = None,
                  arrays: dict[str, np.ndarray] | None = None) -> bool:
    """Mark the task done with its result, count its downstream tasks down, and finish the job after its last task.

    False (nothing written) when the task is no longer this lease's.
    """
    job_id = session.scalar(select(Task.job_id).where(Task.id == task_id))
    if job_id is None:
        return False
    now = db_now(session)
    _lock_job(session, job_id, now)
    if _cancelled_under(session, task_id, lease, now):
        return False
    done = session.execute(update(Task).where(_leased(task_id, lease))
                           .values(state="done", result=result, arrays=arrays, finished_at=now, lease_until=None)
                           .execution_options(synchronize_session=False))
    if done.rowcount != 1:
        return False
    downstream = session.scalar(select(Task.downstream).where(Task.id == task_id)) or []
    if downstream:
        session.execute(update(Task).where(Task.id.in_(downstream)).values(deps_left=Task.deps_left - 1)
                        .execution_options(synchronize_session=False))
    counts = dict(session.execute(select(Task.state, func.count()).where(Task.job_id == job_id).group_by(Task.state)).all())
    total, finished = sum(counts.values()), counts.get("done", 0)
    values: dict[str, Any] = {"progress": finished / total, "message": f"{finished} of {total} tasks done"}
    if finished == total:
        values |= {"status": "done", "progress": 1.0, "finished_at": now,
                   "message": str((result or {}).get("message", "done"))[:500]}
    session.execute(update(Job).where(Job.id == job_id, Job.status == "running").values(**values)
                    .execution_options(synchronize_session=False))
    return True


def fail_task(session: Session, task_id: int, lease: str, error: str) -> str | None:
    """Record a failed attempt: queued again while attempts are left, else failed with its job.

    Returns the task's new state ("cancelled" when its job was asked to stop), or None when the task is no longer
    this lease's.
    """
    task = session.get(Task, task_id, populate_existing=True)
    if task is None or task.lease != lease or task.state != "running":
        return None
    now = db_now(session)
    _lock_job(session, task.job_id, now)
    if _cancelled_under(session, task_id, lease, now):
        return "cancelled"
    if task.attempts < task.max_attempts:
        retried = session.execute(update(Task).where(_leased(task_id, lease))
                                  .values(state="queued", error=error, lease=None, lease_until=None)
                                  .execution_options(synchronize_session=False))
        return "queued" if retried.rowcount == 1 else None
    return "failed" if _fail(session, task, lease, error, now) else None


def _fail(session: Session, task: Task, lease: str | None, error: str, now: datetime, *conditions: Any) -> bool:
    """Fail the task (while it runs under ``lease``) and its job with the error; cancel the job's unfinished tasks.

    The caller has locked the job row (:func:`_lock_job`) first.
    """
    failed = session.execute(update(Task).where(_leased(task.id, lease), *conditions)
                             .values(state="failed", error=error, finished_at=now, lease_until=None)
                             .execution_options(synchronize_session=False))
    if failed.rowcount != 1:
        return False
    text = f"task {task.id} ({task.kind}) failed after {task.attempts} attempt(s): {error}"
    session.execute(update(Task).where(Task.job_id == task.job_id, Task.state.in_(UNFINISHED))
                    .values(state="cancelled", finished_at=now, lease=None, lease_until=None)
                    .execution_options(synchronize_session=False))
    ended = session.execute(update(Job).where(Job.id == task.job_id, Job.status == "running")
                            .values(status="failed", error=text, message=text.splitlines()[0][:500], finished_at=now)
                            .execution_options(synchronize_session=False))
    if ended.rowcount == 1:
        _discard_parts(session, task.job_id)
    return True


def task_payloads(session: Session, task_ids: Sequence[int]) -> list[tuple[int, dict[str, Any]]]:
    """``(id, payload)`` of the given tasks, by id."""
    query = select(Task.id, Task.payload).where(Task.id.in_(list(task_ids))).order_by(Task.id)
    return [(task_id, payload) for task_id, payload in session.execute(query).all()]


def task_results(session: Session, task_ids: Sequence[int]) -> list[dict[str, Any]]:
    """The results of done tasks, in the order of ``task_ids``; ``ValueError`` if one is not done."""
    rows = dict(session.execute(select(Task.id, Task.result).where(Task.id.in_(list(task_ids)), Task.state == "done")).all())
    missing = [i for i in task_ids if i not in rows]
    if missing:
        raise ValueError(f"tasks {missing} are not done; their results are not available")
    return [rows[i] or {} for i in task_ids]


def task_arrays(session: Session, task_ids: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """The stored arrays of done tasks, in the order of ``task_ids``; ``ValueError`` if one is not done."""
    rows = dict(session.execute(select(Task.id, Task.arrays).where(Task.id.in_(list(task_ids)), Task.state == "done")).all())
    missing = [i for i in task_ids if i not in rows]
    if missing:
        raise ValueError(f"tasks {missing} are not done; their results are not available")
    return [rows[i] or {} for i in task_ids]


def results_of_kind(session: Session, job_id: int, kind: str) -> list[tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """``(result, arrays)`` of each done task of one kind of a job, in creation order (e.g. every cell's reduce)."""
    query = (select(Task.result, Task.arrays).where(Task.job_id == job_id, Task.kind == kind, Task.state == "done")
             .order_by(Task.id))
    return [(result or {}, arrays or {}) for result, arrays in session.execute(query).all()]


def unfinished_tasks(session: Session) -> int:
    """How many tasks of running jobs are queued or running (a worker told to stop when idle waits for these)."""
    live = select(Job.id).where(Job.status == "running")
    return session.scalar(select(func.count()).select_from(Task)
                          .where(Task.state.in_(UNFINISHED), Task.job_id.in_(live))) or 0


class TaskJobState(NamedTuple):
    """Where a task job stands, as its owner polls it."""

    status: str
    error: str | None
    cancel_requested: bool
    lease: str | None


def task_job_state(session: Session, job_id: int) -> TaskJobState:
    """A task job's status, error, whether it was asked to stop, and its owner's lease token."""
    job = session.get(Job, job_id, populate_existing=True)
    return TaskJobState(job.status, job.error, bool(job.cancel_requested), job.lease)


def task_kinds_of_jobs(session: Session, job_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """For each of these jobs that has tasks: how many tasks of each kind (in ``TASK_KINDS`` order); others absent."""
    counts: dict[int, dict[str, int]] = {}
    query = (select(Task.job_id, Task.kind, func.count()).where(Task.job_id.in_(list(job_ids)))
             .group_by(Task.job_id, Task.kind))
    for job_id, kind, count in session.execute(query).all():
        counts.setdefault(job_id, {})[kind] = count
    order = {kind: i for i, kind in enumerate(TASK_KINDS)}
    return {job_id: dict(sorted(kinds.items(), key=lambda kv: order.get(kv[0], len(order))))
            for job_id, kinds in counts.items()}


def job_payload(session: Session, job_id: int) -> dict[str, Any]:
    """A task job's payload: what its fan-out recorded for every task (cells, a model and images, ...)."""
    return dict(session.get(Job, job_id).payload)


def job_result(session: Session, job_id: int) -> dict[str, Any] | None:
    """The result of a task job's last task (its reduce) once the job is done; None before."""
    job = session.get(Job, job_id)
    if job is None or job.status != "done":
        return None
    return session.scalar(select(Task.result).where(Task.job_id == job_id).order_by(Task.id.desc()).limit(1))


class TaskBoard(NamedTuple):
    """Where a job's tasks are: counts by state, and lines by (state, kind, worker)."""

    counts: dict[str, int]
    lines: list[TaskLine]


def task_board(session: Session, job_id: int) -> TaskBoard:
    """A job's tasks by state and worker (queued, waiting or not; running on which worker; done; failed with errors).

    For the dashboard: lines are ordered running, queued, failed, cancelled, done, then by kind and worker.
    """
    order = {"running": 0, "queued": 1, "failed": 2, "cancelled": 3, "done": 4}
    lines: dict[tuple[str, str, str | None], TaskLine] = {}
    counts: dict[str, int] = {}
    for task_id, state, kind, worker, error in session.execute(
            select(Task.id, Task.state, Task.kind, Task.worker, Task.error).where(Task.job_id == job_id).order_by(Task.id)):
        shown = worker if state != "queued" else None
        line = lines.setdefault((state, kind, shown), TaskLine(state, kind, shown, 0))
        line.count += 1
        line.task_ids.append(task_id)
        line.error = line.error or error
        counts[state] = counts.get(state, 0) + 1
    ranked = sorted(lines.values(), key=lambda line: (order[line.state], line.kind, line.worker or ""))
    return TaskBoard(counts, ranked)


__all__ = ["DEFAULT_MAX_ATTEMPTS", "NewTask", "TaskBoard", "TaskJobState", "TaskLine", "cancel_task_job", "claim_task",
           "complete_task", "create_task_job", "extend_lease", "fail_orphaned_task_jobs", "fail_task", "is_task_job",
           "job_result", "renew_owner_lease", "settle_cancelled_jobs", "task_arrays", "task_board", "task_job_state",
           "task_kinds_of_jobs", "task_payloads", "task_results", "unfinished_tasks"]
