"""The job queue: the app enqueues and cancels, the engine worker claims, reports progress and finishes.

All functions take the caller's ``Session`` (wrap them in :func:`storage.session_scope`), except
:func:`claim_next_job`, which must run in its own transaction and therefore takes the ``Engine``.
"""
from __future__ import annotations

import secrets
import signal
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, or_, select, update
from sqlalchemy.orm import Session

from storage.db import session_scope
from storage.models import FINISHED_STATUSES, JOB_STATUSES, Experiment, Job, Study
from storage.repo import require_choice, require_row
from storage.types import utcnow

_CLAIM_BATCH = 16
STALE_PREFIX = "worker stopped"
CRASH_PREFIXES = (STALE_PREFIX, "worker killed", "worker exited")


class LeaseLost(Exception):
    """The worker no longer owns its job (failed as stale, retried, taken over): it must stop and write nothing."""

    def __init__(self, job_id: int):
        super().__init__(f"job {job_id} is no longer this worker's (failed as stale or taken over); stopping")
        self.job_id = job_id


def enqueue_job(
    session: Session,
    kind: str,
    payload: dict[str, Any],
    experiment_id: int | None = None,
    study_id: int | None = None,
) -> int:
    """Queue a job for the worker; return its id."""
    if experiment_id is not None:
        require_row(session, Experiment, experiment_id)
    if study_id is not None:
        require_row(session, Study, study_id)
    job = Job(kind=kind, payload=dict(payload), experiment_id=experiment_id, study_id=study_id, status="queued",
              progress=0.0, message="queued", cancel_requested=False)
    session.add(job)
    session.flush()
    return job.id


def claim_next_job(engine: Engine, worker_pid: int) -> Job | None:
    """Atomically move the oldest queued job to "running" for ``worker_pid`` and return it (``None`` if none).

    Each candidate is taken with ``UPDATE ... WHERE id = :id AND status = 'queued'``; a row count of 0
    means another worker got it first, so two workers never claim the same job. The claim writes a fresh
    random ``lease``: every later update by the worker names it, so a worker that lost the job (failed
    as stale, taken over) changes nothing. Commits on return.
    """
    with session_scope(engine) as session:
        while True:
            candidates = session.scalars(
                select(Job.id).where(Job.status == "queued").order_by(Job.created_at, Job.id).limit(_CLAIM_BATCH)
            ).all()
            if not candidates:
                return None
            for job_id in candidates:
                now = utcnow()
                claimed = session.execute(
                    update(Job)
                    .where(Job.id == job_id, Job.status == "queued")
                    .values(status="running", worker_pid=worker_pid, lease=secrets.token_hex(16), started_at=now,
                            heartbeat_at=now, message="started")
                    .execution_options(synchronize_session=False)
                )
                if claimed.rowcount == 1:
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
    return _leased_update(session, job_id, lease, progress=float(progress), message=message, heartbeat_at=utcnow())


def heartbeat(session: Session, job_id: int, *, lease: str) -> bool:
    """Tell the queue the worker is alive; False if the job is no longer this lease's."""
    return _leased_update(session, job_id, lease, heartbeat_at=utcnow())


def finish_job(session: Session, job_id: int, message: str = "done", *, lease: str, status: str = "done") -> bool:
    """Mark a job done (progress 1), or "cancelled" when the worker stopped on a cancel request.

    False (and nothing changed) when the job is no longer this lease's.
    """
    require_choice("final status", status, ("done", "cancelled"))
    now = utcnow()
    values: dict[str, Any] = {"progress": 1.0} if status == "done" else {}
    return _leased_update(session, job_id, lease, status=status, message=message, finished_at=now, heartbeat_at=now,
                          **values)


def fail_job(session: Session, job_id: int, error: str, message: str | None = None, *, lease: str) -> bool:
    """Mark a job failed with ``error`` (e.g. a traceback); the last progress message is kept unless given.

    False (and nothing changed) when the job is no longer this lease's.
    """
    values: dict[str, Any] = {} if message is None else {"message": message}
    return _leased_update(session, job_id, lease, status="failed", error=error, finished_at=utcnow(), **values)


def request_cancel(session: Session, job_id: int) -> str:
    """Ask for a job to stop; a queued job is cancelled at once. Returns the job's status afterwards."""
    job = require_row(session, Job, job_id)
    if job.status == "queued":
        job.status, job.finished_at, job.message = "cancelled", utcnow(), "cancelled before it started"
        job.cancel_requested = True
    elif job.status == "running":
        job.cancel_requested = True
    session.flush()
    return job.status


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

    The message says how long the worker has been silent and what it last reported. The job's
    running experiments (its own, and those of its study) are failed with the same text.
    """
    now = now or utcnow()
    failed = []
    for job in session.scalars(select(Job).where(Job.status == "running")):
        last_seen = job.heartbeat_at or job.started_at or job.created_at
        silent_s = (now - last_seen).total_seconds()
        if silent_s > max_age_s:
            _fail_running_job(session, job, f"{STALE_PREFIX} (no heartbeat for {silent_s:.0f} s)", now)
            failed.append(job.id)
    session.flush()
    return failed


def fail_jobs_of_worker(session: Session, worker_pid: int, reason: str) -> list[int]:
    """Fail the jobs still running under ``worker_pid`` (a worker that died) with ``reason``; return their ids.

    Their running experiments (own and of their study) are failed with the same text.
    """
    now = utcnow()
    jobs = list(session.scalars(select(Job).where(Job.status == "running", Job.worker_pid == worker_pid)))
    for job in jobs:
        _fail_running_job(session, job, reason, now)
    session.flush()
    return [job.id for job in jobs]


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
