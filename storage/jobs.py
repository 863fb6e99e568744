"""The job queue: the app enqueues and cancels, the engine worker claims, reports progress and finishes.

All functions take the caller's ``Session`` (wrap them in :func:`storage.session_scope`), except
:func:`claim_next_job`, which must run in its own transaction and therefore takes the ``Engine``.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from storage.db import session_scope
from storage.models import FINISHED_STATUSES, JOB_STATUSES, Experiment, Job, Study
from storage.repo import require_choice, require_row
from storage.types import utcnow

_CLAIM_BATCH = 16


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
    means another worker got it first, so two workers never claim the same job. Commits on return.
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
                    .values(status="running", worker_pid=worker_pid, started_at=now, heartbeat_at=now,
                            message="started")
                    .execution_options(synchronize_session=False)
                )
                if claimed.rowcount == 1:
                    return session.get(Job, job_id, populate_existing=True)


def _running_update(session: Session, job_id: int, **values: Any) -> bool:
    """Update a job only while it is running; False when it is not (finished, failed as stale, ...)."""
    result = session.execute(
        update(Job).where(Job.id == job_id, Job.status == "running").values(**values)
    )
    return result.rowcount == 1


def update_job_progress(session: Session, job_id: int, progress: float, message: str) -> bool:
    """Record progress in [0, 1] and a message, and beat the heart; False if the job is no longer running."""
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress must be a fraction in [0, 1], got {progress!r}")
    return _running_update(session, job_id, progress=float(progress), message=message, heartbeat_at=utcnow())


def heartbeat(session: Session, job_id: int) -> bool:
    """Tell the queue the worker is alive; False if the job is no longer running."""
    return _running_update(session, job_id, heartbeat_at=utcnow())


def finish_job(session: Session, job_id: int, message: str = "done", *, status: str = "done") -> None:
    """Mark a job done (progress 1), or "cancelled" when the worker stopped on a cancel request."""
    require_choice("final status", status, ("done", "cancelled"))
    job = require_row(session, Job, job_id)
    now = utcnow()
    job.status, job.message, job.finished_at, job.heartbeat_at = status, message, now, now
    if status == "done":
        job.progress = 1.0
    session.flush()


def fail_job(session: Session, job_id: int, error: str, message: str | None = None) -> None:
    """Mark a job failed with ``error`` (e.g. a traceback); the last progress message is kept unless given."""
    job = require_row(session, Job, job_id)
    job.status, job.error, job.finished_at = "failed", error, utcnow()
    if message is not None:
        job.message = message
    session.flush()


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


def is_cancel_requested(session: Session, job_id: int) -> bool:
    """Whether someone asked this job to stop (the worker polls this between steps)."""
    return bool(session.scalar(select(Job.cancel_requested).where(Job.id == job_id)))


def fail_stale_jobs(session: Session, max_age_s: float, *, now: datetime | None = None) -> list[int]:
    """Fail running jobs whose last heartbeat is older than ``max_age_s`` seconds; return their ids.

    The message says how long the worker has been silent and what it last reported. An experiment
    still marked "running" for such a job is marked failed too.
    """
    now = now or utcnow()
    failed = []
    for job in session.scalars(select(Job).where(Job.status == "running")):
        last_seen = job.heartbeat_at or job.started_at or job.created_at
        silent_s = (now - last_seen).total_seconds()
        if silent_s <= max_age_s:
            continue
        text = f"worker stopped (no heartbeat for {silent_s:.0f} s); last message: {job.message or '(none)'}"
        job.status, job.message, job.error, job.finished_at = "failed", text, text, now
        if job.experiment_id is not None:
            experiment = session.get(Experiment, job.experiment_id)
            if experiment is not None and experiment.status == "running":
                experiment.status, experiment.error, experiment.finished_at = "failed", text, now
        failed.append(job.id)
    session.flush()
    return failed


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
