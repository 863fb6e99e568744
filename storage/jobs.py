"""The job queue: the app enqueues and cancels, the engine worker claims, reports progress and finishes.

All functions take the caller's ``Session`` (wrap them in :func:`storage.session_scope`), except
:func:`claim_next_job`, which must run in its own transaction and therefore takes the ``Engine``.

Lanes: a worker may claim only some kinds (``claim_next_job(..., kinds=...)``), so short jobs get a worker
of their own, and takes the queued job of the lowest priority number first (``priority=``, the oldest among
equals); :func:`queue_positions` numbers each queued job within its lane in that claim order. Identical
launches: every job stores :func:`payload_hash` of its kind and payload, and :func:`find_identical_job`
finds one already queued, running or done.

Time and identity: heartbeats and staleness are read from the database's clock (:func:`storage.clock.db_now`), never
the worker's, so a worker whose clock is off cannot fail a healthy job. A claim records the claiming process's
(host, boot id, pid) (:mod:`storage.identity`): a supervisor that saw its child die fails only that child's jobs.
"""
from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Engine, case, func, or_, select, update
from sqlalchemy.orm import Session

from storage.clock import db_now
from storage.db import json_hash, session_scope
from storage.identity import WorkerIdentity, identity
from storage.models import FINISHED_STATUSES, JOB_STATUSES, TASK_JOB_KINDS, Experiment, Job, Study
from storage.rows import require_choice, require_row
from storage.types import utcnow

_CLAIM_BATCH = 16
STALE_PREFIX = "worker stopped"  # a job failed because whoever ran it went silent (crashed_worker)
CRASH_PREFIXES = (STALE_PREFIX, "worker killed", "worker exited")
IDENTICAL_STATUSES = ("queued", "running", "done")  # a launch identical to one of these is refused unless forced
MIN_ETA_PROGRESS = 0.01  # below this fraction an estimate of the time left is noise


class LeaseLost(Exception):
    """The worker no longer owns its job (failed as stale, retried, taken over): it must stop and write nothing."""

    def __init__(self, job_id: int):
        super().__init__(f"job {job_id} is no longer this worker's (failed as stale or taken over); stopping")
        self.job_id = job_id


class IdenticalJob(ValueError):
    """A launch identical (same kind and payload) to a job already queued, running or done."""

    def __init__(self, job: Job):
        state = {"queued": "is already queued", "running": "is running now", "done": "has already run"}[job.status]
        super().__init__(f"an identical {job.kind} job (#{job.id}) {state}; launch it again only to repeat it")
        self.job_id, self.status = job.id, job.status


def payload_hash(kind: str, payload: dict[str, Any]) -> str:
    """The hash that makes two jobs identical: their kind and payload (key order does not matter)."""
    return json_hash({"kind": kind, "payload": payload})


def find_identical_job(session: Session, kind: str, payload: dict[str, Any]) -> Job | None:
    """A job with this kind and payload that is queued, running or done (an active one first, else the newest)."""
    rows = session.scalars(select(Job).where(Job.kind == kind, Job.payload_hash == payload_hash(kind, payload),
                                             Job.status.in_(IDENTICAL_STATUSES))).all()
    return min(rows, key=lambda j: (j.status == "done", -j.id), default=None)


def enqueue_job(
    session: Session,
    kind: str,
    payload: dict[str, Any],
    experiment_id: int | None = None,
    study_id: int | None = None,
    *,
    allow_identical: bool = True,
) -> int:
    """Queue a job for the worker; return its id.

    With ``allow_identical=False`` a job identical to one queued, running or done raises :class:`IdenticalJob`
    and nothing is queued (the dashboard's launches; the user may then force it).
    """
    if experiment_id is not None:
        require_row(session, Experiment, experiment_id)
    if study_id is not None:
        require_row(session, Study, study_id)
    if not allow_identical and (same := find_identical_job(session, kind, payload)) is not None:
        raise IdenticalJob(same)
    job = Job(kind=kind, payload=dict(payload), payload_hash=payload_hash(kind, payload), experiment_id=experiment_id,
              study_id=study_id, status="queued", progress=0.0, message="queued", cancel_requested=False,
              created_at=db_now(session))  # the queue's order: one clock for every machine
    session.add(job)
    session.flush()
    return job.id


