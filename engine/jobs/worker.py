"""The background worker (``python -m engine worker``): claims queued jobs and runs them one at a time.

``--kinds`` restricts a worker to some job kinds: ``run_app.py`` starts one worker for every kind and a
second for the short lane (``engine.core.contract.SHORT_JOB_KINDS``: analysis, adapters, checkpoints, sources_check), so a map,
an upgrade verdict or a checkpoint comparison is computed while a training run occupies the first worker.
Both claim the queued job they may take in ``engine.core.contract.JOB_PRIORITY`` order (analyses and adapters,
then comparisons, then training; the oldest among equals); the claim is atomic, so two workers never run
the same job.

It runs each job through its kind's handler in ``engine.jobs.job_handlers.JOB_HANDLERS`` (the payload formats are
there) and marks the job done, cancelled or failed with the handler's message or error.

The worker writes progress and a heartbeat under the lease of its claim; a job whose worker died is
marked failed by ``run_app.py`` (which saw it die) or by the next worker (``fail_stale_jobs``, no
heartbeat for ``STALE_AFTER_S``) with the reason and its last message, and can be retried. A cancel
request stops a run at the next batch; the run's rows are removed. ``COMPATLAB_HEARTBEAT_S`` and
``COMPATLAB_STALE_AFTER_S`` override the heartbeat period and the stale limit (seconds).

The database may go away (a PostgreSQL restart, a network cut): :func:`serve` then retries with capped exponential
back-off (:data:`RETRY_FIRST_S` doubling to :data:`RETRY_MAX_S`, one line per wait, no trace), and a job that was
running when the database went away is failed by this worker, with that reason, as soon as the database answers
again, so it is never left "running" (the heartbeat stops with it, so another worker's stale sweep fails it too).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Collection, Mapping
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from engine.core import threads
from engine.models import thread_pools
from engine.core.contract import JOB_PRIORITY
from engine.jobs.job_handlers import JOB_HANDLERS, JobContext, JobHandler
from storage import (
    LeaseLost,
    claim_next_job,
    fail_job,
    fail_stale_jobs,
    finish_job,
    heartbeat,
    init_db,
    is_cancel_requested,
    link_job_study,
    running_jobs_here,
    session_scope,
    update_job_progress,
)
from storage import settings


def _env_seconds(setting: settings.Setting) -> float:
    """A number of seconds from the environment (tests shorten the heartbeat and stale limit); a bad one stops here."""
    try:
        return settings.read_setting(setting)
    except settings.SettingError as exc:
        raise SystemExit(str(exc)) from None


HEARTBEAT_S = _env_seconds(settings.HEARTBEAT_S)
STALE_AFTER_S = _env_seconds(settings.STALE_AFTER_S)
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0  # waits while the database does not answer: doubling, capped


def database_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached now (refused, reset, restarted, locked), not a bad query."""
    return isinstance(exc, (OperationalError, InterfaceError)) or (isinstance(exc, DBAPIError)
                                                                   and exc.connection_invalidated)


class DatabaseLost(Exception):
    """The database went away while job ``job_id`` ran under ``lease``; :func:`serve` fails it once it answers."""

    def __init__(self, job_id: int, lease: str, cause: BaseException):
        super().__init__(f"job {job_id}: the database went away while it ran ({type(cause).__name__})")
        self.job_id, self.lease = job_id, lease


class _Beat(threading.Thread):
    """Keeps the job's heartbeat fresh while a long step (e.g. feature extraction) runs, and sets the job's cancel
    event (``engine.core.signals.cancel_scope``) when a cancel is asked, so a blocking call is ended within a period;
    ends when the lease is lost."""

    def __init__(self, db: Engine, job_id: int, lease: str):
        super().__init__(daemon=True)
        self.db, self.job_id, self.lease, self.stop = db, job_id, lease, threading.Event()
        self.cancelled = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            try:
                with session_scope(self.db) as s:
                    if not heartbeat(s, self.job_id, lease=self.lease):
                        self.cancelled.set()  # no longer this worker's: whatever blocks may stop too
                        return
                    if is_cancel_requested(s, self.job_id, lease=self.lease):
                        self.cancelled.set()
            except LeaseLost:
                self.cancelled.set()
                return
            except Exception as exc:  # a missed beat is retried at the next period; no trace
                if not database_gone(exc):
                    raise
                print(f"worker {os.getpid()}: heartbeat of job {self.job_id} missed, the database does not answer",
                      file=sys.stderr, flush=True)