def claim_order(priority: Mapping[str, int] | None = None) -> list[Any]:
    """The ORDER BY of claims: ``priority[kind]`` ascending (kinds not listed last) when given, then oldest first."""
    age = [Job.created_at, Job.id]
    if not priority:
        return age
    return [case(dict(priority), value=Job.kind, else_=max(priority.values()) + 1), *age]


def claim_next_job(engine: Engine, worker_pid: int | WorkerIdentity, *, kinds: Collection[str] | None = None,
                   priority: Mapping[str, int] | None = None) -> Job | None:
    """Atomically move the first queued job in claim order to "running" for ``worker_pid`` and return it (``None`` if
    none).

    ``worker_pid``: a process of this machine, or a full :class:`~storage.identity.WorkerIdentity`; the claim records
    its host, boot id and pid.

    ``kinds``: claim only jobs of these kinds (a lane's worker); every kind when None. ``priority``: kind -> number,
    lower claimed first (``engine.core.contract.JOB_PRIORITY``); the oldest job first among equals, or always when None.

    On PostgreSQL the oldest queued job is selected ``FOR UPDATE SKIP LOCKED``: a row another worker is claiming
    is skipped, not waited for, so any number of workers claim side by side. On SQLite (one writer at a time)
    each candidate is taken with ``UPDATE ... WHERE id = :id AND status = 'queued'``; a row count of 0 means
    another worker got it first. Either way two workers never claim the same job. The claim writes a fresh
    random ``lease``: every later update by the worker names it, so a worker that lost the job (failed
    as stale, taken over) changes nothing. Commits on return.
    """
    queued = select(Job.id).where(Job.status == "queued")
    if kinds is not None:
        queued = queued.where(Job.kind.in_(list(kinds)))
    queued = queued.order_by(*claim_order(priority))
    worker = worker_pid if isinstance(worker_pid, WorkerIdentity) else identity(worker_pid)
    with session_scope(engine) as session:
        if engine.dialect.name == "postgresql":
            job_id = session.scalar(queued.limit(1).with_for_update(skip_locked=True))
            return None if job_id is None or not _take(session, job_id, worker) else _fresh(session, job_id)
        while True:
            candidates = session.scalars(queued.limit(_CLAIM_BATCH)).all()
            if not candidates:
                return None
            for job_id in candidates:
                if _take(session, job_id, worker):
                    return _fresh(session, job_id)


def _take(session: Session, job_id: int, worker: WorkerIdentity) -> bool:
    """Move job ``job_id`` from queued to running for ``worker``; False when it is no longer queued."""
    now = db_now(session)
    claimed = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == "queued")
        .values(status="running", worker_pid=worker.pid, worker_host=worker.host, worker_boot_id=worker.boot_id,
                lease=secrets.token_hex(16), started_at=now, heartbeat_at=now, message="started")
        .execution_options(synchronize_session=False)
    )
    return claimed.rowcount == 1


def _fresh(session: Session, job_id: int) -> Job:
    return session.get(Job, job_id, populate_existing=True)


def _leased_update(session: Session, job_id: int, lease: str, **values: Any) -> bool:
    """Update a job only while it runs under ``lease``; False when it does not (finished, failed as stale,
    or claimed again by another worker), so a worker that lost its job can never change it."""
    result = session.execute(
        update(Job).where(Job.id == job_id, Job.lease == lease, Job.status == "running").values(**values)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def update_job_progress(session: Session, job_id: int, progress: float, message: str, *, lease: str) -> bool:
    """Record progress in [0, 1] and a message, and beat the heart; False if the job is no longer this lease's."""
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress must be a fraction in [0, 1], got {progress!r}")
    return _leased_update(session, job_id, lease, progress=float(progress), message=message,
                          heartbeat_at=db_now(session))


def heartbeat(session: Session, job_id: int, *, lease: str) -> bool:
    """Tell the queue the worker is alive; False if the job is no longer this lease's."""
    return _leased_update(session, job_id, lease, heartbeat_at=db_now(session))


def finish_job(session: Session, job_id: int, message: str = "done", *, lease: str, status: str = "done") -> bool:
    """Mark a job done (progress 1), or "cancelled" when the worker stopped on a cancel request.

    False (and nothing changed) when the job is no longer this lease's.
    """
    require_choice("final status", status, ("done", "cancelled"))
    now = db_now(session)
    values: dict[str, Any] = {"progress": 1.0} if status == "done" else {}
    return _leased_update(session, job_id, lease, status=status, message=message, finished_at=now, heartbeat_at=now,
                          **values)


def fail_job(session: Session, job_id: int, error: str, message: str | None = None, *, lease: str) -> bool:
    """Mark a job failed with ``error`` (e.g. a traceback); the last progress message is kept unless given.

    False (and nothing changed) when the job is no longer this lease's.
    """
    values: dict[str, Any] = {} if message is None else {"message": message}
    return _leased_update(session, job_id, lease, status="failed", error=error, finished_at=db_now(session), **values)


def request_cancel(session: Session, job_id: int) -> str:
    """Ask for a job to stop; a queued job is cancelled at once. Returns the job's status afterwards."""
    job = require_row(session, Job, job_id)
    if job.status == "queued":
        job.status, job.finished_at, job.message = "cancelled", db_now(session), "cancelled before it started"
        job.cancel_requested = True
    elif job.status == "running":
        job.cancel_requested = True
    session.flush()
    return job.status


def cancel_experiment(session: Session, experiment_id: int) -> str:
    """Stop one running experiment of a study run and let the run go on with its other methods and seeds: it is
    marked cancelled at once, and the run discards what it wrote at its next check. Returns its status afterwards
    (unchanged when it is not running)."""
    experiment = require_row(session, Experiment, experiment_id)
    if experiment.status == "running":
        experiment.status, experiment.finished_at = "cancelled", utcnow()
        session.flush()
    return experiment.status


def is_cancel_requested(session: Session, job_id: int, *, lease: str | None = None) -> bool:
    """Whether someone asked this job to stop (the worker polls this between steps).

    With ``lease``: raises :class:`LeaseLost` when the job no longer runs under it.
    """
    row = session.execute(select(Job.cancel_requested, Job.status, Job.lease).where(Job.id == job_id)).first()
    if lease is not None and (row is None or row.status != "running" or row.lease != lease):
        raise LeaseLost(job_id)
    return bool(row and row.cancel_requested)


def _fail_running_job(session: Session, job: Job, reason: str, now: datetime) -> None:
    """Fail a running job whose worker is gone, and the running experiments it was working on."""
    text = f"{reason}; last message: {job.message or '(none)'}"
    job.status, job.message, job.error, job.finished_at = "failed", text, text, now
    experiments = select(Experiment).where(Experiment.status == "running")
    links = [Experiment.id == job.experiment_id] if job.experiment_id is not None else []
    if job.study_id is not None:
        links.append(Experiment.study_id == job.study_id)
    for experiment in session.scalars(experiments.where(or_(*links))) if links else ():
        experiment.status, experiment.error, experiment.finished_at = "failed", text, now


def fail_stale_jobs(session: Session, max_age_s: float, *, now: datetime | None = None) -> list[int]:
    """Fail running jobs whose last heartbeat is older than ``max_age_s`` seconds; return their ids.

    Ages are measured by the database's clock (``now``: a database time, for tests). The message says how long the
    worker has been silent and what it last reported. The job's running experiments (its own, and those of its
    study) are failed with the same text. A job that fans out on Dask beats its heart while it waits, like any other.
    """
    now = now or db_now(session)
    failed = []
    for job in session.scalars(select(Job).where(Job.status == "running")):
        last_seen = job.heartbeat_at or job.started_at or job.created_at
        silent_s = (now - last_seen).total_seconds()
        if silent_s > max_age_s:
            _fail_running_job(session, job, f"{STALE_PREFIX} (no heartbeat for {silent_s:.0f} s)", now)
            failed.append(job.id)
    session.flush()
    return failed


def fail_jobs_of_worker(session: Session, worker_pid: int | WorkerIdentity, reason: str) -> list[int]:
    """Fail the jobs still running under ``worker_pid`` (a worker that died) with ``reason``; return their ids.

    ``worker_pid``: a process of this machine (this host and boot), or a full identity. Only jobs claimed by that
    very (host, boot id, pid) are failed: the same pid on another machine sharing the database, or before a
    reboot, is another process. Their running experiments (own and of their study) are failed with the same text.
    """
    worker = worker_pid if isinstance(worker_pid, WorkerIdentity) else identity(worker_pid)
    now = db_now(session)
    jobs = list(session.scalars(select(Job).where(Job.status == "running", Job.worker_pid == worker.pid,
                                                  Job.worker_host == worker.host,
                                                  Job.worker_boot_id == worker.boot_id)))
    for job in jobs:
        _fail_running_job(session, job, reason, now)
    session.flush()
    return [job.id for job in jobs]


def running_jobs_here(session: Session) -> int:
    """How many jobs are running on this machine (this host and boot), whichever worker claimed them."""
    here = identity(os.getpid())
    return session.scalar(select(func.count()).select_from(Job).where(
        Job.status == "running", Job.worker_host == here.host, Job.worker_boot_id == here.boot_id)) or 0


def worker_exit_reason(returncode: int) -> str:
    """Why a worker process ended, from its return code (negative: killed by that signal)."""
    if returncode >= 0:
        return f"worker exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "unknown signal"
    oom = ", probably out of memory" if -returncode == signal.SIGKILL else ""
    return f"worker killed by signal {-returncode} ({name}){oom}"


def crashed_worker(job_error: str | None) -> bool:
    """Whether a failed job's error says its worker died (killed, exited, went silent), not the job itself."""
    return bool(job_error) and job_error.startswith(CRASH_PREFIXES)


def link_job_study(session: Session, job_id: int, study_id: int, *, lease: str) -> bool:
    """Record which study a running job works on (so a crash can fail its experiments)."""
    return _leased_update(session, job_id, lease, study_id=study_id)


def retry_job(session: Session, job_id: int) -> int:
    """Queue a new job with the same kind, payload and links as a finished one; return the new id."""
    job = require_row(session, Job, job_id)
    if job.status not in FINISHED_STATUSES:
        raise ValueError(f"job {job_id} is still {job.status}; cancel it or wait for it to finish before retrying")
    if job.kind in TASK_JOB_KINDS:  # the removed task layer's: no worker runs such a kind
        raise ValueError(f"job {job_id} ran as tasks of an older version; rerun the command or page action that "
                         "queued it")
    return enqueue_job(session, job.kind, dict(job.payload), experiment_id=job.experiment_id, study_id=job.study_id)


def list_jobs(
    session: Session,
    *,
    status: str | None = None,
    kind: str | None = None,
    experiment_id: int | None = None,
    study_id: int | None = None,
    limit: int | None = 100,
) -> list[Job]:
    """Jobs, newest first, optionally filtered."""
    query = select(Job)
    if status is not None:
        require_choice("status", status, JOB_STATUSES)
        query = query.where(Job.status == status)
    for column, wanted in ((Job.kind, kind), (Job.experiment_id, experiment_id), (Job.study_id, study_id)):
        if wanted is not None:
            query = query.where(column == wanted)
    return list(session.scalars(query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)))