def run_one(db: Engine, *, checkpoint_dir: Path | None = None,
            kinds: Collection[str] | None = None, share_cores: bool = False,
            handlers: Mapping[str, JobHandler] = JOB_HANDLERS) -> int | None:
    """Claim and run the next queued job (of ``kinds``, default any) through its kind's handler in ``handlers``;
    return its id, or None when none is queued.

    ``share_cores``: run the job with ``cores // (jobs running on this machine)`` threads (``engine.core.threads``).
    ``checkpoint_dir``: where run jobs keep their ``experiment_<id>`` folders; None: the database's own folder
    (``storage.checkpoint_folders.checkpoint_root``), so two databases never share one.

    Every write about the job names the claim's lease: once the job is no longer this worker's
    (failed as stale while the worker was paused, taken over), the next progress report or cancel
    check raises :class:`storage.LeaseLost`, the job unwinds, and nothing about it is written.
    """
    from engine.core.signals import Cancelled, cancel_scope

    with session_scope(db) as s:
        fail_stale_jobs(s, STALE_AFTER_S)
    job = claim_next_job(db, os.getpid(), kinds=kinds, priority=JOB_PRIORITY)
    if job is None:
        return None
    if share_cores:  # this job included: the demo alone trains on every core, a check beside it splits them
        with session_scope(db) as s:
            thread_pools.apply(threads.per_process(processes=running_jobs_here(s)))
    handler = handlers.get(job.kind)
    lease = job.lease
    beat = _Beat(db, job.id, lease)
    beat.start()

    def progress(fraction: float, message: str) -> None:
        with session_scope(db) as s:
            if not update_job_progress(s, job.id, max(0.0, min(1.0, fraction)), message[:500], lease=lease):
                raise LeaseLost(job.id)

    def should_stop() -> bool:
        with session_scope(db) as s:
            return is_cancel_requested(s, job.id, lease=lease)

    def on_study(study_id: int) -> None:
        with session_scope(db) as s:
            if not link_job_study(s, job.id, study_id, lease=lease):
                raise LeaseLost(job.id)

    try:
        try:
            if handler is None:
                raise ValueError(f"unknown job kind {job.kind!r}; known kinds: {', '.join(handlers)}")
            with cancel_scope(beat.cancelled):
                message = handler(db, job.payload, JobContext(progress, should_stop, checkpoint_dir, on_study))
            with session_scope(db) as s:
                finish_job(s, job.id, message, lease=lease)
        except LeaseLost as exc:
            print(f"worker {os.getpid()}: {exc}", file=sys.stderr, flush=True)
        except Cancelled as exc:
            with session_scope(db) as s:
                finish_job(s, job.id, str(exc), lease=lease, status="cancelled")
        except Exception as exc:  # the job fails, the worker lives on
            if database_gone(exc):
                raise
            with session_scope(db) as s:
                fail_job(s, job.id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}", str(exc)[:500],
                         lease=lease)
    except Exception as exc:  # only a database that went away is handled here (serve retries)
        if not database_gone(exc):
            raise
        raise DatabaseLost(job.id, lease, exc) from exc
    finally:
        beat.stop.set()
    return job.id


def serve(db: Engine, *, poll_s: float = 1.0, once: bool = False, checkpoint_dir: Path | None = None,
          kinds: Collection[str] | None = None, share_cores: bool = False) -> None:
    """Run jobs (of ``kinds``, default any) until interrupted (``once``: until none is queued); ``share_cores``: see
    :func:`run_one`."""
    init_db(db)
    wait, orphan = RETRY_FIRST_S, None
    while True:
        try:
            if orphan is not None:  # the job that was running when the database went away: failed, never left running
                with session_scope(db) as s:
                    fail_job(s, orphan.job_id, str(orphan), "the database went away while it ran; retry it",
                             lease=orphan.lease)
                orphan = None
            ran = run_one(db, checkpoint_dir=checkpoint_dir, kinds=kinds, share_cores=share_cores)
            wait = RETRY_FIRST_S
        except Exception as exc:  # only a database that does not answer is waited out
            if isinstance(exc, DatabaseLost):
                orphan = exc
            elif not database_gone(exc):
                raise
            print(f"worker {os.getpid()}: the database does not answer ({type(exc.__cause__ or exc).__name__}); "
                  f"retrying in {wait:g} s", file=sys.stderr, flush=True)
            time.sleep(wait)
            wait = min(2 * wait, RETRY_MAX_S)
            continue
        if ran is None:
            if once:
                return
            time.sleep(poll_s)