class QueuePlace(NamedTuple):
    """Where a queued job waits: its lane and its 1-based position in that lane's queue."""

    lane: str
    position: int


def queue_positions(session: Session, lanes: Mapping[str, Sequence[str]], default_lane: str, *,
                    priority: Mapping[str, int] | None = None) -> dict[int, QueuePlace]:
    """Each queued job's lane (the lane listing its kind, else ``default_lane``) and position, in claim order
    (:func:`claim_order` with ``priority``)."""
    lane_of = {kind: lane for lane, kinds in lanes.items() for kind in kinds}
    counts: dict[str, int] = {}
    places = {}
    for job_id, kind in session.execute(
            select(Job.id, Job.kind).where(Job.status == "queued").order_by(*claim_order(priority))):
        lane = lane_of.get(kind, default_lane)
        counts[lane] = counts.get(lane, 0) + 1
        places[job_id] = QueuePlace(lane, counts[lane])
    return places


def job_remaining_s(progress: float, started_at: datetime | None, now: datetime, *, base: float = 0.0) -> float | None:
    """Seconds a running job still needs, from its stored progress and the time since it started (linear).

    ``base``: the share of the progress the job reached without working for it (a retried study reuses the
    experiments that had finished), so the rate is ``(progress - base) / elapsed`` and only what is left counts.
    None before the job has made ``MIN_ETA_PROGRESS`` of its own progress or without a start time.
    """
    if started_at is None or progress - base < MIN_ETA_PROGRESS:
        return None
    elapsed = max(0.0, (now - started_at).total_seconds())
    return elapsed * (1.0 - min(progress, 1.0)) / (progress - base)


def reused_share(session: Session, job: Job) -> float:
    """The share of a study run job's progress that it found done: the study's experiments (one per method and
    seed, from the study's config) that had finished before the job started, over all of them; 0 for other jobs."""
    study = session.get(Study, job.study_id) if job.kind == "run" and job.study_id is not None else None
    methods = (study.config or {}).get("methods") if study is not None else None
    if not methods or job.started_at is None:
        return 0.0
    runs = len(methods) * max(1, len(study.config.get("seeds") or ()))
    before = session.scalars(select(Experiment.finished_at).where(
        Experiment.study_id == study.id, Experiment.status == "done", Experiment.finished_at.is_not(None))).all()
    return min(1.0, sum(when <= job.started_at for when in before) / runs)


def _took_s(session: Session, job: Job) -> float | None:
    """How long the newest finished identical job took (the estimate of a queued job), or None."""
    done = session.execute(
        select(Job.started_at, Job.finished_at).where(Job.payload_hash == job.payload_hash, Job.status == "done",
                                                      Job.started_at.is_not(None), Job.finished_at.is_not(None))
        .order_by(Job.finished_at.desc()).limit(1)).first()
    return None if done is None else (done.finished_at - done.started_at).total_seconds()


def study_remaining_s(session: Session, study_id: int, *, now: datetime | None = None) -> float | None:
    """Seconds until every queued or running job of a study is done; None when nothing is active or any job has no
    estimate yet.

    A run job trains all the study's methods and seeds, and its progress covers them all, so its estimate is the
    whole study's, not the current method's. A running job: :func:`job_remaining_s` of the progress it made itself
    (a retry's reused experiments, :func:`reused_share`, are not counted as speed); a queued one (a retry): how
    long its last identical run took.
    """
    now = now or utcnow()
    active = session.scalars(select(Job).where(Job.study_id == study_id, Job.status.in_(("queued", "running")))).all()
    if not active:
        return None
    total = 0.0
    for job in active:
        left = (job_remaining_s(job.progress, job.started_at, now, base=reused_share(session, job))
                if job.status == "running" else _took_s(session, job))
        if left is None:
            return None
        total += left
    return total
